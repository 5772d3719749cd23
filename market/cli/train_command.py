"""``gpumarket train-llm {sft,grpo,eval} CONFIG.toml``: LoRA fine-tuning of an LLM seat with TRL
and its held-out evaluation (:mod:`market.train.llm_train`; docs/training.md).

A bad config or run folder is one line per problem on stderr and exit code 2 (no traceback);
missing training packages say which to install."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from market.cli.flags import one_line
from market.train.llm_config import TrainConfigError
from market.train.llm_train import run_stage

TRAIN_HINT = "pip install torch==2.13.0 && pip install -e '.[train]'"


def add_train_llm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stage", choices=("sft", "grpo", "eval"), help="what to run")
    parser.add_argument("config", type=Path, metavar="CONFIG.toml", help="the run's TOML config")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the run folder (default runs/train-llm/CONFIG-STAGE); given again, the run "
        "continues from its last checkpoint",
    )
    parser.add_argument("--fresh", action="store_true", help="discard the run folder first")
    parser.add_argument(
        "--no-eval", action="store_true", help="skip the held-out evaluation after training"
    )


def cmd_train_llm(args: argparse.Namespace) -> int:
    """0 done, 2 unusable config or run folder, or a missing package (one line each)."""
    try:
        folder = run_stage(
            args.stage, args.config, args.out, fresh=args.fresh, run_eval=not args.no_eval
        )
    except TrainConfigError as exc:
        for line in str(exc).splitlines():
            print(f"gpumarket train-llm: {line}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(
            f"gpumarket train-llm: missing {exc.name}: {TRAIN_HINT} (peft too: pip install peft)",
            file=sys.stderr,
        )
        return 2
    except (ValueError, OSError) as exc:  # e.g. a model path, an unknown scenario or agent
        print(f"gpumarket train-llm: {one_line(exc)}", file=sys.stderr)
        return 2
    print(f"run folder: {folder}")
    return 0


__all__ = ["add_train_llm_arguments", "cmd_train_llm"]
