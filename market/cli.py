"""The ``gpumarket`` command line.

Exit codes: 0 success, 1 a run failed (e.g. an episode raised), 2 bad usage or input (unknown
scenario, bad scenario key or value, bad seat spec, an output folder of another run), 3 a run with
``--strict`` in which a seat fell back on more than the allowed share of its decisions, 130
interrupted (Ctrl-C; finished episodes are kept and a rerun resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXAMPLES = {
    "run": "gpumarket run market_round --seeds 0:20 --seat bidder_0=rule_expert --out runs\n"
           "  (writes runs/market_round/; rerun the same command to resume, --fresh to start over)\n"
           "         gpumarket run large_market --seeds 0:1000 --backend ray --address 10.0.0.5:6379",
    "eval": "gpumarket eval --agents rule_expert,truthful,random_valid "
            "--scenarios single_trade,market_round --seat bidder_0 --seeds 0:20 --out runs/eval\n"
            "         gpumarket eval --mechanisms --scenario mechanism_stage_4 --seeds 0:30\n"
            "         gpumarket eval --expert-matrix --workers 8",
    "bench": "gpumarket bench --json bench.json   (later: gpumarket bench --compare bench.json)\n"
             "         gpumarket bench --only clearing,memory --quick\n"
             "         gpumarket bench --compare old.json new.json --threshold 0.2",
    "train": "gpumarket train --scenario market_round --seat bidder_0 --episodes 3000 "
             "--out runs/train\n  (then: gpumarket run market_round --seeds 0:20 "
             "--seat bidder_0=torch_policy?path=runs/train/policy.pt)",
    "validate": "gpumarket validate my_scenario.toml",
    "agents": "gpumarket agents",
    "report": "gpumarket report runs/market_round/ -o report.html",
    "show": "gpumarket show runs/market_round/transcripts/0.jsonl --round 2",
    "replay": "gpumarket replay runs/market_round/transcripts/0.jsonl   (or a folder: "
              "runs/market_round)",
    "export-sft": "gpumarket export-sft runs/market_round -o sft.jsonl --seat bidder_0 "
                  "--valid-only --min-return 0.5\n"
                  "         gpumarket export-sft runs/market_round --include-scripted "
                  "--agent rule_expert -o distil.jsonl",
    "tournament": "gpumarket tournament --bidders rule_expert,truthful,random_valid "
                  "--designers fixed,rule_designer --scenario market_round --seeds 0:10 "
                  "--out runs/tournament\n  (rerun the same command to resume an interrupted run)",
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


def one_line(exc: BaseException) -> str:
    """A multi-line scenario error as one line: 'SOURCE: key 'k': problem; key 'j': problem'."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else type(exc).__name__
    head = lines[0].rstrip(":")
    source, _, count = head.rpartition(": ")
    if source and count.endswith("problem(s)"):
        head = source if count.startswith("1 ") else f"{source}: {count.replace('(s)', 's')}"
    return f"{head}: " + "; ".join(line.removeprefix("- ") for line in lines[1:])


def _seconds(text: str) -> float:
    """``--agent-timeout``: seconds >= 0 (0: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(
            f"--agent-timeout {text!r}: give seconds from 0 up (e.g. 30; 0: no limit)")
    return value


def _report_health(console: object, health: list, strict: float | None, command: str) -> bool:
    """Print the seats' failures under a results table; True when ``--strict`` fails the run."""
    from market.health import print_health, strict_failures

    print_health(console, health, strict=strict)
    reasons = strict_failures(health, strict)
    for reason in reasons:
        print(f"gpumarket {command}: --strict: {reason}", file=sys.stderr)
    return bool(reasons)


