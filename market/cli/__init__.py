"""The ``gpumarket`` command line.

Exit codes: 0 success, 1 a run failed (e.g. an episode raised), 2 bad usage or input (unknown
scenario, bad scenario key or value, bad seat spec, an output folder of another run), 3 a run with
``--strict`` in which a seat fell back on more than the allowed share of its decisions, 130
interrupted (Ctrl-C; finished episodes are kept and a rerun resumes).

The parser is :mod:`market.cli.parser`, the commands :mod:`market.cli.commands`; :func:`main` is
the ``gpumarket`` entry point (``market.cli:main``, ``python -m market``).
"""

from __future__ import annotations

import gc
import sys

from market.cli.commands import (
    cmd_agents,
    cmd_bench,
    cmd_eval,
    cmd_export_sft,
    cmd_replay,
    cmd_report,
    cmd_run,
    cmd_show,
    cmd_tournament,
    cmd_train,
    cmd_validate,
)
from market.cli.openenv_command import cmd_openenv
from market.cli.parser import EXAMPLES, build_parser, one_line, parse_seat, parse_seeds
from market.cli.play_command import cmd_play
from market.cli.serve_command import cmd_serve
from scenarios import ScenarioError


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        freeze_start_up()
    args = build_parser().parse_args(argv)
    handler = {
        "run": cmd_run,
        "eval": cmd_eval,
        "bench": cmd_bench,
        "train": cmd_train,
        "validate": cmd_validate,
        "agents": cmd_agents,
        "replay": cmd_replay,
        "report": cmd_report,
        "show": cmd_show,
        "tournament": cmd_tournament,
        "export-sft": cmd_export_sft,
        "openenv": cmd_openenv,
        "serve": cmd_serve,
        "play": cmd_play,
    }[args.command]
    try:
        return handler(args)
    except ScenarioError as exc:
        print(f"gpumarket {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def freeze_start_up() -> None:
    """Take what start-up made (modules, classes, models, scenario tables) out of the cyclic
    garbage collector's walks (:func:`gc.freeze`). It lives as long as the process, and every
    full collection walked all of it: about 6% of a ``large_market`` run's time, whose episodes
    leave enough long-lived objects to trigger full collections. Pool workers forked later
    inherit the frozen set. Only the command line does this (``main()`` without arguments), so
    a program that calls ``main([...])`` or imports gpumarket keeps its collector as it was."""
    gc.freeze()


__all__ = ["EXAMPLES", "build_parser", "main", "one_line", "parse_seat", "parse_seeds"]

if __name__ == "__main__":
    sys.exit(main())
