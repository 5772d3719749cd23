"""LLM training data: SFT export of recorded LLM decisions (byte for byte), scripted decisions
rendered with LLMAgent's own prompt, filters, CLI errors; and the GRPO reward (EnvReward) checked
against recorded rewards and against values computed by hand from docs/rewards.md."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents.llm.agent import LLMAgent, prompt_messages
from agents.llm.backends.base import Completion
from agents.scripted import TruthfulBidder, truthful_bid
from market.cli import main
from market.environment.observations import Observation
from market.record.transcript import TranscriptError, read_transcript
from market.run.rollout import run_episode
from market.train.grpo import EnvReward, parse_horizon
from market.train.training_data import ExportFilter, export_sft, grpo_records, select_decisions
from scenarios import load_scenario

INVALID = 0.05  # rewards.invalid_action_penalty (docs/rewards.md)
TALK = 0.01  # rewards.talk_cost


class PolicyBackend:
    """A fake chat model: ``policy(obs, attempt)`` gives the reply text. The agent hands it the
    observation (see :class:`PolicyLLM`); no network, no model."""

    model = "fake-policy"

    def __init__(self, policy: Callable[[Observation, int, int], str]) -> None:
        self.policy = policy
        self.obs: Observation | None = None
        self.decision = -1
        self.attempt = 0

    def complete(self, messages: list[dict[str, str]], schema: Any, params: Any) -> Completion:
        assert self.obs is not None
        text = self.policy(self.obs, self.decision, self.attempt)
        self.attempt += 1
        return Completion(text=text, model=self.model)

    async def acomplete(
        self, messages: list[dict[str, str]], schema: Any, params: Any
    ) -> Completion:
        return self.complete(messages, schema, params)


class PolicyLLM(LLMAgent):
    """An LLM seat without the semantic pre-check, so that the env itself refuses decision 4 and
    the transcript holds an env refusal to export (as transcripts of other seats do)."""

    def _validate_value(self, value: Any, obs: Observation, semantic: bool = True) -> Any:
        return super()._validate_value(value, obs, semantic=False)

    def act(self, observation: Observation) -> Any:
        backend = self.backend
        assert isinstance(backend, PolicyBackend)
        backend.obs, backend.decision, backend.attempt = observation, backend.decision + 1, 0
        return super().act(observation)


def truthful_text(obs: Observation) -> str:
    return truthful_bid(obs).model_dump_json(exclude_none=True)


# bidder_0's 9 decisions in single_trade (3 rounds x [negotiation, negotiation, bidding])
SCRIPT: dict[int, list[str]] = {
    0: ["I think I will wait.", '{"action_type": "wait"}'],  # repaired on the 2nd attempt
    1: ['{"action_type": "send_message", "to": "all", "text": "hi"}'],  # talk: -TALK
    3: ["garbage", "more garbage"],  # unusable twice: fallback (wait)
    4: ['{"action_type": "accept_offer", "offer_id": "nope"}'],  # parses; env rejects: -INVALID
}


def scripted_policy(obs: Observation, decision: int, attempt: int) -> str:
    if decision in SCRIPT:
        replies = SCRIPT[decision]
        return replies[min(attempt, len(replies) - 1)]
    return truthful_text(obs) if obs.phase == "bidding" else '{"action_type": "wait"}'


class RecordingTruthful(TruthfulBidder):
    """truthful, keeping the observations it was given (to check the replayed prompts)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Observation] = []

    def act(self, obs: Observation) -> Any:
        self.seen.append(obs)
        return super().act(obs)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """single_trade seed 1: bidder_0 an LLM (fake policy, retries=1), bidder_1 truthful."""
    d = tmp_path_factory.mktemp("sft")
    agent = PolicyLLM(PolicyBackend(scripted_policy), retries=1)
    watcher = RecordingTruthful()
    path = d / "ep.jsonl"
    result = run_episode(
        "single_trade", 1, {"bidder_0": agent, "bidder_1": watcher}, transcript=path
    )
    return {"path": path, "dir": d, "result": result, "seen": watcher.seen}


