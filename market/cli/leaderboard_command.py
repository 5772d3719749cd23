"""``gpumarket eval --leaderboard``: its options, the command and its terminal tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from market.record.console import terminal_console
from market.run.health import STRICT_EXIT, print_health, strict_failures
from market.run.jobs import RunConfigError, RunInterrupted
from market.run.leaderboard import DEFAULT_SEATS, fmt, leaderboard


def split(text: str) -> list[str]:
    """A comma-separated list, blanks dropped."""
    return [s.strip() for s in text.split(",") if s.strip()]


def add_leaderboard_arguments(ev: argparse.ArgumentParser) -> None:
    """The leaderboard options of ``gpumarket eval``."""
    ev.add_argument(
        "--leaderboard",
        action="store_true",
        help="rank the agents in every seat type their role allows (--seats), per scenario, "
        "against a reference agent in the same seat on the same seeds: return, paired "
        "difference, invalid/repair/fallback/parse-failure rates, backend errors, timeouts, "
        "tokens, latency and cost; written to OUT/leaderboard.{csv,md,json}",
    )
    ev.add_argument(
        "--seats",
        default=None,
        metavar="S1,S2",
        help="with --leaderboard (implies it): the seats to rank in (default: "
        f"{','.join(DEFAULT_SEATS)}; 'designer' means designer_0)",
    )
    ev.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="[ROLE=]SPEC",
        help="with --leaderboard (implies it): the reference agent of a seat role, "
        "designer=SPEC or bidder=SPEC, or SPEC for every role it fills (repeatable; "
        "default: rule_designer and rule_expert)",
    )


#: the terminal table's columns (the Markdown and CSV files have one column per figure)
TERMINAL = (
    "scenario",
    "agent",
    "n",
    "return +/- CI",
    "minus ref +/- CI",
    "per dec: fb inv rep parse",
    "err/tmo",
    "tokens p/c/reason",
    "s/dec",
    "USD",
    "degraded",
)


def terminal_cells(row: dict[str, Any]) -> list[str]:
    """A leaderboard row as :data:`TERMINAL` shows it."""
    rates = " ".join(
        fmt(row[k], "rate")
        for k in ("fallback_rate", "invalid_rate", "repair_rate", "parse_failure_rate")
    )
    tokens = "/".join(
        fmt(row[k], "int") for k in ("prompt_tokens", "completion_tokens", "reasoning_tokens")
    )
    return [
        row["scenario"],
        row["label"] + (" (reference)" if row["is_reference"] else ""),
        str(row["n"]),
        fmt(row["mean"], "ci", row["ci95"]).replace("±", "+/-"),
        fmt(row["diff_mean"], "diff", row["diff_ci95"]).replace("±", "+/-"),
        rates,
        f"{fmt(row['backend_errors'], 'int')}/{fmt(row['timeouts'], 'int')}",
        tokens,
        fmt(row["latency_per_decision_s"], "sec"),
        fmt(row["cost_usd"], "usd"),
        row["degraded"],
    ]


def wants_leaderboard(args: argparse.Namespace) -> bool:
    return bool(
        getattr(args, "leaderboard", False)
        or getattr(args, "seats", None)
        or getattr(args, "reference", None)
    )


def cmd_leaderboard(args: argparse.Namespace, llm: dict[str, Any]) -> int:
    """``gpumarket eval --leaderboard`` (``llm``: the checked LLM pool/budget options)."""
    if args.mechanisms:
        print(
            "gpumarket eval: --leaderboard and --mechanisms are two evaluations; give one",
            file=sys.stderr,
        )
        return 2
    if args.seat != "bidder_0":
        print(
            f"gpumarket eval: --seat {args.seat} with --leaderboard: give --seats {args.seat} "
            "(the leaderboard takes a list of seats)",
            file=sys.stderr,
        )
        return 2
    out = args.out or Path("runs") / "leaderboard"
    try:
        board = leaderboard(
            split(args.agents),
            split(args.scenarios),
            args.seeds,
            out,
            seats=split(args.seats) if args.seats else DEFAULT_SEATS,
            references=args.reference,
            workers=args.workers,
            backend=args.backend,
            address=args.address,
            transcripts=args.transcripts,
            progress=not args.no_progress,
            fresh=args.fresh,
            llm=llm,
            agent_timeout=args.agent_timeout,
        )
    except RunConfigError as exc:
        print(f"gpumarket eval: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(exc, file=sys.stderr)
        return 130
    console = terminal_console()  # 11 columns: whole when piped, records on a narrow terminal
    rows = board.rows()
    for seat in board.seats:
        mine = [r for r in rows if r["seat"] == seat]
        if not mine:
            continue
        table = Table(title=board.header(seat).replace("`", ""), title_justify="left")
        for col in TERMINAL:
            left = col in ("scenario", "agent", "degraded")
            table.add_column(
                col,
                justify="left" if left else "right",
                overflow="fold",
                no_wrap=not left,
                min_width=12 if left else None,
            )
        for r in mine:
            table.add_row(
                *(escape(c) for c in terminal_cells(r)),
                style="bold red" if r["degraded"] else None,
            )
        console.print(table)
    for note in board.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    for line in board.warnings(rows):
        console.print(f"[bold red]WARNING[/]: {escape(line)}", highlight=False)
    print(
        "rates are per decision; Δ = agent - reference, paired per seed; tables: "
        f"{out / 'leaderboard.md'}, {out / 'leaderboard.csv'}, {out / 'leaderboard.json'}"
    )
    print_health(console, board.health, strict=args.strict)
    reasons = strict_failures(board.health, args.strict)
    for reason in reasons:
        print(f"gpumarket eval: --strict: {reason}", file=sys.stderr)
    if llm.get("budget") is not None:
        print(f"gpumarket eval: {llm['budget'].message()}", file=sys.stderr)
    failed = board.failed()
    for where, seeds in sorted(failed.items()):
        for seed, error in sorted(seeds.items()):
            print(f"gpumarket eval: {where}: episode seed {seed} failed: {error}", file=sys.stderr)
    return 1 if failed else STRICT_EXIT if reasons else 0
