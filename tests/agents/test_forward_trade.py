"""Forward trade and delivery risk: the hedge arithmetic of ``agents.population.delivery_risk``
against hand computations, ``rule_expert`` selling forward exactly the blocks whose sale pays its
risk, and forward contracts appearing in the built-in scenarios with their own seats.

The rule under test (docs/world.md, Delivery risk): of ``h`` blocks held for a round, each
failing with probability ``p``, ``X ~ Binomial(h, 1 - p)`` survive. Promising the ``k``-th block
forward raises the expected shortfall by ``P(X <= k - 1)``; a missing block costs the refund of
its price ``a`` plus the withdrawal penalty ``W``; so the ``k``-th is sold iff
``a > (a + W) * P(X <= k - 1)``.
"""

from __future__ import annotations

import pytest
from support import craft, make_env

from agents.population.delivery_risk import (
    completion_cover_values,
    cover_values,
    forward_sale_blocks,
)
from agents.registry import make_agent
from market.core.actions import SendOffer


def test_forward_sale_rule_by_hand() -> None:
    # 4 blocks held, p = 0.2: P(X <= 0) = 0.2**4 = 0.0016; P(X <= 1) = 0.0016 + 4 * 0.8 * 0.008
    # = 0.0272; P(X <= 2) = 0.0272 + 6 * 0.64 * 0.04 = 0.1808; P(X <= 3) = 1 - 0.8**4 = 0.5904.
    # At a = 6, W = 15 (loss 21): 21 * 0.1808 = 3.80 < 6 sells the 3rd; 21 * 0.5904 = 12.40 > 6
    # keeps the 4th.
    assert forward_sale_blocks(4, 0, 0.2, 6.0, 21.0, 4) == 3
    # at a = 20 (loss 35): 35 * 0.5904 = 20.66 > 20, still 3; a = 30 (loss 45): 26.57 < 30, all 4
    assert forward_sale_blocks(4, 0, 0.2, 20.0, 35.0, 4) == 3
    assert forward_sale_blocks(4, 0, 0.2, 30.0, 45.0, 4) == 4
    # 1 of the 4 already owed: the next is the 2nd promised (P(X <= 1) = 0.0272), then 3rd, 4th
    assert forward_sale_blocks(4, 1, 0.2, 6.0, 21.0, 3) == 2
    # nothing fails: every held block; never more than held (the refund alone is >= the price)
    assert forward_sale_blocks(3, 0, 0.0, 6.0, 21.0, 5) == 3
    assert forward_sale_blocks(0, 0, 0.0, 6.0, 21.0, 2) == 0
    # at most ``most``
    assert forward_sale_blocks(4, 0, 0.2, 6.0, 21.0, 1) == 1


def test_cover_and_completion_values_by_hand() -> None:
    # contract cover: 2 owed, 2 held, p = 0.2. E[short | 2 held] = 0.04 * 2 + 0.32 = 0.4,
    # E[short | 3 held] = 0.008 * 2 + 3 * 0.8 * 0.04 = 0.112: the 1st extra block is worth
    # 10 * 0.288 = 2.88, i.e. loss * (1 - p) * P(X_2 < 2) = 10 * 0.8 * 0.36
    assert cover_values(2, 2, 0.2, 10.0, 1) == [2.88]
    # a job worth 100 needing 2 blocks, p = 0.1: P(both of 2 survive) = 0.81; of 3:
    # 0.729 + 3 * 0.81 * 0.1 = 0.972; of 4: 1 - (0.1**4 + 4 * 0.9 * 0.1**3) = 0.9963;
    # of 5: 1 - (0.1**5 + 5 * 0.9 * 0.1**4) = 0.99954
    assert completion_cover_values(2, 0.1, 100.0, 3) == [16.2, 2.43, 0.32]
    assert completion_cover_values(2, 0.0, 100.0, 3) == []  # nothing fails: no cover


def _first_sell(spec: str, rate: float) -> SendOffer:
    """``spec`` in bidder_0 with no job and 4 blocks for round 2 only, owned blocks failing at
    ``rate``, no shocks: its first negotiation action in round 0."""
    env = make_env(
        "coalition_market",
        rounds=3,
        delivery__owned_failure_rate=rate,
        delivery__outage_exposure=0.0,
        delivery__reliability_exposure=0.0,
    )
    env.reset(seed=0)
    craft(env, jobs={1: []}, holdings={(0, 2): 4})
    while env.agent_selection != "bidder_0" or env.observe("bidder_0").phase != "negotiation":
        agent = env.agent_selection
        env.step(
            make_agent("fixed" if agent == "designer_0" else "truthful").act(env.observe(agent))
        )
    obs = env.observe("bidder_0")
    expert = make_agent(spec)
    expert.reset(0)
    action = expert.act(obs)
    assert isinstance(action, SendOffer), action
    assert action.side == "sell" and action.delivery_round == 2 and not action.short
    assert obs.mechanism.withdrawal_penalty == 15.0
    assert action.price == pytest.approx(6.0 * action.blocks)  # the floor per block, the reserve
    return action


def test_rule_expert_sells_forward_exactly_what_pays_its_risk() -> None:
    """At 20 % failure and an ask of 6 (the reserve) per block, the hand computation above says
    3 of its 4 blocks; the 95 %-confidence cap says 2 (P(X >= 3) = 0.819, P(X >= 2) = 0.973);
    unhedged it sells all 4; with nothing failing it sells all 4 too."""
    assert _first_sell("rule_expert", 0.2).blocks == 3
    assert _first_sell("rule_expert?confidence=0.95", 0.2).blocks == 2
    assert _first_sell("rule_expert?hedge=false", 0.2).blocks == 4
    assert _first_sell("rule_expert", 0.0).blocks == 4


@pytest.mark.parametrize("scenario", ["coalition_market", "shock_storm"])
def test_forward_contracts_appear_with_the_scenarios_own_seats(scenario: str) -> None:
    """Endowments in every round, drawn apart from the jobs, leave labs blocks for rounds they
    have no job in: with the scenario's own seats most episodes have a forward contract."""
    from market.environment.aec import raw_env
    from market.run.rollout import run_episode

    with_contract = 0
    for seed in range(6):
        env = raw_env(scenario)
        run_episode(scenario, seed=seed, env=env)
        with_contract += env.book.next_contract > 0
        assert env.credit_balance() == pytest.approx(0.0, abs=1e-6)
    assert with_contract >= 4, with_contract
