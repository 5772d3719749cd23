"""Replay: exact re-execution, divergence reports, LLM seats from recorded outputs, golden files,
re-recording and re-judging."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agents.base import BaseAgent
from agents.registry import registered
from market.cli import main as cli
from market.record.transcript import TranscriptError, read_transcript, records_of, rewrite
from market.review.replay import builtin_drift, rejudge, replay, rerecord, transcript_files
from market.run.rollout import run_episode
from scenarios import builtin_names, load_scenario

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "transcripts" / "golden"
BIDDERS = sorted(registered("bidder"))
DESIGNERS = sorted(registered("designer"))


def mixed_seats(scenario: str, seed: int) -> dict[str, str]:
    """A different mix of scripted agents in every seat for every seed."""
    sc = load_scenario(scenario)
    seats = {f"bidder_{i}": BIDDERS[(seed * 7 + i * 3) % len(BIDDERS)] for i in range(sc.n_seats)}
    if sc.designer_seat:
        seats["designer_0"] = DESIGNERS[seed % len(DESIGNERS)]
    return seats


def _record_and_replay(tmp_path: Path, scenario: str, seed: int) -> None:
    path = tmp_path / f"{scenario}-{seed}.jsonl"
    result = run_episode(scenario, seed, mixed_seats(scenario, seed), transcript=path)
    report = replay(path)
    assert report.ok, report.describe()
    assert report.steps_checked == result.steps == report.digests_checked
    assert report.rounds_checked == len(result.round_log)


@pytest.mark.parametrize("scenario", builtin_names())
def test_replay_is_exact_for_every_builtin_scenario(tmp_path: Path, scenario: str) -> None:
    for seed in range(3):
        _record_and_replay(tmp_path, scenario, seed)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", builtin_names())
def test_replay_is_exact_over_many_seeds(tmp_path: Path, scenario: str) -> None:
    for seed in range(3, 28):
        _record_and_replay(tmp_path, scenario, seed)


@pytest.fixture
def episode(tmp_path: Path) -> Path:
    path = tmp_path / "episode.jsonl"
    run_episode("market_round", 6, mixed_seats("market_round", 6), transcript=path)
    return path


def _forge(path: Path, edit: Any, out: Path) -> Path:
    """Apply ``edit`` to the records and re-seal the chain: a consistent but wrong recording."""
    records = records_of(read_transcript(path))
    edit(records)
    return rewrite(out, records)


def _first_step_with_reward(
    records: list[dict[str, Any]], seat_filter: str = "bidder"
) -> dict[str, Any]:
    return next(
        r
        for r in records
        if r["type"] == "step"
        and r["live"]
        and any(s.startswith(seat_filter) for s in r["rewards"])
    )


def test_tampered_reward_names_step_and_field(
    episode: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target: dict[str, Any] = {}

    def edit(records: list[dict[str, Any]]) -> None:
        step = _first_step_with_reward(records)
        seat = next(s for s in step["rewards"] if s.startswith("bidder"))
        step["rewards"][seat] += 1e-12
        target.update(i=step["i"], seat=seat)

    forged = _forge(episode, edit, tmp_path / "forged.jsonl")
    report = replay(forged)
    assert report.mismatch is not None
    assert (
        report.mismatch.step == target["i"] and report.mismatch.field == f"rewards.{target['seat']}"
    )
    assert cli(["replay", str(forged)]) == 1
    out = capsys.readouterr().out
    assert (
        f"REPLAY DIVERGES at step {target['i']}" in out
        and f"field 'rewards.{target['seat']}'" in out
    )


def test_edited_file_is_refused_unless_digests_are_ignored(
    episode: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = episode.read_bytes().splitlines(keepends=True)
    n, raw = next(
        (n, raw)
        for n, raw in enumerate(lines)
        if b'"type":"step"' in raw and b'"rewards":{"bidder' in raw
    )
    record = json.loads(raw)
    seat, value = next(iter(record["rewards"].items()))
    old = f'"rewards":{{"{seat}":{json.dumps(value)}'.encode()
    assert old in raw
    lines[n] = raw.replace(old, f'"rewards":{{"{seat}":{json.dumps(value + 1.0)}'.encode())
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(b"".join(lines))
    assert cli(["replay", str(edited)]) == 2
    err = capsys.readouterr().err
    assert f"line {n + 1} (step {record['i']}): digest mismatch" in err and "Traceback" not in err
    assert cli(["replay", str(edited), "--ignore-digests"]) == 1
    assert f"step {record['i']} ({record['seat']}" in capsys.readouterr().out


@pytest.mark.parametrize("field", ["state_digest", "info", "action", "round_summary", "footer"])
def test_other_divergences_are_named(episode: Path, tmp_path: Path, field: str) -> None:
    def edit(records: list[dict[str, Any]]) -> None:
        steps = [r for r in records if r["type"] == "step"]
        if field == "state_digest":
            steps[3]["state_digest"] = "0" * 64
        elif field == "info":
            step = next(s for s in steps if s["info"].get("result") == {})
            step["info"]["result"] = {"forged": True}
        elif field == "action":  # a different bid than was played
            step = next(s for s in steps if s["phase"] == "bidding" and s["live"])
            step["action_kind"], step["action"] = "json", {"action_type": "bid", "bids": [0.5]}
        elif field == "round_summary":
            rnd = next(r for r in records if r["type"] == "round")
            rnd["summary"]["price"] = rnd["summary"]["price"] + 1.0
        else:
            records[-1]["returns"]["bidder_0"] = 123.0

    report = replay(_forge(episode, edit, tmp_path / f"{field}.jsonl"))
    assert report.mismatch is not None, field
    expected = {
        "state_digest": "state_digest",
        "info": "info.result",
        "action": "info",
        "round_summary": "round_summary[0].price",
        "footer": "footer.returns.bidder_0",
    }[field]
    assert report.mismatch.field.startswith(expected), report.describe()


# --- LLM seats replay from their recorded outputs ----------------------------------------------
class TinyLLM(BaseAgent):
    """Stands in for an LLM seat: keeps ``last_exchange`` and token stats, returns JSON text."""

    name = "tiny-llm"
    roles = frozenset({"bidder", "designer"})
    model = "tiny-test-model"
    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.last_exchange: dict[str, Any] | None = None
        self.stats = {"prompt_tokens": 0, "completion_tokens": 0}

    def act(self, observation: Any) -> Any:
        type(self).calls += 1
        if observation.phase == "bidding":
            reply = json.dumps(
                {"action_type": "bid", "bids": [round(float(self.rng.uniform(1, 30)), 3)]}
            )
        elif self.rng.random() < 0.3:
            reply = '{"action_type": "send_message", "text": "anyone selling blocks?"}'
        elif self.rng.random() < 0.1:
            reply = "Sure! Here is my action: wait."  # not JSON: the env records its error
        else:
            reply = '{"action_type": "wait"}'
        messages = [{"role": "user", "content": f"round {observation.round} {observation.phase}"}]
        self.last_exchange = {
            "messages": messages,
            "raw": reply,
            "action": None,
            "error": None,
            "model": self.model,
        }
        self.stats["prompt_tokens"] += 12
        self.stats["completion_tokens"] += len(reply) // 4
        return reply


def test_llm_seats_replay_from_recorded_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "llm.jsonl"
    run_episode("market_round", 2, {"bidder_0": TinyLLM, "bidder_1": TinyLLM}, transcript=path)
    t = read_transcript(path)
    assert (
        t.header.seats["bidder_0"].kind == "llm"
        and t.header.seats["bidder_0"].model == "tiny-test-model"
    )
    llm_steps = [ev for ev in t.steps if ev.seat in ("bidder_0", "bidder_1") and ev.live]
    assert llm_steps and all(ev.llm is not None and ev.llm.raw == ev.action for ev in llm_steps)
    assert all(
        ev.action_kind == "text" and ev.tokens and ev.tokens["prompt_tokens"] == 12
        for ev in llm_steps
    )
    assert any(ev.info.error and "not valid JSON" in ev.info.error for ev in llm_steps)
    TinyLLM.calls = 0
    report = replay(path)
    assert report.ok, report.describe()
    assert TinyLLM.calls == 0  # no agent (no model) is called on replay
    assert cli(["replay", str(path)]) == 0 and TinyLLM.calls == 0
    with pytest.raises(TranscriptError, match="agent objects, or specs"):
        rerecord(path)


def test_llm_judge_replays_its_recorded_verdicts(tmp_path: Path) -> None:
    """A transcript whose scenario names an LLM judge replays without calling any model."""
    path = tmp_path / "judge.jsonl"
    seats = {**mixed_seats("coalition_market", 1), "bidder_0": "spam_pitches"}  # a pitch to judge
    run_episode("coalition_market", 1, seats, transcript=path)
    t = read_transcript(path)
    assert any(r.summary["judge"] for r in t.rounds)

    def edit(records: list[dict[str, Any]]) -> None:
        records[0]["scenario"]["judge"] = "llm:openai?model=nobody&base_url=http://127.0.0.1:9"

    report = replay(_forge(path, edit, tmp_path / "llm_judge.jsonl"))
    assert report.ok, report.describe()
    assert any("recorded verdicts were replayed" in note for note in report.notes)


# --- golden transcripts -------------------------------------------------------------------------
def test_a_golden_transcript_per_builtin_scenario() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.jsonl")) == builtin_names()


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.jsonl")), ids=lambda p: p.stem)
def test_golden_transcripts_replay(path: Path) -> None:
    """A failure here means the economics changed. If that is intended, re-record on purpose:
    ``gpumarket replay transcripts/golden --update`` (and commit the new files)."""
    t = read_transcript(path)
    drift = builtin_drift(t)
    assert drift is None, drift
    report = replay(t)
    assert report.ok, (
        report.describe() + "; if intended: gpumarket replay transcripts/golden --update"
    )
    assert all(spec.kind == "scripted" for spec in t.header.seats.values())


def test_update_rerecords_a_golden_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden = GOLDEN / "single_trade.jsonl"

    def edit(records: list[dict[str, Any]]) -> None:
        step = _first_step_with_reward(records)
        seat = next(iter(step["rewards"]))
        step["rewards"][seat] += 0.5

    stale = _forge(golden, edit, tmp_path / "single_trade.jsonl")
    assert cli(["replay", str(stale)]) == 1
    capsys.readouterr()
    assert cli(["replay", str(stale), "--update"]) == 0
    assert f"re-recorded {stale}" in capsys.readouterr().out
    fresh, old = read_transcript(stale), read_transcript(golden)
    assert fresh.header.seed == old.header.seed and fresh.header.seats == old.header.seats
    assert [ev.rewards for ev in fresh.steps] == [ev.rewards for ev in old.steps]
    assert not list(tmp_path.glob("*.new.jsonl"))


def test_replay_a_directory(tmp_path: Path) -> None:
    for name in ("single_trade", "market_round"):
        shutil.copy(GOLDEN / f"{name}.jsonl", tmp_path / f"{name}.jsonl")
    assert cli(["replay", str(tmp_path), "--rounds"]) == 0
    assert cli(["replay", str(tmp_path / "nothing-here")]) == 2


def test_replay_of_the_transcripts_folder_covers_every_golden(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``gpumarket replay transcripts`` finds the goldens in subfolders and replays each exactly."""
    goldens = sorted(GOLDEN.glob("*.jsonl"))
    assert len(goldens) >= 10
    assert cli(["replay", str(GOLDEN.parent)]) == 0
    out = capsys.readouterr().out
    for path in goldens:
        assert f"{path.name}: " in out and out.count("replay exact") == len(goldens)


