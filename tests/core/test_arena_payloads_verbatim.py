"""The GPU-arena's own payloads, verbatim (tests/core/data/arena_payloads.json), in this market:
each runs or is refused for a domain reason only, in its compact and full (``model_dump``) forms;
swaps, block-level reservations/allocations and pledged blocks move what a hand count says; and
the DAEDALUS card's mechanism JSON runs unchanged in the daedalus family (units by context)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import craft, job, make_env

import market
from market.core import actions
from market.core.actions import MechanismUpdate, parse_action
from market.core.arena_actions import from_arena
from market.core.arena_payloads import BlockContext
from market.core.seats import DESIGNER

DATA = json.loads((Path(__file__).parent / "data" / "arena_payloads.json").read_text())
PAYLOADS: list[dict[str, Any]] = DATA["payloads"]

#: what each payload does here, by (source, line): None = runs; else the domain refusal's words.
#: The world of :func:`world`: 4 labs in round 0; lab 0 holds 2 blocks of round 0 and 1 of
#: round 1 (b_0_0, b_0_1 of round 0, b_0_2 of round 1); jobs j_0_0 and j_0_1; no offers yet.
EXPECTED: dict[tuple[str, int], str | None] = {
    ("data/sft_traces.jsonl", 1): None,  # a swap: buy b_1_0 (round 0), give b_0_0 (round 0)
    ("artifacts/demo_transcript.md", 15): "offer 'o_1' does not exist",  # ids here: o0, o1 ...
    ("artifacts/demo_transcript.md", 22): "offer 'o_2' does not exist",
    ("artifacts/demo_transcript.md", 43): "'b_1_0' is bidder_1's block",  # not lab 0's to run
    ("artifacts/demo_transcript.md", 57): None,
    ("data/sft_traces.jsonl", 6): "'b_1_0' is bidder_1's block",
    ("data/sft_traces.jsonl", 8): None,
    ("data/sft_traces.jsonl", 48): "'b_3_0' is bidder_3's block",  # pledge another lab's block
    ("tests/test_edge_cases.py", 227): "offer 'o_1' does not exist",
    ("tests/test_edge_cases.py", 48): None,
    ("tests/test_edge_cases.py", 52): "you have 0 reserved block(s)",  # nothing reserved yet
    ("tests/test_edge_cases.py", 87): None,
    ("tests/test_judge_hybrid.py", 30): None,
    ("tests/test_api.py", 21): None,
}
#: words of a refusal for format (what the market cannot read), never expected above
FORMAT_WORDS = ("unknown field", "not a block id", "no single offer", "has no ", "must be a")


def world(**overrides: Any) -> Any:
    env = make_env(rounds=3, labs__count=4, negotiation_turns=3, **overrides)
    env.reset(seed=0)
    jobs = [job(0, 2, 40.0, 2, job_id="j_0_0"), job(0, 2, 40.0, 2, job_id="j_0_1")]
    holdings = {(0, 0): 2, (0, 1): 1, (1, 0): 2, (2, 0): 1, (3, 0): 1}
    craft(env, budgets=[100.0] * 4, jobs={0: jobs}, holdings=holdings, capacity=0)
    assert env.agent_selection == "bidder_0"
    return env


def test_the_data_holds_fourteen_payloads_in_both_forms() -> None:
    assert len(PAYLOADS) == 14 == len(EXPECTED)
    assert {(p["source"], p["line"]) for p in PAYLOADS} == set(EXPECTED)
    for p in PAYLOADS:  # the full form is the compact one with every other field null
        assert {k: v for k, v in p["full"].items() if v is not None} == p["compact"]
        assert len(p["full"]) == 10


@pytest.mark.parametrize("form", ["compact", "full"])
@pytest.mark.parametrize("p", PAYLOADS, ids=[f"{p['source']}:{p['line']}" for p in PAYLOADS])
def test_every_verbatim_payload_runs_or_is_refused_for_a_domain_reason(
    p: dict[str, Any], form: str
) -> None:
    env = world()
    env.step(p[form])
    info = env.infos["bidder_0"]
    expected = EXPECTED[(p["source"], p["line"])]
    if expected is None:
        assert "error" not in info, info.get("error")
    else:
        error = str(info["error"])
        assert expected in error and "\n" not in error
        assert not any(w in error for w in FORMAT_WORDS), error


def test_the_verbatim_swap_moves_both_legs_and_the_payment() -> None:
    swap = PAYLOADS[0]["compact"]  # b_0_0 for b_1_0, lab 0 pays 2.0 on top
    assert swap["requested_block_ids"] and swap["block_ids"]
    env = make_env(rounds=3, labs__count=2, negotiation_turns=2)
    env.reset(seed=0)
    # lab 0's first block is of round 1, lab 1's of round 0: a swap across rounds
    craft(env, budgets=[100.0, 100.0], jobs={}, holdings={(0, 1): 1, (1, 0): 2}, capacity=0)
    env.step(swap)
    offer = env.book.offers["o0"]
    assert (offer.side, offer.blocks, offer.delivery_round, offer.price) == ("buy", 1, 0, 2.0)
    assert (offer.give_blocks, offer.give_round) == (1, 1)
    seen = env.observe("bidder_1").offers_received[0]
    assert (seen.give_blocks, seen.give_round) == (1, 1)  # the recipient sees both legs
    env.step({"action_type": "accept_offer", "offer_id": "o0"})
    assert env.infos["bidder_1"]["result"]["status"] == "accepted"
    w = env.world
    assert (w.labs[0].budget, w.labs[1].budget) == (98.0, 102.0)
    assert (int(w.holdings[0, 0]), int(w.holdings[1, 0])) == (1, 1)  # round 0 moved now
    (k,) = env.book.contracts  # round 1's block is a forward contract, lab 0 -> lab 1, no price
    assert (k.seller, k.buyer, k.blocks, k.delivery_round, k.price) == (0, 1, 1, 1, 0.0)


def test_a_swap_the_sender_cannot_cover_is_refused_and_changes_nothing() -> None:
    env = make_env(rounds=3, labs__count=2, negotiation_turns=2)
    env.reset(seed=0)
    craft(env, budgets=[100.0, 100.0], jobs={}, holdings={(1, 0): 2}, capacity=0)
    env.step({"action_type": "send_offer", "to": "bidder_1", "side": "buy", "blocks": 1,
              "price": 2.0, "give_blocks": 1, "give_round": 1})  # fmt: skip
    assert "own 0 uncommitted block(s) for round 1" in env.infos["bidder_0"]["error"]
    assert env.book.offers == {}


def test_a_swap_counter_carries_its_give_leg() -> None:
    env = make_env(rounds=3, labs__count=2, negotiation_turns=2)
    env.reset(seed=0)
    craft(env, budgets=[100.0, 100.0], jobs={}, holdings={(0, 0): 1, (1, 0): 2}, capacity=0)
    env.step({"action_type": "wait"})  # bidder_0
    env.step({"action_type": "send_offer", "to": "bidder_0", "blocks": 1, "price": 9.0})
    counter = {**PAYLOADS[8]["full"], "offer_id": "o0"}  # the arena's counter, on our offer id
    env.step(counter)
    assert "error" not in env.infos["bidder_0"], env.infos["bidder_0"].get("error")
    o = env.book.offers["o1"]
    assert (o.sender, o.recipient, o.side, o.blocks, o.price) == (0, 1, "buy", 1, 1.0)
    assert (o.give_blocks, o.give_round, o.countered_from) == (1, 0, "o0")


def test_block_level_reservation_allocation_and_pledge_map_to_counts() -> None:
    ctx = BlockContext(me=0, now=0, holdings=[2, 1])  # b_0_0, b_0_1: round 0; b_0_2: round 1
    alloc = from_arena({"action_type": "allocate_to_job", "block_ids": ["b_0_1", "b_0_0"],
                        "job_id": "j_0_1"}, ctx)  # fmt: skip
    assert isinstance(alloc, actions.AllocateToJob) and alloc.blocks == 2
    later = from_arena({"action_type": "allocate_to_job", "block_ids": ["b_0_0", "b_0_2"],
                        "job_id": "j_0_1"}, ctx)  # fmt: skip
    assert isinstance(later, actions.ReserveCapacity)
    assert (later.block_ids, later.job_id) == (["r0", "r1"], "j_0_1")
    pledge = from_arena(
        {"action_type": "commit_to_coalition", "coalition_id": "c0", "block_ids": ["b_0_2"]}, ctx
    )
    assert isinstance(pledge, actions.CommitToCoalition) and pledge.pledge_blocks == 1
    # the market's own ids (DeliveryView.failed_block_ids' form) read the same way
    own = from_arena({"action_type": "reserve_capacity", "block_ids": ["r1/bidder_0/0"]}, ctx)
    assert isinstance(own, actions.ReserveCapacity) and own.block_ids == ["r1"]
    # an observation is a context too: its holdings give the ids
    env = world()
    obs = env.observe("bidder_0")
    assert BlockContext.of_observation(obs).my_ids() == ["b_0_0", "b_0_1", "b_0_2"]
    assert from_arena(PAYLOADS[9]["full"], obs).block_ids == ["r0"]


def test_verbatim_reserve_then_release_round_trips() -> None:
    env = world()
    env.step(PAYLOADS[9]["compact"])  # reserve b_0_0 for j_0_0
    assert env.infos["bidder_0"]["result"] == {"reserved": {"r0": 1}, "job_id": "j_0_0"}
    assert env.book.reserved.blocks(0, 0) == 1
    for _ in range(3):  # bidder_1 .. bidder_3 pass
        env.step({"action_type": "wait"})
    env.step(PAYLOADS[10]["full"])  # release b_0_0
    assert "error" not in env.infos["bidder_0"]
    assert env.book.reserved.blocks(0, 0) == 0


# --- units by context ------------------------------------------------------------------------

#: the DAEDALUS designer card's mechanism JSON (its section 1), verbatim
CARD = """{ "auction_type": "second_price", "reserve_price": 0.18, "reveal_reserve": false,
"reveal_competing_bids": false, "reveal_winner_identity": true, "reveal_clearing_price": true,
"reveal_bid_distribution": false, "shill_penalty": 1.2, "withdrawal_penalty": 0.6,
"collusion_penalty": 1.9, "coalition_policy": "penalize_suspected" }"""


def design(scenario: str, action: object, **overrides: Any) -> tuple[Any, dict[str, Any]]:
    env = market.raw_env(scenario, **overrides)
    env.reset(seed=0)
    assert env.agent_selection == DESIGNER
    env.step(action)
    return env, env.infos[DESIGNER]


@pytest.mark.parametrize("stage", range(5))
def test_the_cards_json_runs_unchanged_in_the_daedalus_family(stage: int) -> None:
    env, info = design(f"daedalus_stage_{stage}", CARD)
    assert "error" not in info, info.get("error")
    assert env.scenario.mechanism_units == "daedalus"
    v = env.scenario.jobs.value_per_block[1]  # 1 on DAEDALUS's scale
    assert env.mechanism.reserve_price == pytest.approx(0.18 * v)
    assert env.mechanism.collusion_penalty == pytest.approx(1.9 * v)
    assert env.mechanism.auction_type == "second_price"


def test_credits_elsewhere_with_units_to_override() -> None:
    # a credits scenario: the card's bare JSON gets the hint, units daedalus converts it
    env, info = design("daedalus_stage_0", CARD, mechanism_units="credits")
    assert '"units": "daedalus"' in info["error"]
    env, info = design("daedalus_stage_0", {**json.loads(CARD), "units": "daedalus"},
                       mechanism_units="credits")  # fmt: skip
    assert env.mechanism.reserve_price == pytest.approx(0.18 * 45.0)
    # and in the daedalus family, "units": "credits" gives credits
    env, info = design("daedalus_stage_0", {"reserve_price": 8.1, "units": "credits"})
    assert "error" not in info and env.mechanism.reserve_price == pytest.approx(8.1)


@pytest.mark.parametrize(
    "sent, words",
    [
        ({"reserve_price": 8.1}, "reserve_price 8.1 is above 1"),
        ({"collusion_penalty": 30.0}, "collusion_penalty 30 is above DAEDALUS's penalty range"),
    ],
)
def test_a_credit_value_in_daedalus_units_gets_a_one_line_hint(
    sent: dict[str, float], words: str
) -> None:
    env, info = design("daedalus_stage_0", sent)
    error = str(info["error"])
    assert words in error and "mechanism_units" in error and '"units": "credits"' in error
    assert "\n" not in error


def test_default_units_are_only_a_default() -> None:
    update = MechanismUpdate.model_validate({"reserve_price": 0.5})
    assert update.in_credits(40.0, "daedalus")[0].reserve_price == pytest.approx(20.0)
    assert update.in_credits(40.0, "credits")[0].reserve_price == pytest.approx(0.5)
    explicit = MechanismUpdate.model_validate({"reserve_price": 0.5, "units": "credits"})
    assert explicit.in_credits(40.0, "daedalus")[0].reserve_price == pytest.approx(0.5)
    assert parse_action(CARD, designer=True).mechanism.units is None  # read by the scenario
