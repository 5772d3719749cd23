"""Orderings the built-in population must reproduce, with paired differences over fixed seeds.

1. In every built-in scenario, a seat filled by ``rule_expert`` earns more than the same seat
   filled by the GPU-arena baselines ``always_accept``, ``greedy_hoarder`` and ``random_valid``
   (same other seats, same seeds, so the same worlds): the 95% CI of the mean paired difference
   lies above 0. The spam policies score below ``rule_expert`` the same way.
2. A bid-rotation cartel (``colluder``) earns its members more than bidding truthfully when the
   mechanism ignores collusion, and less when it penalises suspected cartels; the detector
   flags it.

Run with ``-s`` to see the figures (mean +- 95% CI).
"""

from __future__ import annotations

from functools import cache

import pytest

from market.core.collusion import SUSPECTED
from market.core.scenario_schema import Scenario
from market.run.rollout import EpisodeResult, mean_ci95, run_many
from scenarios import load_scenario

SCENARIOS = ("single_trade", "market_round", "coalition_market")
SEEDS = range(30)
SEAT = "bidder_0"


@cache
def returns(scenario: str, spec: str) -> tuple[float, ...]:
    """``SEAT``'s return per seed with ``spec`` in it and the scenario's agents elsewhere."""
    results = run_many(scenario, SEEDS, seats={SEAT: spec})
    if spec == "rule_expert":
        for r in results:
            assert r.invalid_actions[SEAT] == 0, (scenario, r.seed)
            assert not getattr(r, "agent_errors", {}).get(SEAT), (scenario, r.seed)
    return tuple(r.returns[SEAT] for r in results)


def paired(scenario: str, better: str, worse: str) -> tuple[float, float]:
    diffs = [
        a - b for a, b in zip(returns(scenario, better), returns(scenario, worse), strict=True)
    ]
    mean, half = mean_ci95(diffs)
    a, ha = mean_ci95(list(returns(scenario, better)))
    b, hb = mean_ci95(list(returns(scenario, worse)))
    print(
        f"\n{scenario:17s} {SEAT} {better} {a:.3f} ± {ha:.3f} vs {worse} {b:.3f} ± {hb:.3f}: "
        f"paired difference {mean:+.3f} ± {half:.3f} (n={len(diffs)})"
    )
    return mean, half


