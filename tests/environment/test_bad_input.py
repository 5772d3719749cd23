"""Bad input never raises, is penalised exactly, says what was wrong, and changes nothing else.

A rich mid-episode state (open, accepted and countered offers, a forward contract, an active
coalition with pooled credits, a fresh proposal, messages, pitches, a plan and a pending bid) is
built once with valid actions; each bad action is then applied to a deep copy of it at the
designer's, a negotiator's or a bidder's turn, and ``state_digest`` must not move.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import state_digest

import market
from market.core.actions import ACTION_CLASSES, ACTION_TYPES

WAIT = '{"action_type": "wait"}'
NAN = float("nan")


def _to_turn(env: Any, agent: str, phase: str, round_: int) -> None:
    while not (env.agent_selection == agent and env.phase == phase and env.round == round_):
        assert env.agents, f"episode ended before {agent}'s {phase} turn in round {round_}"
        env.step(None if env.terminations[env.agent_selection] else WAIT)


def _do(env: Any, agent: str, phase: str, round_: int, action: dict[str, Any]) -> dict[str, Any]:
    _to_turn(env, agent, phase, round_)
    env.step(json.dumps(action))
    info = env.infos[agent]
    assert "error" not in info, (action, info)
    return info["result"]


def _build() -> dict[str, Any]:
    """Snapshots at designer_0's turn (round 1), bidder_0's 5th negotiation turn (round 1) and
    bidder_1's bidding turn (round 1), with every kind of state populated."""
    env = market.raw_env(scenario="market_round", negotiation_turns=5)
    env.reset(seed=11)
    w = env.world
    w.holdings[0, :] = 3  # bidder_0 has blocks to trade in every round
    # round 0
    _do(
        env,
        "bidder_0",
        "negotiation",
        0,
        {
            "action_type": "send_offer",
            "to": "bidder_2",
            "blocks": 2,
            "price": 20.0,
            "delivery_round": 1,
        },
    )  # o0: forward sale, accepted below
    _do(
        env,
        "bidder_1",
        "negotiation",
        0,
        {
            "action_type": "send_offer",
            "to": "bidder_0",
            "side": "buy",
            "blocks": 1,
            "price": 5.0,
            "delivery_round": 1,
            "expires_in": 2,
        },
    )  # o1
    _do(
        env,
        "bidder_2",
        "negotiation",
        0,
        {
            "action_type": "form_coalition",
            "members": ["bidder_0", "bidder_1"],
            "contribution": 50.0,
            "term_rounds": 3,
        },
    )  # c0, led by bidder_2
    _do(
        env,
        "bidder_0",
        "negotiation",
        0,
        {"action_type": "commit_to_coalition", "coalition_id": "c0", "contribution": 30.0},
    )
    _do(
        env,
        "bidder_1",
        "negotiation",
        0,
        {"action_type": "commit_to_coalition", "coalition_id": "c0", "contribution": 20.0},
    )
    _do(
        env, "bidder_2", "negotiation", 0, {"action_type": "accept_offer", "offer_id": "o0"}
    )  # contract k0
    _do(env, "bidder_0", "bidding", 0, {"action_type": "bid", "bids": [9.0]})
    _do(env, "bidder_1", "bidding", 0, {"action_type": "bid", "bids": [11.0]})
    _do(
        env,
        "bidder_2",
        "bidding",
        0,
        {"action_type": "bid", "bids": [15.0, 14.0], "coalition_id": "c0"},
    )
    _to_turn(env, "designer_0", "design", 1)
    design = copy.deepcopy(env)
    # round 1
    _do(
        env,
        "designer_0",
        "design",
        1,
        {"action_type": "set_mechanism", "mechanism": {"reserve_price": 6.0}},
    )
    _do(
        env, "bidder_0", "negotiation", 1, {"action_type": "accept_offer", "offer_id": "o1"}
    )  # sells its free block
    _do(
        env,
        "bidder_1",
        "negotiation",
        1,
        {
            "action_type": "send_offer",
            "to": "bidder_2",
            "side": "buy",
            "blocks": 1,
            "price": 3.0,
            "expires_in": 2,
        },
    )  # o2, addressed to bidder_2
    _do(
        env,
        "bidder_2",
        "negotiation",
        1,
        {"action_type": "form_coalition", "members": ["bidder_1"], "contribution": 10.0},
    )  # c1
    _do(
        env,
        "bidder_0",
        "negotiation",
        1,
        {"action_type": "make_pitch", "text": "our job is due", "blocks_requested": 2},
    )
    _do(
        env,
        "bidder_1",
        "negotiation",
        1,
        {"action_type": "send_message", "to": ["bidder_0"], "text": "deal?"},
    )
    _do(
        env,
        "bidder_2",
        "negotiation",
        1,
        {"action_type": "send_message", "to": "all", "text": "hello market"},
    )
    job = next(j for j in w.labs[0].jobs if j.status == "active" and j.remaining > 0)
    _do(
        env,
        "bidder_0",
        "negotiation",
        1,
        {"action_type": "allocate_to_job", "job_id": job.job_id, "blocks": 1},
    )
    _do(
        env,
        "bidder_1",
        "negotiation",
        1,
        {"action_type": "counter_pitch", "target": "bidder_0", "text": "not urgent"},
    )
    _do(
        env,
        "bidder_2",
        "negotiation",
        1,
        {
            "action_type": "send_offer",
            "to": "bidder_0",
            "side": "buy",
            "blocks": 1,
            "price": 2.0,
            "delivery_round": 2,
        },
    )  # o3, to bidder_0, countered below
    _do(
        env,
        "bidder_0",
        "negotiation",
        1,
        {"action_type": "counter_offer", "offer_id": "o3", "blocks": 1, "price": 4.0},
    )
    _to_turn(env, "bidder_0", "negotiation", 1)
    negotiation = copy.deepcopy(env)
    _do(env, "bidder_0", "bidding", 1, {"action_type": "bid", "bids": [12.0, 7.0]})
    _to_turn(env, "bidder_1", "bidding", 1)
    bidding = copy.deepcopy(env)
    # the snapshots hold what the cases below rely on
    book, cb = negotiation.book, negotiation.coalitions
    assert book.offers["o1"].status == "accepted" and book.offers["o2"].recipient == 2
    assert book.offers["o3"].status == "countered" and book.offers["o4"].status == "open"
    assert [(k.seller, k.buyer, k.delivery_round, k.delivered) for k in book.contracts] == [
        (0, 2, 1, -1)
    ]
    assert negotiation.world.holdings[0, 1] == 2 and book.committed(0, 1) == 2
    assert cb.coalitions["c0"].status == "active" and cb.coalitions["c0"].leader == 2
    assert set(cb.coalitions["c0"].members) == {0, 1, 2} and cb.coalitions["c0"].pool > 0
    assert cb.coalitions["c1"].status == "proposed" and cb.coalitions["c1"].invited == {1}
    assert book.messages and book.pitches[0].counters and negotiation.orders.plans
    assert bidding.orders.bids and bidding.orders.plans and bidding.agent_selection == "bidder_1"
    return {"design": design, "negotiation": negotiation, "bidding": bidding, "job_id": job.job_id}


