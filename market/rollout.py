"""Run episodes with an agent in every seat, and summarise them.

``run_episode("market_round", seed=0)`` fills every seat from the scenario's ``[agents]`` table;
``seats={"bidder_0": "random_valid"}`` overrides some. Agents are seeded per seat from the
episode's streams, so an episode is a pure function of (scenario, seed, agents).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.base import BaseAgent
from agents.registry import make_agent
from market.environment import DESIGNER, raw_env
from scenarios import load_scenario
from scenarios.schema import Scenario


@dataclass
class EpisodeResult:
    scenario: str
    seed: int
    seats: dict[str, str]
    returns: dict[str, float]
    components: dict[str, dict[str, float]]
    invalid_actions: dict[str, int]
    steps: int
    seconds: float
    round_log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def welfare_ratio(self) -> float:
        parts = [r["designer"]["welfare_ratio"] for r in self.round_log]
        return sum(parts) / len(parts) if parts else float("nan")

    @property
    def revenue(self) -> float:
        return float(sum(r["revenue"] for r in self.round_log))


def default_seats(scenario: Scenario) -> dict[str, str]:
    """Seat -> agent spec from the scenario's [agents] table (the last bidder spec repeats)."""
    bidders = scenario.agents.bidders or ["truthful"]
    seats = {DESIGNER: scenario.agents.designer} if scenario.designer_seat else {}
    for i in range(scenario.n_seats):
        seats[f"bidder_{i}"] = bidders[min(i, len(bidders) - 1)]
    return seats


def resolve_seats(scenario: Scenario, seats: Mapping[str, Any] | None) -> dict[str, Any]:
    resolved: dict[str, Any] = dict(default_seats(scenario))
    for seat, spec in (seats or {}).items():
        if seat not in resolved:
            raise ValueError(f"seat {seat!r} is not in scenario {scenario.name!r}; seats: {', '.join(resolved)}")
        resolved[seat] = spec
    return resolved


def _spec_name(agent: Any) -> str:
    return agent if isinstance(agent, str) else getattr(agent, "name", type(agent).__name__)


def run_episode(
    scenario: str | Path | Scenario = "market_round",
    seed: int = 0,
    seats: Mapping[str, Any] | None = None,
    env: raw_env | None = None,
) -> EpisodeResult:
    """Play one episode. ``seats`` maps seat -> agent spec string or agent object."""
    env = env if env is not None else raw_env(scenario)
    sc = env.scenario
    specs = resolve_seats(sc, seats)
    agents: dict[str, BaseAgent] = {}
    for seat, spec in specs.items():
        agents[seat] = make_agent(spec, "designer" if seat == DESIGNER else "bidder") if isinstance(spec, str) else spec
    start = time.perf_counter()
    env.reset(seed=seed)
    for seat, agent in agents.items():
        agent.reset(env.seat_seed(seat))
    returns: dict[str, float] = defaultdict(float)
    components: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    invalid: dict[str, int] = defaultdict(int)
    steps = 0
    for seat in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        returns[seat] += reward
        for name, value in info.get("reward_components", {}).items():
            components[seat][name] += value
        if "error" in info and info.get("round") is not None:
            invalid[seat] += 1
        env.step(None if terminated or truncated else agents[seat].act(obs))
        steps += 1
    return EpisodeResult(
        scenario=sc.name, seed=seed, seats={s: _spec_name(a) for s, a in specs.items()},
        returns={s: returns.get(s, 0.0) for s in specs},
        components={s: dict(components.get(s, {})) for s in specs},
        invalid_actions={s: invalid.get(s, 0) for s in specs},
        steps=steps, seconds=time.perf_counter() - start, round_log=env.round_log,
    )


def _run_one(args: tuple[Any, int, dict[str, Any]]) -> EpisodeResult:
    scenario, seed, seats = args
    return run_episode(scenario, seed, seats)


def run_many(
    scenario: str | Path | Scenario, seeds: Iterable[int], seats: Mapping[str, str] | None = None, workers: int = 1
) -> list[EpisodeResult]:
    """Episodes over ``seeds``; ``workers > 1`` runs them in a local process pool."""
    sc = load_scenario(scenario)
    jobs = [(sc, seed, dict(seats or {})) for seed in seeds]
    if workers <= 1 or len(jobs) <= 1:
        return [_run_one(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_run_one, jobs, chunksize=max(1, len(jobs) // (4 * workers))))


# two-sided 95% Student-t critical values for 1..30 degrees of freedom
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student t; 0 for one value)."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return mean, t * math.sqrt(var / n)


def summarise(results: list[EpisodeResult]) -> list[dict[str, Any]]:
    """One row per (seat, component) with mean and 95% CI over episodes, plus 'return' rows."""
    if not results:
        return []
    rows = []
    for seat in results[0].seats:
        names = sorted({c for r in results for c in r.components.get(seat, {})})
        for name in ["return", *names]:
            values = [r.returns[seat] if name == "return" else r.components.get(seat, {}).get(name, 0.0) for r in results]
            mean, half = mean_ci95(values)
            rows.append({"seat": seat, "agent": results[0].seats[seat], "component": name, "mean": mean, "ci95": half, "n": len(values)})
    return rows
