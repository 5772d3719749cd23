"""Delivery risk (market.core.delivery, market.core.pledges): owned blocks that fail on common
random numbers, short forward sales with collateral and compensation, coalition pledges that
default and cascade, and the rule expert's risk arithmetic. Every figure is computed by hand."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support import ScriptedAgent, craft, job, make_env, run_episode

import market
from agents.population import (
    ShortSeller,
    blocks_to_hold,
    cover_values,
    deliverable,
    expected_shortfall,
    survive_at_least,
)
from agents.registry import make_agent
from market.core.actions import (
    Bid,
    CommitToCoalition,
    FormCoalition,
    SendOffer,
    action_json_schema,
)
from market.core.delivery import collateral, failed_slots, failure_rate
from market.core.penalties import BREACH_REPUTATION_LOSS
from market.core.rng import RngStreams
from market.core.scenario_schema import DeliverySpec

PRICE = 40.0


def _short_sale(blocks: int = 2, delivery: int = 2, price: float = PRICE) -> SendOffer:
    return SendOffer(
        to="bidder_1", side="sell", blocks=blocks, price=price, delivery_round=delivery, short=True
    )


def _play_short(cover_bid: float | None, **overrides: Any) -> tuple[Any, Any]:
    """bidder_0 (owns nothing) sells 2 blocks for round 2 short to bidder_1, which accepts; in
    round 2 bidder_0 bids ``cover_bid`` per block for 2 blocks (None: it does not cover)."""
    env = make_env(rounds=3, **overrides)
    plan: dict[tuple, Any] = {(0, "negotiation", 0): _short_sale()}
    if cover_bid is not None:
        plan[(2, "bidding")] = Bid(bids=[cover_bid, cover_bid])
    seller = ScriptedAgent(plan)
    buyer = ScriptedAgent(
        {(0, "negotiation", 0): lambda obs: {"action_type": "wait"}}
        | {
            (0, "negotiation", 1): lambda obs: {
                "action_type": "accept_offer",
                "offer_id": obs.offers_received[0].offer_id,
            }
        }
    )

    def setup(e: Any) -> None:
        craft(e, budgets=[100.0, 200.0], jobs={}, holdings={}, capacity=3, reputations=[0.8, 0.8])

    ep = run_episode(env, {"bidder_0": seller, "bidder_1": buyer}, seed=0, setup=setup)
    return env, ep


def test_short_sale_breach_pays_refund_and_compensation_out_of_collateral() -> None:
    """Collateral 1.5 x 40 = 60 leaves the seller at acceptance; the seller holds nothing at
    delivery, so the buyer gets its 40 back plus 0.5 x 40 = 20 compensation (all 60 of the
    collateral), and the seller pays the withdrawal penalty per missing block and loses 0.05."""
    env, ep = _play_short(cover_bid=None)
    w = env.world
    penalty = env.mechanism.withdrawal_penalty * 2
    assert w.collateral_held == 0.0
    assert w.labs[0].budget == pytest.approx(100.0 + 40.0 - 60.0 - penalty)
    assert w.labs[1].budget == pytest.approx(200.0 - 40.0 + 60.0)
    assert w.labs[0].reputation == pytest.approx(0.8 - BREACH_REPUTATION_LOSS)
    breaches = [b for r in env.round_log for b in r["breaches"]]
    assert breaches == [
        {
            "contract_id": "k0",
            "seller": "bidder_0",
            "buyer": "bidder_1",
            "blocks": 2,
            "short_sold": 2,
            "shortfall": 2,
            "refund": 40.0,
            "compensation": 20.0,
            "penalty": penalty,
        }
    ]
    vu = env.scenario.rewards.value_unit
    seller, buyer = ep.components["bidder_0"], ep.components["bidder_1"]
    assert seller["breach_compensation"] == pytest.approx(-20.0 / vu)
    assert buyer["breach_compensation"] == pytest.approx(20.0 / vu)
    assert seller.get("trade_balance", 0.0) == pytest.approx(0.0)  # paid 40, refunded 40
    assert env.credit_balance() == pytest.approx(0.0, abs=1e-9)


def test_covered_short_sale_delivers_and_returns_the_collateral() -> None:
    """The seller wins 2 blocks in round 2's auction (reserve 5, second price) and delivers:
    no breach, the collateral comes back, the buyer holds the blocks."""
    env, ep = _play_short(cover_bid=30.0)
    w = env.world
    assert not [b for r in env.round_log for b in r["breaches"]]
    assert w.collateral_held == 0.0
    assert w.holdings[1, 2] == 2 and w.holdings[0, 2] == 0
    paid = env.round_log[2]["paid"]["bidder_0"]
    assert w.labs[0].budget == pytest.approx(100.0 + 40.0 - paid)
    assert env.credit_balance() == pytest.approx(0.0, abs=1e-9)


def test_short_sale_rules_are_checked_and_errors_say_how_to_fix() -> None:
    """Short sales must be forward, affordable and allowed by the scenario; nothing changes."""
    cases = [
        (_short_sale(delivery=0), {}, "must be forward"),
        (_short_sale(price=500.0), {}, "collateral"),
        (_short_sale(), {"delivery__short_sales": False}, "short sales are off"),
        (SendOffer(to="bidder_1", blocks=2, price=PRICE, delivery_round=2), {}, "uncommitted"),
    ]
    for action, overrides, message in cases:
        env = make_env(rounds=3, **overrides)
        env.reset(seed=0)
        craft(env, budgets=[100.0, 200.0], jobs={}, holdings={}, capacity=3)
        before = env.world.labs[0].budget
        env.step(action)
        error = env.infos["bidder_0"]["error"]
        assert message in error and "\n" not in error, error
        assert env.book.offers == {} and env.world.labs[0].budget == before


def test_collateral_rule() -> None:
    spec = DeliverySpec(collateral_fraction=1.5, collateral_per_block=2.0)
    assert collateral(spec, 40.0, 4, 2) == pytest.approx(1.5 * 40.0 * 2 / 4 + 2.0 * 2)
    assert collateral(spec, 40.0, 4, 0) == 0.0


def test_failure_rate_rule() -> None:
    """p_r = base + outage_exposure x capacity share lost + reliability_exposure x drop."""
    env = make_env(
        rounds=3,
        delivery__owned_failure_rate=0.05,
        delivery__outage_exposure=0.5,
        delivery__reliability_exposure=0.5,
    )
    env.reset(seed=0)
    w = env.world
    w.base_capacity[:] = 10
    w.capacity[:] = [10, 6, 10]
    w.reliability[:] = [1.0, 1.0, 0.8]
    spec = env.scenario.delivery
    assert [failure_rate(w, spec, 1.0, r) for r in range(3)] == pytest.approx(
        [0.05, 0.05 + 0.5 * 0.4, 0.05 + 0.5 * 0.2]
    )


def test_every_observation_shows_its_round_s_failure_rate() -> None:
    """The failure rate in each bidder's observation is the rule's rate for that round, under
    outages and reliability drops (the observation builds it once per round for all labs)."""
    env = market.raw_env(
        "shock_storm", delivery__outage_exposure=0.5, delivery__reliability_exposure=0.7
    )
    sc = env.scenario
    seen = set()
    for seed in (0, 1):
        env.reset(seed=seed)
        for agent in env.agent_iter():
            obs, _, terminated, truncated, _ = env.last()
            if obs.delivery is not None:
                now = min(env.round, sc.rounds - 1)
                want = failure_rate(env.world, sc.delivery, sc.capacity.reliability, now)
                assert obs.delivery.failure_rate == want, (seed, env.round, agent)
                seen.add(want)
            env.step(None if terminated or truncated else {"action_type": "wait"})
    assert len(seen) >= 3  # the shocks move the rate between rounds


def test_failed_slots_are_a_prefix_property_of_the_seed() -> None:
    """Slot k's fate does not depend on how many blocks are held (common random numbers)."""
    streams = RngStreams(7)
    many = failed_slots(streams, 3, 1, 200, 0.3)
    for held in (0, 1, 5, 50, 199):
        few = failed_slots(RngStreams(7), 3, 1, held, 0.3)
        assert few.tolist() == [k for k in many.tolist() if k < held]
    assert 30 < len(many) < 90  # about 0.3 x 200


