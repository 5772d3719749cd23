"""The ``gpumarket`` command line.

Exit codes: 0 success, 1 a run failed, 2 bad usage or input (unknown scenario, bad seat spec).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXAMPLES = {
    "run": "gpumarket run market_round --seeds 0:8 --seat bidder_2=truthful",
    "bench": "gpumarket bench --seconds 2",
    "validate": "gpumarket validate my_scenario.toml",
    "agents": "gpumarket agents",
    "report": "gpumarket report runs/market_round/ -o report.html",
    "show": "gpumarket show runs/market_round/0.jsonl --round 2",
    "replay": "gpumarket replay runs/market_round/0.jsonl   (or a directory: runs/market_round)",
}


def parse_seeds(text: str) -> list[int]:
    """'0:20' -> 0..19, '3' -> [3], '1,5,9' -> those."""
    try:
        if ":" in text:
            lo, hi = text.split(":", 1)
            seeds = list(range(int(lo), int(hi)))
        else:
            seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: use START:STOP (e.g. 0:20) or a comma list (e.g. 1,5,9)") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"--seeds {text!r} selects no seed; STOP must be above START")
    return seeds


def parse_seat(text: str) -> tuple[str, str]:
    seat, sep, spec = text.partition("=")
    if not sep or not seat or not spec:
        raise argparse.ArgumentTypeError(f"--seat {text!r}: write SEAT=AGENT, e.g. bidder_0=truthful")
    return seat.strip(), spec.strip()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpumarket", description="Multi-agent GPU market: run scenarios, benchmark, validate.")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, epilog=f"example: {EXAMPLES[name]}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    run = add("run", "Run a scenario over seeds and print mean +/- 95% CI of each seat's reward components.")
    run.add_argument("scenario", nargs="?", default="market_round", help="built-in name or TOML path (default: market_round)")
    run.add_argument("--seeds", type=parse_seeds, default=list(range(8)), help="START:STOP or a comma list (default 0:8)")
    run.add_argument("--seat", type=parse_seat, action="append", default=[], metavar="SEAT=AGENT", help="fill a seat, e.g. bidder_0=random_valid (repeatable)")
    run.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="worker processes (default: CPU count, at most 4)")
    run.add_argument("--json", type=Path, help="also write the per-episode results as JSON to this file")
    run.add_argument("--out", type=Path, default=Path("runs"),
                     help="transcripts go to OUT/<scenario>/<seed>.jsonl (default: runs)")
    run.add_argument("--no-transcripts", action="store_true", help="do not record transcripts")

    bench = add("bench", "Measure AEC steps/s per built-in scenario and clearing time of a 1,000-bidder, 10,000-block market.")
    bench.add_argument("--seconds", type=float, default=2.0, help="time per scenario (default 2)")
    bench.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    bench.add_argument("--json", type=Path, help="also write the figures as JSON")

    validate = add("validate", "Validate scenario files (or built-in names) and report every problem.")
    validate.add_argument("scenarios", nargs="+")

    add("agents", "List the registered agents and the seats they can fill.")

    report = add("report", "Write one self-contained HTML report (plots, trade/coalition graph, "
                           "every round) of a transcript or a folder of transcripts (*.jsonl).")
    report.add_argument("paths", nargs="+", type=Path, metavar="FILE|DIR",
                        help="transcript files or folders of them")
    report.add_argument("-o", "--output", type=Path, default=None,
                        help="HTML file to write (default: report.html in DIR, or next to FILE)")

    show = add("show", "Print a transcript in the terminal, round by round.")
    show.add_argument("path", type=Path, metavar="FILE", help="a transcript (.jsonl)")
    show.add_argument("--round", type=int, default=None, metavar="N", help="only round N")
    show.add_argument("--no-steps", action="store_true",
                      help="leave out each round's list of actions")

    replay = add("replay", "Re-execute transcripts from their seed and verify every reward and "
                           "state digest (exit 1 on the first divergence, 2 on an unusable file).")
    replay.add_argument("files", nargs="+", type=Path,
                        help="transcript files, or directories of *.jsonl")
    replay.add_argument("--partial", action="store_true",
                        help="replay the complete steps of a cut or aborted transcript")
    replay.add_argument("--update", action="store_true",
                        help="re-record each file afresh (same seed and seats; current built-in "
                             "scenario), then verify it")
    replay.add_argument("--rejudge", metavar="JUDGE",
                        help="also score every round's pitches with this judge (rule, "
                             "llm:openai?model=..., py:module:Judge); report how verdicts change")
    replay.add_argument("--ignore-digests", action="store_true",
                        help="replay even if the digest chain shows the file was edited")
    replay.add_argument("--rounds", action="store_true",
                        help="print a table of the replayed rounds")
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from agents.registry import AgentSpecError, make_agent
    from market.rollout import resolve_seats, run_many, summarise
    from scenarios import load_scenario

    scenario = load_scenario(args.scenario)
    seats = dict(args.seat)
    try:
        resolved = resolve_seats(scenario, seats)
        for seat, spec in resolved.items():
            make_agent(spec, "designer" if seat.startswith("designer") else "bidder")
    except (AgentSpecError, ValueError) as exc:
        print(f"gpumarket run: {exc}", file=sys.stderr)
        return 2
    console = Console()
    out = None if args.no_transcripts else args.out / scenario.name
    with console.status(f"running {scenario.name} over {len(args.seeds)} seed(s) with {args.workers} worker(s)..."):
        results = run_many(scenario, args.seeds, seats, workers=args.workers, transcript=out)
    table = Table(title=f"{scenario.name}: {len(results)} episode(s), seeds {args.seeds[0]}..{args.seeds[-1]} (mean +/- 95% CI)")
    for col in ("seat", "agent", "component", "mean", "+/- 95% CI"):
        table.add_column(col, justify="right" if col in ("mean", "+/- 95% CI") else "left")
    last_seat = None
    for row in summarise(results):
        if last_seat is not None and row["seat"] != last_seat:
            table.add_section()
        last_seat = row["seat"]
        style = "bold" if row["component"] == "return" else None
        table.add_row(row["seat"], row["agent"], row["component"], f"{row['mean']:.4f}", f"{row['ci95']:.4f}", style=style)
    console.print(table)
    welfare = [r.welfare_ratio for r in results]
    from market.rollout import mean_ci95

    mean, half = mean_ci95(welfare)
    console.print(f"welfare ratio (realised / optimal, per round): {mean:.3f} +/- {half:.3f}; "
                  f"steps: {sum(r.steps for r in results)}")
    if args.json:
        payload = [{"scenario": r.scenario, "seed": r.seed, "seats": r.seats, "returns": r.returns,
                    "components": r.components, "invalid_actions": r.invalid_actions, "steps": r.steps,
                    "rounds": r.round_log} for r in results]
        args.json.write_text(json.dumps(payload, indent=1))
        console.print(f"results written to {args.json}")
    if out is not None:
        from market.report import write_report

        report = write_report([r.transcript for r in results if r.transcript is not None], out / "report.html")
        print(f"transcripts: {out}/<seed>.jsonl ({len(results)} file(s)); "
              f"verify with: gpumarket replay {out}")
        print(f"report: {Path(report).resolve().as_uri()}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from market.bench import print_bench, run_bench

    report = run_bench(args.seconds, args.scenario)
    print_bench(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from scenarios import ScenarioError, load_scenario

    failed = 0
    for name in args.scenarios:
        try:
            sc = load_scenario(name)
            print(f"ok: {name} ({sc.labs.count} labs, {sc.rounds} rounds)")
        except ScenarioError as exc:
            failed += 1
            print(f"error: {exc}", file=sys.stderr)
    return 2 if failed else 0


def _cmd_agents(args: argparse.Namespace) -> int:
    from agents.registry import REGISTRY, plugins

    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        print(f"{name:<18} {','.join(sorted(getattr(cls, 'roles', ()))):<16} {doc}")
    for name, ep in sorted(plugins().items()):
        if name not in REGISTRY:
            print(f"{name:<18} {'(plug-in)':<16} {ep.value}")
    print("also: py:package.module:ClassName?..., llm:openai?model=...&base_url=..., llm:hf?path=...")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from market.replay import run_cli

    return run_cli(args)


def _cmd_report(args: argparse.Namespace) -> int:
    from market.report import write_report
    from market.transcript import TranscriptError

    first = args.paths[0]
    out = args.output or ((first if first.is_dir() else first.parent) / "report.html")
    try:
        path = write_report(args.paths, out)
    except (FileNotFoundError, TranscriptError) as exc:
        print(f"gpumarket report: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {path.resolve().as_uri()}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from rich.console import Console

    from market.transcript import TranscriptError
    from market.viewer import render_transcript

    try:
        render_transcript(args.path, Console(), round=args.round, steps=not args.no_steps)
    except (TranscriptError, ValueError) as exc:
        print(f"gpumarket show: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    from scenarios import ScenarioError

    args = _parser().parse_args(argv)
    handler = {"run": _cmd_run, "bench": _cmd_bench, "validate": _cmd_validate, "agents": _cmd_agents,
               "replay": _cmd_replay,
               "report": _cmd_report, "show": _cmd_show}[args.command]
    try:
        return handler(args)
    except ScenarioError as exc:
        print(f"gpumarket {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
