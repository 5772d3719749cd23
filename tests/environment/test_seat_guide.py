"""seat_guide on hand-built observations: the menu, its fields and choices, the story, the screen.

Each observation is written out by hand (``bidder``), so every expected sentence can be checked
word for word against the numbers in it.
"""

from __future__ import annotations

import re
from typing import Any

from market.core.phases import LEGAL
from market.environment.observations import LastActionView, Observation
from market.environment.seat_guide import describe, story, valid_actions, verdict

NEGOTIATION = list(LEGAL["negotiation"])  # every action type the phase allows
MECHANISM = {
    "auction_type": "second_price",
    "reserve_price": 5.0,
    "reveal_reserve": True,
    "reveal_competing_bids": False,
    "reveal_winner_identity": True,
    "reveal_clearing_price": True,
    "reveal_bid_distribution": False,
    "shill_penalty": 5.0,
    "withdrawal_penalty": 10.0,
    "collusion_penalty": 20.0,
    "coalition_policy": "allow",
    "judge_pool_share": 0.0,
}
JOB = {
    "job_id": "job1",
    "size": 4,
    "progress": 1,
    "deadline": 3,
    "value": 120.0,
    "partial_credit": False,
    "min_reliability": 0.5,
    "status": "active",
}


def offer(
    oid: str, sender: str, recipient: str, side: str, blocks: int, price: float, **kw: Any
) -> dict[str, Any]:
    return {
        "offer_id": oid,
        "sender": sender,
        "recipient": recipient,
        "side": side,
        "blocks": blocks,
        "price": price,
        "delivery_round": kw.pop("delivery_round", 1),
        "expires_round": kw.pop("expires_round", 1),
        "status": kw.pop("status", "open"),
        **kw,
    }


def bidder(**fields: Any) -> Observation:
    """bidder_0 in round 1 of 0..4, negotiation, 100 credits, 3 blocks of round 1 and 2 of round
    2, one live job, no offers, contracts or coalitions; ``fields`` override."""
    data: dict[str, Any] = {
        "seat": "bidder_0",
        "role": "bidder",
        "round": 1,
        "rounds_total": 5,
        "value_unit": 100.0,
        "phase": "negotiation",
        "legal_actions": NEGOTIATION,
        "mechanism": MECHANISM,
        "capacity": 6,
        "reliability": 0.9,
        "energy_floor": 0.0,
        "active_labs": ["bidder_0", "bidder_1", "bidder_2"],
        "reputations": {"bidder_0": 0.8, "bidder_1": 0.7, "bidder_2": 0.6},
        "public_coalitions": [],
        "messages": [],
        "pitches": [],
        "shocks": [],
        "price_history": [30.0],
        "budget": 100.0,
        "reputation": 0.8,
        "holdings": [3, 2, 0, 0],
        "reserved": [0, 0, 0, 0],
        "jobs": [JOB],
        "offers_received": [],
        "offers_sent": [],
        "closed_offers": [],
        "contracts": [],
        "coalitions": [],
    }
    data.update(fields)
    return Observation.model_validate(data)


def kinds(obs: Observation) -> list[str]:
    return [c.action_type for c in valid_actions(obs)]


def test_only_what_is_valid_now_is_offered() -> None:
    # no offers, coalitions, reservations or pitches: nothing that would need one
    assert kinds(bidder()) == [
        "send_offer",
        "form_coalition",
        "send_message",
        "make_pitch",
        "allocate_to_job",
        "reserve_capacity",
        "wait",
        "finish",
    ]
    # with them, each comes in with exactly the valid choices
    coalition = {
        "coalition_id": "c1",
        "leader": "bidder_1",
        "members": ["bidder_1"],
        "invited": ["bidder_0"],
        "purpose": "share",
        "split": "equal",
        "term_end": 2,
        "status": "proposed",
    }
    obs = bidder(
        offers_received=[
            offer("o3", "bidder_1", "bidder_0", "sell", 2, 60.0),  # we can pay 60
            offer("o4", "bidder_2", "bidder_0", "sell", 1, 500.0),  # we cannot pay 500
            offer("o5", "bidder_2", "bidder_0", "buy", 2, 50.0),  # we hold 2 free of round 1
        ],
        offers_sent=[offer("o1", "bidder_0", "bidder_2", "sell", 1, 30.0)],
        coalitions=[coalition],
        reserved=[1, 0, 0, 0],
        pitches=[{"lab": "bidder_2", "text": "need", "blocks_requested": 2, "counters": []}],
    )
    menu = {c.action_type: c for c in valid_actions(obs)}
    assert set(menu) == set(NEGOTIATION)
    accept = menu["accept_offer"].fields[0]
    assert [c.value for c in accept.choices] == ["o3", "o5"]
    assert accept.choices[0].label == (
        "o3: bidder_1 offers to sell you 2 blocks for round 1 for 60.00 credits in total "
        "(30.00 a block)"
    )
    # reserving 1 of round 1's 3 blocks leaves 2: the buy offer of 2 is still deliverable
    assert [c.value for c in menu["reject_offer"].fields[0].choices] == ["o3", "o4", "o5", "o1"]
    assert [c.value for c in menu["commit_to_coalition"].fields[0].choices] == ["c1"]
    assert [c.value for c in menu["release_capacity"].fields[1].choices] == ["1"]
    assert [c.value for c in menu["counter_pitch"].fields[0].choices] == ["bidder_2"]
    # another buy offer of 3 blocks would need all of round 1's blocks, one of which is reserved
    tight = bidder(
        offers_received=[offer("o6", "bidder_1", "bidder_0", "buy", 3, 90.0)], reserved=[1, 0, 0, 0]
    )
    assert "accept_offer" not in kinds(tight)