@pytest.mark.parametrize("baseline", ["always_accept", "greedy_hoarder", "random_valid"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rule_expert_beats_gpu_arena_baselines(scenario: str, baseline: str) -> None:
    mean, half = paired(scenario, "rule_expert", baseline)
    assert mean - half > 0, (
        f"rule_expert does not beat {baseline} in {scenario}: {mean:+.3f} ± {half:.3f}"
    )


@pytest.mark.parametrize("spam", ["spam_offers", "spam_coalitions", "spam_pitches"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_spam_scores_below_rule_expert(scenario: str, spam: str) -> None:
    mean, half = paired(scenario, "rule_expert", spam)
    assert mean - half > 0, (
        f"{spam} is not below rule_expert in {scenario}: {mean:+.3f} ± {half:.3f}"
    )


# --- the cartel -------------------------------------------------------------------------------

CARTEL = ("bidder_0", "bidder_1", "bidder_2")
OUTSIDERS = ("bidder_3", "bidder_4", "bidder_5")
CARTEL_SEEDS = range(20)


def daedalus_market(policy: str, collusion_penalty: float) -> Scenario:
    """Six labs with near-identical demand, nine rounds, no designer seat: each lab starts with
    one 2-block job and gets Poisson(1) more per round, worth 30-34 per block with partial
    credit and two rounds of slack; 8 blocks a round under second_price with a reserve of 5."""
    return load_scenario(
        "market_round",
        rounds=9,
        designer_seat=False,
        negotiation_turns=1,
        labs={
            "count": 6,
            "budget": [500.0, 500.0],
            "jobs": [1, 1],
            "endowment": [0, 0],
            "endowment_rounds": 0,
        },
        jobs={
            "size": [2, 2],
            "value_per_block": [30.0, 34.0],
            "slack": [2, 2],
            "partial_credit_prob": 1.0,
            "min_reliability": [0.0, 0.0],
            "arrival_rate": 1.0,
        },
        capacity={"blocks": [8, 8], "reliability": 0.95},
        shocks=[],
        shock_rates={"reliability_drop": 0.0, "demand_surge": 0.0, "energy_spike": 0.0},
        mechanism={
            "auction_type": "second_price",
            "reserve_price": 5.0,
            "coalition_policy": policy,
            "collusion_penalty": collusion_penalty,
            "withdrawal_penalty": 0.0,
            "shill_penalty": 0.0,
        },
    )


def cartel_returns(results: list[EpisodeResult]) -> list[float]:
    """Mean return per cartel seat, per episode."""
    return [sum(r.returns[s] for s in CARTEL) / len(CARTEL) for r in results]


def top_score(result: EpisodeResult) -> float:
    """The highest suspicion score the detector gave the cartel seats in the episode."""
    return max(
        (
            c["score"]
            for log in result.round_log
            for c in log["suspected_cartels"]
            if set(c["members"]) == set(CARTEL)
        ),
        default=0.0,
    )


@pytest.mark.parametrize(
    ("policy", "penalty", "pays"), [("allow", 0.0, True), ("penalize_suspected", 60.0, False)]
)
def test_cartel_pays_only_where_collusion_is_not_penalised(
    policy: str, penalty: float, pays: bool
) -> None:
    market = daedalus_market(policy, penalty)
    honest = dict.fromkeys(CARTEL + OUTSIDERS, "truthful")
    # adapt=false: the claim is about the cartel while it operates, so it must not stop
    cartel = {**honest, **dict.fromkeys(CARTEL, "colluder?adapt=false")}
    with_cartel = run_many(market, CARTEL_SEEDS, seats=cartel)
    truthful = run_many(market, CARTEL_SEEDS, seats=honest)
    c, t = cartel_returns(with_cartel), cartel_returns(truthful)
    mean, half = mean_ci95([a - b for a, b in zip(c, t, strict=True)])
    print(
        f"\ncartel under {policy} (collusion_penalty {penalty:g}): members "
        f"{mean_ci95(c)[0]:.3f} ± {mean_ci95(c)[1]:.3f} per seat vs truthful "
        f"{mean_ci95(t)[0]:.3f} ± {mean_ci95(t)[1]:.3f}; paired {mean:+.3f} ± {half:.3f}"
    )
    assert all(sum(r.invalid_actions.values()) == 0 for r in with_cartel)
    # the detector flags the cartel in every episode, whatever the policy does about it
    assert min(top_score(r) for r in with_cartel) >= SUSPECTED
    charged = [sum(log["collusion_penalties"].values()) for r in with_cartel for log in r.round_log]
    if pays:
        assert mean - half > 0
        assert sum(charged) == 0
    else:
        assert mean + half < 0
        assert sum(charged) > 0


def test_adaptive_cartel_stops_when_penalised() -> None:
    """By default colluders stop when the penalty exceeds their expected gain: they then bid
    truthfully and earn about what truthful seats earn, far above a persisting cartel."""
    market = daedalus_market("penalize_suspected", 60.0)
    honest = dict.fromkeys(CARTEL + OUTSIDERS, "truthful")
    adaptive = run_many(market, CARTEL_SEEDS, seats={**honest, **dict.fromkeys(CARTEL, "colluder")})
    stubborn = run_many(
        market, CARTEL_SEEDS, seats={**honest, **dict.fromkeys(CARTEL, "colluder?adapt=false")}
    )
    a, s = cartel_returns(adaptive), cartel_returns(stubborn)
    t = cartel_returns(run_many(market, CARTEL_SEEDS, seats=honest))
    mean, half = mean_ci95([x - y for x, y in zip(a, s, strict=True)])
    assert mean - half > 0
    assert abs(mean_ci95(a)[0] - mean_ci95(t)[0]) < 0.25
