"""The terminal view of a transcript (``gpumarket show``): content, round filter, hostile text."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from test_report import PAYLOADS, poisoned_copy, record

from market.cli import main as cli_main
from market.record.reader import Transcript, read_transcript
from market.record.schema import Header, RoundSummary, SeatSpec, StepEvent
from market.review.report import Episode, Event
from market.review.viewer import render_transcript, safe_text


@pytest.fixture(scope="module")
def transcript(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("viewer"), 0)


def render(source: object, **kwargs: object) -> str:
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=True, color_system="truecolor")
    render_transcript(source, console, **kwargs)  # type: ignore[arg-type]
    return out.getvalue()


def plain(source: object, **kwargs: object) -> str:
    out = io.StringIO()
    render_transcript(source, Console(file=out, width=160, color_system=None), **kwargs)  # type: ignore[arg-type]
    return out.getvalue()


def wide(source: object) -> str:
    """Plain text on a console wide enough that no conduct line wraps."""
    out = io.StringIO()
    render_transcript(source, Console(file=out, width=1000, color_system=None))  # type: ignore[arg-type]
    return out.getvalue()


def test_every_round_with_its_tables(transcript: Path) -> None:
    text = plain(transcript)
    for r in range(9):
        assert f"Round {r}: second_price" in text
    for title in (
        "Market",
        "Bids, allocations, payments",
        "Reward components this round",
        "Actions",
        "Episode totals",
        "Trades, coalitions, private messages",
    ):
        assert title in text
    assert "capacity_outage" in text  # round 3's shock
    assert "injector (fake-model <b>bold</b>)" in text
    assert "model reasoning: thinking" in text  # the exchange's reasoning, shown as text
    assert "mean welfare ratio" in text


def test_one_round(transcript: Path) -> None:
    text = plain(transcript, round=3)
    assert "Round 3:" in text and "Round 2:" not in text and "Round 4:" not in text
    assert "Episode totals" not in text
    assert "Actions" not in plain(transcript, round=3, steps=False)
    with pytest.raises(ValueError, match="round 42 is not in this transcript"):
        plain(transcript, round=42)


def test_hostile_text_is_inert_in_the_terminal(transcript: Path, tmp_path: Path) -> None:
    hostile = poisoned_copy(transcript, tmp_path / "hostile.jsonl")
    raw = render(hostile)
    assert "\x1b]" not in raw and "\x07" not in raw  # no OSC (title/hyperlink) sequence, no bell
    text = plain(hostile, steps=False) + plain(hostile, round=2)
    assert "[bold red]rich markup[/]" in text  # markup printed, not applied
    assert "\\x1b]0;PWNED\\x07" in text  # control characters made visible
    assert "<script>document.title='PWNED'" in text
    assert safe_text("a\x1b[2Jb\u202ec").plain == "a\\x1b[2Jb\\u202ec"
    assert PAYLOADS  # the payload set is shared with the HTML report's tests


def test_cli_show(transcript: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["show", str(transcript), "--round", "1", "--no-steps"]) == 0
    out = capsys.readouterr().out
    assert "Round 1:" in out and "Actions" not in out
    assert cli_main(["show", str(transcript), "--round", "99"]) == 2
    assert "round 99 is not in this transcript" in capsys.readouterr().err
    assert cli_main(["show", str(transcript.with_name("nope.jsonl"))]) == 2
    assert "no such file" in capsys.readouterr().err


def test_names_from_the_transcript_are_never_markup() -> None:
    """Seat and component names go into table headers and rules: printed literally too."""
    seat = "[b]seat[/b]"
    episode = Transcript(
        path=None,
        header=Header(
            package_version="0",
            created="2026-01-01T00:00:00+00:00",
            scenario_name="[red]sc[/red]",
            scenario={},
            seed=1,
            possible_agents=[seat],
            seats={seat: SeatSpec(spec="[i]x[/i]", name="x", kind="scripted")},
            judge="rule",
        ),
        steps=[
            StepEvent(
                i=0,
                seat=seat,
                round=0,
                phase="bidding",
                action_kind="json",
                action={"action_type": "bid"},
                components={seat: {"[u]comp[/u]": 1.0}},
            ),
        ],
        rounds=[
            RoundSummary(
                i=0,
                round=0,
                summary={"round": 0, "mechanism": {"auction_type": "[blink]vcg[/blink]"}},
            )
        ],
    )
    text = plain(episode)
    for literal in (
        "[red]sc[/red]",
        "[b]seat[/b]",
        "[i]x[/i]",
        "[u]comp[/u]",
        "[blink]vcg[/blink]",
    ):
        assert literal in text


def test_conduct_entries_with_their_steps_and_scores_at_the_end(
    transcript: Path, tmp_path: Path
) -> None:
    t = read_transcript(transcript)
    entries = [e for s in t.steps for e in s.conduct or []]
    claims = [e for e in entries if e["kind"] == "claim" and e["claim"] == "budget"]
    flags = [e for e in entries if e["kind"] == "flag"]
    assert claims and flags  # the injector's public message claims a budget and gives orders
    text = wide(transcript)
    first = claims[0]
    # the step's claim: kind, value, quoted span, label and the judge's reason
    assert f'conduct: claim budget=9999 "{first["span"]}": false ({first["reason"]})' in text
    assert "conduct: manipulation flag instructs_others" in text
    # the scores at the end, checked against a count of bidder_0's judged claims by hand
    assert "Conduct per seat (final; judge rule/conduct-rules-1)" in text
    mine = [e for e in entries if e["seat"] == "bidder_0"]
    true = sum(e["kind"] == "claim" and e["label"] == "true" for e in mine)
    false = sum(e["kind"] == "claim" and e["label"] == "false" for e in mine)
    attempts = sum(e["kind"] == "flag" for e in mine)
    table = text[text.index("Conduct per seat") :]
    row = next(line for line in table.splitlines() if line.startswith("│ bidder_0 "))
    cells = [c.strip() for c in row.strip().strip("│").split("│")]
    assert float(cells[1]) == pytest.approx(true / (true + false), abs=5e-4)
    assert cells[3:5] == [str(true), str(false)] and cells[7] == str(attempts) and attempts > 0
    # a cut-off file: the scores after the last round that carries them
    data = transcript.read_bytes()
    (tmp_path / "cut.jsonl").write_bytes(data[: len(data) // 2])
    assert re.search(r"Conduct per seat \(after round \d+;", plain(tmp_path / "cut.jsonl"))


def test_conduct_spans_are_printed_literally() -> None:
    ep = Episode("hostile", {"scenario_name": "s", "seats": {"bidder_0": "x"}})
    span = "[bold red]loud[/] </script><script>alert(1)</script> \x1b]0;PWNED\x07"
    ep.events.append(
        Event(
            step=0,
            round=0,
            seat="bidder_0",
            phase="negotiation",
            action={"action_type": "send_message", "to": "all", "text": span},
            conduct=[
                {
                    "kind": "flag",
                    "seat": "bidder_0",
                    "flag": "instructs_others",
                    "span": span,
                    "reason": "orders [red]others[/]",
                },
            ],
        )
    )
    ep.rounds.append(
        {
            "round": 0,
            "conduct": {"verdicts": [], "scores": {"bidder_0": {"manipulation_attempts": 1}}},
        }
    )
    raw = render(ep)
    assert "\x1b]" not in raw and "\x07" not in raw
    text = wide(ep)
    assert "[bold red]loud[/] </script><script>alert(1)</script>" in text
    assert "orders [red]others[/]" in text and "\\x1b]0;PWNED\\x07" in text
