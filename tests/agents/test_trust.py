"""The trust ledger's rule (agents/population/trust.py), checked by hand on constructed
observations, and the agents that read it: ``rule_expert`` refuses a low-trust lab's offer and
``retaliatory`` punishes a lab whose public reputation fell."""

from __future__ import annotations

from typing import Any

import pytest
from support import craft, job, make_env

from agents.population.trust import (
    DROP_WEIGHT,
    EXIT_LOSS,
    FULL_TRUST,
    KEPT_GAIN,
    OWN_BREACH_LOSS,
    RECORD_MARGIN,
    TRUST_THRESHOLD,
    TrustLedger,
    record_margin,
)
from agents.registry import make_agent
from market.core.actions import AcceptOffer, RejectOffer, SendOffer
from market.environment import CoalitionView, ContractView, JobView, Observation, OfferView


def _base() -> Observation:
    env = make_env(rounds=6, negotiation_turns=2, labs__count=3)
    env.reset(seed=0)
    return env.observe("bidder_0")


BASE = _base()


def _obs(round_: int, reps: dict[str, float], **fields: Any) -> Observation:
    update: dict[str, Any] = {
        "round": round_,
        "phase": "negotiation",
        "reputations": {"bidder_0": 0.9, **reps},
        "contracts": [],
        "public_coalitions": [],
        "coalitions": [],
        **fields,
    }
    return BASE.model_copy(update=update)


def _contract(cid: str, seller: str, buyer: str, due: int) -> ContractView:
    return ContractView(
        contract_id=cid, seller=seller, buyer=buyer, blocks=2, price=10.0, delivery_round=due
    )


def _club(members: list[str], term_end: int, status: str = "active") -> CoalitionView:
    return CoalitionView(
        coalition_id="c1",
        leader=members[0],
        members=members,
        invited=[],
        purpose="club",
        split="proportional",
        term_end=term_end,
        status=status,
    )


def test_the_constants_the_docstring_states() -> None:
    assert (TRUST_THRESHOLD, FULL_TRUST, RECORD_MARGIN) == (0.35, 0.5, 0.5)
    assert (DROP_WEIGHT, OWN_BREACH_LOSS, EXIT_LOSS, KEPT_GAIN) == (2.0, 0.2, 0.15, 0.05)


def test_a_lab_starts_at_its_public_reputation_and_falls_twice_as_far() -> None:
    ledger = TrustLedger()
    assert ledger.trust("bidder_1") == 0.5  # never seen: par
    ledger.observe(_obs(0, {"bidder_1": 0.6, "bidder_2": 0.8}))
    assert ledger.trust("bidder_1") == pytest.approx(0.6)
    assert ledger.trust("bidder_2") == pytest.approx(0.8)
    assert "bidder_0" not in ledger.scores  # not itself
    ledger.observe(_obs(0, {"bidder_1": 0.6, "bidder_2": 0.8}))  # nothing changed: no move
    ledger.observe(_obs(1, {"bidder_1": 0.55, "bidder_2": 0.8}))
    assert ledger.trust("bidder_1") == pytest.approx(0.6 - 2 * 0.05)  # 0.5
    assert ledger.trust("bidder_2") == pytest.approx(0.8)
    assert ledger.wrongs == [(1, "bidder_1", "reputation fell")]
    ledger.observe(_obs(2, {"bidder_1": 0.45, "bidder_2": 0.8}))
    assert ledger.trust("bidder_1") == pytest.approx(0.3)  # 0.5 - 2 x 0.1
    assert not ledger.trusted("bidder_1") and ledger.trusted("bidder_2")
    assert ledger.wronged_since(2) == ["bidder_1"]


