"""The rule expert against the whole scripted population (``gpumarket eval --expert-matrix``).

Every built-in scenario with a bidder seat x every scripted bidder of the population: the expert
and the member each take the same seat (``bidder_0``) on the same seeds, while the other seats
keep the scenario's own agents, so the two play the same worlds against the same opponents. A
cell is the seat's return of the expert minus the member's, seed by seed: its mean and the 95%
CI of that mean (Student t). The expert *beats* a member when the whole CI lies above 0.

The table also carries the baseline check ``truthful`` minus ``idle`` (doing nothing) per
scenario, when both are in the population: bidding one's values should never lose to staying
out.

Episodes run in a local process pool and only the seat's return comes back, so even
``large_market`` (hundreds of seats) costs no disk; nothing is resumable.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.registry import REGISTRY
from market.core.scenario_schema import Scenario
from market.run.folders import check_seats
from market.run.jobs import ProgressFn, RunConfigError, default_workers
from market.run.rollout import default_seats, mean_ci95, run_episode
from market.run.runner import progress_bar
from market.run.worker_pool import TaskFailed, WorkerPool
from scenarios import builtin_names, load_scenario

EXPERT = "rule_expert"
SEAT = "bidder_0"
#: seeds of the published matrix: 100 keeps every CI narrow enough to tell a real lead from noise
DEFAULT_SEEDS = range(100)
#: the baseline check: bidding one's values against doing nothing
BASELINE = ("truthful", "idle")


def population(expert: str = EXPERT) -> list[str]:
    """Every built-in scripted bidder except ``expert`` (the registry's parameter-free bidders:
    no plug-ins, no LLM or loaded-policy seats)."""
    return [
        name
        for name in sorted(REGISTRY)
        if "bidder" in getattr(REGISTRY[name], "roles", ()) and name != expert
    ]


#: built-ins the default matrix leaves out: the DAEDALUS parity family benchmarks designers
#: against DAEDALUS's fixed bidder population with sealed bids only (no negotiation turn), so a
#: bidder's planning, negotiation and coalitions have nothing to act on there
#: (docs/running.md gives rule_expert's measured cells on it)
DESIGNER_BENCHMARKS = tuple(f"daedalus_stage_{k}" for k in range(5))
#: built-ins the default matrix also leaves out: the GPU-arena task variants (easy/medium/hard of
#: the three tasks) reproduce the arena's baseline ordering and have their own test
#: (tests/agents/test_arena_tasks.py); their small worlds endow every lab each round, so even
#: doing nothing runs jobs there and the matrix's truthful-above-idle baseline does not apply
ARENA_TASK_VARIANTS = tuple(
    f"{task}_{level}"
    for task in ("single_trade", "market_round", "coalition_market")
    for level in ("easy", "medium", "hard")
)


def bidder_scenarios(seat: str = SEAT) -> list[str]:
    """The built-in scenarios that have ``seat``."""
    return [name for name in builtin_names() if seat in default_seats(load_scenario(name))]


def matrix_scenarios(seat: str = SEAT) -> list[str]:
    """The default matrix: :func:`bidder_scenarios` but the :data:`DESIGNER_BENCHMARKS` and the
    :data:`ARENA_TASK_VARIANTS`."""
    left_out = {*DESIGNER_BENCHMARKS, *ARENA_TASK_VARIANTS}
    return [name for name in bidder_scenarios(seat) if name not in left_out]


@dataclass
class ExpertMatrix:
    """The seat's return per (scenario, agent) and seed, and the paired differences."""

    expert: str
    members: list[str]
    scenarios: list[str]
    seat: str
    seeds: list[int]
    returns: dict[tuple[str, str], dict[int, float]]  # (scenario, agent) -> seed -> return
    invalid: dict[tuple[str, str], int]  # (scenario, agent) -> invalid actions, all seeds
    failed: dict[str, dict[int, str]] = field(default_factory=dict)  # "scenario/agent" -> errors

    def paired(self, scenario: str, agent: str, other: str) -> tuple[float, float, int]:
        """Mean and 95% CI half-width of ``agent``'s return minus ``other``'s over the seeds both
        finished, and how many seeds that is."""
        a, b = self.returns[(scenario, agent)], self.returns[(scenario, other)]
        seeds = sorted(set(a) & set(b))
        mean, half = mean_ci95([a[s] - b[s] for s in seeds])
        return mean, half, len(seeds)

    def cells(self) -> list[dict[str, Any]]:
        """One row per (scenario, member): expert minus member, with the two means."""
        rows = []
        for scenario in self.scenarios:
            expert_mean = mean_ci95(list(self.returns[(scenario, self.expert)].values()))[0]
            for member in self.members:
                diff, half, n = self.paired(scenario, self.expert, member)
                rows.append(
                    {
                        "scenario": scenario,
                        "member": member,
                        "n": n,
                        "diff": diff,
                        "ci95": half,
                        "low": diff - half,
                        "high": diff + half,
                        "expert_mean": expert_mean,
                        "member_mean": mean_ci95(list(self.returns[(scenario, member)].values()))[
                            0
                        ],
                    }
                )
        return rows

    def not_beaten(self) -> list[dict[str, Any]]:
        """The cells whose CI does not lie above 0: members the expert does not clearly beat."""
        return [c for c in self.cells() if not c["low"] > 0]

    def baseline(self) -> list[dict[str, Any]]:
        """``truthful`` minus ``idle`` per scenario (empty unless both are members)."""
        bid, idle = BASELINE
        if not {bid, idle} <= {self.expert, *self.members}:
            return []
        rows = []
        for scenario in self.scenarios:
            diff, half, n = self.paired(scenario, bid, idle)
            rows.append(
                {
                    "scenario": scenario,
                    "n": n,
                    "diff": diff,
                    "ci95": half,
                    "low": diff - half,
                    "high": diff + half,
                }
            )
        return rows

    def csv(self) -> str:
        keys = (
            "scenario",
            "member",
            "n",
            "diff",
            "ci95",
            "low",
            "high",
            "expert_mean",
            "member_mean",
        )
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(keys)
        for row in self.cells():
            writer.writerow([repr(row[k]) if isinstance(row[k], float) else row[k] for k in keys])
        return buf.getvalue()

    def grid(self) -> list[list[str]]:
        """Scenarios x members, each cell ``mean ± ci``, ``>`` when the CI lies above 0."""
        by_key = {(c["scenario"], c["member"]): c for c in self.cells()}
        out = []
        for scenario in self.scenarios:
            line = [scenario]
            for member in self.members:
                c = by_key[(scenario, member)]
                line.append(f"{c['diff']:+.3f} ± {c['ci95']:.3f}{'>' if c['low'] > 0 else ''}")
            out.append(line)
        return out

    def markdown(self) -> str:
        seeds = _seed_text(self.seeds)
        lines = [
            f"`{self.expert}` minus each scripted bidder in seat `{self.seat}`: mean return "
            f"difference ± 95% CI over {len(self.seeds)} seed(s) ({seeds}), paired on the same "
            "seeds with the scenario's own agents in the other seats. `>` marks a CI above 0 "
            f"(`{self.expert}` is ahead).",
            "",
            "| scenario | " + " | ".join(self.members) + " |",
            "|---|" + "---:|" * len(self.members),
        ]
        lines += ["| " + " | ".join(row) + " |" for row in self.grid()]
        beaten = len(self.cells()) - len(self.not_beaten())
        lines += ["", f"{beaten} of {len(self.cells())} cells above 0."]
        base = self.baseline()
        if base:
            bid, idle = BASELINE
            lines += [
                "",
                f"Baseline: `{bid}` minus `{idle}` (doing nothing) in seat `{self.seat}`, "
                "mean ± 95% CI, same seeds.",
                "",
                "| scenario | difference |",
                "|---|---:|",
            ]
            lines += [
                f"| {r['scenario']} | {r['diff']:+.3f} ± {r['ci95']:.3f}"
                f"{'>' if r['low'] > 0 else ''} |"
                for r in base
            ]
        return "\n".join(lines) + "\n"


