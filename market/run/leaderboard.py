"""The model leaderboard (``gpumarket eval --leaderboard``): every agent in every seat type its
role allows, per scenario, against a reference agent in the same seat on the same seeds.

The rules:

* **Seats.** Each agent plays each seat of ``seats`` (default ``designer_0`` and ``bidder_0``)
  that its roles allow, in each scenario that has that seat; the scenario's own agents fill the
  other seats. A scenario without a designer seat has no designer entries (a note says so).
* **Reference.** Every (scenario, seat) group also plays the reference agent of the seat's role
  on the same seeds: ``rule_designer`` for the designer seat, ``rule_expert`` for bidder seats
  (:data:`DEFAULT_REFERENCES`; ``--reference [ROLE=]SPEC`` overrides). The paired difference of
  an agent is the mean, with its 95% CI, of ``agent return - reference return`` per seed, over
  the seeds both completed: the same worlds, so the world's luck cancels.
* **Rates are per decision** of the seat (the runner's count of its turns, summed over the
  episodes): invalid actions (rejected by the env), repairs (re-asks of the model after an
  unusable reply), fallbacks (the decisions that played the fallback action: the agent's own
  fallbacks, agent errors and timeouts) and parse failures (unusable replies). Mean latency per
  decision is the seat's model-call seconds over its decisions.
* **Every numeric stats key flows through.** The seat's ``stats`` in the result rows (an LLM
  seat's :data:`agents.llm.agent.STAT_KEYS` and whatever keys an agent adds, e.g.
  ``reasoning_tokens``) are summed over the episodes (``math.fsum``) into ``stats.<key>``
  columns of the CSV and JSON; nothing recomputes them from transcripts.
* **Degraded is loud.** An entry whose seat fell back, raised, timed out, got a backend error,
  reported a non-zero ``degraded*`` stats key, or lost an episode, carries a ``degraded``
  text naming each cause, and one warning line per such entry follows every table.

Output: ``OUT/leaderboard.csv``, ``OUT/leaderboard.md`` (Markdown tables ready for docs) and
``OUT/leaderboard.json``; each (scenario, seat, agent) is one resumable run folder
``OUT/<scenario>/<seat>/<agent>``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.registry import AgentSpecError, make_agent
from market.core.seats import DESIGNER, is_bidder_seat
from market.run.conduct_table import CONDUCT_KEYS, summarize
from market.run.evaluation import csv_value, folder_health, md_cell, seed_text, slug
from market.run.folders import RunFolder, open_folder
from market.run.health import SeatHealth
from market.run.jobs import ProgressFn, RunConfigError
from market.run.rollout import mean_ci95, resolve_seats
from market.run.runner import execute
from scenarios import load_scenario

#: the reference agent of each seat role
DEFAULT_REFERENCES: dict[str, str] = {"designer": "rule_designer", "bidder": "rule_expert"}
#: the seats an agent is tried in by default (each as its roles allow)
DEFAULT_SEATS: tuple[str, ...] = (DESIGNER, "bidder_0")
ROLES = ("designer", "bidder")

#: the fixed columns of ``leaderboard.csv`` (then ``stats.<key>`` for every stats key)
COLUMNS = (
    "scenario",
    "seat",
    "role",
    "agent",
    "label",
    "reference",
    "is_reference",
    "seeds",
    "n",
    "mean",
    "ci95",
    "diff_mean",
    "diff_ci95",
    "diff_n",
    "decisions",
    "invalid_rate",
    "repair_rate",
    "fallback_rate",
    "parse_failure_rate",
    "backend_errors",
    "timeouts",
    "agent_errors",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "latency_per_decision_s",
    "cost_usd",
    *CONDUCT_KEYS,
    "degraded",
)

#: the Markdown and terminal columns: (header, row key, format)
SHOWN = (
    ("n", "n", "int"),
    ("return ± 95% CI", "mean", "ci"),
    ("Δ vs reference ± 95% CI", "diff_mean", "diff"),
    ("invalid/dec", "invalid_rate", "rate"),
    ("repairs/dec", "repair_rate", "rate"),
    ("fallback/dec", "fallback_rate", "rate"),
    ("parse fail/dec", "parse_failure_rate", "rate"),
    ("backend err", "backend_errors", "int"),
    ("timeouts", "timeouts", "int"),
    ("prompt tok", "prompt_tokens", "int"),
    ("compl. tok", "completion_tokens", "int"),
    ("reasoning tok", "reasoning_tokens", "int"),
    ("latency/dec s", "latency_per_decision_s", "sec"),
    ("cost USD", "cost_usd", "usd"),
    ("truthful", "truthfulness", "rate"),  # conduct: market.run.conduct_table
    ("keeps promises", "promise_keeping", "rate"),
    ("manip./ep", "manipulation", "rate"),
    ("degraded", "degraded", "text"),
)


def stat_totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Every numeric key of the rows' ``stats``, summed (``math.fsum``); integer sums stay int."""
    values: dict[str, list[float]] = {}
    for row in rows:
        for key, value in (row.get("stats") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.setdefault(str(key), []).append(value)
    out: dict[str, float] = {}
    for key in sorted(values):
        vs = values[key]
        out[key] = sum(int(v) for v in vs) if all(isinstance(v, int) for v in vs) else math.fsum(vs)
    return out


def per(count: float, decisions: int) -> float:
    """``count / decisions``; NaN when the seat made no decision."""
    return count / decisions if decisions else float("nan")


@dataclass
class Entry:
    """One agent in one seat of one scenario: its result rows of that seat, by seed."""

    scenario: str
    seat: str
    agent: str
    reference: str
    seeds: list[int]
    rows: dict[int, dict[str, Any]]
    failed: dict[int, str] = field(default_factory=dict)

    @property
    def role(self) -> str:
        return "designer" if self.seat == DESIGNER else "bidder"

    @property
    def returns(self) -> dict[int, float]:
        return {s: float(self.rows[s]["return"]) for s in sorted(self.rows)}

    def total(self, key: str) -> int:
        return sum(int(r.get(key, 0) or 0) for r in self.rows.values())

    def degraded(self, stats: Mapping[str, float]) -> str:
        """Why this entry's numbers are not the agent's own choices ('' when they are)."""
        parts = []
        own = self.total("fallbacks") - self.total("agent_errors") - self.total("timeouts")
        for count, what in (
            (own, "fallbacks"),
            (self.total("agent_errors"), "agent errors"),
            (self.total("timeouts"), "timeouts"),
            (stats.get("backend_errors", 0), "backend errors"),
        ):
            if count:
                parts.append(f"{count:g} {what}")
        parts += [f"{k}={v:g}" for k, v in stats.items() if k.startswith("degraded") and v]
        missing = len(self.seeds) - len(self.rows)
        if missing:
            parts.append(f"{missing} of {len(self.seeds)} episodes failed")
        return ", ".join(parts)

    def row(self, reference: Entry | None) -> dict[str, Any]:
        """The leaderboard row (:data:`COLUMNS` plus ``stats``): see the module doc."""
        stats = stat_totals(self.rows.values())
        decisions = self.total("decisions")
        mean, half = mean_ci95(list(self.returns.values()))
        diff = diff_half = float("nan")
        paired = 0
        if reference is not None and reference is not self:
            mine, theirs = self.returns, reference.returns
            common = sorted(set(mine) & set(theirs))
            paired = len(common)
            diff, diff_half = mean_ci95([mine[s] - theirs[s] for s in common])
        if len(self.rows) < 2:  # one seed has no interval (Student t needs two)
            half = float("nan")
        if paired < 2:
            diff_half = float("nan")
        latency = stats.get("latency_s")
        return {
            "scenario": self.scenario,
            "seat": self.seat,
            "role": self.role,
            "agent": self.agent,
            "reference": self.reference,
            "is_reference": self.agent == self.reference,
            "seeds": len(self.seeds),
            "n": len(self.rows),
            "mean": mean,
            "ci95": half,
            "diff_mean": diff,
            "diff_ci95": diff_half,
            "diff_n": paired,
            "decisions": decisions,
            "invalid_rate": per(self.total("invalid_actions"), decisions),
            "repair_rate": per(self.total("repairs"), decisions),
            "fallback_rate": per(self.total("fallbacks"), decisions),
            "parse_failure_rate": per(stats.get("parse_failures", 0), decisions),
            "backend_errors": stats.get("backend_errors", 0),
            "timeouts": self.total("timeouts"),
            "agent_errors": self.total("agent_errors"),
            "prompt_tokens": stats.get("prompt_tokens", 0),
            "completion_tokens": stats.get("completion_tokens", 0),
            "reasoning_tokens": stats.get("reasoning_tokens"),  # None: not recorded
            "latency_per_decision_s": per(latency, decisions) if latency is not None else None,
            "cost_usd": stats.get("cost_usd", 0.0),
            **summarize(
                r.get("conduct") if isinstance(r.get("conduct"), Mapping) else None
                for r in (self.rows[s] for s in sorted(self.rows))
            ).columns(),
            "degraded": self.degraded(stats),
            "stats": stats,
        }


def labels(agents: Iterable[str], width: int = 40) -> dict[str, str]:
    """Short display names: a spec up to ``width`` characters as it is; a longer ``llm`` spec as
    ``llm <model>`` plus the parameters it does not share with every other long ``llm`` spec
    (a sweep over settings shows just the settings). The files keep the full specs."""
    agents = list(agents)
    long = {a: a.partition("?") for a in agents if len(a) > width and a.startswith("llm")}
    params = {a: [p for p in q.split("&") if p] for a, (_, _, q) in long.items()}
    common = set.intersection(*(set(p) for p in params.values())) if len(params) > 1 else set()
    out = {}
    for agent in agents:
        if agent not in long:
            out[agent] = agent
            continue
        model = next((p[6:] for p in params[agent] if p.startswith("model=")), "?")
        rest = [p for p in params[agent] if p not in common and not p.startswith("model=")]
        rest = [p for p in rest if not p.startswith(("base_url=", "api_key_env="))]
        out[agent] = " ".join([f"llm {model}", *rest])
    if len(set(out.values())) < len(out):  # never two agents under one name
        return {a: a for a in agents}
    return out


def fmt(value: Any, kind: str, half: Any = None) -> str:
    """A cell as the Markdown and terminal tables show it ('—': not measured or not defined)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if kind in ("ci", "diff"):
        text = f"{value:+.3f}" if kind == "diff" else f"{value:.3f}"
        return text + (f" ± {half:.3f}" if math.isfinite(half) else " (1 seed: no CI)")
    if kind == "rate":
        return f"{value:.3f}"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "sec":
        return f"{value:.3f}"
    if kind == "usd":
        return f"{value:.4f}"
    return str(value)


@dataclass
class Leaderboard:
    """The entries of a leaderboard run, their rows, and the CSV, Markdown and JSON files."""

    scenarios: list[str]
    seats: list[str]
    seeds: list[int]
    references: dict[str, str]
    entries: list[Entry]
    notes: list[str] = field(default_factory=list)
    health: list[SeatHealth] = field(default_factory=list)

    def reference_of(self, entry: Entry) -> Entry | None:
        for other in self.entries:
            if (other.scenario, other.seat, other.agent) == (
                entry.scenario,
                entry.seat,
                entry.reference,
            ):
                return other
        return None

    def rows(self) -> list[dict[str, Any]]:
        """One row per entry, grouped by seat then scenario, the reference first in each group."""
        names = labels(dict.fromkeys(e.agent for e in self.entries))
        return [{"label": names[e.agent], **e.row(self.reference_of(e))} for e in self.entries]

    def failed(self) -> dict[str, dict[int, str]]:
        return {f"{e.scenario}/{e.seat}/{e.agent}": e.failed for e in self.entries if e.failed}

    def warnings(self, rows: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
        """One line per degraded entry."""
        return [
            f"DEGRADED {r['scenario']} / {r['seat']} / {r['label']}: {r['degraded']}"
            for r in (self.rows() if rows is None else rows)
            if r["degraded"]
        ]

    def stat_keys(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        return sorted({k for r in rows for k in r["stats"]})

    def csv(self) -> str:
        rows = self.rows()
        keys = self.stat_keys(rows)
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow([*COLUMNS, *(f"stats.{k}" for k in keys)])
        for r in rows:
            writer.writerow(
                [
                    *("" if r[c] is None else csv_value(r[c]) for c in COLUMNS),
                    *(csv_value(r["stats"][k]) if k in r["stats"] else "" for k in keys),
                ]
            )
        return buf.getvalue()

    def cells(self, row: Mapping[str, Any]) -> list[str]:
        """The shown cells of a row (:data:`SHOWN`), after the scenario and the agent."""
        out = [row["scenario"], row["label"] + (" (reference)" if row["is_reference"] else "")]
        for _, key, kind in SHOWN:
            half = row["ci95"] if kind == "ci" else row["diff_ci95"] if kind == "diff" else None
            out.append(fmt(row[key], kind, half))
        return out

    def header(self, seat: str) -> str:
        role = "designer" if seat == DESIGNER else "bidder"
        return (
            f"`{seat}` ({role} seat): reference `{self.references[role]}` in the same seat on the "
            f"same {len(self.seeds)} seed(s) ({seed_text(self.seeds)})"
        )

    def markdown(self) -> str:
        rows = self.rows()
        head = ["scenario", "agent", *(h for h, _, _ in SHOWN)]
        lines = [
            "Mean return of the seat ± 95% CI (Student t) over the seeds each agent completed "
            "(`n`); Δ: the paired difference agent − reference per seed, mean ± 95% CI. Rates "
            "are per decision of the seat; latency is model-call seconds per decision; tokens "
            "and cost (USD, where the model has a price) are summed over the episodes. "
            "`—`: not measured (no model calls, or a stat the agent does not record); one seed "
            "gives no CI. Long "
            "`llm` specs are shown by their model and the parameters that set them apart; "
            "`leaderboard.csv` and `leaderboard.json` hold the full specs.",
        ]
        for seat in self.seats:
            mine = [r for r in rows if r["seat"] == seat]
            if not mine:
                continue
            lines += ["", self.header(seat), ""]
            lines.append("| " + " | ".join(head) + " |")
            lines.append(
                "|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 3) + ["---"]) + "|"
            )
            lines += ["| " + " | ".join(md_cell(c) for c in self.cells(r)) + " |" for r in mine]
        notes = [*self.notes, *self.warnings(rows)]
        if notes:
            lines.append("")
            lines += [f"- {md_cell(n)}" for n in notes]
        return "\n".join(lines) + "\n"

    def data(self) -> dict[str, Any]:
        """The JSON form (NaN written as null)."""
        rows = self.rows()

        def clean(value: Any) -> Any:
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            return value

        return {
            "scenarios": self.scenarios,
            "seats": self.seats,
            "seeds": self.seeds,
            "references": self.references,
            "rates": "per decision of the seat",
            "rows": [clean(r) for r in rows],
            "notes": self.notes,
            "warnings": self.warnings(rows),
        }

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "leaderboard.csv").write_text(self.csv(), encoding="utf-8")
        (out / "leaderboard.md").write_text(self.markdown(), encoding="utf-8")
        text = json.dumps(self.data(), indent=1, allow_nan=False)
        (out / "leaderboard.json").write_text(text + "\n", encoding="utf-8")


def roles_of(spec: str) -> frozenset[str]:
    """The seat roles an agent spec fills (it is built once to ask; no model is called)."""
    try:
        return frozenset(getattr(make_agent(spec), "roles", frozenset()))
    except AgentSpecError as exc:
        raise RunConfigError(str(exc)) from None
    except ValueError as exc:
        raise RunConfigError(f"agent {spec!r}: {exc}") from None


def parse_references(items: Iterable[str]) -> dict[str, str]:
    """``--reference`` values: ``ROLE=SPEC`` (ROLE ``designer`` or ``bidder``), or a plain SPEC
    for every role it fills; the rest keep :data:`DEFAULT_REFERENCES`."""
    refs = dict(DEFAULT_REFERENCES)
    for item in items:
        text = item.strip()
        role, sep, spec = text.partition("=")
        if sep and role in ROLES:
            if not spec.strip():
                raise RunConfigError(f"--reference {item!r}: give {role}=SPEC with an agent spec")
            refs[role] = spec.strip()
            continue
        roles = roles_of(text)
        if not roles & set(ROLES):
            raise RunConfigError(
                f"--reference {item!r}: that agent fills no designer or bidder seat"
            )
        for r in roles & set(ROLES):
            refs[r] = text
    for role, spec in refs.items():
        if role not in roles_of(spec):
            raise RunConfigError(
                f"--reference {spec!r} cannot fill the {role} seat; give {role}=SPEC with an "
                f"agent that does (default: {DEFAULT_REFERENCES[role]})"
            )
    return refs


def parse_seats(seats: Iterable[str]) -> list[str]:
    """Seat names (``designer`` is short for ``designer_0``), checked and de-duplicated."""
    out: list[str] = []
    for raw in seats:
        seat = DESIGNER if raw.strip() == "designer" else raw.strip()
        if seat != DESIGNER and not is_bidder_seat(seat):
            raise RunConfigError(
                f"--seats {raw!r}: give designer_0 (or designer) and bidder seats like bidder_0"
            )
        if seat not in out:
            out.append(seat)
    if not out:
        raise RunConfigError("--seats: give at least one seat, e.g. designer_0,bidder_0")
    return out


def leaderboard(
    agents: Sequence[str],
    scenarios: Sequence[str | Path],
    seeds: Iterable[int],
    out_dir: str | Path,
    *,
    seats: Sequence[str] = DEFAULT_SEATS,
    references: Iterable[str] = (),
    workers: int | None = None,
    backend: str = "local",
    address: str | None = None,
    transcripts: bool = False,
    progress: bool | ProgressFn = True,
    fresh: bool = False,
    llm: Mapping[str, Any] | None = None,
    agent_timeout: float | None = None,
) -> Leaderboard:
    """Play the leaderboard (see the module doc), write its files in ``out_dir``, return it.

    ``references``: ``--reference`` values (:func:`parse_references`). The other arguments as in
    :func:`market.run.evaluation.evaluate`. Raises :class:`RunConfigError` for bad input.
    """
    seeds = list(seeds)
    if not agents:
        raise RunConfigError("no agents to rank: give at least one agent spec")
    if not scenarios:
        raise RunConfigError("no scenarios: give at least one")
    if not seeds:
        raise RunConfigError("no seeds: give e.g. --seeds 0:5")
    if len(set(agents)) < len(agents):
        raise RunConfigError("an agent is listed twice in --agents")
    seat_list = parse_seats(seats)
    refs = parse_references(references)
    roles = {a: roles_of(a) for a in agents}
    out = Path(out_dir)
    notes: list[str] = []
    plan: list[tuple[str, str, str, str, RunFolder]] = []
    names: list[str] = []
    for scenario in scenarios:
        sc = load_scenario(scenario)
        if sc.name in names:
            raise RunConfigError(f"scenario {sc.name!r} is listed twice")
        names.append(sc.name)
        present = resolve_seats(sc, None)
        for seat in seat_list:
            role = "designer" if seat == DESIGNER else "bidder"
            if seat not in present:
                notes.append(f"{sc.name} has no seat {seat}: no {role} entries there")
                continue
            ref = refs[role]
            group = [ref, *(a for a in agents if role in roles[a] and a != ref)]
            for agent in group:
                folder = open_folder(
                    sc,
                    seeds,
                    {seat: agent},
                    out / sc.name / seat / slug(agent),
                    transcripts,
                    fresh,
                    1,
                    agent_timeout,
                )
                plan.append((sc.name, seat, agent, ref, folder))
    for agent in agents:
        missing = [
            s for s in seat_list if ("designer" if s == DESIGNER else "bidder") not in roles[agent]
        ]
        if missing:
            notes.append(f"{agent} fills no {' or '.join(missing)} seat: not ranked there")
    if not plan:
        raise RunConfigError("no scenario has any of the seats " + ", ".join(seat_list))
    execute(
        [p[4] for p in plan],
        workers=workers,
        backend=backend,
        address=address,
        progress=progress,
        label="leaderboard",
        llm=llm,
    )
    entries = []
    for scenario_name, seat, agent, ref, folder in plan:
        rows = {
            s: next(r for r in folder.done[s] if r["seat"] == seat)
            for s in folder.seeds
            if s in folder.done
        }
        entries.append(
            Entry(scenario_name, seat, agent, ref, list(seeds), rows, dict(folder.failed))
        )
    order = {s: i for i, s in enumerate(seat_list)}
    entries.sort(key=lambda e: order[e.seat])  # stable: scenario order, reference first
    board = Leaderboard(
        names,
        seat_list,
        seeds,
        refs,
        entries,
        notes,
        folder_health([p[4] for p in plan], out),
    )
    board.write(out)
    return board


__all__ = [
    "COLUMNS",
    "DEFAULT_REFERENCES",
    "DEFAULT_SEATS",
    "Entry",
    "Leaderboard",
    "leaderboard",
    "parse_references",
    "parse_seats",
    "stat_totals",
]