@pytest.fixture(scope="module")
def snapshots() -> dict[str, Any]:
    return _build()


SEAT = {"design": "designer_0", "negotiation": "bidder_0", "bidding": "bidder_1"}

OFFER = {"action_type": "send_offer", "to": "bidder_1", "blocks": 1, "price": 5.0}
# (phase, action, words the error must contain (case-insensitive, any one of a tuple))
CASES: list[tuple[str, Any, tuple[str, ...]]] = [
    # not an action at all
    ("negotiation", "please give me all the GPUs", ("json",)),
    ("negotiation", '{"action_type": "send_offer", "to": ', ("json",)),
    ("negotiation", "[1, 2, 3]", ("object", "list")),
    ("negotiation", "42", ("object",)),
    ("negotiation", '"wait"', ("object",)),
    ("negotiation", "", ("json",)),
    ("negotiation", b"\xff\xfe\x00", ("json",)),
    ("negotiation", [{"action_type": "wait"}], ("object",)),
    ("negotiation", 3.5, ("object",)),
    ("negotiation", {}, ("action_type",)),
    ("negotiation", "[" * 50_000, ("json",)),
    ("negotiation", '{"action_type": "wait"} trailing', ("json",)),
    ("negotiation", {1: "wait"}, ("action_type",)),
    ("negotiation", ("wait",), ("object",)),
    ("negotiation", {"action_type": ["bid"]}, ("action_type",)),
    ("negotiation", {"action_type": "wait", "reasoning": 5}, ("reasoning",)),
    ("negotiation", {"to": "bidder_1", "blocks": 1}, ("action_type",)),
    # unknown action type or fields, wrong types, out of range
    ("negotiation", {"action_type": "teleport"}, ("action_type",)),
    ("negotiation", {"action_type": 7}, ("action_type",)),
    ("negotiation", {"action_type": "wait", "foo": 1}, ("foo",)),
    ("negotiation", {**OFFER, "colour": "red"}, ("colour",)),
    ("negotiation", {**OFFER, "blocks": "many"}, ("blocks",)),
    ("negotiation", {**OFFER, "blocks": -1}, ("blocks",)),
    ("negotiation", {**OFFER, "blocks": 0}, ("blocks",)),
    ("negotiation", {**OFFER, "blocks": 1.5}, ("blocks",)),
    ("negotiation", {**OFFER, "price": -5.0}, ("price",)),
    ("negotiation", {**OFFER, "price": NAN}, ("price",)),
    ("negotiation", {**OFFER, "price": "cheap"}, ("price",)),
    ("negotiation", {**OFFER, "side": "lend"}, ("side",)),
    # a bare integer is a lab id (the GPU-arena alias: 1 is bidder_1); a float is no seat
    ("negotiation", {**OFFER, "to": 1.5}, ("to",)),
    ("negotiation", {**OFFER, "to": "bidder_9"}, ("bidder_9",)),
    ("negotiation", {**OFFER, "to": "bidder_0"}, ("yourself",)),
    ("negotiation", {**OFFER, "to": "designer_0"}, ("to",)),
    ("negotiation", {**OFFER, "delivery_round": 99}, ("delivery_round",)),
    ("negotiation", {**OFFER, "delivery_round": 0}, ("delivery_round",)),
    ("negotiation", {**OFFER, "expires_in": 0}, ("expires_in",)),
    ("negotiation", {"action_type": "send_offer", "to": "bidder_1"}, ("blocks", "price")),
    # the acting seat must be the one whose turn it is
    ("negotiation", {"action_type": "wait", "agent": "bidder_2"}, ("bidder_2",)),
    ("negotiation", {**OFFER, "agent": "bidder_1"}, ("bidder_1",)),
    # out of phase
    ("negotiation", {"action_type": "bid", "bids": [5.0]}, ("negotiation",)),
    (
        "negotiation",
        {"action_type": "set_mechanism", "mechanism": {"reserve_price": 1.0}},
        ("set_mechanism",),
    ),
    ("negotiation", {"reserve_price": 1.0}, ("action_type",)),
    ("bidding", {**OFFER, "to": "bidder_2"}, ("bidding",)),
    ("bidding", {"action_type": "form_coalition", "members": ["bidder_2"]}, ("bidding",)),
    ("bidding", {"action_type": "set_mechanism"}, ("set_mechanism",)),
    ("design", {"action_type": "bid", "bids": [5.0]}, ("design",)),
    ("design", {**OFFER}, ("design",)),
    ("design", {"action_type": "finish"}, ("design",)),
    # offers: blocks not owned (or promised on a forward contract), credits not held
    ("negotiation", {**OFFER, "blocks": 50}, ("block",)),
    (
        "negotiation",
        {**OFFER, "blocks": 1, "delivery_round": 1},
        ("uncommitted",),
    ),  # both promised to k0
    ("negotiation", {**OFFER, "side": "buy", "price": 1e8}, ("credits",)),
    (
        "negotiation",
        {"action_type": "accept_offer", "offer_id": "o1"},
        ("already accepted",),
    ),  # double acceptance
    ("negotiation", {"action_type": "accept_offer", "offer_id": "o2"}, ("not addressed to you",)),
    ("negotiation", {"action_type": "accept_offer", "offer_id": "o3"}, ("already countered",)),
    (
        "negotiation",
        {"action_type": "accept_offer", "offer_id": "o4"},
        ("not addressed to you",),
    ),  # its own counter
    ("negotiation", {"action_type": "accept_offer", "offer_id": "o999"}, ("does not exist",)),
    ("negotiation", {"action_type": "accept_offer"}, ("offer_id",)),
    ("negotiation", {"action_type": "reject_offer", "offer_id": "o2"}, ("neither",)),
    ("negotiation", {"action_type": "reject_offer", "offer_id": "o1"}, ("already accepted",)),
    (
        "negotiation",
        {"action_type": "counter_offer", "offer_id": "o2", "blocks": 1, "price": 1.0},
        ("not addressed",),
    ),
    # coalitions
    ("negotiation", {"action_type": "commit_to_coalition", "coalition_id": "c1"}, ("not invited",)),
    (
        "negotiation",
        {"action_type": "commit_to_coalition", "coalition_id": "c0"},
        ("already a member",),
    ),
    ("negotiation", {"action_type": "commit_to_coalition", "coalition_id": "c77"}, ("c77",)),
    (
        "negotiation",
        {"action_type": "commit_to_coalition", "coalition_id": "c0", "contribution": -3},
        ("contribution",),
    ),
    (
        "negotiation",
        {"action_type": "leave_coalition", "coalition_id": "c1"},
        ("not in coalition",),
    ),
    ("negotiation", {"action_type": "form_coalition", "members": []}, ("members",)),
    ("negotiation", {"action_type": "form_coalition", "members": ["bidder_0"]}, ("yourself",)),
    ("negotiation", {"action_type": "form_coalition", "members": "bidder_1"}, ("members",)),
    (
        "negotiation",
        {"action_type": "form_coalition", "members": ["bidder_1"], "contribution": 1e8},
        ("credits",),
    ),
    (
        "negotiation",
        {"action_type": "form_coalition", "members": ["bidder_1"], "split": "random"},
        ("split",),
    ),
    # messages, pitches, plans
    ("negotiation", {"action_type": "send_message", "text": "   "}, ("text",)),
    ("negotiation", {"action_type": "send_message", "to": "bidder_7", "text": "hi"}, ("bidder_7",)),
    ("negotiation", {"action_type": "send_message", "to": [], "text": "hi"}, ("to",)),
    ("negotiation", {"action_type": "send_message"}, ("text",)),
    (
        "negotiation",
        {"action_type": "make_pitch", "text": "need it", "job_id": "nope"},
        ("job_id",),
    ),
    (
        "negotiation",
        {"action_type": "make_pitch", "text": "need it", "blocks_requested": 0},
        ("blocks_requested",),
    ),
    (
        "negotiation",
        {"action_type": "counter_pitch", "target": "bidder_1", "text": "no"},
        ("not pitched",),
    ),
    ("negotiation", {"action_type": "allocate_to_job", "job_id": "nope", "blocks": 1}, ("job_id",)),
    ("negotiation", {"action_type": "allocate_to_job", "job_id": "JOB", "blocks": -1}, ("blocks",)),
    (
        "negotiation",
        {"action_type": "allocate_to_job", "job_id": "JOB", "blocks": 1000},
        ("needs only",),
    ),
    # bids
    ("bidding", {"action_type": "bid", "bids": [NAN]}, ("bid",)),
    ("bidding", {"action_type": "bid", "bids": [10.0, NAN]}, ("bid 1",)),
    ("bidding", {"action_type": "bid", "bids": [-1.0]}, ("bid 0",)),
    ("bidding", {"action_type": "bid", "bids": [float("inf")]}, ("bid",)),
    ("bidding", {"action_type": "bid", "bids": [1.0, 2.0]}, ("non-increasing",)),
    ("bidding", {"action_type": "bid", "bids": ["ten"]}, ("bids",)),
    ("bidding", {"action_type": "bid", "bids": 5}, ("bids",)),
    ("bidding", {"action_type": "bid", "bids": [1.0] * 500}, ("limit",)),
    ("bidding", {"action_type": "bid", "bids": [1e6]}, ("credits",)),
    (
        "bidding",
        {"action_type": "bid", "bids": [5.0], "coalition_id": "c0"},
        ("leader",),
    ),  # non-leader
    ("bidding", {"action_type": "bid", "bids": [5.0], "coalition_id": "c1"}, ("c1",)),
    ("bidding", {"action_type": "bid", "bids": [5.0], "coalition_id": "c42"}, ("c42",)),
    (
        "bidding",
        {"action_type": "allocate_to_job", "job_id": "job0", "blocks": 1, "agent": "bidder_0"},
        ("bidder_0",),
    ),
    # the designer's mechanism (DAEDALUS flat JSON or nested)
    ("design", {"judge_pool_share": 2.0}, ("judge_pool_share",)),
    (
        "design",
        {"action_type": "set_mechanism", "mechanism": {"judge_pool_share": -0.1}},
        ("judge_pool_share",),
    ),
    ("design", {"auction_type": "vickrey"}, ("auction_type",)),
    (
        "design",
        {"action_type": "set_mechanism", "mechanism": {"auction_type": "dutch"}},
        ("auction_type",),
    ),
    ("design", {"reserve_price": -5}, ("reserve_price",)),
    ("design", {"reserve_price": NAN}, ("reserve_price",)),
    (
        "design",
        {"action_type": "set_mechanism", "mechanism": {"reserve_price": "high"}},
        ("reserve_price",),
    ),
    ("design", {"coalition_policy": "anything_goes"}, ("coalition_policy",)),
    ("design", {"reveal_reserve": "maybe"}, ("reveal_reserve",)),
    ("design", {"action_type": "set_mechanism", "mechanism": {"tax": 1}}, ("tax",)),
    ("design", {"action_type": "set_mechanism", "mechanism": [1, 2]}, ("mechanism",)),
    ("design", {"auction_type": "vcg", "tax": 1}, ("tax",)),
    ("design", "not json", ("json",)),
]