def test_own_contracts_delivered_and_failed() -> None:
    ledger = TrustLedger()
    reps = {"bidder_1": 0.6, "bidder_2": 0.8}
    open_ = [_contract("k1", "bidder_1", "bidder_0", 1), _contract("k2", "bidder_2", "bidder_0", 1)]
    ledger.observe(_obs(0, reps, contracts=open_))
    ledger.observe(_obs(1, reps, contracts=open_))  # due now: not settled yet
    assert ledger.trust("bidder_1") == pytest.approx(0.6) and ledger.kept("bidder_2") == 0
    # round 1 closed: both contracts settled; bidder_1's reputation fell at that close
    ledger.observe(_obs(2, {"bidder_1": 0.575, "bidder_2": 0.8}, contracts=[]))
    assert ledger.trust("bidder_1") == pytest.approx(0.6 - 2 * 0.025 - 0.2)  # 0.35
    assert ledger.trust("bidder_2") == pytest.approx(0.85)  # delivered: + 0.05
    assert (ledger.kept("bidder_1"), ledger.kept("bidder_2")) == (0, 1)
    assert [w[1:] for w in ledger.wrongs] == [
        ("bidder_1", "reputation fell"),
        ("bidder_1", "contract delivered short"),
    ]


def test_a_contract_it_sold_moves_nothing() -> None:
    ledger = TrustLedger()
    reps = {"bidder_1": 0.6}
    ledger.observe(_obs(0, reps, contracts=[_contract("k1", "bidder_0", "bidder_1", 0)]))
    ledger.observe(_obs(1, reps, contracts=[]))
    assert ledger.trust("bidder_1") == pytest.approx(0.6) and ledger.kept("bidder_1") == 0


def test_coalition_exit_and_stay() -> None:
    ledger = TrustLedger()
    reps = {"bidder_1": 0.6, "bidder_2": 0.8}
    ledger.observe(_obs(0, reps, coalitions=[_club(["bidder_0", "bidder_1", "bidder_2"], 2)]))
    # bidder_1 leaves in round 1: its reputation falls by the exit loss (0.1) too
    left = {"bidder_1": 0.5, "bidder_2": 0.8}
    ledger.observe(_obs(1, left, coalitions=[_club(["bidder_0", "bidder_2"], 2)]))
    assert ledger.trust("bidder_1") == pytest.approx(0.6 - 2 * 0.1 - 0.15)  # 0.25
    ledger.observe(_obs(2, left, coalitions=[_club(["bidder_0", "bidder_2"], 2)]))
    assert ledger.trust("bidder_2") == pytest.approx(0.8)  # term not passed yet
    ledger.observe(_obs(3, left, coalitions=[]))  # term (round 2) passed: bidder_2 stayed
    assert ledger.trust("bidder_2") == pytest.approx(0.85) and ledger.kept("bidder_2") == 1
    assert ledger.trust("bidder_1") == pytest.approx(0.25) and ledger.kept("bidder_1") == 0


def test_a_proposed_coalition_binds_no_one() -> None:
    ledger = TrustLedger()
    reps = {"bidder_1": 0.6}
    ledger.observe(_obs(0, reps, coalitions=[_club(["bidder_0", "bidder_1"], 2, "proposed")]))
    ledger.observe(_obs(1, reps, coalitions=[_club(["bidder_0"], 2, "proposed")]))
    ledger.observe(_obs(3, reps, coalitions=[]))
    assert ledger.trust("bidder_1") == pytest.approx(0.6) and ledger.wrongs == []


def test_scores_stay_in_the_unit_interval() -> None:
    ledger = TrustLedger()
    ledger.observe(_obs(0, {"bidder_1": 0.1}))
    ledger.observe(_obs(1, {"bidder_1": 0.0}))
    assert ledger.trust("bidder_1") == 0.0
    high = TrustLedger()
    club = _club(["bidder_0", "bidder_1"], 0)
    high.observe(_obs(0, {"bidder_1": 0.98}, coalitions=[club]))
    high.observe(_obs(1, {"bidder_1": 0.98}))
    assert high.trust("bidder_1") == 1.0  # 0.98 + 0.05, clipped


def test_the_ledger_ignores_the_order_of_the_reputations() -> None:
    a, b = TrustLedger(), TrustLedger()
    first = {"bidder_1": 0.6, "bidder_2": 0.7}
    later = {"bidder_1": 0.5, "bidder_2": 0.65}
    a.observe(_obs(0, first))
    a.observe(_obs(1, later))
    b.observe(_obs(0, dict(reversed(list(first.items())))))
    b.observe(_obs(1, dict(reversed(list(later.items())))))
    assert a.scores == b.scores and a.wrongs == b.wrongs