def _failures(lineup: list[str], seed: int) -> tuple[Any, dict[tuple[int, int], tuple[int, set]]]:
    env = market.raw_env("coalition_market", delivery__owned_failure_rate=0.2)
    agents = {
        a: make_agent("fixed" if a == "designer_0" else lineup[i % len(lineup)])
        for i, a in enumerate(env.possible_agents)
    }
    run_episode(env, agents, seed=seed)
    out = {}
    for r in env.results:
        for f in r.failures:
            out[(f.round, f.lab)] = (f.held, set(f.block_ids()))
    return env, out


def test_same_seed_same_failed_blocks_whatever_the_agents_do() -> None:
    """Two different line-ups, same seed: the same failure rates each round, and wherever both
    held a block slot, the same slots failed (block ids ``r{round}/{seat}/{slot}``); each
    failure is exactly the seed's schedule cut to the blocks held."""
    for seed in (0, 1):
        env_a, fa = _failures(["truthful", "always_accept"], seed)
        env_b, fb = _failures(["rule_expert", "short_seller", "greedy_hoarder"], seed)
        assert fa and fb
        rounds = env_a.scenario.rounds
        spec, rel = env_a.scenario.delivery, env_a.scenario.capacity.reliability
        rates = [failure_rate(env_a.world, spec, rel, r) for r in range(rounds)]
        assert rates == [failure_rate(env_b.world, spec, rel, r) for r in range(rounds)]
        assert {k: v[0] for k, v in fa.items()} != {k: v[0] for k, v in fb.items()}
        compared = 0
        for key in fa.keys() & fb.keys():
            (ha, ids_a), (hb, ids_b) = fa[key], fb[key]
            common = min(ha, hb)
            cut_a = {i for i in ids_a if int(i.rsplit("/", 1)[1]) < common}
            cut_b = {i for i in ids_b if int(i.rsplit("/", 1)[1]) < common}
            assert cut_a == cut_b, (seed, key)
            compared += 1
        assert compared > 0
        for (r, lab), (held, ids) in fa.items():
            slots = failed_slots(RngStreams(seed), r, lab, held, rates[r])
            assert ids == {f"r{r}/bidder_{lab}/{k}" for k in slots.tolist()}