def _apply_bad(env: Any, action: Any) -> tuple[str, dict[str, Any]]:
    seat = env.agent_selection
    turn = env.turn
    before = state_digest(env)
    env.step(action)  # must not raise
    assert state_digest(env) == before, f"{action!r} changed the state"
    assert env.turn == turn + 1 or env.agent_selection != seat  # only the turn moved on
    return seat, env.infos[seat]


@pytest.mark.parametrize(
    ("phase", "action", "words"), CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)]
)
def test_bad_action_changes_nothing(
    snapshots: dict[str, Any], phase: str, action: Any, words: tuple[str, ...]
) -> None:
    env = copy.deepcopy(snapshots[phase])
    if isinstance(action, dict):
        action = {k: (snapshots["job_id"] if v == "JOB" else v) for k, v in action.items()}
    assert env.agent_selection == SEAT[phase]
    penalty = env.scenario.rewards.invalid_action_penalty
    seat, info = _apply_bad(env, action)
    error = info.get("error")
    assert isinstance(error, str) and error.strip(), info
    assert any(w.lower() in error.lower() for w in words), (
        f"error {error!r} does not mention {words}"
    )
    assert info["reward_components"] == {"invalid_action": -penalty}
    assert env.rewards[seat] == -penalty and env._cumulative_rewards[seat] == -penalty
    assert all(r == 0.0 for a, r in env.rewards.items() if a != seat)


