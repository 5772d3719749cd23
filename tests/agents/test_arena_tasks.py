"""The GPU-arena task variants (scenarios/{single_trade,market_round,coalition_market}_{easy,
medium,hard}.toml) and, slow, the arena's baseline ordering on them: rule_expert above
always_accept above random_valid in bidder_0, paired on the same seeds."""

from __future__ import annotations

import math
import statistics

import pytest

from market.run.rollout import run_many
from scenarios import builtin_names, load_scenario

TASKS = ("single_trade", "market_round", "coalition_market")
LEVELS = {"easy": (2, 3), "medium": (3, 5), "hard": (6, 9)}  # labs, rounds
ARCHETYPES = ["cooperative", "selfish", "deadline_panicked", "deceptive", "retaliatory"]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("level", LEVELS)
def test_variant_is_the_arena_world_with_archetype_opponents(task: str, level: str) -> None:
    name = f"{task}_{level}"
    assert name in builtin_names()
    sc, base = load_scenario(name), load_scenario(task)
    labs, rounds = LEVELS[level]
    assert (sc.labs.count, sc.labs.entrants, sc.rounds) == (labs, 0, rounds)
    assert sc.designer_seat == base.designer_seat and sc.mechanism == base.mechanism
    assert sc.agents.bidders == ["truthful", *ARCHETYPES[: labs - 1]]
    assert [(s.kind, s.round) for s in sc.shocks] == {
        "easy": [],
        "medium": [("capacity_outage", 3)],
        "hard": [("capacity_outage", 3), ("energy_spike", 6)],
    }[level]


def _paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean and 95% CI half-width (normal approximation) of the paired differences a - b."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    return statistics.fmean(d), 1.96 * statistics.stdev(d) / math.sqrt(len(d))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["single_trade_hard", "market_round_hard", "coalition_market_hard"]
)
def test_arena_baseline_ordering(name: str) -> None:
    """Seeds 0-29, bidder_0: rule_expert - always_accept and always_accept - random_valid both
    have a paired 95% CI above 0 (docs/scenarios.md has the full table over all nine variants)."""
    seeds = range(30)
    returns = {
        agent: [
            r.returns["bidder_0"] for r in run_many(name, seeds, {"bidder_0": agent}, workers=2)
        ]
        for agent in ("rule_expert", "always_accept", "random_valid")
    }
    for better, worse in (("rule_expert", "always_accept"), ("always_accept", "random_valid")):
        mean, half = _paired(returns[better], returns[worse])
        assert mean - half > 0, (name, better, worse, mean, half)
