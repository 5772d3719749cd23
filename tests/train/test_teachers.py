"""The copyable teacher (market/train/teachers.py) and the spacing of SFT replies: the teacher's
bid is read off the LLM seat's own prompt, and the replies trained on are spaced as the decision
grammar decodes them (docs/training.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import market
from agents.llm.prompts import user_message
from agents.registry import AgentSpecError, make_agent
from market.environment import Observation
from market.train.llm_config import load_config
from market.train.llm_train import decoded_form
from market.train.teachers import CopyableBidder

SUGGESTION = re.compile(r"worth to you would be (\{.*\})\.")


def play_bidder_0(
    scenario: str, seed: int, decide: Callable[[Observation], dict[str, Any]]
) -> None:
    """One episode of ``scenario``: ``decide`` plays bidder_0, every other seat waits."""
    env = market.raw_env(scenario)
    env.reset(seed=seed)
    for seat in env.agent_iter():
        obs, _reward, term, trunc, _info = env.last()
        if term or trunc:
            env.step(None)
        else:
            env.step(decide(obs) if seat == "bidder_0" else {"action_type": "wait"})


def bidding_observations(seeds: range) -> list[Observation]:
    """Every bidder_0 bidding observation of market_round over ``seeds``, the teacher playing
    bidder_0 and the other seats waiting."""
    out: list[Observation] = []
    teacher = CopyableBidder()

    def decide(obs: Observation) -> dict[str, Any]:
        if obs.phase == "bidding":
            out.append(obs)
        return teacher.act(obs).model_dump()

    for seed in seeds:
        play_bidder_0("market_round", seed, decide)
    return out


def test_the_teachers_bid_is_the_prompts_suggestion_capped_after_the_first_unit() -> None:
    observations = bidding_observations(range(12))
    assert len(observations) >= 40
    capped_somewhere = 0
    for cap in (8.0, 20.0):
        teacher = CopyableBidder(cap=cap)
        for obs in observations:
            match = SUGGESTION.search(user_message(obs))
            assert match, "every bidding prompt states the suggested bid"
            shown = json.loads(match.group(1))["bids"]
            expected = shown[:1] + [min(v, cap) for v in shown[1:]]
            bids = teacher.act(obs).model_dump()["bids"]
            assert bids == expected[: max(1, obs.capacity)] or (not shown and bids == [])
            capped_somewhere += any(v > cap for v in shown[1:])
    assert capped_somewhere > 0  # the cap was exercised, not only copied through


def test_the_teacher_waits_outside_bidding_and_rejects_a_bad_cap() -> None:
    env = market.raw_env("market_round")
    env.reset(seed=0)
    for seat in env.agent_iter():
        obs, *_ = env.last()
        if seat == "bidder_0" and obs.phase == "negotiation":
            assert CopyableBidder().act(obs).model_dump(exclude_none=True) == {
                "action_type": "wait"
            }
            break
        env.step({"action_type": "wait"})
    else:
        pytest.fail("bidder_0 never negotiated")
    with pytest.raises(ValueError, match="cap must be at least 0"):
        CopyableBidder(cap=-1)
    with pytest.raises(ValueError, match="cap must be a number"):
        CopyableBidder(cap="lots")
    assert make_agent("py:market.train.teachers:CopyableBidder?cap=12").cap == 12.0
    with pytest.raises((AgentSpecError, ValueError)):
        make_agent("py:market.train.teachers:CopyableBidder?cap=-3")


def test_sft_replies_are_spaced_as_the_decision_grammar_decodes_them() -> None:
    compact = {"role": "assistant", "content": '{"action_type":"bid","bids":[37.59,8.0]}'}
    spaced = decoded_form(compact)
    assert spaced["role"] == "assistant"
    assert spaced["content"] == '{"action_type": "bid", "bids": [37.59, 8.0]}'
    assert json.loads(spaced["content"]) == json.loads(compact["content"])
    prose = {"role": "assistant", "content": "I wait."}
    assert decoded_form(prose) == prose


def test_the_shipped_configs_train_on_the_copyable_teacher() -> None:
    root = Path(__file__).resolve().parents[2]
    for path in (
        root / "market" / "train" / "configs" / "smollm2_market_round.toml",
        root / "docs" / "training" / "copyable_sft.toml",
        root / "docs" / "training" / "copyable_grpo.toml",
    ):
        cfg = load_config(path)
        assert cfg.data.teacher == "py:market.train.teachers:CopyableBidder", path
        assert isinstance(make_agent(cfg.data.teacher), CopyableBidder)


def test_a_list_of_caps_draws_one_per_decision_from_the_seeded_stream() -> None:
    observations = bidding_observations(range(12))
    caps = (0.0, 4.0, 16.0)
    teacher = make_agent("py:market.train.teachers:CopyableBidder?cap=0|4|16")
    assert isinstance(teacher, CopyableBidder) and teacher.caps == caps
    teacher.reset(7)
    first = [teacher.act(o).model_dump()["bids"] for o in observations]
    teacher.reset(7)
    assert [teacher.act(o).model_dump()["bids"] for o in observations] == first  # seeded
    used = set()
    for obs, bids in zip(observations, first, strict=True):
        shown = json.loads(SUGGESTION.search(user_message(obs)).group(1))["bids"]  # type: ignore[union-attr]
        fits = [
            c
            for c in caps
            if bids == (shown[:1] + [min(v, c) for v in shown[1:]])[: max(1, obs.capacity)]
        ]
        assert fits, f"{bids} is the suggestion {shown} under none of the caps {caps}"
        if len(fits) == 1:
            used.add(fits[0])
    assert used == set(caps)  # every cap was drawn on some decision
    with pytest.raises(ValueError, match="numbers joined by"):
        CopyableBidder(cap="4|lots")


def test_the_copyable_expert_negotiates_as_rule_expert_and_bids_the_copyable_bid() -> None:
    """A rule_expert fed the same observations beside it proposes every action the copyable
    expert plays, except that each of its bids is replaced by the copyable bid."""
    from agents.population.expert import RuleExpert
    from market.core.actions import Bid
    from market.train.teachers import CopyableExpert, copyable_bids

    played: dict[str, int] = {}
    for seed in range(3):
        teacher, shadow = CopyableExpert(cap=8), RuleExpert()
        teacher.reset(seed), shadow.reset(seed)

        def decide(obs: Observation) -> dict[str, Any]:
            action, expected = teacher.act(obs), shadow.act(obs)  # noqa: B023 (called now)
            if isinstance(expected, Bid):
                bids = copyable_bids(obs, 8.0)[: max(1, obs.capacity)]
                assert action.model_dump()["bids"] == bids
            else:
                assert action.model_dump() == expected.model_dump()
            played[action.action_type] = played.get(action.action_type, 0) + 1
            return action.model_dump()

        play_bidder_0("coalition_market", seed, decide)
    assert played.get("bid", 0) > 0
    talk = set(played) - {"bid", "wait", "allocate_to_job"}
    assert talk, f"the copyable expert never negotiated: {played}"


def test_every_device_config_in_the_docs_loads_and_names_an_agent_that_exists() -> None:
    """The configs docs/training.md ran with stay valid as the config schema moves."""
    configs = sorted((Path(__file__).resolve().parents[2] / "docs" / "training").glob("*.toml"))
    assert len(configs) >= 10
    for path in configs:
        cfg = load_config(path)
        make_agent(cfg.data.teacher)
        for spec in cfg.eval.baselines:
            make_agent(spec)
