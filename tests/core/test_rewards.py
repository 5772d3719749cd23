"""Rewards (docs/design.md, section 6): a hand-computed decomposition, the designer's composite, the
helper functions, and proof that talk alone cannot be farmed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ScriptedAgent, WaitAgent, craft, errors, job, make_env, population, run_episode

import market
from market.core.actions import AcceptOffer, Bid, SendOffer
from market.core.rewards import (
    LAB_COMPONENTS,
    REWARD_COMPONENTS,
    designer_composite,
    exact_products,
    gini,
    optimal_welfare,
    stability,
)
from scenarios import builtin_names, load_scenario

TALK = 0.01

# --------------------------------------------------------------------------------------------
# A tiny crafted world, computed by hand
# --------------------------------------------------------------------------------------------
# One round, two labs, second price, reserve 4, K = 3 blocks, reliability 1, value_unit 100.
#   bidder_0: budget 100, job a (2 blocks, value 60, partial credit, due now), holds 0 blocks.
#   bidder_1: budget 100, job b (3 blocks, value 60, partial credit, due now), holds 1 block.
# Negotiation: bidder_1 offers its block to bidder_0 for 22 credits (talk: -0.01); bidder_0
# accepts. Bidding: bidder_0 bids [15], bidder_1 bids [20, 20, 20].
# Clearing: bidder_1's three 20s win; bidder_0's 15 is the highest rejected bid -> price 15;
#   bidder_1 pays 45.
# Execution: bidder_0 runs 1 block on a -> 1/2 done, expires with partial credit 30;
#   bidder_1 runs 3 blocks on b -> done, 60.
# Lab rewards (credits / 100):
#   bidder_0: trade_balance -0.22, job_value +0.30                         = 0.08
#   bidder_1: trade_balance +0.22, talk_cost -0.01, auction_payments -0.45,
#             job_value +0.60                                              = 0.36
# Designer: blocks this round = 3 released + 1 held (after the trade) = 4. Knapsack over the
#   units of progress (a: 2 x 30, b: 3 x 20): the best 4 are 30 + 30 + 20 + 20 = 100 (job-level:
#   finish a (60) and 2/3 of b (40) = 100 too). Allocated: a 1 x 30 + b 3 x 20 = 90.
#   welfare_ratio = 90 / 100 = 0.9.
#   Satisfaction = allocated / best possible per lab: a 30 / 60 = 0.5, b 60 / 60 = 1.
#   Gini(0.5, 1) = |0.5 - 1| x 2 / (2 x 2^2 x 0.75) = 1/6 -> fairness 5/6.
#   participation = labs with demand that bid = 2 of 2 = 1; stability = 1 (first round).
#   composite = 0.9 x 5/6 x 1 x 1 = 0.75; revenue term = 45 / (3 x 100) = 0.15 (weight 0).


def tiny_world(env) -> None:
    craft(
        env,
        budgets=[100.0, 100.0],
        holdings={(1, 0): 1},
        jobs={
            0: [job(0, size=2, value=60.0, deadline=0, job_id="a", partial=True)],
            1: [job(1, size=3, value=60.0, deadline=0, job_id="b", partial=True)],
        },
    )


def tiny_episode(bid0: list[float] | None):
    env = make_env(
        designer_seat=True,
        capacity__blocks=[3, 3],
        mechanism__reserve_price=4.0,
        rewards__talk_cost=TALK,
        rewards__value_unit=100.0,
    )
    b0 = ScriptedAgent(
        {
            (0, "negotiation", 1): lambda o: AcceptOffer(offer_id=o.offers_received[0].offer_id),
            **({(0, "bidding"): Bid(bids=bid0)} if bid0 is not None else {}),
        }
    )
    b1 = ScriptedAgent(
        {
            (0, "negotiation", 0): SendOffer(to="bidder_0", side="sell", blocks=1, price=22.0),
            (0, "bidding"): Bid(bids=[20.0, 20.0, 20.0]),
        }
    )
    ep = run_episode(
        env, {"designer_0": WaitAgent(), "bidder_0": b0, "bidder_1": b1}, setup=tiny_world
    )
    assert not errors(ep)
    return env, ep


def test_lab_reward_decomposition_by_hand() -> None:
    env, ep = tiny_episode([15.0])
    log = env.round_log[0]
    assert {k: v for k, v in log["won"].items() if v} == {"bidder_1": 3}
    assert log["price"] == 15.0
    assert ep.components["bidder_0"] == pytest.approx({"trade_balance": -0.22, "job_value": 0.30})
    assert ep.components["bidder_1"] == pytest.approx(
        {"trade_balance": 0.22, "talk_cost": -0.01, "auction_payments": -0.45, "job_value": 0.60}
    )
    assert ep.returns["bidder_0"] == pytest.approx(0.08)
    assert ep.returns["bidder_1"] == pytest.approx(0.36)
    # credits really moved as the rewards say
    assert [lab.budget for lab in env.world.labs] == pytest.approx([78.0, 77.0])
    assert [j.realized for lab in env.world.labs for j in lab.jobs] == pytest.approx([30.0, 60.0])


def test_designer_composite_by_hand() -> None:
    env, ep = tiny_episode([15.0])
    log = env.round_log[0]
    assert log["optimal_welfare"] == pytest.approx(100.0)
    assert log["allocated_welfare"] == pytest.approx(90.0)
    parts = log["designer"]
    assert parts["welfare_ratio"] == pytest.approx(0.9)
    assert parts["fairness"] == pytest.approx(5.0 / 6.0)
    assert parts["participation"] == pytest.approx(1.0)
    assert parts["stability"] == pytest.approx(1.0)
    assert parts["revenue"] == pytest.approx(0.15)
    assert parts["composite"] == pytest.approx(0.75)
    assert ep.components["designer_0"] == pytest.approx({"composite": 0.75})
    assert ep.returns["designer_0"] == pytest.approx(0.75)


def test_participation_counts_only_labs_that_bid() -> None:
    # Same world, bidder_0 abstains: bidder_1's [20, 20, 20] take the 3 blocks and nothing is
    # rejected, so the price is the reserve 4 (pays 12). Allocation as before (90 of 100), fairness
    # 5/6, participation 1/2 -> composite 0.9 x 5/6 x 1/2 = 0.375.
    env, ep = tiny_episode(None)
    parts = env.round_log[0]["designer"]
    assert env.round_log[0]["price"] == 4.0
    assert parts["participation"] == pytest.approx(0.5)
    assert parts["composite"] == pytest.approx(0.375)
    assert ep.components["bidder_1"]["auction_payments"] == pytest.approx(-0.12)


def test_stability_follows_the_clearing_price() -> None:
    # Two rounds without jobs (welfare_ratio 1, fairness 1): the price moves 15 -> 10,
    # stability of round 1 = 1 - |10 - 15| / 15 = 2/3 = its composite.
    env = make_env(
        rounds=2, designer_seat=True, capacity__blocks=[3, 3], mechanism__reserve_price=0.0
    )
    b0 = ScriptedAgent({(0, "bidding"): Bid(bids=[15.0]), (1, "bidding"): Bid(bids=[10.0])})
    b1 = ScriptedAgent({(r, "bidding"): Bid(bids=[20.0, 20.0, 20.0]) for r in range(2)})
    ep = run_episode(
        env,
        {"designer_0": WaitAgent(), "bidder_0": b0, "bidder_1": b1},
        setup=lambda e: craft(e, budgets=[1000.0, 1000.0], jobs={}, holdings={}),
    )
    assert [log["price"] for log in env.round_log] == [15.0, 10.0]
    assert env.round_log[0]["designer"]["stability"] == 1.0
    assert env.round_log[1]["designer"]["stability"] == pytest.approx(2.0 / 3.0)
    assert env.round_log[1]["designer"]["composite"] == pytest.approx(2.0 / 3.0)
    assert ep.returns["designer_0"] == pytest.approx(1.0 + 2.0 / 3.0)


@pytest.mark.parametrize("scenario", ["single_trade", "market_round", "coalition_market"])
def test_returns_are_the_sum_of_their_components(scenario: str) -> None:
    env = market.raw_env(scenario)
    for seed in range(3):
        ep = run_episode(env, population(env, default="random_valid", designer="random"), seed=seed)
        for seat in env.possible_agents:
            assert ep.returns[seat] == pytest.approx(
                sum(ep.components.get(seat, {}).values()), abs=1e-9
            )
            # every component paid is one the RewardComponent type names
            assert set(ep.components.get(seat, {})) <= set(REWARD_COMPONENTS), seat


def test_every_lab_component_has_its_row_in_docs_rewards() -> None:
    table = (Path(__file__).parents[2] / "docs" / "rewards.md").read_text(encoding="utf-8")
    rows = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    assert set(LAB_COMPONENTS) <= rows, set(LAB_COMPONENTS) - rows


# --------------------------------------------------------------------------------------------
# The helper functions against hand-computed values
# --------------------------------------------------------------------------------------------
def test_gini_hand_values() -> None:
    assert gini(np.array([1.0, 1.0, 1.0, 1.0])) == pytest.approx(0.0)
    assert gini(np.array([0.0, 0.0, 0.0, 1.0])) == pytest.approx(0.75)  # (n - 1) / n
    # (1, 2, 3): sum over ordered pairs |xi - xj| = 8; 2 n^2 mean = 2 x 9 x 2 = 36 -> 2/9
    assert gini(np.array([3.0, 1.0, 2.0])) == pytest.approx(2.0 / 9.0)
    assert gini(np.array([0.5, 1.0])) == pytest.approx(1.0 / 6.0)
    assert gini(np.array([])) == 0.0 and gini(np.array([7.0])) == 0.0 and gini(np.zeros(3)) == 0.0


def test_stability_hand_values() -> None:
    assert stability(10.0, None) == 1.0
    assert stability(10.0, 8.0) == pytest.approx(0.8)
    assert stability(5.0, 20.0) == pytest.approx(0.25)
    assert stability(0.0, 0.0) == 1.0
    assert stability(0.0, 4.0) == pytest.approx(0.0)


def test_optimal_welfare_hand_values() -> None:
    uv, rem = np.array([30.0, 20.0, 10.0]), np.array([2, 3, 1])
    assert optimal_welfare(uv, rem, 4) == pytest.approx(30 + 30 + 20 + 20)
    assert optimal_welfare(uv, rem, 1) == pytest.approx(30.0)
    assert optimal_welfare(uv, rem, 100) == pytest.approx(60 + 60 + 10)  # every unit
    assert optimal_welfare(uv, rem, 0) == 0.0
    assert optimal_welfare(np.array([]), np.array([], dtype=int), 5) == 0.0


def test_designer_composite_hand_values() -> None:
    w1 = {"welfare_ratio": 1.0, "fairness": 1.0, "participation": 1.0, "stability": 1.0}
    assert designer_composite(0.9, 5 / 6, 1.0, 1.0, w1) == pytest.approx(0.75)
    assert designer_composite(0.9, 5 / 6, 1.0, 1.0, {**w1, "welfare_ratio": 2.0}) == pytest.approx(
        0.81 * 5 / 6
    )
    assert designer_composite(
        0.9, 5 / 6, 0.5, 1.0, w1, revenue_norm=0.2, revenue_weight=0.5
    ) == pytest.approx(0.475)
    assert designer_composite(0.9, 1.0, 1.0, 1.0, {**w1, "welfare_ratio": 0.0}) == pytest.approx(
        1.0
    )


# --------------------------------------------------------------------------------------------
# Talk alone cannot be farmed
# --------------------------------------------------------------------------------------------
SPAMMERS = ("spam_offers", "spam_coalitions", "spam_pitches")
SEEDS = range(10)


def _scenario_params():
    out = []
    for name in builtin_names():
        sc = load_scenario(name)
        work = sc.n_seats * sc.rounds * (sc.negotiation_turns + 1)
        out.append(pytest.param(name, marks=pytest.mark.slow) if work > 400 else name)
    return out


@pytest.mark.parametrize("scenario", _scenario_params())
def test_spam_never_beats_waiting(scenario: str) -> None:
    env = market.raw_env(scenario)
    for seat in ("bidder_0", "bidder_1"):
        waiting = [
            run_episode(env, population(env, **{seat: WaitAgent()}), seed=s).returns[seat]
            for s in SEEDS
        ]
        for spam in SPAMMERS:
            spamming = [
                run_episode(env, population(env, **{seat: spam}), seed=s).returns[seat]
                for s in SEEDS
            ]
            for seed, (got, base) in enumerate(zip(spamming, waiting, strict=True)):
                assert got <= base + 1e-9, (
                    f"{spam} in {seat} beat waiting on seed {seed}: {got} > {base}"
                )
            if env.scenario.negotiation_turns == 0:  # no talk phase (daedalus): no spam turn
                assert spamming == waiting, spam
                continue
            # every spam turn costs at least the talk cost, so on average it does strictly worse
            assert np.mean(spamming) < np.mean(waiting) - 0.5 * env.scenario.rewards.talk_cost, spam


@settings(max_examples=300, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.floats(0.0, 1e6, allow_nan=False)
            | st.sampled_from([0.1, 1 / 3, 2.5, 7.123456789])  # ties between jobs
            | st.floats(1e-300, 1e300),
            st.integers(0, 20),
        ),
        max_size=30,
    ),
    blocks=st.integers(-1, 400),
)
def test_optimal_welfare_is_the_exact_sum_of_the_best_units(
    jobs: list[tuple[float, int]], blocks: int
) -> None:
    """By hand: list every unit, take the ``blocks`` best, add them exactly (``math.fsum``)."""
    units = sorted((v for v, n in jobs for _ in range(n)), reverse=True)
    expected = math.fsum(units[: max(blocks, 0)])
    values = np.array([v for v, _ in jobs], dtype=float)
    remaining = np.array([n for _, n in jobs], dtype=np.int64)
    got = optimal_welfare(values, remaining, blocks)
    assert got == expected and math.copysign(1, got) == math.copysign(1, expected)
    # the job order does not matter, bit for bit
    flipped = optimal_welfare(values[::-1].copy(), remaining[::-1].copy(), blocks)
    assert flipped.hex() == got.hex()


def test_optimal_welfare_outside_the_split_range_adds_unit_by_unit() -> None:
    assert exact_products(np.array([0.1]), np.array([2**26])) is None  # product could round
    assert exact_products(np.array([1e-300]), np.array([3])) is None  # a part could lose bits
    assert exact_products(np.array([1e301]), np.array([3])) is None  # the split overflows
    tiny = np.array([1e-300, 3e-301, 0.5])
    got = optimal_welfare(tiny, np.array([3, 2, 1]), 4)
    assert got == math.fsum([0.5, 1e-300, 1e-300, 1e-300])
