"""Transcripts: schema, round trip, digest chain, crash safety, migration and the runner hooks."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents.base import BaseAgent
from market.cli import main as cli
from market.record.transcript import (
    GENESIS,
    SCHEMA_VERSION,
    Footer,
    Header,
    RoundSummary,
    StepEvent,
    TranscriptError,
    decode_action,
    encode_action,
    jsonable,
    read_transcript,
    records_of,
    rewrite,
    schema_text,
)
from market.run.rollout import arun_episode, run_episode, run_many

ROOT = Path(__file__).resolve().parents[2]
SEATS = {"bidder_0": "random_valid", "bidder_2": "rule_expert"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("tx") / "episode.jsonl"
    result = run_episode("market_round", 4, SEATS, transcript=path)
    return path, result


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_schema_file_is_current() -> None:
    published = (ROOT / "docs" / "transcript.schema.json").read_text()
    assert published == schema_text(), (
        "docs/transcript.schema.json is stale: "
        "python -m market.record.transcript --schema > docs/transcript.schema.json"
    )
    schema = json.loads(published)
    assert schema["x-schema-version"] == SCHEMA_VERSION
    assert {"Header", "StepEvent", "RoundSummary", "Footer"} <= set(schema["$defs"])


def test_round_trip(recorded: tuple[Path, Any]) -> None:
    path, result = recorded
    assert result.transcript == str(path)
    t = read_transcript(path)
    assert t.complete and t.chain == "verified" and not t.notes
    h = t.header
    assert (h.scenario_name, h.seed, h.schema_version) == ("market_round", 4, SCHEMA_VERSION)
    assert h.seats["bidder_0"].spec == "random_valid" and h.seats["bidder_0"].kind == "scripted"
    assert h.seats["designer_0"].spec == "fixed"
    assert h.judge.startswith("rule/")
    assert h.scenario["rounds"] == 5
    assert len(t.steps) == result.steps and [s.i for s in t.steps] == list(range(result.steps))
    assert [r.summary for r in t.rounds] == jsonable(result.round_log)
    assert t.footer is not None and t.footer.status == "complete"
    assert t.footer.returns == jsonable(result.returns)
    assert t.footer.invalid_actions == result.invalid_actions
    # rewards per step add up to the episode's returns
    totals: dict[str, float] = {}
    for ev in t.steps:
        for seat, r in ev.rewards.items():
            totals[seat] = totals.get(seat, 0.0) + float(r)
    for seat, ret in result.returns.items():
        assert math.isclose(totals.get(seat, 0.0), ret, abs_tol=1e-9)
    first = t.steps[0]
    assert first.seat == "designer_0" and first.phase == "design" and first.live
    assert first.obs_digest and first.state_digest and first.latency_s is not None
    assert any(not ev.live and ev.action is None for ev in t.steps)  # dead seats stepped with None
    # every line is strict JSON (no NaN/Infinity tokens) and ends with the digest
    for raw in _lines(path):
        record = json.loads(raw, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
        assert list(record)[-2:] == ["prev", "digest"]
    assert json.loads(_lines(path)[0])["prev"] == GENESIS


def test_records_validate_against_models(recorded: tuple[Path, Any]) -> None:
    models = {"header": Header, "step": StepEvent, "round": RoundSummary, "footer": Footer}
    for raw in _lines(recorded[0]):
        record = json.loads(raw)
        models[record["type"]].model_validate(record)


@pytest.mark.parametrize(
    ("kind", "anchor"),
    [
        ("header", b'"rounds":'),
        ("step", b'"i":'),
        ("round", b'"price":'),
        ("footer", b'"steps":'),
        ("step", b'"digest":"'),
    ],
)
def test_digest_chain_detects_an_edited_byte(
    recorded: tuple[Path, Any], tmp_path: Path, kind: str, anchor: bytes
) -> None:
    lines = _lines(recorded[0])
    kinds = [json.loads(raw)["type"] for raw in lines]
    n = kinds.index(kind) + (5 if kind == "step" else 0)
    raw = bytearray(lines[n])
    pos = raw.index(anchor) + len(anchor)
    raw[pos] = ord("7") if raw[pos] != ord("7") else ord("3")
    lines[n] = bytes(raw)
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(b"".join(lines))
    with pytest.raises(TranscriptError, match=rf"line {n + 1}\b.*edited"):
        read_transcript(edited)


def test_removed_or_reordered_lines_are_detected(
    recorded: tuple[Path, Any], tmp_path: Path
) -> None:
    lines = _lines(recorded[0])
    dropped = tmp_path / "dropped.jsonl"
    dropped.write_bytes(b"".join(lines[:10] + lines[11:]))
    with pytest.raises(TranscriptError, match=r"line 11 .*'prev' does not match"):
        read_transcript(dropped)
    swapped = tmp_path / "swapped.jsonl"
    swapped.write_bytes(b"".join(lines[:10] + [lines[11], lines[10]] + lines[12:]))
    with pytest.raises(TranscriptError, match="line 11"):
        read_transcript(swapped)
    # without the chain check, missing steps are still caught by their index
    with pytest.raises(TranscriptError, match="expected step"):
        read_transcript(dropped, verify=False)


def test_truncated_file_is_incomplete_not_a_traceback(
    recorded: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = recorded[0].read_bytes()
    lines = _lines(recorded[0])
    cut_line = 30
    offset = sum(len(x) for x in lines[: cut_line - 1]) + len(lines[cut_line - 1]) // 2
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[:offset])
    t = read_transcript(cut)
    complete_steps = sum(1 for raw in lines[: cut_line - 1] if json.loads(raw)["type"] == "step")
    assert not t.complete
    assert t.incomplete == (
        f"incomplete transcript: cut at line {cut_line} (the step in flight was lost); "
        f"{complete_steps} complete steps"
    )
    assert len(t.steps) == complete_steps
    assert cli(["replay", str(cut)]) == 2
    err = capsys.readouterr().err
    assert f"cut at line {cut_line}" in err and "--partial" in err and "Traceback" not in err
    assert cli(["replay", str(cut), "--partial"]) == 0
    out = capsys.readouterr().out
    assert f"partial replay of the complete steps: {complete_steps} steps" in out
    # a file cut inside the header is unusable: a clear error
    head = tmp_path / "head.jsonl"
    head.write_bytes(data[:40])
    with pytest.raises(TranscriptError, match="cut inside the header"):
        read_transcript(head)


def test_missing_footer_is_incomplete(recorded: tuple[Path, Any], tmp_path: Path) -> None:
    lines = _lines(recorded[0])
    killed = tmp_path / "killed.jsonl"
    killed.write_bytes(b"".join(lines[:-1]))
    t = read_transcript(killed)
    assert t.incomplete and t.incomplete.startswith("incomplete transcript: no footer after line")


class _Interrupting(BaseAgent):
    name = "interrupting"

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.calls = 0

    def act(self, observation: Any) -> Any:
        self.calls += 1
        if self.calls > self.after:
            raise KeyboardInterrupt
        return (
            {"action_type": "wait"}
            if observation.phase != "bidding"
            else {"action_type": "bid", "bids": []}
        )


def test_interrupted_run_leaves_an_aborted_readable_file(tmp_path: Path) -> None:
    path = tmp_path / "ctrl_c.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_episode("market_round", 1, {"bidder_1": lambda: _Interrupting(4)}, transcript=path)
    t = read_transcript(path)
    assert (
        t.footer is not None
        and t.footer.status == "aborted"
        and "KeyboardInterrupt" in (t.footer.error or "")
    )
    assert t.incomplete and "aborted" in t.incomplete and t.steps
    assert cli(["replay", str(path)]) == 2
    assert cli(["replay", str(path), "--partial"]) == 0


def test_bad_files_give_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "empty.jsonl": b"",
        "garbage.jsonl": b"\x00\xffnot json at all\n",
        "list.jsonl": b"[1, 2, 3]\n",
        "nothead.jsonl": b'{"type": "step", "i": 0}\n',
        "noversion.jsonl": b'{"type": "header"}\n',
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(TranscriptError):
            read_transcript(tmp_path / name)
        assert cli(["replay", str(tmp_path / name)]) == 2
    with pytest.raises(TranscriptError, match="no such file"):
        read_transcript(tmp_path / "missing.jsonl")
    with pytest.raises(TranscriptError, match="directory"):
        read_transcript(tmp_path)
    assert cli(["replay", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == len(cases) + 1


def test_newer_schema_is_refused(recorded: tuple[Path, Any], tmp_path: Path) -> None:
    records = records_of(read_transcript(recorded[0]))
    path = rewrite(tmp_path / "future.jsonl", records)
    data = path.read_bytes().replace(
        f'"schema_version":{SCHEMA_VERSION}'.encode(), b'"schema_version":99', 1
    )
    path.write_bytes(data)
    with pytest.raises(TranscriptError, match=r"newer gpumarket \(transcript schema v99"):
        read_transcript(path)
    assert cli(["replay", str(path)]) == 2


def _as_v1(records: list[dict[str, Any]]) -> bytes:
    """The first draft's layout: no digest chain, no action_kind, schema_version 1."""
    out = []
    for r in records:
        r = {
            k: v for k, v in r.items() if k not in ("prev", "digest", "action_kind", "file_sha256")
        }
        if r["type"] == "header":
            r["schema_version"] = 1
        out.append(json.dumps(r) + "\n")
    return "".join(out).encode()


