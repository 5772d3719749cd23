"""The options of the ``gpumarket`` commands (but play, serve and openenv, whose modules hold
theirs), added to a command's parser when that command runs (:mod:`market.cli.parser`).

One grammar (docs/running.md, "One grammar"): the commands that run episodes over seeds (run,
eval, tournament) take the same episode options from :func:`add_episode_options`: ``--seeds``
(default :data:`~market.cli.flags.DEFAULT_SEEDS`), ``--workers``, ``--no-progress`` and ``--out``,
the folder the command writes its files into; and the same health options
(``--agent-timeout``, ``--strict``) and backends (``--backend``, ``--address``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from market.bench.config import add_bench_arguments
from market.cli.flags import (
    DEFAULT_SEEDS,
    parse_seat,
    parse_seconds,
    parse_seeds,
    parse_workers,
)
from market.cli.leaderboard_command import add_leaderboard_arguments
from market.run.async_runner import add_llm_arguments
from market.run.health import STRICT_EXIT, parse_share


def add_episode_options(
    cmd: argparse.ArgumentParser, out: str, *, seeds_type: bool = True, seeds_help: str = ""
) -> None:
    """``--seeds``, ``--workers``, ``--no-progress`` and ``--out`` (``out``: what the default
    folder is). ``seeds_type=False`` leaves ``--seeds`` and ``--workers`` as text for the command
    to parse (tournament reports them on one line of its own)."""
    cmd.add_argument(
        "--seeds",
        type=parse_seeds if seeds_type else str,
        default=DEFAULT_SEEDS,
        help=f"START:STOP or a comma list (default {DEFAULT_SEEDS}){seeds_help}",
    )
    cmd.add_argument(
        "--workers",
        type=parse_workers if seeds_type else str,
        default=None,
        metavar="N",
        help="worker processes (default: every CPU core; 1 plays in this process)",
    )
    cmd.add_argument("--no-progress", action="store_true", help="no progress bar")
    cmd.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"the folder this command writes its files into (default: {out})",
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
        type=parse_seconds,
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


def add_seat(cmd: argparse.ArgumentParser, what: str) -> None:
    cmd.add_argument(
        "--seat",
        type=parse_seat,
        action="append",
        default=[],
        metavar="SEAT=AGENT",
        help=f"{what}, e.g. bidder_0=random_valid (repeatable)",
    )


def run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "scenario",
        nargs="?",
        default="market_round",
        help="built-in name or TOML path (default: market_round)",
    )
    add_seat(run, "fill a seat")
    add_episode_options(run, "runs/SCENARIO")
    run.add_argument(
        "--json", type=Path, help="also write the per-episode results as JSON to this file"
    )
    run.add_argument("--no-transcripts", action="store_true", help="do not record transcripts")
    run.add_argument("--no-report", action="store_true", help="do not write the run report")
    run.add_argument(
        "--fresh",
        action="store_true",
        help="discard what the run folder holds and start over (default: resume)",
    )
    add_backend(run)
    add_health(run)
    add_llm_arguments(run)


def eval_options(ev: argparse.ArgumentParser) -> None:
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
    add_episode_options(
        ev,
        "runs/eval; with --mechanisms runs/mechanisms/SCENARIO, --expert-matrix "
        "runs/expert_matrix, --leaderboard runs/leaderboard",
    )
    ev.add_argument("--transcripts", action="store_true", help="also record transcripts")
    ev.add_argument("--fresh", action="store_true", help="discard earlier results in OUT first")
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
        "daedalus family (docs/running.md shows it over --seeds 0:100)",
    )
    ev.add_argument(
        "--negotiation",
        action="store_true",
        help="the negotiation report: value of talk, cost of lying, contract, breach and "
        "default rates, hedging gain and negotiable welfare per scenario, paired over --seeds "
        "(default 0:60; docs/negotiation.md); --agents adds agents whose value of talk it measures",
    )
    add_leaderboard_arguments(ev)
    add_backend(ev)
    add_health(ev)
    add_llm_arguments(ev)


def tournament_options(tour: argparse.ArgumentParser) -> None:
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
    add_episode_options(tour, "runs/tournament/SCENARIO", seeds_type=False)
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


def train_options(tr: argparse.ArgumentParser) -> None:
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
        metavar="DIR",
        help="the folder this command writes policy.pt, curve.json and eval.json into "
        "(default: runs/train)",
    )
    tr.add_argument(
        "--eval-seeds",
        type=parse_seeds,
        default="0:30",
        help="held-out seeds for the evaluation (default 0:30)",
    )
    tr.add_argument("--no-eval", action="store_true", help="skip the evaluation")


def validate_options(validate: argparse.ArgumentParser) -> None:
    validate.add_argument(
        "scenarios",
        nargs="*",
        metavar="SCENARIO",
        help="a scenario file (.toml) or a built-in scenario name (repeatable); none: list the "
        "built-in scenarios",
    )
    add_seat(validate, "check the line-up with this seat's agent too, as run --seat would")


def report_options(report: argparse.ArgumentParser) -> None:
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


def show_options(show: argparse.ArgumentParser) -> None:
    show.add_argument("path", type=Path, metavar="FILE", help="a transcript (.jsonl)")
    show.add_argument("--round", type=int, default=None, metavar="N", help="only round N")
    show.add_argument(
        "--no-steps", action="store_true", help="leave out each round's list of actions"
    )


def replay_options(replay: argparse.ArgumentParser) -> None:
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


def export_sft_options(sft: argparse.ArgumentParser) -> None:
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


#: command -> the function that adds its options (play, serve, openenv and agents: see
#: :func:`market.cli.parser.command_options`)
OPTIONS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "run": run_options,
    "eval": eval_options,
    "tournament": tournament_options,
    "train": train_options,
    "validate": validate_options,
    "report": report_options,
    "show": show_options,
    "replay": replay_options,
    "export-sft": export_sft_options,
    "bench": add_bench_arguments,
}

__all__ = ["OPTIONS", "add_backend", "add_episode_options", "add_health"]