def test_valid_twin_actions_do_change_state(snapshots: dict[str, Any]) -> None:
    """The digest is not blind: the valid versions of the bad actions above move it."""
    good = [
        ("negotiation", {**OFFER, "blocks": 1, "delivery_round": 2}),
        ("negotiation", {"action_type": "send_message", "to": "bidder_1", "text": "hi"}),
        ("negotiation", {"action_type": "make_pitch", "text": "need it", "blocks_requested": 3}),
        (
            "negotiation",
            {"action_type": "allocate_to_job", "job_id": snapshots["job_id"], "blocks": 0},
        ),
        ("negotiation", {"action_type": "form_coalition", "members": ["bidder_1"]}),
        ("negotiation", {"action_type": "leave_coalition", "coalition_id": "c0"}),
        ("negotiation", {"action_type": "finish"}),
        ("bidding", {"action_type": "bid", "bids": [5.0]}),
        ("design", {"judge_pool_share": 0.5}),
    ]
    for phase, action in good:
        env = copy.deepcopy(snapshots[phase])
        before = state_digest(env)
        env.step(json.dumps(action))
        info = env.infos.get(SEAT[phase], {})
        assert "error" not in info, (action, info)
        assert state_digest(env) != before, action


@pytest.mark.parametrize(
    "action", ['{"action_type": "bid", "bids": [1, 2]}', "garbage", '{"action_type": "send_offer"}']
)
def test_bad_action_at_the_clearing_step_is_a_wait(snapshots: dict[str, Any], action: str) -> None:
    """At the last bid of the round (which clears it), a bad action clears exactly like a wait."""
    env = copy.deepcopy(snapshots["bidding"])
    env.step('{"action_type": "bid", "bids": [10.0]}')  # bidder_1
    assert env.agent_selection == "bidder_2" and env.phase == "bidding"
    twin = copy.deepcopy(env)
    rounds = len(env.results)
    env.step(action)
    twin.step(WAIT)
    assert len(env.results) == rounds + 1 and env.round == twin.round
    assert state_digest(env) == state_digest(twin)
    penalty = env.scenario.rewards.invalid_action_penalty
    assert env.infos["bidder_2"]["reward_components"]["invalid_action"] == -penalty
    for a in env.agents:
        diff = env._cumulative_rewards[a] - twin._cumulative_rewards[a]
        assert diff == pytest.approx(-penalty if a == "bidder_2" else 0.0, abs=1e-12)


