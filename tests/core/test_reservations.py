"""reserve_capacity / release_capacity: reserved blocks are not for sale, reservations are atomic,
job reservations run first, the observation, masks and LLM schema show them."""

from __future__ import annotations

import re
from typing import Any

import pytest
from support import craft, job, make_env

from agents.llm.prompts import legal_action_schema
from market.core.actions import ACTION_TYPES, ActionParseError, ReserveCapacity, parse_action
from market.core.phases import LEGAL
from market.environment.wrappers import MENU_NAMES, action_mask


def _env(rounds: int = 3, holdings: dict[tuple[int, int], int] | None = None, **kw: Any) -> Any:
    env = make_env(rounds=rounds, negotiation_turns=5, **kw)
    env.reset(seed=0)
    craft(
        env,
        budgets=[100.0, 100.0],
        jobs={0: [job(0, 2, 60.0, rounds - 1, "a"), job(0, 2, 20.0, rounds - 1, "b")]},
        holdings=holdings if holdings is not None else {(0, 0): 3, (0, 1): 2},
        capacity=0,
    )
    return env


def _step(env: Any, action: Any) -> dict[str, Any]:
    agent = env.agent_selection
    env.step(action)
    return dict(env.infos[agent])


def test_new_action_types_are_legal_in_negotiation_and_in_the_llm_schema() -> None:
    assert {"reserve_capacity", "release_capacity"} <= set(ACTION_TYPES)
    assert {"reserve_capacity", "release_capacity"} <= set(LEGAL["negotiation"])
    assert "reserve_capacity" not in LEGAL["bidding"]
    schema = str(legal_action_schema(("reserve_capacity", "release_capacity"), False))
    assert "reserve_capacity" in schema and "release_capacity" in schema and "'blocks'" in schema
    assert "block_ids" not in schema  # the arena's id lists are accepted, not taught to models


def test_reserved_blocks_cannot_be_offered_and_release_frees_them() -> None:
    env = _env()
    info = _step(env, {"action_type": "reserve_capacity", "blocks": 2})
    assert info["result"] == {"reserved": {"r0": 2}, "job_id": None}, info
    assert env.book.reserved.blocks(0, 0) == 2
    # bidder_1 acts; then bidder_0 tries to sell 2 of its 3 blocks: only 1 is unreserved
    _step(env, {"action_type": "wait"})
    info = _step(env, {"action_type": "send_offer", "to": "bidder_1", "blocks": 2, "price": 10})
    assert "1 uncommitted block(s) for round 0 (and 2 reserved" in info["error"]
    _step(env, {"action_type": "wait"})
    info = _step(env, {"action_type": "release_capacity", "blocks": 1})
    assert info["result"] == {"released": {"r0": 1}}
    _step(env, {"action_type": "wait"})
    info = _step(env, {"action_type": "send_offer", "to": "bidder_1", "blocks": 2, "price": 10})
    assert "error" not in info and info["result"]["offer_id"] == "o0"


def test_reserving_after_offering_voids_the_offer_at_acceptance() -> None:
    env = _env()
    _step(env, {"action_type": "send_offer", "to": "bidder_1", "blocks": 3, "price": 30})
    _step(env, {"action_type": "wait"})
    before = [lab.budget for lab in env.world.labs]
    _step(env, {"action_type": "reserve_capacity", "blocks": 1})
    info = _step(env, {"action_type": "accept_offer", "offer_id": "o0"})
    assert info["result"]["status"] == "void"  # the seller can no longer deliver its 3 blocks
    assert [lab.budget for lab in env.world.labs] == before
    assert env.world.holdings[0, 0] == 3 and env.world.holdings[1, 0] == 0


def test_reserved_blocks_cannot_accept_a_buy_offer_or_a_counter() -> None:
    env = _env()
    _step(env, {"action_type": "reserve_capacity", "blocks": 3})
    _step(
        env, {"action_type": "send_offer", "to": "bidder_0", "side": "buy", "blocks": 1, "price": 9}
    )
    info = _step(env, {"action_type": "accept_offer", "offer_id": "o0"})
    assert "0 uncommitted block(s) for round 0 (and 3 reserved" in info["error"]
    _step(env, {"action_type": "wait"})
    info = _step(env, {"action_type": "counter_offer", "offer_id": "o0", "blocks": 1, "price": 20})
    assert "(and 3 reserved" in info["error"]
    assert env.world.holdings[0, 0] == 3


