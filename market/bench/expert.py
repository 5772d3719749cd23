"""The ``expert`` section of the bench suite: the share of the step time that the rule expert's
decisions take, per built-in scenario.

With ``rule_expert`` in every bidder seat (and the ``fixed`` designer where there is a designer
seat), one process plays episodes and times every turn in two parts, in CPU seconds of its thread
(``time.thread_time``, so time the process spends descheduled on a busy machine counts in
neither): ``agent.act(obs)`` (the decision) and ``env.step(action)`` (the env). The share is

    share = sum(act seconds) / (sum(act seconds) + sum(step seconds))

over every live turn of the episodes (``math.fsum``). Reading the observation (``env.last()``) is
in neither part. The target is a share of at most :data:`TARGET_SHARE` in every scenario: the
expert must not be what limits a run.
"""

from __future__ import annotations

import math
import time
from typing import Any

from agents.registry import make_agent
from market.bench.config import BenchConfig, SectionResult, metric
from market.core.seats import is_bidder_seat
from market.environment.aec import raw_env
from scenarios import builtin_names

#: the rule expert's decisions take at most this share of the step time in any built-in scenario
TARGET_SHARE = 1 / 3


def expert_episode(scenario: str, seed: int) -> tuple[list[float], list[float]]:
    """Seconds of every ``act`` and every ``step`` of one episode with the rule expert in every
    bidder seat and the ``fixed`` designer."""
    env = raw_env(scenario)
    env.reset(seed=seed)
    agents: dict[str, Any] = {}
    for seat in env.possible_agents:
        agent = make_agent("rule_expert" if is_bidder_seat(seat) else "fixed")
        agent.reset(seed=seed)
        agents[seat] = agent
    act_s: list[float] = []
    step_s: list[float] = []
    clock = time.thread_time  # CPU seconds of this thread: time spent descheduled is in neither
    for seat in env.agent_iter():
        obs, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        t0 = clock()
        action = agents[seat].act(obs)
        t1 = clock()
        env.step(action)
        t2 = clock()
        act_s.append(t1 - t0)
        step_s.append(t2 - t1)
    return act_s, step_s


def expert_share(scenario: str, seconds: float = 2.0) -> dict[str, Any]:
    """The rule expert's share of the step time in ``scenario``: a warm-up episode (seed 0, not
    counted), then episodes from seed 0 on for about ``seconds`` (at least one)."""
    expert_episode(scenario, 0)
    act_s: list[float] = []
    step_s: list[float] = []
    start = time.perf_counter()
    seed = 0
    while seed == 0 or time.perf_counter() - start < seconds:
        acts, steps = expert_episode(scenario, seed)
        act_s += acts
        step_s += steps
        seed += 1
    act, step = math.fsum(act_s), math.fsum(step_s)
    return {
        "scenario": scenario,
        "episodes": seed,
        "turns": len(act_s),
        "act_s": act,
        "step_s": step,
        "share": act / (act + step) if act + step > 0 else 0.0,
        "act_us": 1e6 * act / max(1, len(act_s)),
    }


def section_expert(config: BenchConfig) -> SectionResult:
    rows = [expert_share(name, config.seconds) for name in (config.scenarios or builtin_names())]
    metrics = [
        metric(f"expert.{r['scenario']}.share", r["share"], "share", "lower", "expert")
        for r in rows
    ]
    return SectionResult(metrics, {"rows": rows, "target_share": TARGET_SHARE})