def test_double_sale_of_promised_blocks_is_refused(snapshots: dict[str, Any]) -> None:
    """Regression: blocks promised on a forward contract due this round could be sold again on
    the spot (the forward buyer then got a refund instead of its blocks)."""
    env = copy.deepcopy(snapshots["negotiation"])
    assert env.round == 1 and env.book.committed(0, 1) == env.world.holdings[0, 1] == 2
    for blocks in (1, 2):
        _, info = _apply_bad(copy.deepcopy(env), json.dumps({**OFFER, "blocks": blocks}))
        assert "uncommitted" in info["error"]


def test_offer_cannot_outlive_its_delivery_round() -> None:
    """Regression: an offer for round r that stayed open past r could be accepted later, making a
    contract for a past round that was paid for and never delivered or breached."""
    env = market.raw_env(scenario="market_round")
    env.reset(seed=2)
    env.world.holdings[0, :] = 2
    _do(env, "bidder_0", "negotiation", 0, {**OFFER, "blocks": 2, "price": 10.0, "expires_in": 3})
    assert env.book.offers["o0"].expires_round == 0
    _to_turn(env, "bidder_1", "negotiation", 1)
    env.step(json.dumps({"action_type": "accept_offer", "offer_id": "o0"}))
    assert "error" in env.infos["bidder_1"] and not env.book.contracts
    # a forward offer stays open until (and including) its delivery round
    _do(
        env,
        "bidder_0",
        "negotiation",
        2,
        {**OFFER, "blocks": 1, "delivery_round": 3, "expires_in": 5},
    )
    assert env.book.offers["o1"].expires_round == 3