def test_version_1_is_migrated_in_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "new.jsonl"
    run_episode("single_trade", 2, {"bidder_0": "random_valid"}, transcript=path)
    old = tmp_path / "old.jsonl"
    old.write_bytes(_as_v1(records_of(read_transcript(path))))
    t = read_transcript(old)
    assert t.source_version == 1 and t.header.schema_version == SCHEMA_VERSION
    assert t.chain == "unverified" and "migrated from schema v1" in t.notes[0]
    assert {ev.action_kind for ev in t.steps} <= {"json", "none", "text"}
    assert cli(["replay", str(old)]) == 0
    out = capsys.readouterr().out
    assert "migrated from schema v1" in out and "replay exact" in out
    # upgrading for good: rewrite() writes the current schema with a fresh chain
    upgraded = rewrite(tmp_path / "upgraded.jsonl", records_of(t))
    assert read_transcript(upgraded).chain == "verified"


def test_action_encoding_round_trips() -> None:
    from market.core.actions import Bid, SetMechanism, parse_action

    bid = Bid(bids=[3.5, 1.25])
    kind, value = encode_action(bid)
    assert kind == "model" and parse_action(decode_action(kind, value)) == bid
    mech = SetMechanism.model_validate({"mechanism": {"auction_type": "vcg"}})
    kind, value = encode_action(mech, designer=True)
    assert parse_action(json.loads(json.dumps(value)), designer=True) == mech
    assert encode_action('{"action_type": "wait"}') == ("text", '{"action_type": "wait"}')
    assert encode_action(b'{"action_type": "wait"}') == ("text", '{"action_type": "wait"}')
    assert encode_action({"action_type": "wait"}) == ("json", {"action_type": "wait"})
    assert encode_action(None) == ("none", None)
    # numpy numbers are not JSON: stored as the action the env parses from them
    kind, value = encode_action({"action_type": "bid", "bids": np.array([2.0, 1.0])})
    assert kind == "model" and value["bids"] == [2.0, 1.0]
    assert encode_action({"action_type": "bid", "bids": [math.nan]})[0] == "opaque"
    assert encode_action(object())[0] == "opaque"
    assert jsonable({"x": math.inf, 1: np.float32(0.5), "s": {2, 1}, "t": (1, -math.inf)}) == {
        "x": "Infinity",
        "1": 0.5,
        "s": [1, 2],
        "t": [1, "-Infinity"],
    }


