"""The ``gpumarket`` argument parser: every command, its options, help and example."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from market.bench.config import add_bench_arguments
from market.cli.leaderboard_command import add_leaderboard_arguments
from market.cli.openenv_command import add_openenv_parser
from market.cli.play_command import EXAMPLE as PLAY_EXAMPLE
from market.cli.play_command import add_play_arguments
from market.cli.serve_command import EXAMPLE as SERVE_EXAMPLE
from market.cli.serve_command import add_serve_arguments
from market.run.async_runner import add_llm_arguments
from market.run.health import STRICT_EXIT, parse_share

EXAMPLES = {
    "run": "gpumarket run market_round --seeds 0:20 --seat bidder_0=rule_expert --out runs\n"
    "  (writes runs/market_round/; rerun the same command to resume, --fresh to start over)\n"
    "         gpumarket run large_market --seeds 0:1000 --backend ray --address 10.0.0.5:6379",
    "eval": "gpumarket eval --agents rule_expert,truthful,random_valid "
    "--scenarios single_trade,market_round --seat bidder_0 --seeds 0:20 --out runs/eval\n"
    "         gpumarket eval --mechanisms --scenario mechanism_stage_4 --seeds 0:30\n"
    "         gpumarket eval --expert-matrix --workers 8\n"
    '         gpumarket eval --leaderboard --agents "llm?model=m&base_url=http://127.0.0.1:8080/v1,truthful" '
    "--scenarios single_trade,market_round --seeds 0:5",
    "bench": "gpumarket bench --json bench.json   (later: gpumarket bench --compare bench.json)\n"
    "         gpumarket bench --only clearing,memory --quick\n"
    "         gpumarket bench --compare old.json new.json --threshold 0.2",
    "train": "gpumarket train --scenario market_round --seat bidder_0 --episodes 3000 "
    "--out runs/train\n  (then: gpumarket run market_round --seeds 0:20 "
    "--seat bidder_0=torch_policy?path=runs/train/policy.pt)",
    "validate": "gpumarket validate my_scenario.toml",
    "agents": "gpumarket agents",
    "openenv": "gpumarket openenv --port 8000   (then: MarketEnvClient(base_url="
    '"http://127.0.0.1:8000"); docs/openenv.md)',
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
    "serve": SERVE_EXAMPLE,
    "play": PLAY_EXAMPLE,
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
        raise argparse.ArgumentTypeError(
            f"--seeds {text!r}: use START:STOP (e.g. 0:20) or a comma list (e.g. 1,5,9)"
        ) from None
    if not seeds:
        raise argparse.ArgumentTypeError(
            f"--seeds {text!r} selects no seed; STOP must be above START"
        )
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
            f"--agent-timeout {text!r}: give seconds from 0 up (e.g. 30; 0: no limit)"
        )
    return value


def parse_seat(text: str) -> tuple[str, str]:
    seat, sep, spec = text.partition("=")
    if not sep or not seat or not spec:
        raise argparse.ArgumentTypeError(
            f"--seat {text!r}: write SEAT=AGENT, e.g. bidder_0=truthful"
        )
    return seat.strip(), spec.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumarket", description="Multi-agent GPU market: run scenarios, benchmark, validate."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        # argparse %-formats help strings (not descriptions): "95% CI" must be written "95%% CI"
        return sub.add_parser(
            name,
            help=help_.replace("%", "%%"),
            description=help_,
            epilog=f"example: {EXAMPLES[name]}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    def add_backend(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument(
            "--backend",
            choices=("local", "ray"),
            default="local",
            help="where episodes run: 'local' (a process pool, default) or 'ray' "
            "(Ray tasks; needs pip install 'gpumarket[ray]')",
        )
        cmd.add_argument(
            "--address",
            default=None,
            metavar="HOST:PORT",
            help="with --backend ray: the cluster to join (its head's address, or "
            "'auto'); default: a private Ray instance on this machine",
        )

    def add_health(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument(
            "--agent-timeout",
            type=_seconds,
            default=None,
            metavar="SECONDS",
            help="seconds one decision of a seat may take; past it the seat plays "
            "its fallback action and a timeout is counted (default: the "
            "scenario's agent_timeout, 120; 0: no limit)",
        )
        cmd.add_argument(
            "--strict",
            type=parse_share,
            nargs="?",
            const=0.0,
            default=None,
            metavar="SHARE",
            help=f"exit with code {STRICT_EXIT} when a seat (or an LLM judge) fell "
            "back on more than SHARE of its decisions: agent errors, timeouts "
            "and the agent's own fallbacks (SHARE from 0 to 1 or a percentage; "
            "default 0: any fallback fails the run)",
        )

    run = add(
        "run",
        "Run a scenario over seeds in parallel and print mean +/- 95% CI of each "
        "seat's reward components. Every finished episode is kept in "
        "OUT/SCENARIO/results.jsonl (one row per episode and seat) with its transcript "
        "in OUT/SCENARIO/transcripts/; rerunning skips the episodes already there.",
    )
    run.add_argument(
        "scenario",
        nargs="?",
        default="market_round",
        help="built-in name or TOML path (default: market_round)",
    )
    run.add_argument(
        "--seeds",
        type=parse_seeds,
        default=list(range(8)),
        help="START:STOP or a comma list (default 0:8)",
    )
    run.add_argument(
        "--seat",
        type=parse_seat,
        action="append",
        default=[],
        metavar="SEAT=AGENT",
        help="fill a seat, e.g. bidder_0=random_valid (repeatable)",
    )
    run.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: every CPU core; 1 runs in this process)",
    )
    run.add_argument(
        "--json", type=Path, help="also write the per-episode results as JSON to this file"
    )
    run.add_argument(
        "--out",
        type=Path,
        default=Path("runs"),
        help="the run goes to the folder OUT/<scenario> (default: runs)",
    )
    run.add_argument("--no-transcripts", action="store_true", help="do not record transcripts")
    run.add_argument("--no-report", action="store_true", help="do not write the run report")
    run.add_argument(
        "--fresh",
        action="store_true",
        help="discard what OUT/<scenario> holds and start over (default: resume)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_backend(run)
    add_health(run)
    add_llm_arguments(run)

    ev = add(
        "eval",
        "Evaluate agents in one seat across scenarios: a table of the seat's mean "
        "return +/- 95% CI per agent x scenario (other seats keep each scenario's "
        "agents), printed and written to OUT/eval.csv and OUT/eval.md. With "
        "--mechanisms: compare mechanisms on one scenario (welfare ratio, revenue, "
        "fairness, participation, stability, designer composite) and each bidder "
        "type's gain from deviating to its best alternative built-in strategy; "
        "written to OUT/mechanisms.{csv,md,html}. Resumable like run. With "
        "--expert-matrix: rule_expert minus every scripted bidder of the population "
        "in every built-in scenario but the daedalus family, paired on the same seeds "
        "(mean +/- 95% CI), "
        "written to OUT/expert_matrix.{csv,md}.",
    )
    ev.add_argument(
        "--agents",
        default=None,
        metavar="A,B,...",
        help="agent specs for the seat, comma-separated (default: rule_expert and the "
        "GPU-arena baselines; with --expert-matrix: the agents rule_expert is "
        "compared with, default every scripted bidder)",
    )
    ev.add_argument(
        "--scenarios",
        default=None,
        metavar="S1,S2,...",
        help="built-in names or TOML paths (default: the three GPU-arena tasks; with "
        "--expert-matrix: every built-in scenario but the daedalus family)",
    )
    ev.add_argument(
        "--seat", default="bidder_0", help="the seat the agents take (default: bidder_0)"
    )
    ev.add_argument(
        "--seeds",
        type=parse_seeds,
        default=None,
        help="START:STOP or a comma list (default 0:20; with --expert-matrix 0:100)",
    )
    ev.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: runs/eval, or runs/mechanisms/SCENARIO)",
    )
    ev.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: every CPU core)"
    )
    ev.add_argument("--transcripts", action="store_true", help="also record transcripts")
    ev.add_argument("--fresh", action="store_true", help="discard earlier results in OUT first")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.add_argument(
        "--mechanisms",
        action="store_true",
        help="compare mechanisms on --scenario instead of agents",
    )
    ev.add_argument(
        "--scenario",
        default="mechanism_stage_4",
        help="with --mechanisms: the scenario (default: mechanism_stage_4)",
    )
    ev.add_argument(
        "--candidates",
        default="",
        metavar="M1,M2,...",
        help="with --mechanisms: which mechanisms (default: robust, first_price, vcg, "
        "fair_share, posted_price, random)",
    )
    ev.add_argument(
        "--alternatives",
        default="",
        metavar="A,B,...",
        help="with --mechanisms: strategies a bidder type may deviate to (default: "
        "every built-in bidder but the spammers)",
    )
    ev.add_argument(
        "--no-deviations",
        action="store_true",
        help="with --mechanisms: skip the deviation (incentive) check",
    )
    ev.add_argument(
        "--expert-matrix",
        action="store_true",
        help="rule_expert against every scripted bidder in every built-in scenario but the "
        "daedalus family",
    )
    add_leaderboard_arguments(ev)
    add_backend(ev)
    add_health(ev)
    add_llm_arguments(ev)

    bench = add(
        "bench",
        "Benchmark this machine: AEC steps/s per scenario, episodes/s with 1, 2 "
        "and all cores and on Ray, clearing time against market size (10 to "
        "10,000 bidders) with its growth exponent, memory per live env, "
        "transcript overhead, LLM decisions/s at concurrency 1/8/32 (fake server "
        "unless --llm-base-url). --json writes the figures; --compare OLD.json "
        "flags metrics > --threshold worse (exit 1). See docs/benchmarks.md.",
    )
    add_bench_arguments(bench)

    tr = add(
        "train",
        "Train a small torch policy (REINFORCE with a baseline) for one seat "
        "against the scenario's scripted population; save it, its learning "
        "curve and a paired evaluation vs random_valid and rule_expert. "
        "Needs torch (pip install 'gpumarket[rl]'). See docs/rl.md.",
    )
    tr.add_argument("--scenario", default="market_round", help="built-in name or TOML path")
    tr.add_argument("--seat", default="bidder_0", help="the seat to train (default bidder_0)")
    tr.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="training episodes (default 3000 unless --seconds is given)",
    )
    tr.add_argument("--seconds", type=float, default=None, help="training time budget")
    tr.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    tr.add_argument("--batch", type=int, default=16, help="episodes per update (default 16)")
    tr.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    tr.add_argument(
        "--out",
        type=Path,
        default=Path("runs/train"),
        help="writes policy.pt, curve.json, eval.json here (default runs/train)",
    )
    tr.add_argument(
        "--eval-seeds",
        type=parse_seeds,
        default="0:30",
        help="held-out seeds for the evaluation (default 0:30)",
    )
    tr.add_argument("--no-eval", action="store_true", help="skip the evaluation")

    validate = add(
        "validate", "Validate scenario files (or built-in names) and report every problem."
    )
    validate.add_argument("scenarios", nargs="+")

    add("agents", "List the registered agents and the seats they can fill.")
    add_openenv_parser(add)

    report = add(
        "report",
        "Write one self-contained HTML report (plots, trade/coalition graph, "
        "every round) of a transcript or a folder of transcripts (*.jsonl); of a run "
        "folder, the run report (aggregates, episode index, sampled episode pages).",
    )
    report.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="FILE|DIR",
        help="transcript files or folders of them",
    )
    report.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="HTML file to write (default: report.html in DIR, or next to FILE)",
    )
    report.add_argument(
        "--episode", type=int, metavar="SEED", help="of a run folder: write episode SEED's page"
    )

    show = add("show", "Print a transcript in the terminal, round by round.")
    show.add_argument("path", type=Path, metavar="FILE", help="a transcript (.jsonl)")
    show.add_argument("--round", type=int, default=None, metavar="N", help="only round N")
    show.add_argument(
        "--no-steps", action="store_true", help="leave out each round's list of actions"
    )

    replay = add(
        "replay",
        "Re-execute transcripts from their seed and verify every reward and "
        "state digest (exit 1 on the first divergence, 2 on an unusable file).",
    )
    replay.add_argument(
        "files", nargs="+", type=Path, help="transcript files, or directories of *.jsonl"
    )
    replay.add_argument(
        "--partial",
        action="store_true",
        help="replay the complete steps of a cut or aborted transcript",
    )
    replay.add_argument(
        "--update",
        action="store_true",
        help="re-record each file afresh (same seed; current built-in scenario), then verify "
        "it; seats play the file's specs only where they are built-in agents: name any other "
        "with --seat (a transcript never runs code)",
    )
    replay.add_argument(
        "--seat",
        type=parse_seat,
        action="append",
        default=[],
        metavar="SEAT=AGENT",
        help="with --update: the agent that plays SEAT in the re-recording (repeatable)",
    )
    replay.add_argument(
        "--rejudge",
        metavar="JUDGE",
        help="also score every round's pitches with this judge (rule, "
        "llm:openai?model=..., py:module:Judge); report how verdicts change",
    )
    replay.add_argument(
        "--ignore-digests",
        action="store_true",
        help="replay even if the digest chain shows the file was edited",
    )
    replay.add_argument(
        "--rounds", action="store_true", help="print a table of the replayed rounds"
    )

    tour = add(
        "tournament",
        "Rate bidders against each other (rotating through the bidder "
        "seats) and designers against bidder populations, with OpenSkill "
        "ratings, win rates and mean returns with confidence intervals. "
        "Resumable: finished matches are kept in OUT/matches.jsonl.",
    )
    tour.add_argument(
        "--bidders",
        default="",
        metavar="A,B,...",
        help="bidder agent specs, comma-separated (at least two)",
    )
    tour.add_argument(
        "--designers",
        default="",
        metavar="X,Y,...",
        help="designer agent specs, comma-separated (at least two)",
    )
    tour.add_argument(
        "--scenario",
        default="market_round",
        help="built-in name or TOML path (default: market_round)",
    )
    tour.add_argument("--seeds", default="0:10", help="START:STOP or a comma list (default 0:10)")
    tour.add_argument(
        "--out", type=Path, default=None, help="output folder (default: runs/tournament/SCENARIO)"
    )
    tour.add_argument(
        "--workers",
        default=str(min(4, os.cpu_count() or 1)),
        help="worker processes (default: CPU count, at most 4)",
    )
    tour.add_argument(
        "--house-designer",
        default=None,
        metavar="SPEC",
        help="designer seat in bidder matches (default: the scenario's designer)",
    )
    tour.add_argument(
        "--population",
        action="append",
        default=[],
        metavar="NAME=A,B,...",
        help="a bidder population designers face (repeatable; default: the "
        "scenario's own bidders and a mixed population)",
    )
    tour.add_argument(
        "--max-matches",
        default=None,
        metavar="N",
        help="stop after N new matches (rerun to continue)",
    )
    add_backend(tour)
    add_health(tour)

    sft = add(
        "export-sft",
        "Export the LLM decisions of transcripts as a chat-format SFT "
        "dataset (JSONL: messages = system, user, assistant; metadata = "
        "file, seed, step, seat, agent, rewards...). See "
        "docs/training-data.md.",
    )
    sft.add_argument(
        "transcripts",
        nargs="+",
        type=Path,
        metavar="TRANSCRIPT",
        help="transcript files, folders of *.jsonl, or run folders",
    )
    sft.add_argument("-o", "--output", type=Path, required=True, help="the JSONL file to write")
    sft.add_argument(
        "--seat", action="append", default=[], help="only this seat's decisions (repeatable)"
    )
    sft.add_argument(
        "--agent",
        default=None,
        metavar="GLOB",
        help="only seats whose recorded agent spec matches (e.g. 'llm:*')",
    )
    sft.add_argument(
        "--phase",
        action="append",
        default=[],
        choices=("design", "negotiation", "bidding"),
        help="only decisions in this phase (repeatable)",
    )
    sft.add_argument(
        "--min-reward",
        type=float,
        default=None,
        help="only decisions whose step reward is at least this",
    )
    sft.add_argument(
        "--min-return",
        type=float,
        default=None,
        help="only decisions of seats whose episode return is at least this",
    )
    sft.add_argument(
        "--valid-only",
        action="store_true",
        help="only decisions that parsed without fallback and that the env accepted",
    )
    sft.add_argument(
        "--include-scripted",
        action="store_true",
        help="also export scripted seats' decisions as the prompt an LLM seat would "
        "see plus the action JSON (for distilling a scripted agent)",
    )
    sft.add_argument(
        "--partial",
        action="store_true",
        help="export the complete steps of a cut or aborted transcript",
    )
    sft.add_argument(
        "--grpo",
        action="store_true",
        help="write GRPO prompt rows instead (prompt, transcript, step, "
        "transcript_sha256...) for TRL's GRPOTrainer with "
        "market.train.training_data.EnvReward; load with "
        "datasets.load_dataset('json', data_files=OUT)",
    )
    add_serve_arguments(
        add("serve", "Host matches with remote seats over HTTP, or an agent service.")
    )
    add_play_arguments(add("play", "Play one seat yourself, in the terminal, against agents."))
    return parser


def parse_specs(text: str) -> list[str]:
    """A comma-separated list of agent specs or scenario names, blanks dropped."""
    return [s.strip() for s in text.split(",") if s.strip()]


__all__ = ["EXAMPLES", "build_parser", "one_line", "parse_seat", "parse_seeds", "parse_specs"]