# --- fuzzing ---------------------------------------------------------------------------------

JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = sorted({f for cls in ACTION_CLASSES.values() for f in cls.model_fields} - {"action_type"})
FIELD_VALUES = (
    JSONISH
    | st.sampled_from(
        [
            "bidder_0",
            "bidder_1",
            "bidder_2",
            "bidder_3",
            "designer_0",
            "all",
            "o0",
            "o1",
            "o2",
            "o3",
            "o4",
            "c0",
            "c1",
            "job0",
            "job1",
            "sell",
            "buy",
            "equal",
            "vcg",
            "restrict",
        ]
    )
    | st.integers(-3, 12)
    | st.lists(st.floats(-5, 50) | st.just(NAN), max_size=6)
    | st.lists(st.sampled_from(["bidder_0", "bidder_1", "bidder_2", "nobody"]), max_size=3)
)
STRUCTURED = st.builds(
    lambda t, fields: {"action_type": t, **fields},
    st.sampled_from(ACTION_TYPES),
    st.dictionaries(
        st.sampled_from(FIELDS + ["mechanism", "auction_type", "judge_pool_share", "bogus"]),
        FIELD_VALUES,
        max_size=4,
    ),
)
# valid-looking actions (valid in some phase and state) and one-field mutations of them
TEMPLATES = [
    {**OFFER, "delivery_round": 2},
    {"action_type": "accept_offer", "offer_id": "o1"},
    {"action_type": "reject_offer", "offer_id": "o4"},
    {"action_type": "counter_offer", "offer_id": "o3", "blocks": 1, "price": 3.0},
    {"action_type": "form_coalition", "members": ["bidder_1"], "contribution": 5.0},
    {"action_type": "commit_to_coalition", "coalition_id": "c1"},
    {"action_type": "leave_coalition", "coalition_id": "c0"},
    {"action_type": "send_message", "to": "all", "text": "hi"},
    {"action_type": "make_pitch", "text": "need", "blocks_requested": 2},
    {"action_type": "counter_pitch", "target": "bidder_0", "text": "no"},
    {"action_type": "allocate_to_job", "job_id": "job0", "blocks": 1},
    {"action_type": "bid", "bids": [10.0, 5.0]},
    {"action_type": "bid", "bids": [10.0], "coalition_id": "c0"},
    {"action_type": "set_mechanism", "mechanism": {"auction_type": "vcg"}},
    {"auction_type": "first_price", "judge_pool_share": 0.2},
    {"action_type": "wait"},
]
MUTATED = st.builds(
    lambda t, key, value, drop: (
        {k: v for k, v in t.items() if k != key} if drop else {**t, key: value}
    ),
    st.sampled_from(TEMPLATES),
    st.sampled_from(FIELDS + ["action_type", "mechanism", "bogus"]),
    FIELD_VALUES,
    st.booleans(),
)
ACTIONS = (
    st.sampled_from(TEMPLATES)
    | MUTATED
    | st.text(max_size=40)
    | st.dictionaries(st.text(max_size=10), JSONISH, max_size=5)
    | STRUCTURED
    | STRUCTURED.map(lambda d: json.dumps(d, allow_nan=True))
    | JSONISH
)


