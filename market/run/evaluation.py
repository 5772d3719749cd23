"""Evaluation: each agent in one seat of each scenario (``gpumarket eval``), as a table of mean
returns with 95% CIs, paired differences, tokens and cost. Every (scenario, agent) pair is one
resumable run folder; all episodes run in one pool (:func:`market.run.runner.execute`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.specs_redact import redact_spec
from market.run.conduct_table import (
    CONDUCT_HEADERS,
    CONDUCT_KEYS,
    ConductSummary,
    conduct_cells,
    summarize,
)
from market.run.folders import RunFolder, open_folder
from market.run.health import SeatHealth, from_rows
from market.run.jobs import ProgressFn, RunConfigError
from market.run.rollout import mean_ci95
from market.run.runner import execute
from scenarios import load_scenario


def slug(spec: str) -> str:
    """A folder name for an agent spec: readable, and unique per spec (its secrets masked first:
    a token never names a folder, and a new token for the same agent keeps its folder)."""
    spec = redact_spec(spec)
    text = re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec).strip("_")[:48] or "agent"
    if text == spec:
        return text
    return f"{text}-{hashlib.sha256(spec.encode()).hexdigest()[:6]}"


@dataclass
class Cell:
    """The seat's returns with one agent in one scenario."""

    agent: str
    scenario: str
    seat: str
    returns: dict[int, float]
    tokens: int = 0  # the seat's model tokens (prompt + completion) over these episodes
    cost_usd: float = 0.0  # and their cost (priced by the seat's spec or --price)
    # the seat's conduct score per seed (None: recorded before the conduct judge)
    conduct: dict[int, Mapping[str, Any] | None] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.returns)

    @property
    def mean_ci(self) -> tuple[float, float]:
        return mean_ci95([self.returns[s] for s in sorted(self.returns)])

    @property
    def conduct_summary(self) -> ConductSummary:
        """The seat's conduct over these episodes (:mod:`market.run.conduct_table`)."""
        return summarize(self.conduct[s] for s in sorted(self.conduct))


@dataclass
class EvalTable:
    agents: list[str]
    scenarios: list[str]
    seat: str
    seeds: list[int]
    cells: dict[tuple[str, str], Cell]
    failed: dict[str, dict[int, str]] = field(default_factory=dict)
    health: list[SeatHealth] = field(default_factory=list)  # per run folder and seat

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for scenario in self.scenarios:
            for agent in self.agents:
                cell = self.cells[(agent, scenario)]
                mean, half = cell.mean_ci
                out.append(
                    {
                        "scenario": scenario,
                        "agent": agent,
                        "seat": self.seat,
                        "n": cell.n,
                        "mean": mean,
                        "ci95": half,
                        "low": mean - half,
                        "high": mean + half,
                        "tokens": cell.tokens,
                        "cost_usd": cell.cost_usd,
                        **cell.conduct_summary.columns(),
                    }
                )
        return out

    def agent_conduct(self, agent: str) -> ConductSummary:
        """``agent``'s conduct over every scenario and seed."""
        return summarize(
            c.conduct[s]
            for scenario in self.scenarios
            for c in [self.cells[(agent, scenario)]]
            for s in sorted(c.conduct)
        )

    def paired(self, agent: str, other: str, scenario: str) -> tuple[float, float]:
        """Mean and 95% CI of ``agent``'s return minus ``other``'s, per seed (the same worlds)."""
        a = self.cells[(agent, scenario)].returns
        b = self.cells[(other, scenario)].returns
        return mean_ci95([a[s] - b[s] for s in sorted(set(a) & set(b))])

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        keys = (
            "scenario",
            "agent",
            "seat",
            "n",
            "mean",
            "ci95",
            "low",
            "high",
            "tokens",
            "cost_usd",
            *CONDUCT_KEYS,
        )
        writer.writerow(keys)
        for row in self.rows():
            writer.writerow([csv_value(row[k]) for k in keys])
        return buf.getvalue()

    def grid(self) -> list[list[str]]:
        """Agents x scenarios cells ``mean ± ci``, the best mean per scenario marked ``*``; then
        the agent's tokens and USD cost over every scenario and seed (:data:`USAGE_COLUMNS`) and
        its conduct there (:data:`market.run.conduct_table.CONDUCT_HEADERS`)."""
        best = {}
        for scenario in self.scenarios:
            means = {a: self.cells[(a, scenario)].mean_ci[0] for a in self.agents}
            finite = {a: m for a, m in means.items() if math.isfinite(m)}
            best[scenario] = max(finite, key=finite.__getitem__) if finite else None
        out = []
        for agent in self.agents:
            line = [agent]
            for scenario in self.scenarios:
                mean, half = self.cells[(agent, scenario)].mean_ci
                mark = "*" if best[scenario] == agent and len(self.agents) > 1 else ""
                line.append(f"{mean:.3f} ± {half:.3f}{mark}")
            cells = [self.cells[(agent, scenario)] for scenario in self.scenarios]
            line += [
                f"{sum(c.tokens for c in cells):,}",
                f"{math.fsum(c.cost_usd for c in cells):.4f}",
                *conduct_cells(self.agent_conduct(agent)),
            ]
            out.append(line)
        return out

    def markdown(self) -> str:
        head = ["agent", *self.scenarios, *USAGE_COLUMNS, *CONDUCT_HEADERS]
        lines = [
            f"Mean return of `{self.seat}` ± 95% CI over {len(self.seeds)} seed(s) "
            f"({seed_text(self.seeds)}); the other seats hold each scenario's own agents. "
            "`*` marks the best mean per scenario. Tokens (prompt + completion) and cost (USD, "
            "where the model has a price) are the seat's, over every scenario and seed, and so "
            "is its conduct: mean truthfulness and promise-keeping over the episodes where the "
            "seat made a judged claim / had a due promise (n of them), manipulation attempts "
            "per episode.",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
        ]
        lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in self.grid()]
        if len(self.agents) > 1:
            first = self.agents[0]
            lines += [
                "",
                f"Paired difference `{first}` minus each other agent (same seeds, so "
                "the same worlds), mean ± 95% CI; `>` marks a CI above 0.",
                "",
                "| " + " | ".join([f"{first} minus", *self.scenarios]) + " |",
                "|" + "|".join(["---"] + ["---:"] * len(self.scenarios)) + "|",
            ]
            for other in self.agents[1:]:
                cells = [other]
                for scenario in self.scenarios:
                    mean, half = self.paired(first, other, scenario)
                    cells.append(f"{mean:+.3f} ± {half:.3f}{'>' if mean - half > 0 else ''}")
                lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
        return "\n".join(lines) + "\n"


