"""The ``peer`` section of the bench suite: this env against the GPU-arena seed's, side by side.

gpumarket grew out of the GPU-arena seed, a single-agent negotiation env (package
``gpu_budget_arena``) with the tasks ``single_trade``, ``market_round`` and ``coalition_market``.
``gpumarket bench --peer-arena DIR`` times it from a checkout the user points to (DIR holds
``gpu_budget_arena/``) against the built-in scenarios of the same names, so the speed ratio can be
rerun by anyone on any machine.

Three line-ups per task, each timed in steps per CPU second of one thread
(``time.thread_time``, so time spent descheduled on a busy machine counts nowhere):

- ``seed_expert``: the seed's env with its ``rule_based_expert_policy`` deciding for the learning
  lab (its opponents are played inside the env's step, as in the seed);
- ``default``: this env with the scenario's default seats;
- ``rule_expert``: this env with ``rule_expert`` in every bidder seat (the designer seat keeps the
  scenario's default).

A step is one ``env.step`` call in both: in the seed, one decision of the learning lab (and the
opponents' replies); here, one seat's turn of the AEC cycle. Every line-up plays a warm-up
episode first, then ``passes`` interleaved passes (every task and line-up once per pass, each for
``seconds / passes`` CPU seconds and at least one episode); the figure is the median over passes,
so load that comes and goes hits all line-ups alike. It runs in a fresh interpreter with DIR on
its import path, so the seed's modules never enter the bench's own process.
"""

from __future__ import annotations

import importlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from market.bench.config import (
    BenchConfig,
    SectionResult,
    SectionSkipped,
    metric,
    run_in_subprocess,
)
from market.core.seats import is_bidder_seat
from market.environment.aec import raw_env
from market.run.rollout import run_episode

TASKS: tuple[str, ...] = ("single_trade", "market_round", "coalition_market")
OURS: tuple[str, ...] = ("default", "rule_expert")  # our line-ups, each compared with the seed's
LINEUPS: tuple[str, ...] = ("seed_expert", *OURS)
PASSES = 5
SEED_PACKAGE = "gpu_budget_arena"
SEED_MODULES: tuple[str, ...] = ("env.py", "models.py", "baselines.py")
#: speed targets against the seed's expert (``line-up -> task -> at least this ratio``)
TARGET_RATIOS: dict[str, dict[str, float]] = {
    "default": {"market_round": 5.0, "single_trade": 3.0},
    "rule_expert": dict.fromkeys(TASKS, 3.0),
}

Play = Callable[[int], int]  # seed -> steps of one episode


class PeerArenaError(ValueError):
    """A ``--peer-arena`` folder that is not a checkout of the seed (the message is one line)."""


def check_peer_dir(path: str | Path) -> Path:
    """The checkout's root (the folder holding ``gpu_budget_arena/``), or a one-line error that
    says what is missing."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise PeerArenaError(f"--peer-arena {path}: no such folder")
    if (root / "env.py").is_file() and root.name == SEED_PACKAGE:
        root = root.parent  # the package folder itself was given
    missing = [m for m in SEED_MODULES if not (root / SEED_PACKAGE / m).is_file()]
    if missing:
        raise PeerArenaError(
            f"--peer-arena {path}: not a checkout of the GPU-arena seed (no "
            f"{', '.join(f'{SEED_PACKAGE}/{m}' for m in missing)} under it); give the folder "
            f"that holds {SEED_PACKAGE}/"
        )
    return root.resolve()


def seed_player(task: str) -> Play:
    """One episode of the seed's ``task`` with its expert policy; returns the steps taken.
    The seed's package must be importable (its checkout on ``sys.path``)."""
    env_module = importlib.import_module(f"{SEED_PACKAGE}.env")
    models = importlib.import_module(f"{SEED_PACKAGE}.models")
    policy = importlib.import_module(f"{SEED_PACKAGE}.baselines").rule_based_expert_policy
    env = env_module.GpuBudgetNegotiationEnv()

    def play(seed: int) -> int:
        obs = env.reset(models.ResetConfig(task_type=task, seed=seed))
        steps = 0
        while not obs.done:
            obs = env.step(policy(obs))
            steps += 1
        return steps

    return play


def our_player(task: str, lineup: str) -> Play:
    """One episode of this package's built-in scenario ``task`` with the ``lineup``'s seats on
    one reused env; returns the AEC steps taken."""
    env = raw_env(task)
    seats = lineup_seats(env.possible_agents, lineup)

    def play(seed: int) -> int:
        return run_episode(task, seed, seats, env=env).steps

    return play