def parse_seat(text: str) -> tuple[str, str]:
    seat, sep, spec = text.partition("=")
    if not sep or not seat or not spec:
        raise argparse.ArgumentTypeError(f"--seat {text!r}: write SEAT=AGENT, e.g. bidder_0=truthful")
    return seat.strip(), spec.strip()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpumarket", description="Multi-agent GPU market: run scenarios, benchmark, validate.")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        # argparse %-formats help strings (not descriptions): "95% CI" must be written "95%% CI"
        return sub.add_parser(name, help=help_.replace("%", "%%"), description=help_,
                              epilog=f"example: {EXAMPLES[name]}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    def add_backend(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--backend", choices=("local", "ray"), default="local",
                         help="where episodes run: 'local' (a process pool, default) or 'ray' "
                              "(Ray tasks; needs pip install 'gpumarket[ray]')")
        cmd.add_argument("--address", default=None, metavar="HOST:PORT",
                         help="with --backend ray: the cluster to join (its head's address, or "
                              "'auto'); default: a private Ray instance on this machine")

    def add_health(cmd: argparse.ArgumentParser) -> None:
        from market.health import STRICT_EXIT, parse_share

        cmd.add_argument("--agent-timeout", type=_seconds, default=None, metavar="SECONDS",
                         help="seconds one decision of a seat may take; past it the seat plays "
                              "its fallback action and a timeout is counted (default: the "
                              "scenario's agent_timeout, 120; 0: no limit)")
        cmd.add_argument("--strict", type=parse_share, nargs="?", const=0.0, default=None,
                         metavar="SHARE",
                         help=f"exit with code {STRICT_EXIT} when a seat (or an LLM judge) fell "
                              "back on more than SHARE of its decisions: agent errors, timeouts "
                              "and the agent's own fallbacks (SHARE from 0 to 1 or a percentage; "
                              "default 0: any fallback fails the run)")

    run = add("run", "Run a scenario over seeds in parallel and print mean +/- 95% CI of each "
                     "seat's reward components. Every finished episode is kept in "
                     "OUT/SCENARIO/results.jsonl (one row per episode and seat) with its transcript "
                     "in OUT/SCENARIO/transcripts/; rerunning skips the episodes already there.")
    run.add_argument("scenario", nargs="?", default="market_round", help="built-in name or TOML path (default: market_round)")
    run.add_argument("--seeds", type=parse_seeds, default=list(range(8)), help="START:STOP or a comma list (default 0:8)")
    run.add_argument("--seat", type=parse_seat, action="append", default=[], metavar="SEAT=AGENT", help="fill a seat, e.g. bidder_0=random_valid (repeatable)")
    run.add_argument("--workers", type=int, default=None,
                     help="worker processes (default: every CPU core; 1 runs in this process)")
    run.add_argument("--json", type=Path, help="also write the per-episode results as JSON to this file")
    run.add_argument("--out", type=Path, default=Path("runs"),
                     help="the run goes to the folder OUT/<scenario> (default: runs)")
    run.add_argument("--no-transcripts", action="store_true", help="do not record transcripts")
    run.add_argument("--fresh", action="store_true",
                     help="discard what OUT/<scenario> holds and start over (default: resume)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_backend(run)
    add_health(run)
    from market.async_runner import add_llm_arguments

    add_llm_arguments(run)

    ev = add("eval", "Evaluate agents in one seat across scenarios: a table of the seat's mean "
                     "return +/- 95% CI per agent x scenario (other seats keep each scenario's "
                     "agents), printed and written to OUT/eval.csv and OUT/eval.md. With "
                     "--mechanisms: compare mechanisms on one scenario (welfare ratio, revenue, "
                     "fairness, participation, stability, designer composite) and each bidder "
                     "type's gain from deviating to its best alternative built-in strategy; "
                     "written to OUT/mechanisms.{csv,md,html}. Resumable like run. With "
                     "--expert-matrix: rule_expert minus every scripted bidder of the population "
                     "in every built-in scenario, paired on the same seeds (mean +/- 95% CI), "
                     "written to OUT/expert_matrix.{csv,md}.")
    ev.add_argument("--agents", default=None, metavar="A,B,...",
                    help="agent specs for the seat, comma-separated (default: rule_expert and the "
                         "GPU-arena baselines; with --expert-matrix: the agents rule_expert is "
                         "compared with, default every scripted bidder)")
    ev.add_argument("--scenarios", default=None, metavar="S1,S2,...",
                    help="built-in names or TOML paths (default: the three GPU-arena tasks; with "
                         "--expert-matrix: every built-in scenario)")
    ev.add_argument("--seat", default="bidder_0", help="the seat the agents take (default: bidder_0)")
    ev.add_argument("--seeds", type=parse_seeds, default=None,
                    help="START:STOP or a comma list (default 0:20; with --expert-matrix 0:100)")
    ev.add_argument("--out", type=Path, default=None,
                    help="output folder (default: runs/eval, or runs/mechanisms/SCENARIO)")
    ev.add_argument("--workers", type=int, default=None,
                    help="worker processes (default: every CPU core)")
    ev.add_argument("--transcripts", action="store_true", help="also record transcripts")
    ev.add_argument("--fresh", action="store_true", help="discard earlier results in OUT first")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.add_argument("--mechanisms", action="store_true",
                    help="compare mechanisms on --scenario instead of agents")
    ev.add_argument("--scenario", default="mechanism_stage_4",
                    help="with --mechanisms: the scenario (default: mechanism_stage_4)")
    ev.add_argument("--candidates", default="", metavar="M1,M2,...",
                    help="with --mechanisms: which mechanisms (default: robust, first_price, vcg, "
                         "fair_share, posted_price, random)")
    ev.add_argument("--alternatives", default="", metavar="A,B,...",
                    help="with --mechanisms: strategies a bidder type may deviate to (default: "
                         "every built-in bidder but the spammers)")
    ev.add_argument("--no-deviations", action="store_true",
                    help="with --mechanisms: skip the deviation (incentive) check")
    ev.add_argument("--expert-matrix", action="store_true",
                    help="rule_expert against every scripted bidder in every built-in scenario")
    add_backend(ev)
    add_health(ev)
    add_llm_arguments(ev)

    bench = add("bench", "Benchmark this machine: AEC steps/s per scenario, episodes/s with 1, 2 "
                         "and all cores and on Ray, clearing time against market size (10 to "
                         "10,000 bidders) with its growth exponent, memory per live env, "
                         "transcript overhead, LLM decisions/s at concurrency 1/8/32 (fake server "
                         "unless --llm-base-url). --json writes the figures; --compare OLD.json "
                         "flags metrics > --threshold worse (exit 1). See docs/benchmarks.md.")
    from market.bench import DEFAULT_THRESHOLD, SECTIONS, parse_sections

    bench.add_argument("--seconds", type=float, default=2.0,
                       help="time per scenario and per transcript variant (default 2)")
    bench.add_argument("--scenario", action="append", help="steps: only these scenarios (repeatable)")
    bench.add_argument("--only", type=parse_sections, metavar="S1,S2",
                       help=f"only these sections: {','.join(SECTIONS)} (default: all)")
    bench.add_argument("--quick", action="store_true", help="tiny budgets: a smoke run for CI")
    bench.add_argument("--json", type=Path, help="write the figures (and machine info) as JSON")
    bench.add_argument("--compare", nargs="+", metavar="FILE",
                       help="OLD.json: compare this run with it; OLD.json NEW.json: compare two "
                            "files without running")
    bench.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                       help="flag a metric worse by more than this fraction (default 0.2)")
    bench.add_argument("--llm-base-url", help="llm: an OpenAI-compatible server (…/v1) instead "
                                              "of the fake one")
    bench.add_argument("--llm-model", default="fake-model", help="llm: the model name to request")
    bench.add_argument("--llm-latency-ms", type=float, default=None,
                       help="llm: the fake server's fixed latency (default 50; 5 with --quick)")

    tr = add("train", "Train a small torch policy (REINFORCE with a baseline) for one seat "
                      "against the scenario's scripted population; save it, its learning "
                      "curve and a paired evaluation vs random_valid and rule_expert. "
                      "Needs torch (pip install 'gpumarket[rl]'). See docs/rl.md.")
    tr.add_argument("--scenario", default="market_round", help="built-in name or TOML path")
    tr.add_argument("--seat", default="bidder_0", help="the seat to train (default bidder_0)")
    tr.add_argument("--episodes", type=int, default=None,
                    help="training episodes (default 3000 unless --seconds is given)")
    tr.add_argument("--seconds", type=float, default=None, help="training time budget")
    tr.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    tr.add_argument("--batch", type=int, default=16, help="episodes per update (default 16)")
    tr.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    tr.add_argument("--out", type=Path, default=Path("runs/train"),
                    help="writes policy.pt, curve.json, eval.json here (default runs/train)")
    tr.add_argument("--eval-seeds", type=parse_seeds, default="0:30",
                    help="held-out seeds for the evaluation (default 0:30)")
    tr.add_argument("--no-eval", action="store_true", help="skip the evaluation")

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

    tour = add("tournament", "Rate bidders against each other (rotating through the bidder "
                             "seats) and designers against bidder populations, with OpenSkill "
                             "ratings, win rates and mean returns with confidence intervals. "
                             "Resumable: finished matches are kept in OUT/matches.jsonl.")
    tour.add_argument("--bidders", default="", metavar="A,B,...",
                      help="bidder agent specs, comma-separated (at least two)")
    tour.add_argument("--designers", default="", metavar="X,Y,...",
                      help="designer agent specs, comma-separated (at least two)")
    tour.add_argument("--scenario", default="market_round",
                      help="built-in name or TOML path (default: market_round)")
    tour.add_argument("--seeds", default="0:10", help="START:STOP or a comma list (default 0:10)")
    tour.add_argument("--out", type=Path, default=None,
                      help="output folder (default: runs/tournament/SCENARIO)")
    tour.add_argument("--workers", default=str(min(4, os.cpu_count() or 1)),
                      help="worker processes (default: CPU count, at most 4)")
    tour.add_argument("--house-designer", default=None, metavar="SPEC",
                      help="designer seat in bidder matches (default: the scenario's designer)")
    tour.add_argument("--population", action="append", default=[], metavar="NAME=A,B,...",
                      help="a bidder population designers face (repeatable; default: the "
                           "scenario's own bidders and a mixed population)")
    tour.add_argument("--max-matches", default=None, metavar="N",
                      help="stop after N new matches (rerun to continue)")
    add_backend(tour)
    add_health(tour)

    sft = add("export-sft", "Export the LLM decisions of transcripts as a chat-format SFT "
                            "dataset (JSONL: messages = system, user, assistant; metadata = "
                            "file, seed, step, seat, agent, rewards...). See "
                            "docs/training-data.md.")
    sft.add_argument("transcripts", nargs="+", type=Path, metavar="TRANSCRIPT",
                     help="transcript files, folders of *.jsonl, or run folders")
    sft.add_argument("-o", "--output", type=Path, required=True, help="the JSONL file to write")
    sft.add_argument("--seat", action="append", default=[],
                     help="only this seat's decisions (repeatable)")
    sft.add_argument("--agent", default=None, metavar="GLOB",
                     help="only seats whose recorded agent spec matches (e.g. 'llm:*')")
    sft.add_argument("--phase", action="append", default=[],
                     choices=("design", "negotiation", "bidding"),
                     help="only decisions in this phase (repeatable)")
    sft.add_argument("--min-reward", type=float, default=None,
                     help="only decisions whose step reward is at least this")
    sft.add_argument("--min-return", type=float, default=None,
                     help="only decisions of seats whose episode return is at least this")
    sft.add_argument("--valid-only", action="store_true",
                     help="only decisions that parsed without fallback and that the env accepted")
    sft.add_argument("--include-scripted", action="store_true",
                     help="also export scripted seats' decisions as the prompt an LLM seat would "
                          "see plus the action JSON (for distilling a scripted agent)")
    sft.add_argument("--partial", action="store_true",
                     help="export the complete steps of a cut or aborted transcript")
    sft.add_argument("--grpo", action="store_true",
                     help="write GRPO prompt rows instead (prompt, transcript, step, "
                          "transcript_sha256...) for TRL's GRPOTrainer with "
                          "market.training_data.EnvReward; load with "
                          "datasets.load_dataset('json', data_files=OUT)")
    return parser