def test_reserve_is_atomic_and_names_the_offending_block() -> None:
    env = _env()
    digest = env.state_digest()
    info = _step(env, {"action_type": "reserve_capacity", "block_ids": ["r0", "r1", "r1", "r1"]})
    assert info["error"].startswith("block r1: you own 2 block(s) for round 1"), info["error"]
    assert env.book.reserved.blocks_by == {}  # nothing reserved, not even round 0's block
    assert env.state_digest() != digest  # only the turn moved on
    env2 = _env()
    _step(env2, {"action_type": "reserve_capacity", "block_ids": ["r0", "r1", "r1", "r1"]})
    assert env2.state_digest() == env.state_digest()
    _step(env, {"action_type": "wait"})
    info = _step(env, {"action_type": "release_capacity", "block_ids": ["r0"]})
    assert info["error"].startswith("block r0: you have 0 reserved block(s) for round 0")


def test_reserve_respects_forward_contracts_and_rounds() -> None:
    env = _env()
    _step(
        env,
        {
            "action_type": "send_offer",
            "to": "bidder_1",
            "blocks": 2,
            "price": 8,
            "delivery_round": 1,
        },
    )
    _step(env, {"action_type": "accept_offer", "offer_id": "o0"})
    info = _step(env, {"action_type": "reserve_capacity", "blocks": 1, "round": 1})
    assert "0 are neither reserved nor promised on a contract" in info["error"]
    _step(env, {"action_type": "wait"})
    info = _step(env, {"action_type": "reserve_capacity", "blocks": 1, "round": 7})
    assert "round 7 is not between the current round 0 and the last round 2" in info["error"]


@pytest.mark.parametrize(
    "raw, message",
    [
        (
            {"action_type": "reserve_capacity", "block_ids": ["b_0_1"]},
            "arena block id 'b_0_1' names a position",
        ),
        ({"action_type": "reserve_capacity", "block_ids": ["r1"], "blocks": 2}, "not both"),
        ({"action_type": "release_capacity", "blocks": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_reservations_do_not_parse(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ActionParseError, match=re.escape(message)):
        parse_action(raw)


def test_job_reservation_runs_that_job_first() -> None:
    """Three blocks, jobs a (2 blocks, 60) and b (2 blocks, 20), same deadline: earliest deadline
    first runs a first (tie broken by id). Reserving 2 blocks for b runs b to completion first."""
    for reserve, done in ((None, {"a"}), ("b", {"b"})):
        env = _env(rounds=1, holdings={(0, 0): 3})
        if reserve:
            _step(env, ReserveCapacity(blocks=2, job_id=reserve))
        while env.agents and not all(env.terminations.values()):
            _step(env, {"action_type": "wait"})
        jobs = {j.job_id: j for j in env.world.labs[0].jobs}
        assert {k for k, j in jobs.items() if j.status == "done"} == done
        assert sum(j.progress for j in jobs.values()) == 3


def test_reservations_end_with_their_round_and_show_in_the_observation() -> None:
    env = _env()
    _step(env, {"action_type": "reserve_capacity", "block_ids": ["r0", "r1"]})
    obs = env.observe("bidder_0")
    assert obs.holdings[:2] == [3, 2] and obs.reserved == [1, 1, 0]
    assert "reserved for your own jobs (not for sale): [1, 1, 0]" in obs.to_prompt()
    while env.round == 0:
        _step(env, {"action_type": "wait"})
    assert env.book.reserved.blocks_by == {(0, 1): 1}
    assert env.observe("bidder_0").reserved == [1, 0]


def test_mask_marks_reserve_and_release_exactly_when_valid() -> None:
    env = _env()
    obs = env.observe("bidder_0")
    mask = action_mask(obs)
    reserve, release = MENU_NAMES.index("reserve_for_jobs"), MENU_NAMES.index("release_reserved")
    assert mask[reserve] == 1 and mask[release] == 0
    _step(env, {"action_type": "reserve_capacity", "blocks": 3})
    _step(env, {"action_type": "wait"})
    mask = action_mask(env.observe("bidder_0"))
    assert mask[reserve] == 0 and mask[release] == 1  # all 3 blocks reserved already


def test_job_reservation_needs_an_active_job_of_ones_own() -> None:
    env = _env()
    info = _step(env, {"action_type": "reserve_capacity", "blocks": 1, "job_id": "nosuch"})
    assert "job_id 'nosuch' is not one of your active jobs" in info["error"]
    assert env.book.reserved.blocks_by == {}
