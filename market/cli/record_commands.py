"""``gpumarket train``, ``report``, ``show`` and ``replay``: the commands that train a policy or
read what runs wrote (the exit codes are listed in :mod:`market.cli`)."""

from __future__ import annotations

import argparse
import json
import sys

from market.cli.flags import one_line
from market.record.console import terminal_console
from market.record.terminal import terminal_text
from market.record.transcript import TranscriptError
from market.review.replay_cli import run_cli
from market.review.report import write_episode_page, write_report, write_run_report
from market.review.viewer import render_transcript
from market.train import rl_train


def cmd_train(args: argparse.Namespace) -> int:
    if max(args.eval_seeds) >= rl_train.TRAIN_SEED_FLOOR:
        print(
            f"gpumarket train: --eval-seeds must be below {rl_train.TRAIN_SEED_FLOOR} "
            "(training draws its episode seeds at or above it)",
            file=sys.stderr,
        )
        return 2
    try:
        config = rl_train.TrainConfig(
            scenario=args.scenario,
            seat=args.seat,
            episodes=args.episodes,
            seconds=args.seconds,
            seed=args.seed,
            batch_episodes=args.batch,
            lr=args.lr,
        )
        trainer = rl_train.Trainer(config)
    except ValueError as exc:
        print(f"gpumarket train: {one_line(exc)}", file=sys.stderr)
        return 2

    def progress(point: dict[str, float]) -> None:
        if point["episodes"] % (20 * config.batch_episodes) < config.batch_episodes:
            print(
                f"episodes {point['episodes']:>6}  {point['seconds']:7.1f}s  "
                f"mean return {point['mean_return']:+.3f}",
                flush=True,
            )

    result = trainer.train(progress)
    checkpoint = rl_train.save_checkpoint(result, args.out / "policy.pt")
    rl_train.write_curve(result, args.out / "curve.json")
    print(
        f"trained {result.episodes} episodes in {result.seconds:.1f}s: {checkpoint}, "
        f"{args.out / 'curve.json'}"
    )
    if result.interrupted:
        print(
            f"gpumarket train: interrupted; the policy after {result.episodes} episodes is "
            f"saved in {checkpoint} (evaluate it with torch_policy?path={checkpoint})",
            file=sys.stderr,
        )
        return 130
    if not args.no_eval:
        report = rl_train.evaluate(checkpoint, args.scenario, args.seat, args.eval_seeds)
        (args.out / "eval.json").write_text(json.dumps(report, indent=1))
        print(rl_train.format_evaluation(report))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    return run_cli(args)


def cmd_report(args: argparse.Namespace) -> int:
    """One transcript or folder: the single page of :func:`write_report`; a run folder (the one
    ``gpumarket run`` writes): its run report, or with ``--episode SEED`` one episode's page."""
    first = args.paths[0]
    run_folder = len(args.paths) == 1 and (first / "results.jsonl").is_file()
    try:
        if args.episode is not None:
            if not run_folder:
                print(
                    f"gpumarket report: --episode needs one run folder (with results.jsonl), "
                    f"not {' '.join(map(str, args.paths))}; e.g. gpumarket report "
                    f"runs/market_round --episode {args.episode}",
                    file=sys.stderr,
                )
                return 2
            page = write_episode_page(first, args.episode, args.output)
            print(f"episode page written to {page.resolve().as_uri()}")
            return 0
        if run_folder:
            report = write_run_report(first, out=args.output)
            print(
                f"report written to {report.path.resolve().as_uri()} "
                f"({len(report.pages)} episode page(s))"
            )
            return 0
        out = args.output or ((first if first.is_dir() else first.parent) / "report.html")
        path = write_report(args.paths, out)
    except (FileNotFoundError, TranscriptError) as exc:
        print(f"gpumarket report: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {path.resolve().as_uri()}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    try:
        render_transcript(args.path, terminal_console(), round=args.round, steps=not args.no_steps)
    except (TranscriptError, ValueError) as exc:
        print(terminal_text(f"gpumarket show: {exc}", False), file=sys.stderr)
        return 2
    return 0


__all__ = ["cmd_replay", "cmd_report", "cmd_show", "cmd_train"]
