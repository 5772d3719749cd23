"""The ``gpumarket replay`` command: replay (or re-record, or re-judge) transcript files and print
the verdict, the rounds and the re-judging comparison as terminal tables.

A transcript is untrusted text: every line printed from it (a scenario name, a seat, a note, an
error) goes through :func:`market.record.terminal.terminal_text`, so an escape sequence in a file
shows as ``\\x1b[2J`` and never reaches the terminal as a control character."""

from __future__ import annotations

import sys
from typing import Any

from rich.table import Table

from market.record.console import terminal_console
from market.record.reader import read_transcript
from market.record.recorded import print_conduct_rejudge
from market.record.schema import TranscriptError
from market.record.terminal import terminal_text
from market.review.replay import (
    RejudgeReport,
    builtin_drift,
    rejudge,
    replay,
    rerecord,
    transcript_files,
)


def run_cli(args: Any) -> int:
    """``gpumarket replay``: 0 all exact, 1 a replay diverged, 2 a file could not be used."""
    files = transcript_files(args.files)
    if not files:
        where = ", ".join(map(str, args.files))
        print(f"gpumarket replay: no *.jsonl transcripts in {where}", file=sys.stderr)
        return 2
    if args.seat and not args.update:
        print(
            "gpumarket replay: --seat names the agents of a re-recording; add --update",
            file=sys.stderr,
        )
        return 2
    status = 0
    for path in files:
        rj: RejudgeReport | None = None
        try:
            if args.update:
                target, result = rerecord(path, seats=dict(args.seat))
                print(terminal_text(f"re-recorded {target}: {result.steps} steps", False))
            t = read_transcript(path, verify=not args.ignore_digests)
            if args.rejudge:
                rj = rejudge(t, args.rejudge, partial=args.partial)
                report = rj.replay
            else:
                report = replay(t, partial=args.partial)
        except TranscriptError as exc:
            print(terminal_text(f"error: {exc}", False), file=sys.stderr)
            status = max(status, 2)
            continue
        for note in report.notes:
            print(terminal_text(f"note: {note}", False))
        drift = builtin_drift(t)
        if drift:
            print(terminal_text(f"note: {drift}", False))
        print(terminal_text(report.describe(), False))
        if args.rounds:
            print_rounds(report.round_log)
        if rj is not None:
            print_rejudge(rj)
            if rj.conduct is not None:
                print_conduct_rejudge(rj.conduct)
        if not report.ok:
            status = max(status, 1)
    return status


def print_rounds(round_log: list[dict[str, Any]]) -> None:
    """A terminal table of the rounds: mechanism, clearing, welfare, judge grants, shocks."""
    table = Table(title="rounds")
    for col in (
        "round",
        "mechanism",
        "reserve",
        "price",
        "sold",
        "revenue",
        "welfare",
        "grants",
        "shocks",
    ):
        table.add_column(col)
    for r in round_log:
        grants = [f"{v['lab']}:{v['granted']}" for v in r.get("judge", []) if v.get("granted")]
        table.add_row(
            str(r["round"]),
            str(r["mechanism"].get("auction_type")),
            f"{r['reserve']:.2f}",
            f"{r['price']:.2f}",
            str(r["sold"]),
            f"{r['revenue']:.2f}",
            f"{r['designer'].get('welfare_ratio', float('nan')):.3f}",
            ", ".join(grants) or "-",
            str(len(r.get("shocks", []))),
        )
    terminal_console().print(table)


def print_rejudge(rj: RejudgeReport) -> None:
    """Per judged round and lab: old -> new score and grant (``*`` marks a changed grant)."""

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    print(
        f"rejudge with {rj.judge}: {len(rj.rounds)} judged round(s), {rj.changed} grant(s) change"
    )
    for r in rj.rounds:
        if "error" in r:
            print(terminal_text(f"  round {r['round']}: the judge failed: {r['error']}", False))
            continue
        for v in r["verdicts"]:
            (s0, s1), (g0, g1) = v["score"], v["granted"]
            mark = "  " if g0 == g1 else "* "
            line = (
                f"  {mark}round {r['round']} {v['lab']}: score {fmt(s0)} -> {fmt(s1)}, "
                f"granted {g0} -> {g1}"
            )
            print(terminal_text(line, False))