def _fuzz_step(env: Any, action: Any) -> None:
    seat = env.agent_selection
    if env.terminations.get(seat) or env.truncations.get(seat):
        env.step(action)  # a dead seat's action is ignored
        assert seat not in env.agents
        return
    twin = copy.deepcopy(env)
    before = state_digest(env)
    last_turn = env.turn == len(env.schedule) - 1
    env.step(action)
    info = env.infos[seat]
    if "error" in info:
        assert isinstance(info["error"], str) and info["error"]
        assert (
            info["reward_components"].get("invalid_action")
            == -env.scenario.rewards.invalid_action_penalty
        )
        twin.step(WAIT)
        assert state_digest(env) == state_digest(twin), f"invalid {action!r} changed the state"
        if not last_turn:
            assert state_digest(env) == before
    w = env.world
    assert abs(env.credit_balance()) <= 1e-6 * env.initial_credits
    assert all(lab.budget >= -1e-9 for lab in w.labs) and (w.holdings >= 0).all()
    assert all(math.isfinite(r) for r in env.rewards.values())


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    phase=st.sampled_from(["design", "negotiation", "bidding"]),
    actions=st.lists(ACTIONS, min_size=1, max_size=8),
)
def test_fuzz_actions(snapshots: dict[str, Any], phase: str, actions: list[Any]) -> None:
    _fuzz_run(snapshots[phase], actions)


@pytest.mark.slow
@settings(
    max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    phase=st.sampled_from(["design", "negotiation", "bidding"]),
    actions=st.lists(ACTIONS, min_size=1, max_size=25),
)
def test_fuzz_actions_long(snapshots: dict[str, Any], phase: str, actions: list[Any]) -> None:
    _fuzz_run(snapshots[phase], actions)


def _fuzz_run(snapshot: Any, actions: list[Any]) -> None:
    """Step a copy of ``snapshot`` with ``actions`` (checked by :func:`_fuzz_step`) until done."""
    env = copy.deepcopy(snapshot)
    for action in actions:
        if not env.agents:
            break
        _fuzz_step(env, action)
