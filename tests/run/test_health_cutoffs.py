"""Cut-offs and degraded features in the health counts: an LLM seat whose replies stop at the
token limit (``finish_reason`` ``"length"``) or come with a backend's degraded note is counted in
its result rows, in the transcript's LLM exchange (``finish_reason``, ``finish_reasons``,
``degraded``), in the health table and the HTML report, and ``--strict`` fails on cut-offs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agents.llm.agent import LLMAgent
from agents.llm.backends.base import Completion
from agents.llm.conversation import note_completion
from market.cli import main as cli
from market.record.transcript import read_transcript
from market.review.report import load_episodes, write_report
from market.run.health import (
    STRICT_EXIT,
    SeatHealth,
    from_episodes,
    from_matches,
    from_rows,
    print_health,
    strict_failures,
    warnings,
)
from market.run.rollout import run_episode
from market.run.runner import ROW_KEYS, episode_rows

NOTE = "response_format not supported by this server: not used"


class CutOffEveryOther:
    """A model backend that plays an empty bid or waits, its odd replies marked cut off by the
    token limit, every reply with one degraded note (as a backend reports them)."""

    model = "cutoff-model"

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages: Any, schema: Any, params: Any) -> Completion:
        self.calls += 1
        bidding = "bid" in str((schema or {}).get("properties", {}).get("action_type", ""))
        text = '{"action_type": "bid", "bids": []}' if bidding else '{"action_type": "wait"}'
        finish = "length" if self.calls % 2 else "stop"
        return Completion(
            text=text,
            model=self.model,
            prompt_tokens=5,
            completion_tokens=4,
            extra={"finish_reason": finish, "degraded": [NOTE]},
        )

    async def acomplete(self, messages: Any, schema: Any, params: Any) -> Completion:
        return self.complete(messages, schema, params)


def test_note_completion_records_every_finish_reason_and_counts_a_decision_once() -> None:
    exchange: dict[str, Any] = {"degraded": []}
    assert note_completion(exchange, {"finish_reason": "length", "degraded": ["a", "a"]})
    assert not note_completion(exchange, {"finish_reason": "stop", "degraded": ["a", "b"]})
    assert exchange["finish_reasons"] == ["length", "stop"]
    assert exchange["finish_reason"] == "stop" and exchange["degraded"] == ["a", "b"]
    already = {"degraded": ["token counter: failed"]}
    assert not note_completion(already, {"degraded": "one note as a string"})
    assert already["degraded"] == ["token counter: failed", "one note as a string"]
    assert already["finish_reasons"] == [None]


def test_cutoffs_and_degraded_decisions_reach_rows_transcripts_and_health(tmp_path: Path) -> None:
    backend = CutOffEveryOther()
    agent = LLMAgent(backend, retries=0)
    path = tmp_path / "t.jsonl"
    result = run_episode("single_trade", 0, {"bidder_0": agent}, transcript=path)
    decisions = result.decisions["bidder_0"]
    requests = backend.calls
    assert decisions >= 2 and requests == decisions  # retries=0: one request per decision
    cut = (requests + 1) // 2  # calls 1, 3, 5... were cut off
    rows = episode_rows(result, "c")
    assert all(tuple(r) == ROW_KEYS for r in rows)
    (row,) = [r for r in rows if r["seat"] == "bidder_0"]
    assert row["cutoffs"] == cut and row["degraded"] == decisions
    assert all(r["cutoffs"] == r["degraded"] == 0 for r in rows if r["seat"] != "bidder_0")
    (seat,) = [h for h in from_rows(rows) if h.seat == "bidder_0"]
    assert (seat.cutoffs, seat.degraded, seat.decisions) == (cut, decisions, decisions)
    assert seat.troubled and seat.cutoff_share == cut / decisions
    # rows written before the columns existed read the counts from the stats
    old = [{k: v for k, v in r.items() if k not in ("cutoffs", "degraded")} for r in rows]
    (older,) = [h for h in from_rows(old) if h.seat == "bidder_0"]
    assert (older.cutoffs, older.degraded) == (cut, decisions)
    # the transcript's LLM exchanges carry the finish reasons and the notes
    exchanges = [
        e.llm for e in read_transcript(path).steps if e.seat == "bidder_0" and e.llm is not None
    ]
    extras = [x.model_extra or {} for x in exchanges]
    assert len(extras) == decisions
    assert [x["finish_reason"] for x in extras] == [
        "length" if i % 2 == 0 else "stop" for i in range(decisions)
    ]
    assert all(x["finish_reasons"] == [x["finish_reason"]] for x in extras)
    assert all(x["degraded"] == [NOTE] for x in extras)
    # and the report counts the same from the transcript
    (told,) = [h for h in from_episodes(load_episodes(path)) if h.seat == "bidder_0"]
    assert (told.cutoffs, told.degraded, told.decisions) == (cut, decisions, decisions)
    # a tournament record (seat_counts) carries them too
    record = {"seats": {"bidder_0": "llm"}, "health": {"bidder_0": row | {"refused": 0}}}
    (agent_row,) = from_matches([record])
    assert (agent_row.cutoffs, agent_row.degraded) == (cut, decisions)
    html = write_report(path, tmp_path / "report.html").read_text()
    start = html.index('id="health"')
    health = html[start : html.index("</section>", start)]
    assert "<th>cut off</th>" in health and "<th>degraded</th>" in health
    assert f"{cut} ({cut / decisions:.0%})" in health


def test_strict_fails_on_cutoffs_above_the_share_and_degraded_is_shown_not_failed() -> None:
    seat = SeatHealth("bidder_0", "llm:x", decisions=10, cutoffs=3, degraded=10)
    assert strict_failures([seat], 0.5) == []
    (reason,) = strict_failures([seat], 0.2)
    assert "3 replies cut off by the token limit in 10 decisions (30.0%)" in reason
    assert "above --strict 0.2" in reason
    # degraded decisions alone never fail a run, whatever the share
    only_degraded = SeatHealth("bidder_1", "llm:y", decisions=10, degraded=10)
    assert strict_failures([only_degraded], 0.0) == [] and only_degraded.troubled
    assert any("cut off by the token limit" in w for w in warnings([seat], 0.1))
    out = io.StringIO()
    print_health(Console(file=out, width=200), [seat, only_degraded])
    text = " ".join(out.getvalue().split())
    assert "cut off" in text and "degraded" in text and "3 (30%)" in text
    assert "bidder_1 (llm:y): 10 of its 10 decisions ran with a degraded feature" in text


class CutOffSeat(LLMAgent):
    """An LLM seat on :class:`CutOffEveryOther` (for ``--seat bidder_0=py:...``)."""

    name = "cutoff_seat"

    def __init__(self) -> None:
        super().__init__(CutOffEveryOther(), retries=0)


def test_run_shows_cutoffs_and_strict_fails_on_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["run", "single_trade", "--seeds", "0:2", "--workers", "1", "--no-progress"]
    base += ["--seat", "bidder_0=py:test_health_cutoffs:CutOffSeat", "--no-transcripts"]
    assert cli([*base, "--out", str(tmp_path / "a")]) == 0  # shown, not failed, without --strict
    out = " ".join(capsys.readouterr().out.split())
    assert "cut off" in out and "degraded" in out
    assert "replies cut off by the token limit" in out  # the loud warning: above 10%
    assert cli([*base, "--out", str(tmp_path / "b"), "--strict", "10%"]) == STRICT_EXIT
    err = " ".join(capsys.readouterr().err.split())
    assert "--strict: bidder_0 (py:test_health_cutoffs:CutOffSeat) had" in err
    assert "replies cut off by the token limit in" in err and "above --strict 0.1" in err
    # every cut-off within the share: the run passes
    assert cli([*base, "--out", str(tmp_path / "c"), "--strict", "100%"]) == 0