def _seed_text(seeds: Sequence[int]) -> str:
    if seeds and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}..{seeds[-1]}"
    return ",".join(str(s) for s in seeds)


def _play_seat(job: tuple[Scenario, str, str, int, str]) -> tuple[str, str, int, float, int, str]:
    """Worker: one episode -> (scenario, agent, seed, the seat's return, its invalid actions,
    error or ""). An episode that raises is reported, not fatal."""
    sc, agent, seat, seed, name = job
    try:
        result = run_episode(sc, seed, {seat: agent})
    except Exception as exc:  # an agent or env bug: report it, keep the matrix going
        return name, agent, seed, math.nan, 0, f"{type(exc).__name__}: {exc}"[:500]
    return name, agent, seed, result.returns[seat], int(result.invalid_actions.get(seat, 0)), ""


def _not_finished(
    job: tuple[Scenario, str, str, int, str], failure: TaskFailed
) -> tuple[str, str, int, float, int, str]:
    """What :func:`_play_seat` gives for an episode whose worker died playing it."""
    _, agent, _, seed, name = job
    return name, agent, seed, math.nan, 0, f"episode not finished: {failure}"


def expert_matrix(
    seeds: Iterable[int] = DEFAULT_SEEDS,
    out_dir: str | Path | None = None,
    workers: int | None = None,
    *,
    expert: str = EXPERT,
    members: Sequence[str] | None = None,
    scenarios: Sequence[str | Path] | None = None,
    seat: str = SEAT,
    progress: bool | ProgressFn = True,
) -> ExpertMatrix:
    """Play ``expert`` and every member in ``seat`` of every scenario over ``seeds``.

    ``members``: default :func:`population`; ``scenarios``: default every built-in scenario
    with the seat but the DAEDALUS parity family (:func:`matrix_scenarios`). ``workers``: processes (default: every core; 1 plays in this process). With
    ``out_dir``, writes ``expert_matrix.csv`` and ``expert_matrix.md`` there. Raises
    :class:`~market.runner.RunConfigError` for an unknown agent, scenario or seat.
    """
    seed_list = list(dict.fromkeys(int(s) for s in seeds))
    if not seed_list:
        raise RunConfigError("no seeds: give at least two (e.g. --seeds 0:30) for a CI")
    members = list(population(expert) if members is None else members)
    if expert in members or len(set(members)) < len(members):
        raise RunConfigError(
            f"the members must be distinct agents other than the expert "
            f"{expert!r}; got {', '.join(members)}"
        )
    if not members:
        raise RunConfigError("no members to compare the expert with: give at least one agent")
    loaded: list[Scenario] = []
    for spec in matrix_scenarios(seat) if scenarios is None else scenarios:
        try:
            sc = load_scenario(spec)
        except ValueError as exc:  # ScenarioError names the file, key and problem
            raise RunConfigError(str(exc)) from None
        if sc.name in {s.name for s in loaded}:
            raise RunConfigError(f"scenario {sc.name!r} is listed twice")
        for agent in (expert, *members):
            check_seats(sc, {seat: agent})  # unknown agent, wrong role or no such seat
        loaded.append(sc)
    if not loaded:
        raise RunConfigError(f"no scenario has the seat {seat!r}")
    # the longest episodes first, so that the pool does not end waiting on one of them
    cost = {sc.name: sc.n_seats * sc.rounds for sc in loaded}
    jobs = sorted(
        (
            (sc, agent, seat, seed, sc.name)
            for sc in loaded
            for agent in (expert, *members)
            for seed in seed_list
        ),
        key=lambda j: -cost[j[4]],
    )
    matrix = ExpertMatrix(
        expert,
        members,
        [sc.name for sc in loaded],
        seat,
        seed_list,
        {(sc.name, a): {} for sc in loaded for a in (expert, *members)},
        {(sc.name, a): 0 for sc in loaded for a in (expert, *members)},
    )
    _run(jobs, matrix, default_workers() if workers is None else max(1, int(workers)), progress)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "expert_matrix.csv").write_text(matrix.csv(), encoding="utf-8")
        (out / "expert_matrix.md").write_text(matrix.markdown(), encoding="utf-8")
    return matrix


