"""The conduct record of every scripted bidder of the population (docs/conduct.md's table).

Each bidder of the registry takes seat ``bidder_0`` of a scenario, the other seats keep the
scenario's own agents, on seeds 0-9; the rule judge (``env.unwrapped.conduct``) scores the seat
in every episode. A row gives, per agent and scenario:

- ``n``: the episodes played;
- ``truthfulness``: the mean over the episodes with a judged claim (``n_claims`` of them) of the
  episode's true claims / judged claims; empty without one;
- ``promise_keeping``: the mean over the episodes with a due promise (``n_promises``) of kept /
  due promises; empty without one;
- ``manipulation``: the mean number of manipulation attempts per episode;
- ``claims_false`` and ``promises_broken``: their means per episode.

The first three are the ``eval`` table's conduct columns
(:func:`market.run.conduct_table.summarize`). ``python -m market.run.conduct_population`` prints
the table in Markdown; ``--csv PATH`` also writes the rows (``docs/data/conduct-population.csv``
is the committed measurement).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from agents.registry import REGISTRY
from market.environment.aec import raw_env
from market.run.conduct_table import summarize
from market.run.rollout import run_episode

SEAT = "bidder_0"
SCENARIOS = ("market_round", "coalition_market")
SEEDS = range(10)


@dataclass(frozen=True)
class ConductRow:
    """One agent's conduct record in one scenario (the means of the module docstring)."""

    scenario: str
    agent: str
    n: int
    truthfulness: float | None
    n_claims: int
    promise_keeping: float | None
    n_promises: int
    manipulation: float
    claims_false: float
    promises_broken: float


def bidders() -> list[str]:
    """The registry's agents that fill a bidder seat, by name."""
    return sorted(n for n, f in REGISTRY.items() if "bidder" in getattr(f, "roles", ()))


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _defined(value: float) -> float | None:
    return None if math.isnan(value) else value


def episode_score(scenario: str, seed: int, agent: str) -> dict[str, Any]:
    """The seat's conduct score dict after one episode (all zeros when it said nothing judged)."""
    env = raw_env(scenario)
    run_episode(scenario, seed, {SEAT: agent}, env=env)
    empty = {
        "claims_true": 0,
        "claims_false": 0,
        "promises_kept": 0,
        "promises_broken": 0,
        "manipulation_attempts": 0,
        "truthfulness": None,
        "promise_keeping": None,
    }
    return dict(env.unwrapped.conduct.score_dicts().get(SEAT, empty))


def conduct_row(scenario: str, agent: str, seeds: Iterable[int] = SEEDS) -> ConductRow:
    """The agent's row: one episode per seed in ``SEAT`` of ``scenario``."""
    scores = [episode_score(scenario, s, agent) for s in seeds]
    summary = summarize(scores)
    return ConductRow(
        scenario,
        agent,
        len(scores),
        _defined(summary.truthfulness),
        summary.truthfulness_n,
        _defined(summary.promise_keeping),
        summary.promise_keeping_n,
        summary.manipulation if scores else 0.0,
        _mean([s["claims_false"] for s in scores]),
        _mean([s["promises_broken"] for s in scores]),
    )


def population_table(
    scenarios: Iterable[str] = SCENARIOS,
    agents: Iterable[str] | None = None,
    seeds: Iterable[int] = SEEDS,
) -> list[ConductRow]:
    """Every (scenario, agent) row, scenarios in the given order, agents by name."""
    names = list(agents) if agents is not None else bidders()
    seeds = list(seeds)
    return [conduct_row(sc, a, seeds) for sc in scenarios for a in names]


def _cell(value: float | None, n: int | None = None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if n is None else f"{value:.3f} ({n})"


def markdown(rows: Sequence[ConductRow]) -> str:
    """The rows as a Markdown table: one line per agent, a column group per scenario."""
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    by = {(r.scenario, r.agent): r for r in rows}
    head = ["agent"]
    for sc in scenarios:
        head += [f"{sc} truthful (n)", "promise-keeping (n)", "manipulation / ep."]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for agent in dict.fromkeys(r.agent for r in rows):
        cells = [f"`{agent}`"]
        for sc in scenarios:
            r = by[(sc, agent)]
            cells += [
                _cell(r.truthfulness, r.n_claims),
                _cell(r.promise_keeping, r.n_promises),
                f"{r.manipulation:.2f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(rows: Sequence[ConductRow], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.DictWriter(f, fieldnames=[x.name for x in fields(ConductRow)])
        out.writeheader()
        for r in rows:
            out.writerow({k: "" if v is None else v for k, v in asdict(r).items()})


def read_csv(path: Path) -> list[ConductRow]:
    """Rows written by :func:`write_csv`, back as :class:`ConductRow`."""

    def num(text: str) -> float | None:
        return None if text == "" else float(text)

    with path.open(encoding="utf-8") as f:
        return [
            ConductRow(
                r["scenario"],
                r["agent"],
                int(r["n"]),
                num(r["truthfulness"]),
                int(r["n_claims"]),
                num(r["promise_keeping"]),
                int(r["n_promises"]),
                float(r["manipulation"]),
                float(r["claims_false"]),
                float(r["promises_broken"]),
            )
            for r in csv.DictReader(f)
        ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--agents", default="", help="comma-separated; default: every bidder")
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="seeds 0..N-1")
    parser.add_argument("--csv", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    agents = [a for a in args.agents.split(",") if a] or None
    rows = population_table(args.scenarios.split(","), agents, range(args.seeds))
    if args.csv is not None:
        write_csv(rows, args.csv)
    print(markdown(rows))


if __name__ == "__main__":
    main()
