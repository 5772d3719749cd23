"""``gpumarket eval --negotiation``: the negotiation report (docs/negotiation.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.table import Table

from market.cli.flags import DEFAULT_SEEDS, parse_seeds, parse_specs
from market.record.console import terminal_console
from market.review.negotiation_report import DEFAULT_SEEDS as REPORT_SEEDS
from market.review.negotiation_report import SEAT, negotiation_report
from market.run.jobs import RunConfigError, RunInterrupted


def cmd_negotiation(args: argparse.Namespace) -> int:
    """``gpumarket eval --negotiation``: value of talk, cost of lying, contract rates, hedging
    gain and negotiable welfare per scenario, written to OUT/negotiation.{csv,md,svg}."""
    if args.mechanisms or args.expert_matrix:
        print(
            "gpumarket eval: --negotiation, --mechanisms and --expert-matrix are separate "
            "evaluations; give one",
            file=sys.stderr,
        )
        return 2
    if args.backend != "local" or args.seat != SEAT:
        print(
            f"gpumarket eval: --negotiation plays scripted seats in a local process pool, in seat "
            f"{SEAT}; drop --backend and --seat",
            file=sys.stderr,
        )
        return 2
    # the report's own default (60 seeds: enough for its CIs) unless --seeds was given
    seeds = REPORT_SEEDS if list(args.seeds) == list(parse_seeds(DEFAULT_SEEDS)) else args.seeds
    out = args.out or Path("runs") / "negotiation"
    try:
        report = negotiation_report(
            out,
            seeds,
            scenarios=parse_specs(args.scenarios) if args.scenarios else None,
            agents=parse_specs(args.agents) if args.agents else (),
            workers=args.workers,
            progress=not args.no_progress,
            fresh=args.fresh,
        )
    except RunConfigError as exc:
        print(f"gpumarket eval: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, RunInterrupted):
        print(
            "gpumarket eval: interrupted; finished episodes are kept in their run folders, "
            "run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    head, rows = report.headline()
    table = Table(
        title=f"negotiation report, seat {SEAT}, {len(report.seeds)} paired seed(s): "
        "mean +/- 95% CI (> : CI above 0; lying: beyond a 10% loss)"
    )
    for i, column in enumerate(head):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(c.replace("±", "+/-") for c in row))
    terminal_console().print(table)
    print(
        f"tables: {out / 'negotiation.md'}, {out / 'negotiation.csv'}; plot: {out / 'negotiation.svg'}"
    )
    for where, seeds_failed in sorted(report.failed.items()):
        for seed, error in sorted(seeds_failed.items()):
            print(f"gpumarket eval: {where}: episode seed {seed} failed: {error}", file=sys.stderr)
    return 1 if report.failed else 0