def test_failures_show_in_the_owner_s_observation_and_the_round_log() -> None:
    env = make_env(rounds=2, delivery__owned_failure_rate=0.5)
    seen: list[Any] = []
    watcher = ScriptedAgent(
        {(1, "negotiation"): lambda obs: seen.append(obs) or {"action_type": "wait"}}
    )

    def setup(e: Any) -> None:
        craft(e, budgets=[100.0, 100.0], jobs={}, holdings={(0, 0): 20}, capacity=0)

    run_episode(env, {"bidder_0": watcher}, seed=3, setup=setup)
    (failure,) = env.round_log[0]["failures"]
    assert failure["seat"] == "bidder_0" and failure["held"] == 20
    assert 0 < failure["failed"] < 20 and env.world.holdings[0, 0] == 20 - failure["failed"]
    view = seen[0].delivery
    assert view.failed_last_round == failure["failed"]
    assert view.failed_block_ids == failure["block_ids"]
    assert view.failure_rate == pytest.approx(0.5)
    assert int(env.world.blocks_failed[0]) == failure["failed"]


def test_pledge_default_compensates_the_cut_member_and_cascades_to_its_sale() -> None:
    """bidder_0 pledges 2 blocks it does not hold; bidder_1 (a 2-block job, nothing held) was
    entitled to them: bidder_0 defaults by 2, loses 0.05 reputation and pays 10 x 2 = 20 out of
    its pool balance to bidder_1, which was cut by 2 and so breaches the forward sale of 1 block
    it had made for that round (the cascade)."""
    env = make_env(rounds=2, labs__count=3)
    leader = ScriptedAgent(
        {
            (0, "negotiation", 0): FormCoalition(
                members=["bidder_1"], contribution=50.0, pledge_blocks=2, term_rounds=2
            )
        }
    )
    member = ScriptedAgent(
        {
            (0, "negotiation", 0): lambda obs: CommitToCoalition(
                coalition_id=obs.coalitions[0].coalition_id, contribution=10.0
            ),
            (0, "negotiation", 1): SendOffer(
                to="bidder_2", blocks=1, price=30.0, delivery_round=1, short=True
            ),
        }
    )
    buyer = ScriptedAgent(
        {
            (0, "negotiation", 1): lambda obs: {
                "action_type": "accept_offer",
                "offer_id": obs.offers_received[0].offer_id,
            }
        }
    )

    def setup(e: Any) -> None:
        craft(
            e,
            budgets=[200.0, 200.0, 200.0],
            jobs={1: [job(1, size=2, value=60.0, deadline=1)]},
            holdings={},
            capacity=0,
            reputations=[0.8, 0.8, 0.8],
        )

    ep = run_episode(
        env, {"bidder_0": leader, "bidder_1": member, "bidder_2": buyer}, seed=0, setup=setup
    )
    pools = [p for r in env.round_log for p in r["pools"]]
    assert len(pools) == 2  # rounds 0 and 1 of the term
    assert pools[0]["defaults"] == {"bidder_0": 2} and pools[0]["cut"] == {"bidder_1": 2}
    assert pools[0]["compensation"] == [{"payer": "bidder_0", "payee": "bidder_1", "credits": 20.0}]
    vu = env.scenario.rewards.value_unit
    # 20 from the pool in each of the two rounds, less the 0.5 x 30 it owes its own buyer
    assert ep.components["bidder_1"]["breach_compensation"] == pytest.approx((40.0 - 15.0) / vu)
    assert ep.components["bidder_2"]["breach_compensation"] == pytest.approx(15.0 / vu)
    assert env.world.labs[0].reputation == pytest.approx(0.8 - 2 * BREACH_REPUTATION_LOSS)
    # the cascade: bidder_1 got none of the 2 blocks it was entitled to and breached its sale
    (breach,) = env.round_log[1]["breaches"]
    assert breach["seller"] == "bidder_1" and breach["shortfall"] == 1
    assert env.credit_balance() == pytest.approx(0.0, abs=1e-9)


