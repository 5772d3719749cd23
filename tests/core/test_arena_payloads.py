"""GPU-arena action payloads parse unchanged as documented aliases of ours (market/core/arena.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from support import craft, make_env

from market.core.actions import ACTION_TYPES, ActionParseError, parse_action
from market.core.arena import ARENA_FIELDS, ARENA_KEYS, arena_table
from market.core.arena_payloads import BlockContext

#: lab 0 in round 0 holding 2 blocks of round 0 and 1 of round 1: b_0_0, b_0_1 are round 0's
CTX = BlockContext(me=0, now=0, holdings=[2, 1])

ROOT = Path(__file__).resolve().parents[2]
NULLS = dict.fromkeys(ARENA_KEYS)  # the arena sends every field, unused ones null


def arena(kind: str, **fields: Any) -> dict[str, Any]:
    return {"action_type": kind, **NULLS, **fields}


def test_every_arena_action_type_exists_here_and_the_docs_table_is_current() -> None:
    assert len(ARENA_FIELDS) == 14 and set(ARENA_FIELDS) <= set(ACTION_TYPES)
    assert {f for fields in ARENA_FIELDS.values() for f in fields} == set(ARENA_KEYS)
    assert arena_table() in (ROOT / "docs" / "actions.md").read_text(), (
        "docs/actions.md's GPU-arena table is stale: paste market.core.arena.arena_table()"
    )


# one payload per (arena action, arena field) of ARENA_FIELDS, and the fields it must become
CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    (
        "send_offer",
        "target_lab_id",
        dict(target_lab_id="lab_2", block_ids=["r1"], payment=5),
        dict(to="bidder_2"),
    ),
    (
        "send_offer",
        "block_ids",
        dict(target_lab_id=1, block_ids=["r3", "r3"], payment=5),
        dict(side="sell", blocks=2, delivery_round=3),
    ),
    (
        "send_offer",
        "requested_block_ids",
        dict(target_lab_id="lab_1", requested_block_ids=["R4"], payment=5),
        dict(side="buy", blocks=1, delivery_round=4),
    ),
    (
        "send_offer",
        "payment",
        dict(target_lab_id="lab_1", block_ids=["r0"], payment=12.5),
        dict(price=12.5),
    ),
    (
        "send_offer",
        "message",
        dict(target_lab_id="lab_1", block_ids=["r0"], payment=1, message="hi"),
        dict(message="hi"),
    ),
    (
        "send_offer",
        "conditions",
        dict(target_lab_id="lab_1", block_ids=["r0"], payment=1, conditions={"a": 1}),
        dict(conditions={"a": 1}),
    ),
    ("accept_offer", "offer_id", dict(offer_id="o3"), dict(offer_id="o3")),
    ("reject_offer", "offer_id", dict(offer_id="o3"), dict(offer_id="o3")),
    (
        "counter_offer",
        "target_lab_id",
        dict(offer_id="o3", target_lab_id="lab_1", block_ids=["r1"], payment=2),
        dict(offer_id="o3", blocks=1),
    ),
    (
        "counter_offer",
        "offer_id",
        dict(offer_id="o3", block_ids=["r1"], payment=2),
        dict(offer_id="o3"),
    ),
    (
        "counter_offer",
        "block_ids",
        dict(offer_id="o3", block_ids=["r1", "r1", "r1"], payment=2),
        dict(blocks=3),
    ),
    (
        "counter_offer",
        "requested_block_ids",
        dict(offer_id="o3", requested_block_ids=["r1"], payment=2),
        dict(blocks=1),
    ),
    ("counter_offer", "payment", dict(offer_id="o3", block_ids=["r1"], payment=7), dict(price=7.0)),
    (
        "counter_offer",
        "message",
        dict(offer_id="o3", block_ids=["r1"], payment=7, message="m"),
        dict(message="m"),
    ),
    (
        "counter_offer",
        "conditions",
        dict(offer_id="o3", block_ids=["r1"], payment=7, conditions={}),
        dict(conditions={}),
    ),
    ("make_pitch", "message", dict(message="urgent"), dict(text="urgent")),
    ("make_pitch", "job_id", dict(message="urgent", job_id="job1"), dict(job_id="job1")),
    (
        "make_pitch",
        "requested_block_ids",
        dict(message="urgent", requested_block_ids=["r0", "r0"]),
        dict(blocks_requested=2),
    ),
    (
        "counter_pitch",
        "target_lab_id",
        dict(target_lab_id="lab_0", message="no"),
        dict(target="bidder_0"),
    ),
    ("counter_pitch", "message", dict(target_lab_id="lab_0", message="no"), dict(text="no")),
    ("reserve_capacity", "block_ids", dict(block_ids=["r1", "r2"]), dict(block_ids=["r1", "r2"])),
    ("reserve_capacity", "job_id", dict(block_ids=["r1"], job_id="job0"), dict(job_id="job0")),
    ("release_capacity", "block_ids", dict(block_ids=["r1"]), dict(block_ids=["r1"])),
    ("form_coalition", "target_lab_id", dict(target_lab_id="lab_3"), dict(members=["bidder_3"])),
    (
        "form_coalition",
        "message",
        dict(target_lab_id="lab_3", message="pool"),
        dict(purpose="pool"),
    ),
    ("form_coalition", "payment", dict(target_lab_id="lab_3", payment=20), dict(contribution=20.0)),
    ("commit_to_coalition", "coalition_id", dict(coalition_id="c1"), dict(coalition_id="c1")),
    ("commit_to_coalition", "payment", dict(coalition_id="c1", payment=9), dict(contribution=9.0)),
    (
        "commit_to_coalition",
        "block_ids",
        dict(coalition_id="c1", block_ids=["b_0_0", "b_0_2"]),
        dict(pledge_blocks=2),
    ),
    ("allocate_to_job", "job_id", dict(job_id="job2", block_ids=["r0"]), dict(job_id="job2")),
    ("allocate_to_job", "block_ids", dict(job_id="job2", block_ids=["r0", "r0"]), dict(blocks=2)),
    (
        "send_message",
        "target_lab_id",
        dict(target_lab_id="lab_1", message="x"),
        dict(to="bidder_1"),
    ),
    ("send_message", "message", dict(message="x"), dict(to="all", text="x")),
]


def test_the_cases_cover_every_arena_field() -> None:
    assert {(k, f) for k, f, _, _ in CASES} == {
        (k, f) for k, fields in ARENA_FIELDS.items() for f in fields
    }


@pytest.mark.parametrize(
    "kind, field, payload, expected", CASES, ids=[f"{c[0]}.{c[1]}" for c in CASES]
)
def test_arena_field_becomes_ours(
    kind: str, field: str, payload: dict[str, Any], expected: dict[str, Any]
) -> None:
    action = parse_action(arena(kind, **payload), blocks=CTX)
    assert action.action_type == kind
    assert {k: getattr(action, k) for k in expected} == expected


@pytest.mark.parametrize("kind", ["wait", "finish"])
def test_all_null_payloads(kind: str) -> None:
    assert parse_action(arena(kind)).action_type == kind


@pytest.mark.parametrize(
    "payload, message",
    [
        (
            arena("send_offer", target_lab_id="lab_1", block_ids=["r1", "r2"], payment=1),
            "the arena's offer over blocks of several rounds has no single offer here",
        ),
        (
            arena(
                "send_offer",
                target_lab_id="lab_1",
                block_ids=["b_0_0", "b_0_2"],
                requested_block_ids=["b_1_0"],
                payment=1,
            ),
            "the arena's swap offer over blocks of several rounds",
        ),
        (
            arena("send_offer", target_lab_id="lab_1", block_ids=["b_0_1"], payment=1),
            "arena block id 'b_0_1' names a position in a lab's holdings",
        ),
        (
            arena("send_offer", target_lab_id="lab_1", block_ids=["b_0_0", "b_0_0"], payment=1),
            "names block 'b_0_0' twice",
        ),
        (
            arena("send_offer", target_lab_id="lab_1", block_ids=["blk7"], payment=1),
            "'blk7' is not a block id",
        ),
        (
            arena("send_offer", target_lab_id="lab_1", requested_block_ids=["b_2_0"], payment=1),
            "'b_2_0' is bidder_2's block, not the target's (bidder_1)",
        ),
        (arena("wait", message="hello"), "unknown field 'message'"),
    ],
)
def test_arena_payloads_that_cannot_mean_anything_here(
    payload: dict[str, Any], message: str
) -> None:
    ctx = None if "position" in message else CTX
    with pytest.raises(ActionParseError, match=re.escape(message)) as err:
        parse_action(payload, blocks=ctx)
    assert "\n" not in str(err.value)


def test_arena_offer_plays_in_the_env_and_reports_ignored_conditions() -> None:
    env = make_env(rounds=3, negotiation_turns=2)
    env.reset(seed=0)
    craft(env, budgets=[100.0, 100.0], jobs={}, holdings={(0, 2): 2}, capacity=0)
    env.step(
        arena(
            "send_offer",
            target_lab_id="lab_1",
            block_ids=["r2", "r2"],
            payment=30,
            conditions={"sla": "99%"},
        )
    )
    assert env.infos["bidder_0"]["result"] == {"offer_id": "o0", "conditions_ignored": ["sla"]}
    offer = env.book.offers["o0"]
    assert (offer.recipient, offer.side, offer.blocks, offer.delivery_round, offer.price) == (
        1,
        "sell",
        2,
        2,
        30.0,
    )
    env.step(arena("accept_offer", offer_id="o0"))
    assert env.infos["bidder_1"]["result"]["status"] == "accepted"
    env.step(arena("send_offer", target_lab_id="lab_7", requested_block_ids=["r1"], payment=1))
    assert "'bidder_7' does not exist" in env.infos["bidder_0"]["error"]