class _Odd(BaseAgent):
    """Returns actions in every shape an agent may: text, dicts, numpy, junk and bytes."""

    name = "odd"

    def act(self, observation: Any) -> Any:
        k = int(self.rng.integers(6))
        if observation.phase == "bidding":
            return [
                {"action_type": "bid", "bids": np.array([1.0])},
                '{"action_type":"bid","bids":[2]}',
                object(),
                b'{"action_type": "wait"}',
                {"action_type": "bid", "bids": []},
                "not json",
            ][k]
        return [
            {"action_type": "wait"},
            "{}",
            42,
            {"action_type": "send_message", "text": "hi"},
            '{"action_type": "finish"}' if k == 4 and self.rng.random() < 0.2 else "[]",
            None,
        ][k]


def test_odd_actions_record_and_replay(tmp_path: Path) -> None:
    from market.review.replay import replay

    kinds: set[str] = set()
    for seed in range(3):
        path = tmp_path / f"{seed}.jsonl"
        run_episode("market_round", seed, {"bidder_0": _Odd, "bidder_1": _Odd}, transcript=path)
        t = read_transcript(path)
        kinds |= {ev.action_kind for ev in t.steps}
        assert not t.header.seats["bidder_0"].rebuildable
        report = replay(t)
        assert report.ok, report.describe()
    assert kinds == {"model", "json", "text", "opaque", "none"}