def _llm_options(args: argparse.Namespace, command: str) -> dict | None:
    """The LLM pool/budget options of run and eval, or None after printing why they are bad
    (a bad value, or pool flags with --backend ray, which has no shared pool)."""
    from market.async_runner import given_llm_flags, llm_options

    try:
        llm = llm_options(args)
    except ValueError as exc:
        print(f"gpumarket {command}: {exc}", file=sys.stderr)
        return None
    given = given_llm_flags(args)
    if args.backend == "ray" and given:
        print(f"gpumarket {command}: {', '.join(given)} apply to LLM runs on the local backend "
              "(one shared client pool); leave them out with --backend ray (see docs/ray.md)",
              file=sys.stderr)
        return None
    return llm


def _cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from market.rollout import mean_ci95
    from market.runner import RunConfigError, RunInterrupted, run_scenario, summarise_rows
    from scenarios import load_scenario

    scenario = load_scenario(args.scenario)
    if args.workers is not None and args.workers < 1:
        print(f"gpumarket run: --workers {args.workers}: give at least 1", file=sys.stderr)
        return 2
    out = args.out / scenario.name
    llm = _llm_options(args, "run")
    if llm is None:
        return 2
    try:
        summary = run_scenario(scenario, args.seeds, dict(args.seat), out, workers=args.workers,
                               transcripts=not args.no_transcripts,
                               progress=not args.no_progress, fresh=args.fresh,
                               backend=args.backend, address=args.address, llm=llm,
                               agent_timeout=args.agent_timeout)
    except RunConfigError as exc:
        print(f"gpumarket run: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(exc, file=sys.stderr)
        return 130
    console = Console()
    if summary.skipped:
        print(f"resumed {out}: {len(summary.skipped)} episode(s) were already complete, "
              f"{len(summary.played)} played now")
    rows = summary.rows
    n = len(summary.episodes)
    table = Table(title=f"{scenario.name}: {n} episode(s), seeds {args.seeds[0]}..{args.seeds[-1]} (mean +/- 95% CI)")
    for col in ("seat", "agent", "component", "mean", "+/- 95% CI"):
        table.add_column(col, justify="right" if col in ("mean", "+/- 95% CI") else "left")
    last_seat = None
    for row in summarise_rows(rows):
        if last_seat is not None and row["seat"] != last_seat:
            table.add_section()
        last_seat = row["seat"]
        style = "bold" if row["component"] == "return" else None
        table.add_row(row["seat"], row["agent"], row["component"], f"{row['mean']:.4f}", f"{row['ci95']:.4f}", style=style)
    console.print(table)
    mean, half = mean_ci95(list(summary.episode("welfare_ratio").values()))
    console.print(f"welfare ratio (realised / optimal, per round): {mean:.3f} +/- {half:.3f}; "
                  f"steps: {sum(summary.episode('steps').values())}")
    from market.health import STRICT_EXIT, from_rows

    strict_failed = _report_health(console, from_rows(rows), args.strict, "run")
    if args.json:
        by_seed: dict[int, list] = {}
        for row in rows:
            by_seed.setdefault(row["seed"], []).append(row)
        payload = [{"scenario": scenario.name, "seed": seed,
                    "seats": {r["seat"]: r["agent"] for r in seat_rows},
                    "returns": {r["seat"]: r["return"] for r in seat_rows},
                    "components": {r["seat"]: r["components"] for r in seat_rows},
                    "invalid_actions": {r["seat"]: r["invalid_actions"] for r in seat_rows},
                    "steps": seat_rows[0]["steps"], "rounds": summary.round_logs.get(seed, [])}
                   for seed, seat_rows in by_seed.items()]
        args.json.write_text(json.dumps(payload, indent=1))
        console.print(f"results written to {args.json}")
    print(f"results: {out / 'results.jsonl'} ({len(rows)} row(s): one per episode and seat)")
    transcripts = [out / "transcripts" / f"{s}.jsonl" for s in summary.episodes]
    transcripts = [p for p in transcripts if p.is_file()]
    if transcripts and not args.no_transcripts:
        from market.report import write_report

        report = write_report(transcripts, out / "report.html")
        print(f"transcripts: {out / 'transcripts'}/<seed>.jsonl ({len(transcripts)} file(s)); "
              f"verify with: gpumarket replay {out}")
        print(f"report: {Path(report).resolve().as_uri()}")
    if llm["budget"] is not None:  # what the run spent, and whether the budget stopped it
        print(f"gpumarket run: {llm['budget'].message()}", file=sys.stderr)
    for seed, error in sorted(summary.failed.items()):
        print(f"gpumarket run: episode seed {seed} failed: {error}", file=sys.stderr)
    return 1 if summary.failed else STRICT_EXIT if strict_failed else 0


def _specs(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from market.runner import (
        METRICS,
        USAGE_COLUMNS,
        RunConfigError,
        RunInterrupted,
        evaluate,
        evaluate_mechanisms,
    )

    if args.workers is not None and args.workers < 1:
        print(f"gpumarket eval: --workers {args.workers}: give at least 1", file=sys.stderr)
        return 2
    if args.expert_matrix:
        return _cmd_expert_matrix(args)
    args.agents = args.agents or DEFAULT_EVAL_AGENTS
    args.scenarios = args.scenarios or DEFAULT_EVAL_SCENARIOS
    args.seeds = list(range(20)) if args.seeds is None else args.seeds
    llm = _llm_options(args, "eval")
    if llm is None:
        return 2
    console = Console()
    try:
        if args.mechanisms:
            from scenarios import load_scenario

            name = load_scenario(args.scenario).name
            out = args.out or Path("runs") / "mechanisms" / name
            report = evaluate_mechanisms(
                args.scenario, args.seeds, out, args.workers,
                candidates=_specs(args.candidates) or None,
                alternatives=_specs(args.alternatives) or None,
                deviations=not args.no_deviations, progress=not args.no_progress,
                fresh=args.fresh, backend=args.backend, address=args.address,
                agent_timeout=args.agent_timeout)
        else:
            out = args.out or Path("runs") / "eval"
            table = evaluate(_specs(args.agents), _specs(args.scenarios), args.seat, args.seeds,
                             out, args.workers, transcripts=args.transcripts,
                             progress=not args.no_progress, fresh=args.fresh,
                             backend=args.backend, address=args.address, llm=llm,
                             agent_timeout=args.agent_timeout)
    except RunConfigError as exc:
        print(f"gpumarket eval: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(exc, file=sys.stderr)
        return 130
    if args.mechanisms:
        rich = Table(title=f"mechanisms on {report.scenario}: {len(report.seeds)} seed(s) "
                           "(mean +/- 95% CI)")
        for col in ("mechanism", *METRICS):
            rich.add_column(col, justify="left" if col == "mechanism" else "right")
        for row in report.table():
            rich.add_row(row["mechanism"], *(
                f"{row[k]:.1f}±{row[k + '_ci95']:.1f}" if k == "revenue"
                else f"{row[k]:.3f}±{row[k + '_ci95']:.3f}" for k in METRICS))
        console.print(rich)
        types = sorted({d.bidder_type for devs in report.deviations.values() for d in devs})
        if types:
            gains = Table(title="gain from deviating to the best alternative strategy "
                                "(paired, mean +/- 95% CI; > 0: a profitable deviation)")
            gains.add_column("mechanism")
            for kind in types:
                gains.add_column(kind, justify="right")
            for m in report.mechanisms:
                devs = {d.bidder_type: d for d in report.deviations.get(m, [])}
                cells = []
                for kind in types:
                    alt, gain, half = devs[kind].best if kind in devs else (None, 0.0, 0.0)
                    cells.append("" if alt is None else f"{gain:+.3f}±{half:.3f} {alt}")
                gains.add_row(m, *cells)
            console.print(gains)
        for note in report.notes:
            console.print(f"note: {note}", markup=False, highlight=False)
        print(f"tables: {out / 'mechanisms.md'}, {out / 'mechanisms.csv'}, "
              f"{out / 'deviations.csv'}; plots: {(out / 'mechanisms.html').resolve().as_uri()}")
        failed, health = report.failed, report.health
    else:
        rich = Table(title=f"{table.seat}: mean return +/- 95% CI over {len(table.seeds)} seed(s)"
                           " (* best per scenario)")
        rich.add_column("agent")
        for scenario in table.scenarios:
            rich.add_column(scenario, justify="right")
        for column in USAGE_COLUMNS:  # the seat's tokens and cost over every scenario and seed
            rich.add_column(column, justify="right")
        for line in table.grid():
            rich.add_row(*(c.replace("±", "+/-") for c in line))
        console.print(rich)
        print(f"tables: {out / 'eval.md'}, {out / 'eval.csv'}")
        failed, health = table.failed, table.health
    from market.health import STRICT_EXIT

    strict_failed = _report_health(console, health, args.strict, "eval")
    if llm["budget"] is not None:  # what the run spent, and whether the budget stopped it
        print(f"gpumarket eval: {llm['budget'].message()}", file=sys.stderr)
    for where, seeds in sorted(failed.items()):
        for seed, error in sorted(seeds.items()):
            print(f"gpumarket eval: {where}: episode seed {seed} failed: {error}", file=sys.stderr)
    return 1 if failed else STRICT_EXIT if strict_failed else 0


def _scenario_code(name: str) -> str:
    """A short column code for a scenario: its words' initials and its digits (MS0, ST)."""
    return "".join(part if part.isdigit() else part[:1].upper() for part in name.split("_") if part)


DEFAULT_EVAL_AGENTS = "rule_expert,truthful,no_negotiation,greedy_hoarder,always_accept,random_valid"
DEFAULT_EVAL_SCENARIOS = "single_trade,market_round,coalition_market"


def _cmd_expert_matrix(args: argparse.Namespace) -> int:
    """``gpumarket eval --expert-matrix``: rule_expert minus each scripted bidder, per scenario."""
    from market.expert_matrix import BASELINE, DEFAULT_SEEDS, expert_matrix
    from market.runner import RunConfigError

    if args.mechanisms:
        print("gpumarket eval: --expert-matrix and --mechanisms are two evaluations; give one",
              file=sys.stderr)
        return 2
    if args.backend != "local":
        print("gpumarket eval: --expert-matrix plays scripted seats in a local process pool; "
              "drop --backend", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / "expert_matrix"
    try:
        matrix = expert_matrix(
            DEFAULT_SEEDS if args.seeds is None else args.seeds, out, args.workers,
            members=_specs(args.agents) if args.agents else None,
            scenarios=_specs(args.scenarios) if args.scenarios else None,
            seat=args.seat, progress=not args.no_progress)
    except RunConfigError as exc:
        print(f"gpumarket eval: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpumarket eval: interrupted (the expert matrix is not resumable)", file=sys.stderr)
        return 130
    # members down, scenarios across (by code), means only: 13 x 10 cells with their CIs do not
    # fit a terminal; the files hold the CIs
    cells = {(c["member"], c["scenario"]): c for c in matrix.cells()}
    codes = [_scenario_code(s) for s in matrix.scenarios]
    if len(set(codes)) < len(codes):
        codes = [f"S{k}" for k in range(1, len(codes) + 1)]
    width = max(len(m) for m in [*matrix.members, "member"])
    print(f"{matrix.expert} minus each scripted bidder in {matrix.seat}: mean return difference "
          f"over {len(matrix.seeds)} paired seed(s); > : 95% CI above 0")
    print("member".ljust(width) + "".join(code.rjust(7) for code in codes))
    for member in matrix.members:
        print(member.ljust(width) + "".join(
            f"{cells[(member, s)]['diff']:+.2f}{'>' if cells[(member, s)]['low'] > 0 else ' '}"
            .rjust(7) for s in matrix.scenarios))
    print("codes: " + ", ".join(f"{c}={s}" for c, s in zip(codes, matrix.scenarios, strict=True)))
    behind = matrix.not_beaten()
    tightest = sorted(cells.values(), key=lambda c: c["low"])[:3]
    print(f"{len(cells) - len(behind)} of {len(cells)} cells above 0; lowest CI bounds: "
          + "; ".join(f"{c['scenario']} / {c['member']} {c['diff']:+.3f} +/- {c['ci95']:.3f}"
                      for c in tightest)
          + "".join(f"\n  not beaten: {c['scenario']} / {c['member']}: {c['diff']:+.3f} +/- "
                    f"{c['ci95']:.3f}" for c in behind[:10])
          + (f"\n  ... and {len(behind) - 10} more" if len(behind) > 10 else ""))
    for row in matrix.baseline():
        print(f"{BASELINE[0]} minus {BASELINE[1]} in {row['scenario']}: {row['diff']:+.3f} +/- "
              f"{row['ci95']:.3f}")
    print(f"tables: {out / 'expert_matrix.md'}, {out / 'expert_matrix.csv'}")
    for where, seeds in sorted(matrix.failed.items()):
        for seed, error in sorted(seeds.items()):
            print(f"gpumarket eval: {where}: episode seed {seed} failed: {error}", file=sys.stderr)
    return 1 if matrix.failed else 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from market.bench import bench_command

    return bench_command(args)


def _cmd_train(args: argparse.Namespace) -> int:
    try:
        from market import rl_train
    except ImportError:
        print("gpumarket train: needs torch: pip install 'gpumarket[rl]'", file=sys.stderr)
        return 2
    if max(args.eval_seeds) >= rl_train.TRAIN_SEED_FLOOR:
        print(f"gpumarket train: --eval-seeds must be below {rl_train.TRAIN_SEED_FLOOR} "
              "(training draws its episode seeds at or above it)", file=sys.stderr)
        return 2
    try:
        config = rl_train.TrainConfig(scenario=args.scenario, seat=args.seat, episodes=args.episodes,
                                      seconds=args.seconds, seed=args.seed,
                                      batch_episodes=args.batch, lr=args.lr)
        trainer = rl_train.Trainer(config)
    except ValueError as exc:
        print(f"gpumarket train: {one_line(exc)}", file=sys.stderr)
        return 2

    def progress(point: dict[str, float]) -> None:
        if point["episodes"] % (20 * config.batch_episodes) < config.batch_episodes:
            print(f"episodes {point['episodes']:>6}  {point['seconds']:7.1f}s  "
                  f"mean return {point['mean_return']:+.3f}", flush=True)

    result = trainer.train(progress)
    checkpoint = rl_train.save_checkpoint(result, args.out / "policy.pt")
    rl_train.write_curve(result, args.out / "curve.json")
    print(f"trained {result.episodes} episodes in {result.seconds:.1f}s: {checkpoint}, "
          f"{args.out / 'curve.json'}")
    if result.interrupted:
        print(f"gpumarket train: interrupted; the policy after {result.episodes} episodes is "
              f"saved in {checkpoint} (evaluate it with torch_policy?path={checkpoint})",
              file=sys.stderr)
        return 130
    if not args.no_eval:
        report = rl_train.evaluate(checkpoint, args.scenario, args.seat, args.eval_seeds)
        (args.out / "eval.json").write_text(json.dumps(report, indent=1))
        print(rl_train.format_evaluation(report))
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
    from agents.registry import REGISTRY, plugin_status

    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        print(f"{name:<18} {','.join(sorted(getattr(cls, 'roles', ()))):<16} {doc}")
    broken = []
    for plugin in plugin_status():  # each plug-in is imported, so a broken one shows here
        if plugin.name in REGISTRY:
            continue
        if plugin.error is None:
            print(f"{plugin.name:<18} {','.join(plugin.roles):<16} {plugin.doc} (plug-in {plugin.target})")
        else:
            broken.append(plugin.name)
            print(f"{plugin.name:<18} {'BROKEN':<16} plug-in {plugin.target}: {plugin.error}")
    if broken:
        print(f"gpumarket agents: {len(broken)} plug-in(s) cannot be used ({', '.join(broken)}); "
              "fix or uninstall the distribution that registers them", file=sys.stderr)
    print("also: py:package.module:ClassName?..., llm:openai?model=...&base_url=..., llm:hf?path=..., "
          "torch_policy?path=CHECKPOINT (a policy from gpumarket train)")
    return 0


def _cmd_export_sft(args: argparse.Namespace) -> int:
    from market.training_data import run_export_cli

    return run_export_cli(args)


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


def _tournament_config(args: argparse.Namespace) -> tuple[object, int, int | None]:
    """The tournament configuration from the arguments; ValueError with one line if bad."""
    from market.tournament import TournamentConfig

    def specs(text: str) -> tuple[str, ...]:
        return tuple(s.strip() for s in text.split(",") if s.strip())

    def count(flag: str, text: str, least: int) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: give a whole number") from None
        if value < least:
            raise ValueError(f"{flag} {text!r}: must be at least {least}")
        return value

    try:
        seeds = parse_seeds(args.seeds)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None
    populations = None
    for item in args.population:
        name, sep, members = item.partition("=")
        if not sep or not name.strip() or not specs(members):
            raise ValueError(f"--population {item!r}: write NAME=A,B,..., "
                             "e.g. mixed=shader,colluder")
        populations = populations or {}
        if name.strip() in populations:
            raise ValueError(f"--population {name.strip()!r} given twice")
        populations[name.strip()] = specs(members)
    config = TournamentConfig(args.scenario, specs(args.bidders), specs(args.designers), seeds,
                              args.house_designer, populations)
    workers = count("--workers", args.workers, 1)
    limit = None if args.max_matches is None else count("--max-matches", args.max_matches, 0)
    return config, workers, limit


def _cmd_tournament(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from market.tournament import TournamentError, check_manifest, plan, rich_table, run_tournament
    from scenarios import ScenarioError

    try:
        config, workers, limit = _tournament_config(args)
        planned = plan(config)
        out = args.out or Path("runs") / "tournament" / planned.scenario.name
        check_manifest(out, planned.manifest())
    except (TournamentError, ScenarioError, ValueError) as exc:
        print(f"gpumarket tournament: {one_line(exc)}", file=sys.stderr)
        return 2
    console = Console()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("matches", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            result = run_tournament(config, out, workers=workers, max_matches=limit,
                                    progress=progress, backend=args.backend,
                                    address=args.address, agent_timeout=args.agent_timeout)
        except (TournamentError, ScenarioError) as exc:
            bar.stop()
            print(f"gpumarket tournament: {one_line(exc)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            bar.stop()
            print(f"interrupted: finished matches are kept in {out}; rerun the same command to "
                  "resume", file=sys.stderr)
            return 130
    console.print(rich_table(planned, result.rows, result.done))
    state = "complete" if result.complete else "partial: rerun the same command to continue"
    console.print(f"{result.played} match(es) played now; {result.done} of {result.total} in "
                  f"{out} ({state}). Tables: {out / 'ratings.md'}, {out / 'ratings.csv'}")
    from market.health import STRICT_EXIT, from_matches
    from market.tournament import load_records

    health = from_matches(load_records(out, planned).values())  # per agent: its seats rotate
    return STRICT_EXIT if _report_health(console, health, args.strict, "tournament") else 0


def main(argv: list[str] | None = None) -> int:
    from scenarios import ScenarioError

    args = _parser().parse_args(argv)
    handler = {"run": _cmd_run, "eval": _cmd_eval, "bench": _cmd_bench, "train": _cmd_train, "validate": _cmd_validate, "agents": _cmd_agents,
               "replay": _cmd_replay,
               "report": _cmd_report, "show": _cmd_show,
               "tournament": _cmd_tournament, "export-sft": _cmd_export_sft}[args.command]
    try:
        return handler(args)
    except ScenarioError as exc:
        print(f"gpumarket {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