def test_a_folder_of_run_folders_replays_only_their_transcripts(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "single_trade"
    (run / "transcripts").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "results.jsonl").write_text("not a transcript\n")
    shutil.copy(GOLDEN / "single_trade.jsonl", run / "transcripts" / "0.jsonl")
    assert transcript_files([tmp_path]) == [run / "transcripts" / "0.jsonl"]
    assert cli(["replay", str(tmp_path)]) == 0


# --- re-judging -----------------------------------------------------------------------------------
class DenyAll:
    """A judge that grants nothing (for --rejudge tests)."""

    kind = "deny"
    version = "deny-1"
    model = None

    def describe(self) -> str:
        return "deny"

    def score(self, pitch: Any, lab: Any, context: Any) -> Any:
        from market.core.judge import Verdict

        return Verdict(
            lab=lab.index, scores={}, total=0.0, granted=0, rationale="denied", kind="deny"
        )


def test_rejudge_reports_how_verdicts_change(capsys: pytest.CaptureFixture[str]) -> None:
    golden = GOLDEN / "coalition_market.jsonl"
    granted = sum(v["granted"] for r in read_transcript(golden).rounds for v in r.summary["judge"])
    assert granted > 0
    same = rejudge(golden, "rule")
    assert same.replay.ok and same.rounds and same.changed == 0
    denied = rejudge(golden, f"py:{__name__}:DenyAll")
    assert denied.replay.ok  # the recorded episode itself is unchanged
    assert denied.changed == sum(1 for r in denied.rounds for v in r["verdicts"] if v["granted"][0])
    assert denied.changed > 0
    assert cli(["replay", str(golden), "--rejudge", f"py:{__name__}:DenyAll"]) == 0
    out = capsys.readouterr().out
    assert f"{denied.changed} grant(s) change" in out and "* round" in out
    assert cli(["replay", str(golden), "--rejudge", "nonsense-judge"]) == 2
