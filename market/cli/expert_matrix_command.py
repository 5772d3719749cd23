"""``gpumarket eval --expert-matrix``: rule_expert minus every scripted bidder, per scenario."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from market.cli.flags import parse_specs
from market.run.expert_matrix import BASELINE, expert_matrix
from market.run.jobs import RunConfigError


def scenario_code(name: str) -> str:
    """A short column code for a scenario: its words' initials and its digits (MS0, ST)."""
    return "".join(part if part.isdigit() else part[:1].upper() for part in name.split("_") if part)


def cmd_expert_matrix(args: argparse.Namespace) -> int:
    """``gpumarket eval --expert-matrix``: rule_expert minus each scripted bidder, per scenario."""
    if args.mechanisms:
        print(
            "gpumarket eval: --expert-matrix and --mechanisms are two evaluations; give one",
            file=sys.stderr,
        )
        return 2
    if args.backend != "local":
        print(
            "gpumarket eval: --expert-matrix plays scripted seats in a local process pool; "
            "drop --backend",
            file=sys.stderr,
        )
        return 2
    out = args.out or Path("runs") / "expert_matrix"
    try:
        matrix = expert_matrix(
            args.seeds,
            out,
            args.workers,
            members=parse_specs(args.agents) if args.agents else None,
            scenarios=parse_specs(args.scenarios) if args.scenarios else None,
            seat=args.seat,
            progress=not args.no_progress,
        )
    except RunConfigError as exc:
        print(f"gpumarket eval: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpumarket eval: interrupted (the expert matrix is not resumable)", file=sys.stderr)
        return 130
    # members down, scenarios across (by code), means only: 13 x 10 cells with their CIs do not
    # fit a terminal; the files hold the CIs
    cells = {(c["member"], c["scenario"]): c for c in matrix.cells()}
    codes = [scenario_code(s) for s in matrix.scenarios]
    if len(set(codes)) < len(codes):
        codes = [f"S{k}" for k in range(1, len(codes) + 1)]
    width = max(len(m) for m in [*matrix.members, "member"])
    print(
        f"{matrix.expert} minus each scripted bidder in {matrix.seat}: mean return difference "
        f"over {len(matrix.seeds)} paired seed(s); > : 95% CI above 0"
    )
    print("member".ljust(width) + "".join(code.rjust(7) for code in codes))
    for member in matrix.members:
        print(
            member.ljust(width)
            + "".join(
                f"{cells[(member, s)]['diff']:+.2f}{'>' if cells[(member, s)]['low'] > 0 else ' '}".rjust(
                    7
                )
                for s in matrix.scenarios
            )
        )
    print("codes: " + ", ".join(f"{c}={s}" for c, s in zip(codes, matrix.scenarios, strict=True)))
    behind = matrix.not_beaten()
    tightest = sorted(cells.values(), key=lambda c: c["low"])[:3]
    print(
        f"{len(cells) - len(behind)} of {len(cells)} cells above 0; lowest CI bounds: "
        + "; ".join(
            f"{c['scenario']} / {c['member']} {c['diff']:+.3f} +/- {c['ci95']:.3f}"
            for c in tightest
        )
        + "".join(
            f"\n  not beaten: {c['scenario']} / {c['member']}: {c['diff']:+.3f} +/- {c['ci95']:.3f}"
            for c in behind[:10]
        )
        + (f"\n  ... and {len(behind) - 10} more" if len(behind) > 10 else "")
    )
    for row in matrix.baseline():
        print(
            f"{BASELINE[0]} minus {BASELINE[1]} in {row['scenario']}: {row['diff']:+.3f} +/- "
            f"{row['ci95']:.3f}"
        )
    print(f"tables: {out / 'expert_matrix.md'}, {out / 'expert_matrix.csv'}")
    for where, seeds in sorted(matrix.failed.items()):
        for seed, error in sorted(seeds.items()):
            print(f"gpumarket eval: {where}: episode seed {seed} failed: {error}", file=sys.stderr)
    return 1 if matrix.failed else 0