def test_fields_ask_only_what_the_action_needs() -> None:
    menu = {c.action_type: c for c in valid_actions(bidder())}
    send = menu["send_offer"]
    assert [f.name for f in send.fields] == ["to", "side", "blocks", "price", "delivery_round"]
    assert "conditions" in send.extra and "reasoning" in send.extra
    to = send.fields[0]
    assert to.required and [c.value for c in to.choices] == ["bidder_1", "bidder_2"]
    assert [c.value for c in send.fields[4].choices] == ["1", "2", "3", "4"]
    assert menu["wait"].fields == () and menu["finish"].fields == ()
    assert [c.value for c in menu["allocate_to_job"].fields[0].choices] == ["job1"]
    # a lab without a free block may only buy
    broke = {c.action_type: c for c in valid_actions(bidder(holdings=[0, 0, 0, 0]))}
    assert [c.value for c in broke["send_offer"].fields[1].choices] == ["buy"]
    assert "reserve_capacity" not in broke
    # every prompt and meaning is plain: no reST markup, no reprs
    for choice in valid_actions(bidder()):
        for text in (choice.meaning, *(f.prompt for f in choice.fields)):
            assert "``" not in text and "(" + "'" not in text and "View(" not in text


def test_bidding_and_design_menus() -> None:
    bid = valid_actions(
        bidder(phase="bidding", legal_actions=["bid", "allocate_to_job", "wait", "finish"])
    )
    assert [c.action_type for c in bid] == ["bid", "allocate_to_job", "wait", "finish"]
    # the job needs 3 more blocks at 30 a block x reliability 0.9; 3 are held: no more value
    assert "none of your jobs can still gain" in bid[0].meaning
    hungry = valid_actions(bidder(phase="bidding", legal_actions=["bid"], holdings=[0, 0, 0, 0]))
    assert "about 27.00, 27.00, 27.00" in hungry[0].meaning
    assert hungry[0].fields[0].kind == "numbers" and not hungry[0].fields[0].required
    designer = bidder(
        seat="designer_0",
        role="designer",
        phase="design",
        legal_actions=["set_mechanism", "wait"],
        budget=None,
        reputation=None,
        holdings=None,
        reserved=None,
        jobs=None,
    )
    menu = valid_actions(designer)
    names = [f.name for f in menu[0].fields]
    assert names[0] == "mechanism.auction_type" and "mechanism.judge_pool_share" in names
    assert all(not f.required for f in menu[0].fields)


def test_the_story_between_two_turns() -> None:
    before = bidder(
        offers_sent=[
            offer("o1", "bidder_0", "bidder_2", "sell", 1, 30.0),
            offer("o2", "bidder_0", "bidder_1", "sell", 1, 31.0),
        ],
    )
    refused = LastActionView(
        round=1,
        phase="negotiation",
        action_type="accept_offer",
        accepted=False,
        error="offer 'o9' does not exist; use an offer_id from offers_received",
        penalty=0.05,
    )
    after = bidder(
        budget=130.0,
        holdings=[2, 2, 0, 0],
        offers_sent=[],
        closed_offers=[
            offer("o1", "bidder_0", "bidder_2", "sell", 1, 30.0, status="accepted"),
            offer("o2", "bidder_0", "bidder_1", "sell", 1, 31.0, status="rejected"),
        ],
        offers_received=[offer("o7", "bidder_1", "bidder_0", "buy", 1, 40.0, message="deal?")],
        messages=[{"sender": "bidder_1", "to": ["bidder_0"], "text": "hello  there", "round": 1}],
        last_action=refused,
    )
    lines = story(before, after, {"trade_balance": 0.3, "invalid_action": -0.05})
    assert lines[0] == (
        "The market refused your accept_offer: offer 'o9' does not exist; use an offer_id from "
        "offers_received. It cost you a penalty of 0.05 reward; nothing else changed."
    )
    assert 'bidder_1 to you (round 1): "hello there"' in lines
    assert (
        "bidder_2 accepted your offer o1: you offer to sell to bidder_2 1 block for round 1 for "
        "30.00 credits in total (30.00 a block)." in lines
    )
    assert "bidder_1 rejected your offer o2." in lines
    assert (
        "New offer o7: bidder_1 offers to buy from you 1 block for round 1 for 40.00 credits in "
        'total (40.00 a block), open until the end of round 1. Their note: "deal?"' in lines
    )
    assert "Your budget went from 100.00 to 130.00 credits." in lines
    assert "You now own 2 blocks for round 1 (you had 3)." in lines
    assert lines[-1] == (
        "Your reward since your last turn: +0.25 (trade balance +0.30, invalid action -0.05); "
        "a reward of 1 is 100 credits."
    )


