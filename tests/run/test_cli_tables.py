"""Tables fit the width they are given and never cut a number or a spec (issue 34, item 8): whole
when the output is piped or logged, whatever its width; as records on a terminal too narrow for
them (COLUMNS=60); as they are when they fit."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.table import Table
from support import ROOT

from market.record.console import FittingConsole, natural_width
from market.run.runner import summarise_rows

SPEC = "py:agents.scripted:TruthfulBidder"  # a spec longer than rich's guess of 80 columns allows
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def wide_table() -> Table:
    table = Table(title="a wide table: every value must stay whole")
    for col in ("seat", "agent", "component", "mean", "+/- 95% CI", "frac_bidders_served"):
        table.add_column(col, justify="right" if col != "seat" else "left")
    table.add_row("bidder_0", SPEC, "auction_payments", "-0.5388", "0.5925", "[0.35,0.40,0.25]")
    table.add_row("bidder_1", "always_accept", "job_value", "1.1761", "7.2748", "[0.35,0.41,0.24]")
    return table


def printed(console: FittingConsole) -> str:
    assert isinstance(console.file, io.StringIO)
    return ANSI.sub("", console.file.getvalue())


def test_on_a_narrow_terminal_a_table_becomes_records_with_every_value_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    console = FittingConsole(file=io.StringIO(), force_terminal=True)
    assert console.width == 60
    table = wide_table()
    assert natural_width(console, table) > 60
    console.print(table)
    text = printed(console)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 60
    assert "…" not in text
    assert "seat: bidder_0" in lines and "  agent: " + SPEC in lines
    for value in ("-0.5388", "0.5925", "[0.35,0.40,0.25]", "7.2748", "auction_payments"):
        assert any(value in line for line in lines), value
    assert "  frac_bidders_served: [0.35,0.41,0.24]" in lines


def test_a_value_longer_than_the_terminal_gets_a_line_of_its_own_and_stays_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "30")
    console = FittingConsole(file=io.StringIO(), force_terminal=True)
    console.print(wide_table())
    lines = printed(console).splitlines()
    assert "  agent:" in lines and "    " + SPEC in lines  # 37 columns: left for the terminal


def test_a_table_that_fits_is_printed_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    console = FittingConsole(file=io.StringIO(), force_terminal=True)
    console.print(wide_table())
    lines = printed(console).splitlines()
    row = next(line for line in lines if SPEC in line)
    assert "-0.5388" in row and "[0.35,0.40,0.25]" in row and row.startswith("│ bidder_0")


def test_piped_a_table_is_printed_whole_whatever_the_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # a logged CI job's width says nothing of the reader's
    console = FittingConsole(file=io.StringIO())
    assert not console.is_terminal
    console.print(wide_table(), "a long line of text that a log keeps on one line " * 3)
    lines = printed(console).splitlines()
    row = next(line for line in lines if SPEC in line)
    assert "-0.5388" in row and "[0.35,0.40,0.25]" in row
    assert len(row) > 80 and "…" not in printed(console)
    assert lines[-1].count("a long line of text") == 3
    assert console.width == 40  # only the table was widened


def run_cli(out: Path, **env: str) -> tuple[str, list[dict[str, object]]]:
    """``gpumarket run`` with a long spec, stdout piped; the output and the summary rows."""
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TTY_COMPATIBLE")}
    environ |= {"PYTHONPATH": str(ROOT), "NO_COLOR": "1", **env}
    argv = ["run", "single_trade", "--seeds", "0:2", "--seat", f"bidder_0={SPEC}"]
    argv += ["--workers", "1", "--no-progress", "--no-report", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "market", *argv],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return ANSI.sub("", done.stdout), summarise_rows(rows)


def test_run_piped_prints_its_table_whole(tmp_path: Path) -> None:
    text, summary = run_cli(tmp_path / "piped")
    assert "…" not in text
    for row in summary:
        line = next(
            (
                line
                for line in text.splitlines()
                if f" {row['seat']} " in line and f" {row['component']} " in line
            ),
            None,
        )
        assert line is not None, (row, text)
        assert str(row["agent"]) in line  # the spec whole, on the row's line
        assert f"{row['mean']:.4f}" in line and f"{row['ci95']:.4f}" in line


def test_run_on_a_60_column_terminal_prints_records(tmp_path: Path) -> None:
    # TTY_COMPATIBLE=1: rich treats the pipe as a terminal, COLUMNS=60 wide
    text, summary = run_cli(tmp_path / "tty", TTY_COMPATIBLE="1", COLUMNS="60")
    table = text[: text.index("welfare ratio")]
    assert "…" not in table and max(len(line) for line in table.splitlines()) <= 60
    lines = table.splitlines()
    assert f"  agent: {SPEC}" in lines
    for row in summary:
        assert f"  mean: {row['mean']:.4f}" in lines
        assert f"  +/- 95% CI: {row['ci95']:.4f}" in lines