def _run(
    jobs: list[tuple[Scenario, str, str, int, str]],
    matrix: ExpertMatrix,
    workers: int,
    progress: bool | ProgressFn,
) -> None:
    total, done = len(jobs), 0
    callback = progress if callable(progress) else None
    # the pool is forked before the progress bar starts its refresh thread (as in the runner)
    pool = WorkerPool(_play_seat, min(workers, total)) if workers > 1 and total > 1 else None
    bar = progress_bar(progress is True, "expert matrix")
    try:
        with bar:
            task = bar.add_task("expert matrix", total=total)
            outcomes = (
                (
                    _not_finished(jobs[position], result)
                    if isinstance(result, TaskFailed)
                    else result
                    for position, result in pool.imap_unordered(jobs)
                )
                if pool is not None
                else map(_play_seat, jobs)
            )
            for name, agent, seed, ret, invalid, error in outcomes:
                if error:
                    matrix.failed.setdefault(f"{name}/{agent}", {})[seed] = error
                else:
                    matrix.returns[(name, agent)][seed] = ret
                    matrix.invalid[(name, agent)] += invalid
                done += 1
                bar.update(task, completed=done)
                if callback is not None:
                    callback(done, total)
            if pool is not None:
                pool.close()
    finally:
        if pool is not None:
            pool.terminate()


__all__ = [
    "BASELINE",
    "DEFAULT_SEEDS",
    "ARENA_TASK_VARIANTS",
    "DESIGNER_BENCHMARKS",
    "EXPERT",
    "ExpertMatrix",
    "bidder_scenarios",
    "expert_matrix",
    "matrix_scenarios",
    "population",
]
