"""DAEDALUS units on the designer seat: the ``units`` field, its conversion to credits on the
scenario's value scale, the clear error for a bare DAEDALUS JSON, and ``rounds_per_design``."""

from __future__ import annotations

import json

import pytest

import market
from agents.llm.prompts import legal_action_schema
from agents.population import DAEDALUS_ROBUST
from market.core.actions import MechanismUpdate, parse_action
from market.core.seats import DESIGNER
from scenarios import ScenarioError, load_scenario

# the card's mechanism as a DAEDALUS designer sends it: flat, without our units field
BARE = {k: v for k, v in DAEDALUS_ROBUST.items() if k != "units"}


def design_step(action: object, **overrides: object) -> tuple[object, dict[str, object]]:
    """A fresh daedalus_stage_0 env (plus overrides) after the designer's first action."""
    env = market.raw_env("daedalus_stage_0", **overrides)
    env.reset(seed=0)
    assert env.agent_selection == DESIGNER and env.phase == "design"
    env.step(action)
    return env, env.infos[DESIGNER]


def test_daedalus_units_convert_on_the_top_of_the_value_range() -> None:
    # reserve 0.18 of the highest value per block (45 credits) is 8.1 credits per block
    env, info = design_step({**DAEDALUS_ROBUST})
    assert "error" not in info
    assert env.mechanism.reserve_price == pytest.approx(0.18 * 45.0)
    assert env.mechanism.auction_type == "second_price"
    assert env.mechanism.reveal_winner_identity is True and env.mechanism.reveal_reserve is False
    result = info["result"]
    assert result["units"] == "daedalus" and result["value_scale"] == 45.0
    assert result["converted"]["reserve_price"] == [0.18, pytest.approx(8.1)]
    # every money field converts with the same factor (penalties too)
    env, _ = design_step(
        {"units": "daedalus", "reserve_price": 0.5, "collusion_penalty": 2.0, "shill_penalty": 1.0}
    )
    assert env.mechanism.reserve_price == pytest.approx(22.5)
    assert env.mechanism.collusion_penalty == pytest.approx(90.0)
    assert env.mechanism.shill_penalty == pytest.approx(45.0)


def test_the_value_scale_is_the_scenarios() -> None:
    env, _ = design_step(
        {"units": "daedalus", "reserve_price": 0.18}, jobs__value_per_block=[10.0, 20.0]
    )
    assert env.mechanism.reserve_price == pytest.approx(3.6)
    # zero stays zero: "no reserve" in DAEDALUS units is no reserve here
    env, _ = design_step({"units": "daedalus", "reserve_price": 0.0})
    assert env.mechanism.reserve_price == 0.0


def test_a_bare_daedalus_json_is_a_clear_error_where_credits_are_the_default() -> None:
    before = market.raw_env("daedalus_stage_0", mechanism_units="credits")
    before.reset(seed=0)
    env, info = design_step(json.dumps(BARE), mechanism_units="credits")
    error = str(info["error"])
    assert '"units": "daedalus"' in error and "8.10 credits" in error and "\n" not in error
    assert env.mechanism == before.mechanism  # nothing applied
    assert env.infos[DESIGNER]["reward_components"] == {
        "invalid_action": -env.scenario.rewards.invalid_action_penalty
    }


def test_explicit_credits_and_ordinary_credit_updates_are_left_alone() -> None:
    env, info = design_step({**BARE, "units": "credits"})
    assert "error" not in info and env.mechanism.reserve_price == pytest.approx(0.18)
    # a small reserve in credits without DAEDALUS's penalty fields is not the signature
    env, info = design_step(
        {"reserve_price": 0.5, "auction_type": "second_price"}, mechanism_units="credits"
    )
    assert "error" not in info and env.mechanism.reserve_price == pytest.approx(0.5)
    assert "units" not in info["result"]
    # nor is one with a field DAEDALUS lacks, or an auction type it lacks
    assert not MechanismUpdate.model_validate(
        {**BARE, "judge_pool_share": 0.1}
    ).daedalus_signature()
    assert not MechanismUpdate.model_validate(
        {**BARE, "auction_type": "fair_share"}
    ).daedalus_signature()
    assert MechanismUpdate.model_validate(BARE).daedalus_signature()
    # penalties outside DAEDALUS's [0, 3] range are credits
    assert not MechanismUpdate.model_validate(
        {**BARE, "collusion_penalty": 30.0}
    ).daedalus_signature()


def test_a_normalised_reserve_above_one_is_refused() -> None:
    env, info = design_step({"units": "daedalus", "reserve_price": 4.5})
    assert "above 1" in str(info["error"])
    assert env.mechanism.reserve_price == pytest.approx(4.5)  # the scenario's, unchanged


def test_units_is_in_the_designers_schema_and_parses_in_both_forms() -> None:
    text = json.dumps(legal_action_schema(["set_mechanism", "wait"], designer=True))
    assert '"units"' in text and "daedalus" in text and "value_per_block" in text
    flat = parse_action({"units": "daedalus", "reserve_price": 0.2}, designer=True)
    nested = parse_action(
        {"action_type": "set_mechanism", "mechanism": {"units": "daedalus", "reserve_price": 0.2}}
    )
    assert flat == nested and flat.mechanism.units == "daedalus"


def designer_rounds(**overrides: object) -> list[int]:
    env = market.raw_env("daedalus_stage_0", **overrides)
    env.reset(seed=1)
    acted: list[int] = []
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        if agent == DESIGNER:
            acted.append(env.round)
            env.step({"units": "daedalus", "reserve_price": 0.1 * (len(acted))})
        else:
            env.step({"action_type": "wait"})
    return acted


def test_rounds_per_design_gives_the_designer_one_turn_per_step() -> None:
    assert designer_rounds(rounds=12) == [0, 5, 10]  # the family's 5 rounds per design step
    assert designer_rounds(rounds=4, rounds_per_design=1) == [0, 1, 2, 3]
    assert designer_rounds(rounds=4, rounds_per_design=3) == [0, 3]
    assert designer_rounds(rounds=4, mechanism_every="episode") == [0]


def test_the_mechanism_holds_for_the_whole_design_step() -> None:
    env = market.raw_env("daedalus_stage_0", rounds=10)
    env.reset(seed=2)
    reserves: dict[int, float] = {}
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        if agent == DESIGNER:
            env.step({"units": "daedalus", "reserve_price": 0.1 if env.round == 0 else 0.3})
        else:
            reserves[env.round] = env.mechanism.reserve_price
            env.step({"action_type": "wait"})
    assert {r: reserves[r] for r in range(10)} == {
        **dict.fromkeys(range(5), pytest.approx(4.5)),
        **dict.fromkeys(range(5, 10), pytest.approx(13.5)),
    }


def test_rounds_per_design_is_validated() -> None:
    with pytest.raises(ScenarioError, match="rounds_per_design"):
        load_scenario("daedalus_stage_0", rounds_per_design=0)
