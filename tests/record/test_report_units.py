"""The HTML reports say what a reward is in (issue 34, item 11): credits ÷ the scenario's
``rewards.value_unit``, next to every table and chart of rewards, on the run page and on the
episode pages, with the scenario's own unit rather than a fixed 100."""

from __future__ import annotations

import html
import re
from pathlib import Path

from market.review.report import build_report, episode_from, write_run_report
from market.review.report.run_page import build_run_report, read_rows
from market.run.runner import run_scenario
from scenarios import load_scenario

NOTE = "Lab rewards, returns and reward components are in reward units: credits \u00f7 {}"


def text_of_page(path: Path) -> str:
    return html.unescape(path.read_text(encoding="utf-8"))


def between(page: str, start: str, end: str | None) -> str:
    """The part of ``page`` from the element with id ``start`` to the one with id ``end``."""
    first = page.index(f'id="{start}"')
    return page[first : page.index(f'id="{end}"', first) if end else None]


def test_run_report_and_episode_pages_state_the_scenarios_unit(tmp_path: Path) -> None:
    scenario = load_scenario("single_trade", rewards__value_unit=50.0)
    out = tmp_path / "run"
    run_scenario(scenario, range(2), None, out, workers=1, progress=False)
    report = write_run_report(out)
    page = text_of_page(report.path)
    aggregate, index = between(page, "aggregate", "index"), between(page, "index", None)
    note = NOTE.format(50)
    assert note + " (the scenario's rewards.value_unit), so 1.0 is 50 credits" in aggregate
    assert "The designer's reward is its composite score, which has no unit." in aggregate
    assert "return (credits \u00f7 50)" in aggregate  # the bar chart's axis
    assert note in index  # the index shows each seat's return
    assert "credits \u00f7 100" not in page

    assert report.pages, "the run wrote no episode page"
    episode = text_of_page(report.pages[0])
    seats = episode[episode.index("Seats: returns and reward components") :]
    assert seats.index(note) < seats.index('class="seats"')  # with the seats table
    assert "Reward components per seat (credits \u00f7 50)" in episode
    assert re.search(r"<text[^>]*>reward \(credits \u00f7 50\)</text>", episode)  # plot axes
    assert "Reward components this round (credits \u00f7 50)" in episode
    assert "<th>reward (credits \u00f7 50)</th>" in episode  # each step's reward


def test_the_unit_is_the_default_100_or_said_to_be_unknown(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_scenario("single_trade", range(1), None, out, workers=1, progress=False)
    assert NOTE.format(100) in text_of_page(write_run_report(out, sample=False).path)
    # rows without their run folder's manifest: the unit is not known, and the page says so
    page = html.unescape(build_run_report(read_rows(out)))
    assert (
        "in reward units: credits \u00f7 the scenario's rewards.value_unit (not recorded here)"
        in page
    )


def test_a_report_of_scenarios_with_different_units_names_each(tmp_path: Path) -> None:
    runs = []
    for unit in (100.0, 25.0):
        name = f"u{int(unit)}"
        sc = load_scenario("single_trade", rewards__value_unit=unit, name=name)
        run_scenario(sc, range(1), None, tmp_path / name, workers=1, progress=False)
        runs.append(episode_from(tmp_path / name / "transcripts" / "0.jsonl"))
    page = html.unescape(build_report(runs))
    assert "credits \u00f7 25 in u25; credits \u00f7 100 in u100" in page
    assert "return (reward units)" in page  # one axis cannot carry two units
