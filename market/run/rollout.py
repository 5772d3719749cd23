"""Run episodes with an agent in every seat, and summarise them.

``run_episode("market_round", seed=0)`` fills every seat from the scenario's ``[agents]`` table;
``seats={"bidder_0": "random_valid"}`` overrides some. Agents are seeded per seat from the
episode's streams, so an episode is a pure function of (scenario, seed, agents).

Every decision has a time limit (the scenario's ``agent_timeout``, or the ``agent_timeout``
argument): an agent that raises or runs past it is counted and its seat plays
:func:`fallback_action` for that turn, so one broken or hung agent never stops the episode.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.llm.backends.base import RequestLimiter
from agents.llm.backends.pool import Budget, ClientPool
from agents.registry import make_agent
from agents.specs_redact import redact_spec
from market.core.actions import ActionModel, Bid, Wait
from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER, bidder_seat
from market.environment.aec import raw_env
from market.record.transcript import EpisodeRecorder
from market.run.deadlines import (
    AgentTimeout,
    Deadline,
    decision_limit,
    resolve_timeout,
    with_agent_timeout,
)
from market.run.offload import run_offloaded
from scenarios import load_scenario


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
    agent_errors: dict[str, int] = field(default_factory=dict)
    last_agent_error: dict[str, str] = field(default_factory=dict)
    agent_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    transcript: str | None = None  # the transcript file written for this episode, if any
    decisions: dict[str, int] = field(default_factory=dict)  # turns the seat's agent was asked
    timeouts: dict[str, int] = field(default_factory=dict)  # decisions past agent_timeout
    # the first failure's message per seat: the agent raised or timed out, or it fell back on
    # its own (an LLM seat's last_exchange["error"])
    first_error: dict[str, str] = field(default_factory=dict)
    # the conduct judge's per-seat scores (market.environment.conduct_log.score_dict)
    conduct: dict[str, dict[str, Any]] = field(default_factory=dict)

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
        seats[bidder_seat(i)] = bidders[min(i, len(bidders) - 1)]
    return seats


def resolve_seats(scenario: Scenario, seats: Mapping[str, Any] | None) -> dict[str, Any]:
    resolved: dict[str, Any] = dict(default_seats(scenario))
    for seat, spec in (seats or {}).items():
        if seat not in resolved:
            raise ValueError(
                f"seat {seat!r} is not in scenario {scenario.name!r}; seats: {', '.join(resolved)}"
            )
        resolved[seat] = spec
    return resolved


def _spec_name(agent: Any) -> str:
    """A seat's agent as results and tables show it: a spec with its secrets masked
    (``token=***``), or an agent object's name."""
    if isinstance(agent, str):
        return redact_spec(agent)
    return getattr(agent, "name", type(agent).__name__)


def fallback_action(obs: Any) -> ActionModel:
    """What a seat does when its agent fails: abstain in bidding, wait otherwise."""
    return Bid(bids=[]) if getattr(obs, "phase", None) == "bidding" else Wait()


def _is_factory(spec: Any) -> bool:
    """An agent class or a zero-argument function returning an agent (not an agent object)."""
    return isinstance(spec, type) or (callable(spec) and not hasattr(spec, "act"))