#: the usage columns after the scenarios in :meth:`EvalTable.grid`
USAGE_COLUMNS = ("tokens", "cost USD")


def md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def csv_value(value: Any) -> Any:
    return repr(value) if isinstance(value, float) else value  # full precision for scripts


def seed_text(seeds: Sequence[int]) -> str:
    if seeds and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}..{seeds[-1]}"
    return ",".join(str(s) for s in seeds)


def _conduct_of(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A result row's conduct score; None for a row written before the conduct judge."""
    score = row.get("conduct")
    return score if isinstance(score, Mapping) else None


def _cell(agent: str, scenario: str, seat: str, folder: RunFolder) -> Cell:
    """The seat's return, tokens and cost in each complete episode of ``folder``."""
    rows = [
        next(r for r in folder.done[s] if r["seat"] == seat)
        for s in folder.seeds
        if s in folder.done
    ]
    return Cell(
        agent,
        scenario,
        seat,
        {r["seed"]: r["return"] for r in rows},
        conduct={r["seed"]: _conduct_of(r) for r in rows},
        tokens=sum(int(r["tokens"]["total"]) for r in rows),
        cost_usd=math.fsum(float(r["stats"].get("cost_usd", 0.0)) for r in rows),
    )


def folder_health(folders: Iterable[RunFolder], out: Path) -> list[SeatHealth]:
    """Per-seat agent health of every folder, each seat labelled with its folder under ``out``."""
    health: list[SeatHealth] = []
    for f in folders:
        where = f.out.relative_to(out).as_posix() if f.out.is_relative_to(out) else str(f.out)
        health += from_rows(
            [r for s in f.seeds if s in f.done for r in f.done[s]], prefix=f"{where}: "
        )
    return health


def evaluate(
    agents: Sequence[str],
    scenarios: Sequence[str | Path],
    seat: str,
    seeds: Iterable[int],
    out_dir: str | Path,
    workers: int | None = None,
    *,
    backend: str = "local",
    address: str | None = None,
    transcripts: bool = False,
    progress: bool | ProgressFn = True,
    fresh: bool = False,
    llm: Mapping[str, Any] | None = None,
    agent_timeout: float | None = None,
) -> EvalTable:
    """Each agent in ``seat`` of each scenario (other seats: the scenario's own agents).

    Every (scenario, agent) pair is one resumable run folder ``out_dir/<scenario>/<agent>``;
    all episodes run in one pool. ``out_dir/eval.csv`` and ``out_dir/eval.md`` hold the table.
    ``backend``, ``address``, ``llm`` and ``agent_timeout`` as in :func:`run_scenario`.
    """
    seeds = list(seeds)
    if not agents:
        raise RunConfigError("no agents to evaluate: give at least one agent spec")
    if not scenarios:
        raise RunConfigError("no scenarios to evaluate on: give at least one")
    out = Path(out_dir)
    folders: dict[tuple[str, str], RunFolder] = {}
    names = []
    for scenario in scenarios:
        sc = load_scenario(scenario)
        if sc.name in names:
            raise RunConfigError(f"scenario {sc.name!r} is listed twice")
        names.append(sc.name)
        for agent in agents:
            if (agent, sc.name) in folders:
                raise RunConfigError(f"agent {agent!r} is listed twice")
            folders[(agent, sc.name)] = open_folder(
                sc,
                seeds,
                {seat: agent},
                out / sc.name / slug(agent),
                transcripts,
                fresh,
                1,
                agent_timeout,
            )
    execute(
        list(folders.values()),
        workers=workers,
        backend=backend,
        address=address,
        progress=progress,
        label="eval",
        llm=llm,
    )
    table = EvalTable(
        list(agents),
        names,
        seat,
        seeds,
        {key: _cell(key[0], key[1], seat, f) for key, f in folders.items()},
        {f"{k[1]}/{k[0]}": f.failed for k, f in folders.items() if f.failed},
    )
    table.health = folder_health(folders.values(), out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.csv").write_text(table.csv(), encoding="utf-8")
    (out / "eval.md").write_text(table.markdown(), encoding="utf-8")
    return table


__all__ = ["Cell", "EvalTable", "evaluate", "slug"]
