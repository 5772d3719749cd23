"""``gpumarket play SCENARIO --seat bidder_0``: a person plays one seat from the terminal.

The named seat is a :class:`agents.human.HumanAgent` (the observation drawn with ``rich``, the
action entered field by field or as raw JSON); every other seat is the scenario's default agent
unless ``--seat SEAT=SPEC`` says otherwise. The episode is the runner's
(:func:`market.run.rollout.run_episode`) with no time limit on decisions, and its transcript is a
normal one, ``<out>/<scenario>/<seed>.jsonl``: ``gpumarket replay`` replays it exactly and
``gpumarket export-sft`` exports the person's decisions. EOF or Ctrl-C ends the game: the
transcript ends with the ``aborted`` footer, its complete steps kept, and the command exits 130.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.table import Table

from agents.human import HumanAgent
from agents.registry import AgentSpecError
from market.core.seats import DESIGNER
from market.run.rollout import resolve_seats, run_episode
from scenarios import load_scenario

EXAMPLE = (
    "gpumarket play single_trade --seat bidder_0 --seed 3 "
    "--seat bidder_1=rule_expert   (docs/human-play.md)"
)


def add_play_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("scenario", help="built-in scenario name or path to a .toml file")
    cmd.add_argument(
        "--seat",
        action="append",
        default=[],
        metavar="SEAT or SEAT=AGENT",
        help="the seat you play (a bare name, e.g. bidder_0; exactly one), or another seat's "
        "agent (SEAT=AGENT, repeatable; default: the scenario's line-up)",
    )
    cmd.add_argument("--seed", type=int, default=0, help="episode seed (default 0)")
    cmd.add_argument(
        "--out",
        type=Path,
        default=Path("runs/play"),
        help="folder for the transcript, <out>/<scenario>/<seed>.jsonl (default runs/play)",
    )


def split_seats(values: list[str]) -> tuple[str, dict[str, str]]:
    """(the person's seat, other seat -> spec) from the ``--seat`` values; ValueError (one line)
    unless exactly one value is a bare seat name."""
    mine = [v.strip() for v in values if "=" not in v]
    if len(mine) != 1:
        raise ValueError(
            "name the seat you play exactly once, as a bare name: --seat bidder_0 "
            f"(got {len(mine)}: {', '.join(mine) or 'none'})"
        )
    others: dict[str, str] = {}
    for value in values:
        seat, sep, spec = value.partition("=")
        if sep:
            if not seat.strip() or not spec.strip():
                raise ValueError(f"--seat {value!r}: write SEAT=AGENT, e.g. bidder_1=truthful")
            others[seat.strip()] = spec.strip()
    if mine[0] in others:
        raise ValueError(f"--seat {mine[0]} is yours: do not also give it an agent")
    return mine[0], others


def cmd_play(args: argparse.Namespace) -> int:
    try:
        seat, others = split_seats(args.seat)
        scenario = load_scenario(args.scenario)
        lineup = resolve_seats(scenario, others)
        if seat not in lineup:
            raise ValueError(
                f"--seat {seat}: {scenario.name} has seats {', '.join(lineup)}; pick one of them"
            )
        human = HumanAgent()
        lineup[seat] = human
    except (ValueError, AgentSpecError) as exc:
        print(f"gpumarket play: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.seed < 0:
        print("gpumarket play: --seed must be >= 0", file=sys.stderr)
        return 2
    folder = args.out / scenario.name
    console = human.console
    role = "the market designer" if seat == DESIGNER else "a lab"
    console.print(
        f"You play {seat} ({role}) in {scenario.name}, seed {args.seed}. "
        "At each turn: a number or name picks the action, then its fields one by one "
        "(blank keeps a default); or paste the whole action as JSON. Ctrl-D or Ctrl-C quits.",
        markup=False,
    )
    try:
        result = run_episode(scenario, args.seed, lineup, transcript=folder, agent_timeout=0)
    except KeyboardInterrupt:
        print(
            f"game stopped; the transcript so far is {folder / f'{args.seed}.jsonl'} "
            "(ends with the aborted footer)",
            file=sys.stderr,
        )
        return 130
    table = Table(title=f"{scenario.name} seed {args.seed}: episode returns")
    table.add_column("seat")
    table.add_column("agent")
    table.add_column("return", justify="right")
    for name, value in result.returns.items():
        table.add_row(name, "you" if name == seat else result.seats[name], f"{value:.4f}")
    console.print(table)
    console.print(
        f"transcript: {result.transcript}  (gpumarket replay / show / report / export-sft it)",
        markup=False,
    )
    return 0