def test_pledged_blocks_go_to_the_member_that_needs_them() -> None:
    """bidder_0 holds 3 and pledges 2; bidder_1 needs 2 for its job: 2 blocks move, no default."""
    env = make_env(rounds=1)
    leader = ScriptedAgent(
        {(0, "negotiation", 0): FormCoalition(members=["bidder_1"], pledge_blocks=2)}
    )
    member = ScriptedAgent(
        {
            (0, "negotiation", 0): lambda obs: CommitToCoalition(
                coalition_id=obs.coalitions[0].coalition_id
            )
        }
    )

    def setup(e: Any) -> None:
        craft(
            e,
            budgets=[100.0, 100.0],
            jobs={1: [job(1, size=2, value=60.0, deadline=0)]},
            holdings={(0, 0): 3},
            capacity=0,
            reliability=1.0,
        )

    run_episode(env, {"bidder_0": leader, "bidder_1": member}, seed=0, setup=setup)
    (pool,) = env.round_log[0]["pools"]
    assert pool["given"] == {"bidder_0": 2} and pool["received"] == {"bidder_1": 2}
    assert pool["defaults"] == {} and pool["cut"] == {}
    assert env.world.holdings[:, 0].tolist() == [1, 2]
    assert env.world.labs[1].jobs[0].status == "done"


