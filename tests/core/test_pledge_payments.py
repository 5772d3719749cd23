"""Pledge economics (market/core/pledges.py, step 2a): members that draw blocks from a
coalition's pool pay the members that gave them the round's clearing price per block, out of
their budgets and never below zero; credits only move between members. And ``rule_expert``
pledges its spare blocks to a pool of its own and is paid for them."""

from __future__ import annotations

from typing import Any

import pytest
from support import ScriptedAgent, craft, job, make_env, run_episode

from agents.registry import make_agent
from market.core.actions import CommitToCoalition, FormCoalition

PRICE = 8.0  # the reserve: with no bids the auction clears at it


def _join(obs: Any) -> CommitToCoalition:
    return CommitToCoalition(coalition_id=obs.coalitions[0].coalition_id)


def _three_member_pool(budget_c: float) -> tuple[Any, Any]:
    """bidder_0 holds 2 and pledges 2, bidder_1 holds 1 and pledges 1, bidder_2 holds nothing
    and needs 3 blocks for a job due now."""
    env = make_env(rounds=1, labs__count=3, mechanism__reserve_price=PRICE)
    leader = ScriptedAgent(
        {
            (0, "negotiation", 0): FormCoalition(
                members=["bidder_1", "bidder_2"], pledge_blocks=2, term_rounds=1
            )
        }
    )
    giver = ScriptedAgent(
        {
            (0, "negotiation", 0): lambda obs: CommitToCoalition(
                coalition_id=obs.coalitions[0].coalition_id, pledge_blocks=1
            )
        }
    )
    taker = ScriptedAgent({(0, "negotiation", 0): _join})

    def setup(e: Any) -> None:
        craft(
            e,
            budgets=[100.0, 100.0, budget_c],
            jobs={2: [job(2, size=3, value=90.0, deadline=0)]},
            holdings={(0, 0): 2, (1, 0): 1},
            capacity=0,
            reliability=1.0,
        )

    ep = run_episode(
        env, {"bidder_0": leader, "bidder_1": giver, "bidder_2": taker}, seed=0, setup=setup
    )
    return env, ep


def test_takers_pay_givers_the_clearing_price_per_block() -> None:
    """By hand: the pool of 3 goes to bidder_2, which pays bidder_0 2 x 8 = 16 and bidder_1
    1 x 8 = 8; the members' budgets sum to 300 before and after."""
    env, ep = _three_member_pool(100.0)
    (pool,) = env.round_log[0]["pools"]
    assert env.round_log[0]["price"] == pytest.approx(PRICE)
    assert pool["price"] == pytest.approx(PRICE)
    assert pool["received"] == {"bidder_2": 3} and pool["defaults"] == {}
    assert pool["payments"] == [
        {"payer": "bidder_2", "payee": "bidder_0", "blocks": 2, "credits": 16.0},
        {"payer": "bidder_2", "payee": "bidder_1", "blocks": 1, "credits": 8.0},
    ]
    budgets = [lab.budget for lab in env.world.labs]
    assert budgets == pytest.approx([116.0, 108.0, 76.0])
    assert sum(budgets) == pytest.approx(300.0)
    vu = env.scenario.rewards.value_unit
    trade = {s: ep.components[s].get("trade_balance", 0.0) for s in ("bidder_0", "bidder_1")}
    assert trade == pytest.approx({"bidder_0": 16.0 / vu, "bidder_1": 8.0 / vu})
    assert ep.components["bidder_2"]["trade_balance"] == pytest.approx(-24.0 / vu)
    assert env.world.labs[2].jobs[0].status == "done"
    assert env.credit_balance() == pytest.approx(0.0, abs=1e-9)


def test_a_taker_pays_only_what_its_budget_holds() -> None:
    """bidder_2 has 10 credits: it pays bidder_0 min(16, 10) = 10 and bidder_1 nothing (its
    budget is spent); it still gets the 3 blocks, and the total is unchanged (210)."""
    env, _ = _three_member_pool(10.0)
    (pool,) = env.round_log[0]["pools"]
    assert pool["received"] == {"bidder_2": 3}
    assert pool["payments"] == [
        {"payer": "bidder_2", "payee": "bidder_0", "blocks": 2, "credits": 10.0}
    ]
    budgets = [lab.budget for lab in env.world.labs]
    assert budgets == pytest.approx([110.0, 100.0, 0.0])
    assert sum(budgets) == pytest.approx(210.0)
    assert env.credit_balance() == pytest.approx(0.0, abs=1e-9)


def test_blocks_nobody_needs_come_back_unpaid() -> None:
    """bidder_0 pledges 2 of its 2 blocks; bidder_1 needs none: both come back, nobody pays."""
    env = make_env(rounds=1, mechanism__reserve_price=PRICE)
    leader = ScriptedAgent(
        {(0, "negotiation", 0): FormCoalition(members=["bidder_1"], pledge_blocks=2)}
    )

    def setup(e: Any) -> None:
        craft(e, budgets=[50.0, 50.0], jobs={}, holdings={(0, 0): 2}, capacity=0)

    run_episode(
        env,
        {"bidder_0": leader, "bidder_1": ScriptedAgent({(0, "negotiation", 0): _join})},
        seed=0,
        setup=setup,
    )
    (pool,) = env.round_log[0]["pools"]
    assert pool["received"] == {"bidder_0": 2} and pool["payments"] == []
    assert [lab.budget for lab in env.world.labs] == pytest.approx([50.0, 50.0])


def test_rule_expert_pledges_its_spare_blocks_to_a_pool_and_is_paid() -> None:
    """``rule_expert`` holds 2 blocks for this round and has no job: it proposes a block pool
    pledging both (nothing fails here, so both pay); bidder_1 joins and, needing 2 blocks for a
    job due now, draws them and pays 2 x 8 = 16."""
    env = make_env(rounds=1, mechanism__reserve_price=PRICE)
    seen: list[Any] = []

    class Spy(ScriptedAgent):
        def act(self, obs: Any) -> Any:
            action = expert.act(obs)
            seen.append(action)
            return action

    expert = make_agent("rule_expert")
    member = ScriptedAgent(
        {(0, "negotiation"): lambda obs: _join(obs) if obs.coalitions else {"action_type": "wait"}}
    )

    def setup(e: Any) -> None:
        craft(
            e,
            budgets=[50.0, 50.0],
            jobs={1: [job(1, size=2, value=60.0, deadline=0)]},
            holdings={(0, 0): 2},
            capacity=0,
            reliability=1.0,
        )

    expert.reset(0)
    run_episode(env, {"bidder_0": Spy({}), "bidder_1": member}, seed=0, setup=setup)
    forms = [a for a in seen if isinstance(a, FormCoalition)]
    assert len(forms) == 1 and forms[0].pledge_blocks == 2 and forms[0].contribution == 0.0
    (pool,) = env.round_log[0]["pools"]
    assert pool["given"] == {"bidder_0": 2} and pool["received"] == {"bidder_1": 2}
    assert [lab.budget for lab in env.world.labs] == pytest.approx([66.0, 34.0])
    assert env.world.labs[1].jobs[0].status == "done"