def raw_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_llm_decisions_are_exported_byte_for_byte(recorded: dict[str, Any]) -> None:
    out = recorded["dir"] / "sft.jsonl"
    counts = export_sft([recorded["path"]], out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    steps = [r for r in raw_lines(recorded["path"]) if r["type"] == "step" and "llm" in r]
    assert len(records) == len(steps) == 9 == counts.exported
    assert counts.filtered == {"scripted": 9}  # bidder_1's 9 decisions are not LLM decisions
    raw_text = recorded["path"].read_text()
    for rec, step in zip(records, steps, strict=True):
        *prompt, reply = rec["messages"]
        assert prompt == step["llm"]["messages"]
        assert reply == {"role": "assistant", "content": step["llm"]["raw"]}
        # the very bytes of the recorded prompt (transcripts write compact ASCII JSON)
        assert json.dumps(prompt, separators=(",", ":")) in raw_text
        assert rec["metadata"]["step"] == step["i"] and rec["metadata"]["seat"] == "bidder_0"
    meta = [r["metadata"] for r in records]
    # decision 0 was repaired: system, user, bad reply, repair request + the final reply
    assert [m["role"] for m in records[0]["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert meta[0]["attempts"] == 2 and meta[0]["parsed"] and not meta[0]["fallback"]
    assert meta[3]["fallback"] and not meta[3]["parsed"]
    assert records[3]["messages"][-1]["content"] == "more garbage"
    assert meta[4]["parsed"] and meta[4]["env_error"] and meta[4]["step_reward"] == -INVALID
    assert meta[1]["step_reward"] == -TALK and meta[1]["action_type"] == "send_message"
    episode_return = recorded["result"].returns["bidder_0"]
    assert all(m["episode_return"] == episode_return for m in meta)
    assert all(m["scenario"] == "single_trade" and m["seed"] == 1 for m in meta)


def test_scripted_decisions_use_the_llm_prompt_and_the_action_json(
    recorded: dict[str, Any],
) -> None:
    flt = ExportFilter(seats=["bidder_1"], include_scripted=True)
    records = list(select_decisions([recorded["path"]], flt))
    seen = recorded["seen"]  # what bidder_1 was actually shown during the episode
    assert len(records) == len(seen) == 9
    for rec, obs in zip(records, seen, strict=True):
        *prompt, reply = rec["messages"]
        assert prompt == prompt_messages(obs)
        expected = TruthfulBidder().act(obs).model_dump(mode="json", exclude_none=True)
        expected.pop("agent", None)
        assert json.loads(reply["content"]) == expected
        assert rec["metadata"]["kind"] == "scripted"


def test_filters_and_counts(recorded: dict[str, Any]) -> None:
    path = [recorded["path"]]

    def steps(flt: ExportFilter) -> list[int]:
        return [r["metadata"]["step"] for r in select_decisions(path, flt)]

    llm_steps = steps(ExportFilter())
    assert len(llm_steps) == 9
    # decision 3 fell back, decision 4 was rejected by the env
    assert steps(ExportFilter(valid_only=True)) == [
        s for k, s in enumerate(llm_steps) if k not in (3, 4)
    ]
    # step rewards: decision 1 paid talk_cost, decision 4 the invalid-action penalty
    assert steps(ExportFilter(min_reward=0.0)) == [
        s for k, s in enumerate(llm_steps) if k not in (1, 4)
    ]
    assert steps(ExportFilter(phases=["bidding"])) == [llm_steps[k] for k in (2, 5, 8)]
    assert steps(ExportFilter(agent="nomatch*")) == []
    assert steps(ExportFilter(agent="llm*")) == llm_steps
    both = steps(ExportFilter(include_scripted=True))
    assert len(both) == 18
    returns = recorded["result"].returns
    top = max(returns, key=returns.get)
    kept = list(
        select_decisions(path, ExportFilter(include_scripted=True, min_return=returns[top]))
    )
    assert {r["metadata"]["seat"] for r in kept} == {top} and len(kept) == 9


def test_unknown_seat_missing_file_and_cut_transcript(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(TranscriptError, match="unknown seat 'bidder_9'"):
        list(select_decisions([recorded["path"]], ExportFilter(seats=["bidder_9"])))
    with pytest.raises(TranscriptError, match="no such file"):
        list(select_decisions([tmp_path / "missing.jsonl"]))
    cut = tmp_path / "cut.jsonl"
    data = recorded["path"].read_bytes()
    cut.write_bytes(data[: data.index(b'"i":12,') + 40])  # cut inside step 12's line
    with pytest.raises(TranscriptError, match="incomplete transcript.*--partial"):
        list(select_decisions([cut]))
    partial = list(select_decisions([cut], partial=True))
    assert [r["metadata"]["step"] for r in partial] == [0, 2, 4, 6, 8, 10]  # steps 0..11 kept
    assert all(r["metadata"]["partial"] for r in partial)


def test_cli_export_and_one_line_errors(
    recorded: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    assert main(["export-sft", str(recorded["path"]), "-o", str(out), "--valid-only"]) == 0
    printed = capsys.readouterr().out
    assert "7 decision(s) exported from 1 transcript(s)" in printed
    assert "invalid 2" in printed and "scripted 9" in printed
    assert len(out.read_text().splitlines()) == 7
    cut = tmp_path / "cut.jsonl"
    data = recorded["path"].read_bytes()
    cut.write_bytes(data[: data.index(b'"i":12,') + 40])
    for argv, needle in (
        ([str(tmp_path / "missing.jsonl")], "no such file"),
        ([str(cut)], "incomplete transcript"),
        ([str(recorded["path"]), "--seat", "bidder_9"], "unknown seat 'bidder_9'"),
    ):
        assert main(["export-sft", *argv, "-o", str(tmp_path / "x.jsonl")]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.jsonl").exists()
    assert main(["export-sft", str(cut), "--partial", "-o", str(out)]) == 0
    assert "6 decision(s) exported" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# the GRPO reward
# ---------------------------------------------------------------------------------------------
def test_recorded_completion_reproduces_recorded_rewards(recorded: dict[str, Any]) -> None:
    t = read_transcript(recorded["path"])
    rows = grpo_records([recorded["path"]])
    assert len(rows) == 9
    # bidder_0's recorded policy is truthful whenever the script is silent, so a truthful
    # stand-in continues exactly as recorded in rounds 1 and 2 (decisions 6..8 are scripted-free)
    step_reward = EnvReward("step", stand_in="truthful")
    round_reward = EnvReward("round", stand_in="truthful")
    for row in rows:
        ev = t.steps[row["step"]]
        raw = ev.llm.raw if ev.llm else None
        assert raw is not None
        detail = step_reward.score(row["transcript"], row["step"], raw)
        recorded_step = float(ev.rewards.get("bidder_0", 0.0))
        if ev.llm.model_extra.get("fallback"):  # the fallback costs the parse-failure penalty
            assert detail.parse_error and detail.reward == recorded_step - INVALID
        else:
            assert detail.reward == recorded_step
    # round horizon: from the last negotiation/bidding decisions, only scripted play follows
    for row in rows[5:]:
        got = round_reward.score(row["transcript"], row["step"], t.steps[row["step"]].llm.raw)
        assert got.reward == row["recorded_round_return"]


def test_step_rewards_by_hand(recorded: dict[str, Any]) -> None:
    rows = grpo_records([recorded["path"]])
    neg = rows[0]  # bidder_0's first decision: round 0, negotiation, nothing paid yet
    reward = EnvReward("step", stand_in="truthful")

    def r(text: str) -> float:
        return reward.score(neg["transcript"], neg["step"], text).reward

    assert r('{"action_type": "wait"}') == 0.0
    assert r('{"action_type": "send_message", "to": "all", "text": "hi"}') == -TALK
    # parses, but the env rejects it: exactly the env's invalid-action penalty
    assert r('{"action_type": "accept_offer", "offer_id": "o999"}') == -INVALID
    # unusable: the fallback (wait, 0) minus the parse-failure penalty
    assert r("no json") == -INVALID
    assert r('{"action_type": "bid", "bids": [1]}') == -INVALID  # bid is not legal now
    # TRL's calling convention: message-list completions, extra columns as lists
    metrics: list[tuple[str, float]] = []
    out = reward(
        prompts=[neg["prompt"]] * 2,
        completions=[
            [{"role": "assistant", "content": '{"action_type": "wait"}'}],
            [{"role": "assistant", "content": "oops"}],
        ],
        transcript=[neg["transcript"]] * 2,
        step=[neg["step"]] * 2,
        transcript_sha256=[neg["transcript_sha256"]] * 2,
        trainer_state=None,
        log_metric=lambda name, value: metrics.append((name, value)),
    )
    assert out == [0.0, -INVALID]
    assert metrics == [("gpumarket/parse_failure_rate", 0.5)]


def hand_scenario() -> Any:
    """One round, no negotiation, two labs each with one job (1 block, value 30, no partial
    credit, deadline round 0), 2 blocks at reliability 1, second price, reserve 5."""
    return load_scenario(
        "single_trade",
        name="hand_bid",
        rounds=1,
        negotiation_turns=0,
        labs={
            "count": 2,
            "budget": [150.0, 150.0],
            "jobs": [1, 1],
            "endowment": [0, 0],
            "reputation": [0.5, 0.5],
        },
        jobs={
            "size": [1, 1],
            "value_per_block": [30.0, 30.0],
            "slack": [0, 0],
            "partial_credit_prob": 0.0,
            "min_reliability": [0.0, 0.0],
            "arrival_rate": 0.0,
        },
        capacity={"blocks": [2, 2], "reliability": 1.0},
        agents={"designer": "fixed", "bidders": ["truthful", "truthful"]},
    )


def record_hand(path: Path, reply: str = '{"action_type": "bid", "bids": [30]}') -> Path:
    agent = PolicyLLM(PolicyBackend(lambda obs, d, a: reply), retries=0)
    run_episode(hand_scenario(), 0, {"bidder_0": agent}, transcript=path)
    return path


def test_better_bid_gets_higher_reward_by_hand(tmp_path: Path) -> None:
    path = record_hand(tmp_path / "hand.jsonl")
    (row,) = grpo_records([path])
    reward = EnvReward("round")  # bidder_1 (truthful, rebuilt from its spec) bids 30 after us

    def r(text: str) -> float:
        return reward.score(row["transcript"], row["step"], text).reward

    # 2 blocks, two bids: both win; second price = highest rejected bid (none) or the reserve 5.
    # Winning runs the job (reliability 1): job_value 30/100, payment 5/100.
    win = (30.0 - 5.0) / 100.0
    assert r('{"action_type": "bid", "bids": [20]}') == pytest.approx(win, abs=1e-12)
    assert r('{"action_type": "bid", "bids": []}') == 0.0  # no block: the job expires, value 0
    assert r('{"action_type": "bid", "bids": [3]}') == 0.0  # below the reserve: rejected
    assert r('{"action_type": "bid", "bids": [200]}') == -INVALID  # over the budget of 150
    assert r("I bid twenty") == -INVALID  # fallback: the empty bid (0) minus the penalty
    assert row["recorded_round_return"] == pytest.approx(win, abs=1e-12)


def test_reward_is_deterministic_and_the_cache_changes_nothing(recorded: dict[str, Any]) -> None:
    rows = grpo_records([recorded["path"]])
    replies = [
        '{"action_type": "wait"}',
        '{"action_type": "bid", "bids": [40, 30]}',
        '{"action_type": "send_offer", "to": "bidder_1", "side": "buy", "blocks": 1, "price": 20}',
    ]
    cached = EnvReward("episode", stand_in="truthful")
    uncached = EnvReward("episode", stand_in="truthful", cache_size=0)
    for row in reversed(rows):  # later steps first: earlier ones then replay from scratch
        for text in replies:
            a = cached.score(row["transcript"], row["step"], text).reward
            b = cached.score(row["transcript"], row["step"], text).reward
            c = uncached.score(row["transcript"], row["step"], text).reward
            assert a == b == c
    # one replayed prefix per decision; every other call was served from a snapshot (which
    # scoring must not mutate: the equalities above would break)
    assert cached.stats["cache_misses"] == len(rows)
    assert cached.stats["cache_hits"] == 2 * len(rows) * len(replies) - len(rows)
    assert uncached.stats["cache_hits"] == 0


def test_changed_file_and_bad_options_are_clear_errors(tmp_path: Path) -> None:
    path = record_hand(tmp_path / "hand.jsonl")
    (row,) = grpo_records([path])
    reward = EnvReward()
    with pytest.raises(TranscriptError, match="changed since the dataset was built"):
        reward(
            prompts=[row["prompt"]],
            completions=["{}"],
            transcript=[row["transcript"]],
            step=[row["step"]],
            transcript_sha256=["0" * 64],
        )
    with pytest.raises(ValueError, match="needs the dataset columns"):
        reward(prompts=[row["prompt"]], completions=["{}"])
    with pytest.raises(ValueError, match="horizon 'weeks'"):
        EnvReward("weeks")
    assert parse_horizon("rounds:2") == ("rounds", 2) and parse_horizon(3) == ("steps", 3)
    with pytest.raises(ValueError, match="stand_in"):  # an LLM seat needs a scripted stand-in
        EnvReward(stand_in="llm:openai?model=x").score(row["transcript"], row["step"], "{}")


def test_cli_grpo_export_loads_as_a_dataset_and_locates_the_recorded_state(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "grpo.jsonl"
    assert main(["export-sft", str(recorded["path"]), "-o", str(out), "--grpo"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows == json.loads(json.dumps(grpo_records([recorded["path"]])))
    assert all(
        r["prompt"][0]["role"] == "system" and r["prompt"][1]["role"] == "user" for r in rows
    )
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert loaded.num_rows == len(rows) == 9
    # the columns go straight to EnvReward: the recorded reply scores the recorded step reward
    t = read_transcript(recorded["path"])
    first = next(r for r in rows if not t.steps[r["step"]].llm.model_extra.get("fallback"))
    reward = EnvReward("step", stand_in="truthful")
    got = reward(
        [first["prompt"]],
        [t.steps[first["step"]].llm.raw],
        transcript=[first["transcript"]],
        step=[first["step"]],
        transcript_sha256=[first["transcript_sha256"]],
    )
    assert got == [first["recorded_reward"]]