def test_the_story_of_a_new_round() -> None:
    before = bidder(phase="bidding", legal_actions=["bid"])
    result = {
        "round": 1,
        "auction_type": "second_price",
        "blocks_sold": 5,
        "clearing_price": 25.0,
        "winners": {"bidder_0": 2, "bidder_1": 3},
        "my_won": 2,
        "my_paid": 50.0,
    }
    after = bidder(
        round=2,
        holdings=[2, 0, 0],
        reserved=[0, 0, 0],
        last_result=result,
        jobs=[{**JOB, "progress": 4, "status": "done"}],
        active_labs=["bidder_0", "bidder_1"],
        last_action=LastActionView(
            round=1, phase="bidding", action_type="bid", accepted=True, result={"units": 2}
        ),
    )
    lines = story(before, after)
    assert lines[:3] == [
        "The market accepted your bid: your bid for 2 blocks is in.",
        "The round 1 auction (second price) sold 5 blocks at 25.00 a block. Winners: bidder_0 2, "
        "bidder_1 3. You won 2 blocks and paid 50.00 credits.",
        "Round 2 began: 6 blocks for sale, reliability 0.90, floor price 0.00.",
    ]
    assert "bidder_2 left the market." in lines
    assert "Job job1 is done: it earned 120.00 credits." in lines
    assert story(None, bidder()) == []  # a first turn has no story


def test_the_screen_is_plain_sentences() -> None:
    lines = describe(
        bidder(
            reserved=[1, 0, 0, 0],
            offers_received=[offer("o3", "bidder_1", "bidder_0", "sell", 2, 60.0)],
        )
    )
    text = "\n".join(lines)
    assert lines[0] == "Round 1 (rounds 0 to 4), negotiation phase. You are bidder_0, a lab."
    assert "  Blocks you own: round 1: 3 blocks (1 reserved); round 2: 2 blocks." in lines
    assert (
        "  Job job1 needs 3 more blocks by round 3: 4 blocks worth 120.00 credits (30.00 a "
        "block), pays only if finished, runs only at reliability 0.50 or better." in lines
    )
    assert "  Budget 100.00 credits, reputation 0.800." in lines
    assert not re.search(r"[{}\[\]]|View\(|``|:\w+:`", text), text  # no JSON, reprs or reST


def test_a_browser_seat_gets_the_same_from_json() -> None:
    obs = bidder(offers_received=[offer("o3", "bidder_1", "bidder_0", "sell", 2, 60.0)])
    again = Observation.model_validate_json(obs.model_dump_json())
    assert valid_actions(again) == valid_actions(obs)
    assert describe(again) == describe(obs) and story(obs, again) == story(obs, obs)


def test_verdicts_in_words() -> None:
    def said(kind: str, **result: Any) -> str:
        return verdict(
            LastActionView(
                round=0, phase="negotiation", action_type=kind, accepted=True, result=result
            )
        )

    assert (
        said("send_offer", offer_id="o2")
        == "The market accepted your send_offer: offer o2 is open."
    )
    assert said("accept_offer", offer_id="o2", status="void", contract_id=None).endswith(
        "but offer o2 was void: its sender can no longer honour it, so nothing changed hands."
    )
    assert said("reserve_capacity", reserved={"r1": 2}, job_id=None) == (
        "The market accepted your reserve_capacity: reserved 2 blocks of round 1."
    )
    assert said("wait") == "You waited."
    unreadable = LastActionView(
        round=0,
        phase="bidding",
        action_type=None,
        accepted=False,
        error="not valid JSON",
        penalty=0.05,
    )
    assert verdict(unreadable).startswith(
        "The market refused your action (it could not be read): not valid JSON."
    )
