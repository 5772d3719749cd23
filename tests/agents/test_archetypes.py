"""The opponent archetypes do what their names say (agents/population/archetypes.py)."""

from __future__ import annotations

from typing import Any

import pytest
from support import craft, job, make_env

from agents.registry import REGISTRY, make_agent
from market.core.actions import AcceptOffer, Bid, RejectOffer, SendMessage, SendOffer, Wait

ARCHETYPES = ("cooperative", "selfish", "deadline_panicked", "deceptive", "retaliatory")


def _env(labs: int = 2, rounds: int = 3) -> Any:
    env = make_env(rounds=rounds, negotiation_turns=6, labs__count=labs)
    env.reset(seed=0)
    jobs = {1: [job(1, 2, 60.0, rounds - 1, "want", partial=True)]}  # bidder_1 values a block at 30
    craft(env, budgets=[500.0] * labs, jobs=jobs, holdings={(0, 0): 4}, capacity=0)
    return env


def _turn(env: Any, seat: str, action: Any) -> dict[str, Any]:
    assert env.agent_selection == seat, (env.agent_selection, seat)
    env.step(action)
    return dict(env.infos[seat])


def test_archetypes_are_registered() -> None:
    for name in ARCHETYPES:
        assert name in REGISTRY and make_agent(name).name == name


@pytest.mark.parametrize("price, accepts", [(29.0, True), (30.0, True), (31.0, False)])
def test_cooperative_accepts_exactly_the_fair_offers(price: float, accepts: bool) -> None:
    env = _env()
    agent = make_agent("cooperative")
    _turn(env, "bidder_0", SendOffer(to="bidder_1", blocks=1, price=price))
    action = agent.act(env.observe("bidder_1"))
    assert isinstance(action, AcceptOffer if accepts else RejectOffer)
    assert "error" not in _turn(env, "bidder_1", action)


def test_cooperative_joins_coalitions() -> None:
    env = _env()
    agent = make_agent("cooperative")
    _turn(
        env,
        "bidder_0",
        {"action_type": "form_coalition", "members": ["bidder_1"], "contribution": 10},
    )
    info = _turn(env, "bidder_1", agent.act(env.observe("bidder_1")))
    assert info["result"] == {"coalition_id": "c0", "status": "active"}
    assert env.coalitions.coalitions["c0"].balances[1] == pytest.approx(50.0)  # 10 % of 500


def test_selfish_never_accepts_an_offer_worse_than_its_value() -> None:
    """Value of a block to bidder_1: 30. It buys only at <= 0.8 x 30 = 24 per block."""
    for price in (10.0, 24.0, 24.5, 29.0, 30.0, 45.0):
        env = _env()
        agent = make_agent("selfish")
        _turn(env, "bidder_0", SendOffer(to="bidder_1", blocks=2, price=2 * price))
        action = agent.act(env.observe("bidder_1"))
        assert isinstance(action, AcceptOffer) == (price <= 24.0), (price, action)
    env = _env()
    _turn(env, "bidder_0", {"action_type": "form_coalition", "members": ["bidder_1"]})
    assert isinstance(make_agent("selfish").act(env.observe("bidder_1")), Wait)  # never joins


def test_deadline_panicked_overpays_more_as_its_deadline_nears() -> None:
    env = _env(rounds=4)
    obs = env.observe("bidder_0").model_copy(
        update={"phase": "bidding", "holdings": [0], "reserved": [0], "budget": 1e6}
    )
    jobs = [j.model_copy(update={"deadline": 3}) for j in env.observe("bidder_1").jobs]
    agent = make_agent("deadline_panicked")
    per_block = []
    for now in range(4):
        bid = agent.act(obs.model_copy(update={"round": now, "jobs": jobs}))
        assert isinstance(bid, Bid)
        per_block.append(bid.bids[0])
    # value 30 x reliability 1: factor 1 + 1/(1 + rounds left) = 1.25, 1.33, 1.5, 2
    assert per_block == pytest.approx([37.5, 40.0, 45.0, 60.0])
    assert all(b > 30.0 for b in per_block)


def test_deceptive_messages_misstate_its_needs() -> None:
    env = _env()
    agent = make_agent("deceptive")
    agent.reset(0)
    needy = agent.act(env.observe("bidder_1").model_copy(update={"phase": "negotiation"}))
    assert isinstance(needy, SendMessage) and "0 more blocks" in needy.text  # it needs 2
    rich = env.observe("bidder_0").model_copy(update={"phase": "negotiation"})
    agent.reset(0)
    claim = agent.act(rich)  # bidder_0 holds 4 spare blocks and needs none
    assert isinstance(claim, SendMessage) and "need 7 more blocks" in claim.text


def test_retaliatory_punishes_exactly_the_seats_that_wronged_it_then_forgives() -> None:
    env = make_env(rounds=6, negotiation_turns=3, labs__count=3)
    env.reset(seed=0)
    craft(env, budgets=[500.0] * 3, jobs={}, holdings={(2, r): 3 for r in range(6)}, capacity=0)
    agent = make_agent("retaliatory?forgive_after=2")
    agent.reset(0)

    def me() -> dict[str, Any]:
        return _turn(env, "bidder_2", agent.act(env.observe("bidder_2")))

    # round 0: bidder_2 offers a spare block to bidder_0, who rejects it
    _turn(env, "bidder_0", Wait())
    _turn(env, "bidder_1", Wait())
    assert me()["result"]["offer_id"] == "o0" and env.book.offers["o0"].recipient == 0
    _turn(env, "bidder_0", RejectOffer(offer_id="o0"))
    _turn(env, "bidder_1", Wait())
    me()  # it sees the rejection: bidder_0 wronged it in round 0
    assert agent.until == {"bidder_0": 2}
    verdicts: dict[int, dict[str, str]] = {}
    for _ in range(3 * 4):  # rounds 0-3: both labs offer to buy a block at a fair price
        now = env.round
        for seat in ("bidder_0", "bidder_1"):
            if env.agent_selection == seat and env.phase == "negotiation":
                _turn(env, seat, SendOffer(to="bidder_2", side="buy", blocks=1, price=40.0))
        if env.agent_selection == "bidder_2" and env.phase == "negotiation":
            action = agent.act(env.observe("bidder_2"))
            if isinstance(action, AcceptOffer | RejectOffer):
                sender = env.book.offers[action.offer_id].sender
                verdicts.setdefault(now, {})[f"bidder_{sender}"] = type(action).__name__
            _turn(env, "bidder_2", action)
        while env.phase == "bidding" or env.agent_selection != "bidder_0":
            env.step(Wait() if env.phase != "bidding" else Bid())
        if env.round > 3:
            break
    assert verdicts[1] == {"bidder_0": "RejectOffer", "bidder_1": "AcceptOffer"}
    assert verdicts[2]["bidder_0"] == "AcceptOffer"  # forgiven after 2 rounds
