"""The terminal view of a transcript (``gpumarket show``): content, round filter, hostile text."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from test_report import PAYLOADS, poisoned_copy, record

from market.cli import main as cli_main
from market.record.reader import Transcript
from market.record.schema import Header, RoundSummary, SeatSpec, StepEvent
from market.record.viewer import render_transcript, safe_text


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