def test_digest_every(tmp_path: Path) -> None:
    from market.review.replay import replay

    path = tmp_path / "sparse.jsonl"
    result = run_episode("market_round", 3, transcript=path, digest_every=7)
    t = read_transcript(path)
    with_digest = [ev.i for ev in t.steps if ev.state_digest]
    closing = {r.i for r in t.rounds} | {ev.i for ev in t.steps if ev.phase == "done"}
    assert set(with_digest) == {i for i in range(result.steps) if i % 7 == 0} | closing
    assert all((ev.obs_digest is not None) == (ev.live and ev.i % 7 == 0) for ev in t.steps)
    report = replay(t)
    assert report.ok and report.digests_checked == len(with_digest)


def test_run_many_and_async_write_one_file_per_episode(tmp_path: Path) -> None:
    results = run_many("single_trade", [0, 1, 2], transcript=tmp_path / "many")
    assert [Path(r.transcript or "").name for r in results] == ["0.jsonl", "1.jsonl", "2.jsonl"]
    assert all(read_transcript(r.transcript or "").complete for r in results)
    with pytest.raises(ValueError, match="directory"):
        run_many("single_trade", [0], transcript=tmp_path / "x.jsonl")
    pooled = run_many("single_trade", [3, 4], workers=2, transcript=tmp_path / "pool")
    assert all(read_transcript(r.transcript or "").complete for r in pooled)
    res = asyncio.run(arun_episode("single_trade", 5, transcript=tmp_path / "async"))
    assert res.transcript == str(tmp_path / "async" / "5.jsonl")
    assert read_transcript(res.transcript).footer is not None
    # no transcript: nothing written, the result says so
    assert run_episode("single_trade", 0).transcript is None


def test_cli_run_writes_transcripts_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "runs" / "single_trade"
    assert cli(["run", "single_trade", "--seeds", "0:2", "--workers", "1", "--out", str(run)]) == 0
    assert sorted(p.name for p in run.iterdir()) == [
        "episodes",  # the run report's episode pages (both seeds: the first five are sampled)
        "report.html",
        "results.jsonl",
        "rounds.jsonl",
        "run.json",
        "transcripts",
    ]
    assert sorted(p.name for p in (run / "transcripts").iterdir()) == ["0.jsonl", "1.jsonl"]
    assert sorted(p.name for p in (run / "episodes").iterdir()) == ["0.html", "1.html"]
    assert f"{run}" in capsys.readouterr().out
    assert cli(["replay", str(run)]) == 0
    none = tmp_path / "none"
    assert (
        cli(
            [
                "run",
                "single_trade",
                "--seeds",
                "0:1",
                "--workers",
                "1",
                "--out",
                str(none / "single_trade"),
                "--no-transcripts",
            ]
        )
        == 0
    )
    assert not (none / "single_trade" / "transcripts").exists()
    assert (none / "single_trade" / "results.jsonl").is_file()


def test_transcript_cli_checks_files(
    recorded: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from market.record.transcript import main

    assert main([str(recorded[0])]) == 0
    assert "chain verified; complete" in capsys.readouterr().out


@pytest.mark.parametrize("scenario", ["market_round", "coalition_market"])
def test_recording_does_not_change_the_episode(tmp_path: Path, scenario: str) -> None:
    for seed in range(2):
        plain = run_episode(scenario, seed, SEATS)
        recorded = run_episode(scenario, seed, SEATS, transcript=tmp_path / f"{seed}.jsonl")
        assert recorded.returns == plain.returns and recorded.round_log == plain.round_log
        assert recorded.steps == plain.steps