def _build_agents(
    sc: Scenario, seats: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Resolve seat specs to agents: spec strings and zero-argument factories build fresh agents."""
    specs = resolve_seats(sc, seats)
    agents: dict[str, Any] = {}
    for seat, spec in specs.items():
        role = "designer" if seat == DESIGNER else "bidder"
        if isinstance(spec, str):
            agents[seat] = make_agent(spec, role)
        elif _is_factory(spec):
            agents[seat] = spec()
        else:
            agents[seat] = spec
    return specs, agents


class Tally:
    """Per-seat returns, reward components, invalid actions and agent failures of one episode
    (also kept by replay)."""

    def __init__(self) -> None:
        self.returns: dict[str, float] = defaultdict(float)
        self.components: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.invalid: dict[str, int] = defaultdict(int)
        self.agent_errors: dict[str, int] = defaultdict(int)
        self.timeouts: dict[str, int] = defaultdict(int)
        self.decisions: dict[str, int] = defaultdict(int)
        self.last_agent_error: dict[str, str] = {}
        self.first_error: dict[str, str] = {}
        self.steps = 0

    def observe(self, seat: str, reward: float, info: dict[str, Any]) -> None:
        self.returns[seat] += reward
        for name, value in info.get("reward_components", {}).items():
            self.components[seat][name] += value
        if "error" in info:
            self.invalid[seat] += 1

    def agent_failed(self, seat: str, exc: BaseException) -> None:
        if isinstance(exc, AgentTimeout):
            self.timeouts[seat] += 1
        else:
            self.agent_errors[seat] += 1
        self.last_agent_error[seat] = f"{type(exc).__name__}: {exc}"[:500]
        self.first_error.setdefault(seat, self.last_agent_error[seat])

    def agent_returned(self, seat: str, agent: Any) -> None:
        """Note the first fallback an agent took on its own (an LLM seat's unusable reply)."""
        if seat in self.first_error:
            return
        exchange = getattr(agent, "last_exchange", None)
        if isinstance(exchange, dict) and exchange.get("fallback"):
            self.first_error[seat] = f"fallback: {exchange.get('error') or 'no usable reply'}"[:500]

    def result(
        self,
        sc: Scenario,
        seed: int,
        specs: dict[str, Any],
        agents: dict[str, Any],
        start: float,
        env: raw_env,
    ) -> EpisodeResult:
        return EpisodeResult(
            scenario=sc.name,
            seed=seed,
            seats={s: _spec_name(a) for s, a in specs.items()},
            returns={s: self.returns.get(s, 0.0) for s in specs},
            components={s: dict(self.components.get(s, {})) for s in specs},
            invalid_actions={s: self.invalid.get(s, 0) for s in specs},
            steps=self.steps,
            seconds=time.perf_counter() - start,
            round_log=env.round_log,
            agent_errors={s: self.agent_errors.get(s, 0) for s in specs},
            last_agent_error=dict(self.last_agent_error),
            agent_stats={s: dict(getattr(a, "stats", {}) or {}) for s, a in agents.items()},
            decisions={s: self.decisions.get(s, 0) for s in specs},
            timeouts={s: self.timeouts.get(s, 0) for s in specs},
            first_error=dict(self.first_error),
            conduct=env.conduct.score_dicts(),
        )


def transcript_path(transcript: str | Path, seed: int) -> Path:
    """Where an episode's transcript goes: ``transcript`` itself if it names a ``.jsonl`` file,
    else ``<transcript>/<seed>.jsonl`` (a directory)."""
    path = Path(transcript)
    return path if path.suffix == ".jsonl" else path / f"{seed}.jsonl"


def _recorder(
    transcript: str | Path | None,
    env: raw_env,
    seed: int,
    specs: dict[str, Any],
    agents: dict[str, Any],
    digest_every: int,
) -> EpisodeRecorder | None:
    if transcript is None:
        return None
    path = transcript_path(transcript, seed)
    return EpisodeRecorder(path, env, seed, specs, agents, digest_every)


def _finish(recorder: EpisodeRecorder | None, result: EpisodeResult) -> EpisodeResult:
    if recorder is not None:
        recorder.finish(result)
        result.transcript = str(recorder.path)
    return result


class Episode:
    """One episode's setup, bookkeeping and recording, shared by the sync and async loops."""

    def __init__(
        self,
        env: raw_env,
        seed: int,
        seats: Mapping[str, Any] | None,
        transcript: str | Path | None,
        digest_every: int,
        limiter: RequestLimiter | ClientPool | None = None,
        budget: Budget | None = None,
        agent_timeout: float | None = None,
    ) -> None:
        self.env, self.seed = env, seed
        self.specs, self.agents = _build_agents(env.scenario, seats)
        limit = resolve_timeout(env.scenario, agent_timeout)
        explicit = agent_timeout is not None or "agent_timeout" in env.scenario.model_fields_set
        self.deadline = Deadline(
            limit, {s: decision_limit(a, limit, explicit) for s, a in self.agents.items()}
        )
        for agent in self.agents.values():
            if limiter is not None:
                agent.limiter = limiter
            if budget is not None:
                agent.budget = budget
        self.start = time.perf_counter()
        env.reset(seed=seed)
        for seat, agent in self.agents.items():
            agent.reset(env.seat_seed(seat))
        self.tally = Tally()
        self.recorder = _recorder(transcript, env, seed, self.specs, self.agents, digest_every)

    def turns(self) -> Iterator[tuple[str, Any, bool]]:
        """(seat, observation, whether the seat still plays) for every AEC step."""
        for seat in self.env.agent_iter():
            obs, reward, terminated, truncated, info = self.env.last()
            self.tally.observe(seat, reward, info)
            yield seat, obs, not (terminated or truncated)

    def act(self, seat: str, obs: Any) -> tuple[Any, str | None, float]:
        """(action, agent error, latency) of one decision within the time limit."""
        began = time.perf_counter()
        self.tally.decisions[seat] += 1
        agent = self.agents[seat]
        try:
            action, error = self.deadline.act(seat, agent, obs), None
            self.tally.agent_returned(seat, agent)
        except Exception as exc:  # an agent bug or a timeout must not take the episode down
            action, error = self.agent_failed(seat, obs, exc)
        return action, error, time.perf_counter() - began

    async def aact(self, seat: str, obs: Any) -> tuple[Any, str | None, float]:
        began = time.perf_counter()
        self.tally.decisions[seat] += 1
        agent = self.agents[seat]
        try:
            action, error = await self.deadline.aact(seat, agent, obs), None
            self.tally.agent_returned(seat, agent)
        except Exception as exc:  # includes AgentTimeout
            action, error = self.agent_failed(seat, obs, exc)
        return action, error, time.perf_counter() - began

    def agent_failed(self, seat: str, obs: Any, exc: BaseException) -> tuple[ActionModel, str]:
        self.tally.agent_failed(seat, exc)
        return fallback_action(obs), self.tally.last_agent_error[seat]

    def step(
        self, seat: str, obs: Any, live: bool, action: Any, latency: float | None, error: str | None
    ) -> None:
        if self.recorder is not None:
            self.recorder.before_step(seat, obs, action, live, latency, error)
        self.env.step(action)
        self.tally.steps += 1
        if self.recorder is not None:
            self.recorder.after_step()

    def abort(self, exc: BaseException) -> None:
        self.deadline.close()
        if self.recorder is not None:
            self.recorder.finish(error=exc)

    def result(self) -> EpisodeResult:
        self.deadline.close()
        result = self.tally.result(
            self.env.scenario, self.seed, self.specs, self.agents, self.start, self.env
        )
        return _finish(self.recorder, result)


def run_episode(
    scenario: str | Path | Scenario = "market_round",
    seed: int = 0,
    seats: Mapping[str, Any] | None = None,
    env: raw_env | None = None,
    *,
    transcript: str | Path | None = None,
    digest_every: int = 1,
    agent_timeout: float | None = None,
) -> EpisodeResult:
    """Play one episode. ``seats`` maps seat -> spec string, agent object or agent factory.

    An exception inside an agent never stops the episode: it is counted for the seat
    (``agent_errors``) and the seat plays :func:`fallback_action` for that turn. So is a
    decision that takes longer than ``agent_timeout`` seconds (``timeouts``; None: the scenario's
    ``agent_timeout``, 0: no limit): each ``act`` runs on a worker thread, and a hung call is
    left running on it (a daemon thread) while the seat falls back until the call returns.

    ``transcript``: record the episode (see :mod:`market.record.transcript`) to this ``.jsonl`` file, or
    to ``<dir>/<seed>.jsonl`` when it is a directory; every event is flushed as it happens, and a
    run that raises or is interrupted still ends the file with an ``aborted`` footer.
    ``digest_every``: record the observation and state digests every N steps (the state digest
    also at every round end); 1 records them at every step.
    """
    episode = Episode(
        env if env is not None else raw_env(scenario),
        seed,
        seats,
        transcript,
        digest_every,
        agent_timeout=agent_timeout,
    )
    try:
        for seat, obs, live in episode.turns():
            action = error = latency = None
            if live:
                action, error, latency = episode.act(seat, obs)
            episode.step(seat, obs, live, action, latency, error)
    except BaseException as exc:  # includes KeyboardInterrupt: mark the file aborted, re-raise
        episode.abort(exc)
        raise
    return episode.result()


async def arun_episode(
    scenario: str | Path | Scenario = "market_round",
    seed: int = 0,
    seats: Mapping[str, Any] | None = None,
    *,
    limiter: RequestLimiter | ClientPool | None = None,
    agent_timeout: float | None = None,
    transcript: str | Path | None = None,
    digest_every: int = 1,
    budget: Budget | None = None,
    executor: Executor | None = None,
) -> EpisodeResult:
    """Play one episode with ``aact``, so many episodes with LLM seats can run concurrently.

    Every agent gets ``limiter``: a :class:`~agents.llm.backends.pool.ClientPool` (shared clients,
    global and per-endpoint limits on requests in flight) or a plain ``RequestLimiter``; and
    ``budget``, which is charged with every completion's tokens. An agent that raises or
    exceeds ``agent_timeout`` seconds (None: the scenario's ``agent_timeout``; 0: no limit) is
    counted and plays the fallback action. An agent without its own ``aact`` (a scripted one)
    runs its ``act`` on a worker thread, so a blocking agent cannot stall the other episodes.
    ``transcript`` and ``digest_every`` as in :func:`run_episode` (a cancelled task leaves an
    ``aborted`` footer).

    ``executor``: build the env and play every step (with its recording) and every agent without
    its own ``aact`` on this executor's threads, never on the event loop, so that the loop stays
    free for other work (a server's requests) however heavy the episode; only agents with their
    own ``aact`` (remote seats, LLM seats) are awaited on the loop. The episode is the same, step
    for step. A cancelled episode stops after the step in progress, then writes its footer.
    """
    if executor is not None:
        offloaded: EpisodeResult = await run_offloaded(
            executor,
            lambda: Episode(
                raw_env(scenario),
                seed,
                seats,
                transcript,
                digest_every,
                limiter,
                budget,
                agent_timeout,
            ),
        )
        return offloaded
    episode = Episode(
        raw_env(scenario), seed, seats, transcript, digest_every, limiter, budget, agent_timeout
    )
    try:
        for seat, obs, live in episode.turns():
            action = error = latency = None
            if live:
                action, error, latency = await episode.aact(seat, obs)
            episode.step(seat, obs, live, action, latency, error)
    except BaseException as exc:  # includes CancelledError and KeyboardInterrupt
        episode.abort(exc)
        raise
    return episode.result()


def run_concurrent(
    scenario: str | Path | Scenario,
    seeds: Iterable[int],
    seats: Mapping[str, Any] | None = None,
    *,
    max_in_flight: int = 8,
    agent_timeout: float | None = None,
    transcript: str | Path | None = None,
    per_endpoint: int | None = None,
    budget: Budget | None = None,
) -> list[EpisodeResult]:
    """Episodes over ``seeds`` as concurrent asyncio tasks sharing one
    :class:`~agents.llm.backends.pool.ClientPool` (``max_in_flight`` requests in flight in all,
    ``per_endpoint`` per server) and ``budget``. All episodes start at once; the runner's async
    path (:mod:`market.run.async_runner`) bounds episodes in flight and stops on a spent budget.

    ``seats`` values must be spec strings or zero-argument factories (each episode needs its own
    agents); results come back in seed order. ``transcript``: a directory; each episode is
    recorded to ``<transcript>/<seed>.jsonl``. ``agent_timeout`` as in :func:`arun_episode`.
    """
    _check_transcript_dir(transcript)
    for seat, spec in (seats or {}).items():
        if not isinstance(spec, str) and not _is_factory(spec):
            raise ValueError(
                f"seat {seat}: pass a spec string or a factory, not an agent object, "
                "so that concurrent episodes do not share one agent"
            )
    sc = load_scenario(scenario)
    pool = ClientPool(max_in_flight, per_endpoint)

    async def main() -> list[EpisodeResult]:
        tasks = [
            arun_episode(
                sc,
                seed,
                seats,
                limiter=pool,
                agent_timeout=agent_timeout,
                transcript=transcript,
                budget=budget,
            )
            for seed in seeds
        ]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            await pool.aclose()

    return asyncio.run(main())


def _check_transcript_dir(transcript: str | Path | None) -> None:
    if transcript is not None and Path(transcript).suffix == ".jsonl":
        raise ValueError(
            f"transcript={str(transcript)!r}: several episodes are recorded one file "
            "per seed; pass a directory (each episode goes to <dir>/<seed>.jsonl)"
        )


def _run_one(args: tuple[Any, ...]) -> EpisodeResult:
    scenario, seed, seats, *rest = args
    transcript, digest_every = rest if rest else (None, 1)
    return run_episode(scenario, seed, seats, transcript=transcript, digest_every=digest_every)


def run_many(
    scenario: str | Path | Scenario,
    seeds: Iterable[int],
    seats: Mapping[str, str] | None = None,
    workers: int = 1,
    *,
    transcript: str | Path | None = None,
    digest_every: int = 1,
    agent_timeout: float | None = None,
) -> list[EpisodeResult]:
    """Episodes over ``seeds``; ``workers > 1`` runs them in a local process pool.

    ``transcript``: a directory; each episode is recorded to ``<transcript>/<seed>.jsonl``.
    ``agent_timeout`` as in :func:`run_episode`.
    """
    _check_transcript_dir(transcript)
    sc = with_agent_timeout(load_scenario(scenario), agent_timeout)
    jobs = [(sc, seed, dict(seats or {}), transcript, digest_every) for seed in seeds]
    if workers <= 1 or len(jobs) <= 1:
        return [_run_one(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_run_one, jobs, chunksize=max(1, len(jobs) // (4 * workers))))


# two-sided 95% Student-t critical values for 1..30 degrees of freedom
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student t; 0 for one value)."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    var = sum([(v - mean) ** 2 for v in values]) / (n - 1)  # a list: faster, the same sum
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
            values = [
                r.returns[seat] if name == "return" else r.components.get(seat, {}).get(name, 0.0)
                for r in results
            ]
            mean, half = mean_ci95(values)
            rows.append(
                {
                    "seat": seat,
                    "agent": results[0].seats[seat],
                    "component": name,
                    "mean": mean,
                    "ci95": half,
                    "n": len(values),
                }
            )
    return rows
