"""The ``gpumarket`` command line.

Exit codes: 0 success, 1 a run failed (e.g. an episode raised), 2 bad usage or input (unknown
scenario, bad scenario key or value, bad seat spec, an output folder of another run), 3 a run with
``--strict`` in which a seat fell back on more than the allowed share of its decisions, 130
interrupted (Ctrl-C; finished episodes are kept and a rerun resumes).

The parser is :mod:`market.cli.parser`; :func:`main` is the ``gpumarket`` entry point
(``market.cli:main``, ``python -m market``). Start-up: a command's module is imported when that
command runs (:func:`handler`), so ``gpumarket --help`` and ``gpumarket agents`` never import the
environment or the run stack; tests/test_architecture.py checks which modules they load.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable

from market.cli.commands import cmd_agents
from market.cli.flags import one_line, parse_seat, parse_seeds
from market.cli.local_exit import exit_hard_after
from market.cli.parser import EXAMPLES, build_parser

Handler = Callable[[argparse.Namespace], int]


def handler(command: str) -> Handler:
    """The function of ``command``, its module imported now (see the module doc), before
    :func:`freeze_start_up` freezes what was loaded."""
    if command == "agents":
        return cmd_agents
    if command == "bench":  # the OpenAI client and the benchmarks' servers (issue 15)
        from market.bench.suite import bench_command

        return bench_command
    if command == "export-sft":  # LLM prompts: jinja2 (issue 15)
        from market.train.training_data import run_export_cli

        return run_export_cli
    if command in ("run", "eval", "tournament"):
        from market.cli.run_commands import cmd_eval, cmd_run, cmd_tournament

        return {"run": cmd_run, "eval": cmd_eval, "tournament": cmd_tournament}[command]
    if command in ("train", "report", "show", "replay"):
        from market.cli.record_commands import cmd_replay, cmd_report, cmd_show, cmd_train

        return {"train": cmd_train, "report": cmd_report, "show": cmd_show, "replay": cmd_replay}[
            command
        ]
    if command == "validate":
        from market.cli.validate_command import cmd_validate

        return cmd_validate
    if command == "play":
        from market.cli.play_command import cmd_play

        return cmd_play
    if command == "serve":
        from market.cli.serve_command import cmd_serve

        return cmd_serve
    if command == "openenv":
        from market.cli.openenv_command import cmd_openenv

        return cmd_openenv
    if command == "train-llm":
        from market.cli.train_command import cmd_train_llm

        return cmd_train_llm
    raise KeyError(command)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare ``gpumarket``: what there is to do
        parser.print_help()
        return 0
    run = handler(args.command)
    if argv is None:
        freeze_start_up()
        run = exit_hard_after(run)  # a local model's threads must not abort the exit
    try:
        return run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (``gpumarket agents | head``): nothing to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stays open: Python flushes it at exit
        return 0
    except ValueError as exc:
        if not _scenario_error(exc):
            raise
        print(f"gpumarket {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2


def _scenario_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a :class:`scenarios.ScenarioError`; one can only have been raised if
    ``scenarios`` was imported, so a command that never loads it does not import it here."""
    scenarios = sys.modules.get("scenarios")
    return scenarios is not None and isinstance(exc, scenarios.ScenarioError)


def freeze_start_up() -> None:
    """Take what start-up made (modules, classes, models, scenario tables) out of the cyclic
    garbage collector's walks (:func:`gc.freeze`). It lives as long as the process, and every
    full collection walked all of it: about 6% of a ``large_market`` run's time, whose episodes
    leave enough long-lived objects to trigger full collections. Pool workers forked later
    inherit the frozen set. Called once the command's module is imported (:func:`handler`), so
    that what the command loaded is frozen too. Only the command line does this (``main()``
    without arguments), so a program that calls ``main([...])`` or imports gpumarket keeps its
    collector as it was."""
    gc.freeze()


__all__ = ["EXAMPLES", "build_parser", "handler", "main", "one_line", "parse_seat", "parse_seeds"]

if __name__ == "__main__":
    sys.exit(main())