def test_risk_arithmetic_by_hand() -> None:
    # P(Bin(5, 0.8) >= 3) = sum_k C(5,k) 0.8^k 0.2^(5-k), k = 3..5
    want = sum(math.comb(5, k) * 0.8**k * 0.2 ** (5 - k) for k in range(3, 6))
    assert survive_at_least(5, 3, 0.2) == pytest.approx(want) == pytest.approx(0.94208)
    assert deliverable(5, 0, 0.2, 0.95) == 2  # P(>=3) = 0.942 < 0.95, P(>=2) = 0.993
    assert deliverable(5, 0, 0.0, 0.95) == 5
    assert deliverable(5, 4, 0.2, 0.95) == 0
    assert blocks_to_hold(3, 0.2, 0.95) == 6  # P(Bin(5,.8)>=3)=.942, P(Bin(6,.8)>=3)=.983
    assert blocks_to_hold(3, 0.0, 0.95) == 3
    # owing 2 with 2 held at p = 0.2: short 2 w.p. 0.04, short 1 w.p. 2 x 0.8 x 0.2 = 0.32
    assert expected_shortfall(2, 2, 0.2) == pytest.approx(0.04 * 2 + 0.32)
    # with 3 held: short 2 w.p. 0.008, short 1 w.p. 3 x 0.8 x 0.04 = 0.096
    assert expected_shortfall(3, 2, 0.2) == pytest.approx(0.016 + 0.096)
    values = cover_values(2, 2, 0.2, 10.0, 5)
    assert values[0] == pytest.approx(round(10.0 * (0.4 - 0.112), 2))
    assert values == sorted(values, reverse=True) and len(values) <= 5
    assert cover_values(2, 2, 0.0, 10.0, 5) == []  # nothing fails: no cover is worth anything


def test_short_seller_sells_short_and_the_schema_and_mask_know_short_sales() -> None:
    env = market.raw_env("coalition_market")
    agent = ShortSeller()
    agent.reset(0)
    env.reset(seed=0)
    while env.phase != "negotiation":
        env.step({"action_type": "wait"})
    action = agent.act(env.observe(env.agent_selection))
    assert isinstance(action, SendOffer) and action.short and action.delivery_round > env.round
    schema = str(action_json_schema())
    assert "short" in schema and "pledge_blocks" in schema
    from market.environment.wrappers import MENU_NAMES, translate

    obs = env.observe(env.agent_selection)
    k = MENU_NAMES.index("sell_forward_short")
    native, ok = translate(obs, k)
    assert isinstance(native, SendOffer) and native.short and ok
    env.step(native)
    assert "error" not in env.infos[obs.seat], env.infos[obs.seat]


def test_rule_expert_rejects_bad_parameters() -> None:
    for spec in ("rule_expert?confidence=1.5", "rule_expert?hedge=maybe"):
        with pytest.raises(ValueError):
            make_agent(spec)
    assert make_agent("rule_expert?hedge=false").hedge is False
    assert make_agent("rule_expert").confidence is None  # no cap beyond the expected-cost rule
    assert np.isclose(make_agent("rule_expert?confidence=0.95").confidence, 0.95)


def test_llm_action_schema_offers_the_new_fields() -> None:
    """The LLM seat's legal-action schema is built from the action models: it carries ``short``
    on send_offer and ``pledge_blocks`` on the coalition actions, with their descriptions."""
    from agents.llm.prompts import legal_action_schema

    schema = legal_action_schema(["send_offer", "form_coalition", "commit_to_coalition"])
    text = str(schema)
    assert "'short'" in text and "'pledge_blocks'" in text
    assert "collateral" in text and "default" in text
