"""``gpumarket play SCENARIO --seat bidder_0``: a person plays one seat from the terminal.

The named seat is a :class:`agents.human.HumanAgent` (the story since its last turn, its state
and the actions valid now in plain sentences; an action picked from the menu and its fields
answered from listed choices, or raw JSON); every other seat is the scenario's default agent
unless ``--seat SEAT=SPEC`` says otherwise. The episode is the runner's loop
(:class:`market.run.rollout.Episode`) with no time limit on decisions, plus what a person is
told: the market's verdict right after each action and the rewards since the last turn
(:func:`play_episode`). Its transcript is a normal one, ``OUT/<seed>.jsonl`` (``--out``, default
``runs/play/<scenario>``): ``gpumarket replay`` replays it exactly and
``gpumarket export-sft`` exports the person's decisions. EOF or Ctrl-C ends the game: the
transcript ends with the ``aborted`` footer, its complete steps kept, and the command exits 130.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from agents.human import HumanAgent
from agents.registry import AgentSpecError
from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER
from market.environment.aec import raw_env
from market.environment.observe import last_action_view
from market.run.rollout import Episode, EpisodeResult, resolve_seats
from scenarios import load_scenario


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
        default=None,
        metavar="DIR",
        help="the folder this command writes the transcript, <seed>.jsonl, into (default: "
        "runs/play/SCENARIO)",
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


def play_episode(
    scenario: Scenario,
    seed: int,
    lineup: dict[str, Any],
    seat: str,
    human: HumanAgent,
    transcript: Path,
) -> EpisodeResult:
    """:func:`market.run.rollout.run_episode`'s loop, with no time limit, that also tells the
    person's seat the market's verdict right after each of its actions, its rewards by component
    since its last turn (the episode's tally) and, at the end, what happened after its last turn.
    A KeyboardInterrupt (the person quit) ends the transcript with the aborted footer."""
    episode = Episode(raw_env(scenario), seed, lineup, transcript, 1, agent_timeout=0)
    env, seen = episode.env, dict[str, float]()

    def since_last_turn() -> dict[str, float]:
        nonlocal seen
        now = dict(episode.tally.components.get(seat, {}))
        delta = {k: v - seen.get(k, 0.0) for k, v in now.items() if v != seen.get(k, 0.0)}
        seen = now
        return delta

    try:
        for name, obs, live in episode.turns():
            action = error = latency = None
            if name == seat:
                human.note_rewards(since_last_turn())
                if not live:
                    human.farewell(obs)
            if live:
                action, error, latency = episode.act(name, obs)
            episode.step(name, obs, live, action, latency, error)
            if live and name == seat:
                human.note_verdict(last_action_view(env.infos.get(seat, {}), env.scenario))
    except BaseException as exc:  # the person quit, or a bug: the transcript says aborted
        episode.abort(exc)
        raise
    return episode.result()


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
    folder = args.out or Path("runs/play") / scenario.name
    console = human.console
    role = "the market designer" if seat == DESIGNER else "a lab"
    console.print(
        f"You play {seat} ({role}) in {scenario.name}, seed {args.seed}. "
        "At each turn: a number or name picks the action, then its fields one by one "
        "(blank keeps a default); or paste the whole action as JSON. Ctrl-D or Ctrl-C quits.",
        markup=False,
    )
    try:
        result = play_episode(scenario, args.seed, lineup, seat, human, folder)
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