@pytest.mark.parametrize(
    "trust, margin", [(1.0, 0.0), (0.5, 0.0), (0.4, 0.1), (0.25, 0.25), (0.0, 0.5)]
)
def test_record_margin(trust: float, margin: float) -> None:
    assert record_margin(trust) == pytest.approx(margin)


# --- agents reading the ledger ---------------------------------------------------------------
def _offer_env(reputation: float) -> Any:
    env = make_env(rounds=3, negotiation_turns=4, labs__count=2)
    env.reset(seed=0)
    jobs = {0: [job(0, 2, 60.0, 2, "want", partial=True)]}  # bidder_0 values a block at 30
    craft(
        env,
        budgets=[500.0, 500.0],
        jobs=jobs,
        holdings={(1, 0): 4},
        capacity=0,
        reputations=[0.8, reputation],
    )
    return env


@pytest.mark.parametrize("reputation, accepts", [(0.8, True), (0.6, True), (0.3, False)])
def test_rule_expert_refuses_a_low_trust_labs_offer(reputation: float, accepts: bool) -> None:
    env = _offer_env(reputation)
    agent = make_agent("rule_expert")
    agent.reset(0)
    assert env.agent_selection == "bidder_0"
    env.step(agent.act(env.observe("bidder_0")))  # its first turn: nothing on offer yet
    assert env.agent_selection == "bidder_1"
    env.step(SendOffer(to="bidder_0", side="sell", blocks=1, price=5.0))
    action = agent.act(env.observe("bidder_0"))
    assert isinstance(action, AcceptOffer) is accepts, action


def test_rule_expert_buys_from_a_poor_record_only_at_a_discount() -> None:
    # trust 0.4: margin 0.1, so a block it values at 30 is worth at most 27 from this lab
    for price, accepts in ((26.9, True), (27.5, False)):
        env = _offer_env(0.4)
        agent = make_agent("rule_expert")
        agent.reset(0)
        env.step(agent.act(env.observe("bidder_0")))
        env.step(SendOffer(to="bidder_0", side="sell", blocks=1, price=price))
        action = agent.act(env.observe("bidder_0"))
        assert isinstance(action, AcceptOffer) is accepts, (price, action)


def _offer(sender: str) -> OfferView:
    return OfferView(
        offer_id="o1",
        sender=sender,
        recipient="bidder_0",
        side="sell",
        blocks=1,
        price=0.01,
        delivery_round=1,
        expires_round=1,
        status="open",
    )


WANT = JobView(
    job_id="want",
    size=2,
    progress=0,
    deadline=5,
    value=60.0,
    partial_credit=True,
    min_reliability=0.0,
    status="active",
)  # a block is worth 30 to it: an offer at 0.01 is fair


def test_retaliatory_punishes_a_lab_whose_reputation_fell() -> None:
    fair = _obs(
        1,
        {"bidder_1": 0.6, "bidder_2": 0.7},
        offers_received=[_offer("bidder_1")],
        jobs=[WANT],
        budget=500.0,
        holdings=[0] * 5,
    )
    calm = make_agent("retaliatory")
    calm.reset(0)
    calm.act(_obs(0, {"bidder_1": 0.6, "bidder_2": 0.7}))
    honest = calm.act(fair)
    angry = make_agent("retaliatory")
    angry.reset(0)
    angry.act(_obs(0, {"bidder_1": 0.65, "bidder_2": 0.7}))
    punished = angry.act(fair)  # bidder_1's reputation fell by 0.05 since round 0
    assert isinstance(honest, AcceptOffer), honest
    assert isinstance(punished, RejectOffer), punished


def test_reciprocal_rejects_an_untrusted_lab_and_accepts_a_trusted_one() -> None:
    for rep, rejects in ((0.3, True), (0.7, False)):
        agent = make_agent("reciprocal")
        agent.reset(0)
        obs = _obs(
            1,
            {"bidder_1": rep, "bidder_2": 0.7},
            offers_received=[_offer("bidder_1")],
            jobs=[WANT],
            budget=500.0,
            holdings=[0] * 5,
        )
        action = agent.act(obs)
        assert isinstance(action, RejectOffer if rejects else AcceptOffer), action