def lineup_seats(seats: list[str], lineup: str) -> dict[str, str] | None:
    """The seat overrides of a line-up of ours: none for ``default``, ``rule_expert`` in every
    bidder seat for ``rule_expert``."""
    if lineup == "default":
        return None
    if lineup == "rule_expert":
        return {seat: "rule_expert" for seat in seats if is_bidder_seat(seat)}
    raise ValueError(f"unknown line-up {lineup!r}; choose from default, rule_expert")


def cpu_rate(play: Play, seconds: float, seed: int) -> tuple[int, int, float]:
    """Episodes from ``seed`` on until ``seconds`` of this thread's CPU time have passed (at least
    one): (episodes, steps, CPU seconds)."""
    clock = time.thread_time
    start = clock()
    episodes = steps = 0
    while episodes == 0 or clock() - start < seconds:
        steps += play(seed + episodes)
        episodes += 1
    return episodes, steps, clock() - start


def peer_rates(peer_dir: str, seconds: float, passes: int = PASSES) -> dict[str, Any]:
    """Steps per CPU second of every task and line-up (see the module docstring), in this
    process, with ``peer_dir`` put first on ``sys.path``. Returns the medians and every pass."""
    root = check_peer_dir(peer_dir)
    sys.path.insert(0, str(root))
    players: dict[tuple[str, str], Play] = {}
    for task in TASKS:
        players[task, "seed_expert"] = seed_player(task)
        for lineup in OURS:
            players[task, lineup] = our_player(task, lineup)
    for play in players.values():
        play(0)  # warm-up: imports, caches, the first reset
    slice_s = seconds / max(1, passes)
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in players}
    seeds = dict.fromkeys(players, 1)
    for _ in range(max(1, passes)):
        for key, play in players.items():
            episodes, steps, cpu = cpu_rate(play, slice_s, seeds[key])
            seeds[key] += episodes
            rates[key].append(steps / cpu if cpu > 0 else float("inf"))
    tasks: dict[str, dict[str, Any]] = {}
    for task in TASKS:
        row: dict[str, Any] = {}
        for lineup in LINEUPS:
            row[lineup] = statistics.median(rates[task, lineup])
            row[f"{lineup}_passes"] = rates[task, lineup]
        for lineup in OURS:
            row[f"{lineup}_ratio"] = row[lineup] / row["seed_expert"]
        tasks[task] = row
    return {"tasks": tasks, "passes": max(1, passes), "peer_commit": _commit_of(root)}


def _commit_of(root: Path) -> str | None:
    """The checkout's git commit, when it is a git work tree and git is at hand."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def section_peer(config: BenchConfig) -> SectionResult:
    if config.peer_arena is None:
        raise SectionSkipped(
            "no --peer-arena DIR given (a checkout of the GPU-arena seed to time against)"
        )
    root = check_peer_dir(config.peer_arena)
    # every task and line-up gets `seconds` of CPU time in all, as a scenario does in `steps`
    found = run_in_subprocess(__name__, "peer_rates", str(root), config.seconds, PASSES)
    metrics = []
    for task, row in found["tasks"].items():
        for lineup in LINEUPS:
            name, value = f"peer.{task}.{lineup}", row[lineup]
            metrics.append(
                metric(f"{name}.steps_per_cpu_s", value, "steps/CPU s", "higher", "peer")
            )
            if lineup in OURS:
                ratio = row[f"{lineup}_ratio"]
                metrics.append(metric(f"{name}.ratio", ratio, "x", "higher", "peer"))
    return SectionResult(metrics, {"peer_dir": str(root), **found})


def peer_targets(details: dict[str, Any]) -> list[dict[str, Any]]:
    """The speed targets against the seed that a ``peer`` section's figures check."""
    out = []
    for lineup, wanted in TARGET_RATIOS.items():
        for task, ratio in wanted.items():
            row = details["tasks"].get(task)
            if row is None:
                continue
            seats = "default seats" if lineup == "default" else "rule_expert in every bidder seat"
            out.append(
                {
                    "target": f"{task} ({seats}) >= {ratio:g}x the seed's expert, steps/CPU s",
                    "value": row[f"{lineup}_ratio"],
                    "ok": row[f"{lineup}_ratio"] >= ratio,
                }
            )
    return out
