"""The episode job layer every backend shares: what one episode job is, how a worker plays it
into result rows, and the exceptions of a run.

A job is ``(scenario, seed, seats, transcript dir or None, digest_every, config hash)``; a worker
turns it into an outcome ``(seed, rows, round log, error)`` (:func:`play`), never raising for an
episode bug. The local process pool (:mod:`market.run.runner`), the asyncio path
(:mod:`market.run.async_runner`) and the Ray backend (:mod:`market.run.ray_backend`) all hand each
outcome to the same ``finished(index, outcome)`` callback, so rows are identical on every path
(the pool's workers also hand over the episode's file lines, encoded as the parent would).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from market.core.rewards import DESIGNER_COMPONENTS
from market.core.seats import DESIGNER
from market.run.health import judge_counts, seat_counts
from market.run.rollout import EpisodeResult, run_episode, transcript_path

#: one episode: (scenario, seed, seats, transcript dir or None, digest_every, config hash)
EpisodeJob = tuple[Any, ...]
#: a job with the index of the run folder it belongs to
Job = tuple[int, EpisodeJob]
#: what a worker returns for one job: (seed, rows or None, round log, error or None)
Outcome = tuple[int, list[dict[str, Any]] | None, list[Any], str | None]
#: a finished episode's text in its run folder: (rounds-file line, results-file lines)
EpisodeLines = tuple[str, str]
#: the callback every backend calls as each episode finishes: ``finished(index, outcome)``
Finished = Callable[[int, tuple[int, Any, Any, str | None]], None]

#: the keys of a results row, in order
ROW_KEYS = (
    "config",
    "scenario",
    "seed",
    "seat",
    "agent",
    "role",
    "return",
    "components",
    "invalid_actions",
    "decisions",
    "agent_errors",
    "timeouts",
    "fallbacks",
    "repairs",
    "cutoffs",
    "degraded",
    "tokens",
    "stats",
    "first_error",
    "last_agent_error",
    "conduct",
    "welfare_ratio",
    "revenue",
    "mean_price",
    "designer",
    "judge",
    "rounds",
    "steps",
    "seconds",
    "transcript",
)
#: designer parts averaged over an episode's rounds (``row["designer"]``)
DESIGNER_PARTS = DESIGNER_COMPONENTS


class RunConfigError(ValueError):
    """A run cannot start as asked: bad seats or agent specs, or a folder of another run."""


class RunInterrupted(KeyboardInterrupt):  # noqa: N818 - it is a KeyboardInterrupt
    """Ctrl-C during a run. Every finished episode is kept; run again to resume."""

    def __init__(self, done: int, total: int, folders: Sequence[Path]) -> None:
        self.done, self.total, self.folders = done, total, list(folders)
        where = ", ".join(str(f) for f in self.folders[:3]) + (
            " ..." if len(self.folders) > 3 else ""
        )
        super().__init__(
            f"interrupted: {done} of {total} episode(s) finished and kept in {where}; "
            "run the same command again to resume"
        )


# ----------------------------------------------------------------------------- rows


def _tokens(stats: Mapping[str, float]) -> dict[str, int]:
    prompt = int(stats.get("prompt_tokens", 0) or 0)
    completion = int(stats.get("completion_tokens", 0) or 0)
    return {"prompt": prompt, "completion": completion, "total": prompt + completion}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def episode_rows(result: EpisodeResult, config: str) -> list[dict[str, Any]]:
    """One row per seat of a finished episode (see :data:`ROW_KEYS`)."""
    log = result.round_log
    designer = {p: _mean([float(r["designer"].get(p, 0.0)) for r in log]) for p in DESIGNER_PARTS}
    episode = {
        "welfare_ratio": designer["welfare_ratio"],
        "revenue": float(sum(r["revenue"] for r in log)),
        "mean_price": _mean([float(r["price"]) for r in log]),
        "designer": designer,
        "judge": judge_counts(log),
        "rounds": len(log),
        "steps": result.steps,
        "seconds": round(result.seconds, 6),
        "transcript": result.transcript,
    }
    rows = []
    health = seat_counts(result)
    for seat, agent in result.seats.items():
        stats = {
            k: v
            for k, v in (result.agent_stats.get(seat) or {}).items()
            if isinstance(v, int | float)
        }
        counts = health[seat]
        rows.append(
            {
                "config": config,
                "scenario": result.scenario,
                "seed": result.seed,
                "seat": seat,
                "agent": agent,
                "role": "designer" if seat == DESIGNER else "bidder",
                "return": result.returns.get(seat, 0.0),
                "components": dict(result.components.get(seat, {})),
                "invalid_actions": int(result.invalid_actions.get(seat, 0)),
                "decisions": counts["decisions"],
                "agent_errors": counts["agent_errors"],
                "timeouts": counts["timeouts"],
                # an agent error or timeout makes the runner play the fallback action; an LLM agent
                # also falls back on its own when no valid action can be parsed (stats["fallbacks"])
                "fallbacks": counts["fallbacks"],
                "repairs": counts["repairs"],  # an LLM seat re-asked after an unusable reply
                "cutoffs": counts["cutoffs"],  # LLM replies cut off by the token limit
                "degraded": counts["degraded"],  # LLM decisions with a degraded feature
                "tokens": _tokens(stats),
                "stats": stats,
                "first_error": counts["first_error"],
                "last_agent_error": result.last_agent_error.get(seat),
                # the conduct judge's score of the seat ({} when it recorded nothing for it)
                "conduct": dict(result.conduct.get(seat) or {}),
                **episode,
            }
        )
    return rows


# ----------------------------------------------------------------------------- workers


def play(job: tuple[Any, ...]) -> tuple[int, list[dict[str, Any]] | None, list[Any], str | None]:
    """Worker: one episode -> (seed, rows, round log, error). Never raises for an episode bug."""
    scenario, seed, seats, transcript, digest_every, config = job
    try:
        result = run_episode(
            scenario, seed, seats, transcript=transcript, digest_every=digest_every
        )
    except Exception as exc:  # an env or agent-construction bug: report it, keep the run going
        return seed, None, [], f"{type(exc).__name__}: {exc}"[:1000]
    return seed, episode_rows(result, config), result.round_log, None


def json_line(obj: Any) -> str:
    """One compact JSON line (with its newline) of a run folder's results or rounds file."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=True) + "\n"


def episode_lines(
    config: str, seed: int, rows: list[dict[str, Any]], rounds: list[Any]
) -> EpisodeLines:
    """The text a run folder appends for a finished episode: (its line of the rounds file, its
    rows' lines of the results file)."""
    return (
        json_line({"config": config, "seed": seed, "rounds": rounds}),
        "".join(json_line(r) for r in rows),
    )


#: the pool worker's jobs, one per run folder; each task puts in its seed (see start_pool_worker)
_FOLDER_JOBS: tuple[EpisodeJob, ...] = ()


def start_pool_worker(folder_jobs: tuple[EpisodeJob, ...]) -> None:
    """Initializer of the local pool's workers (:class:`market.run.worker_pool.WorkerPool`,
    whose workers leave Ctrl-C to the parent): keep each folder's job.

    A task is then only ``(folder index, seed)``, so the scenario is handed to each worker once
    (inherited when the pool forks) instead of pickled with every episode; and the worker also
    encodes the episode's file lines (:func:`play_seed`). Both were serial work in the parent,
    which at 16 workers could not keep up with them."""
    global _FOLDER_JOBS
    _FOLDER_JOBS = folder_jobs


def play_seed(task: tuple[int, int]) -> tuple[int, Outcome, EpisodeLines | None]:
    """Pool worker: play ``seed`` of folder ``index`` -> (index, outcome, the lines to append)."""
    index, seed = task
    scenario, _, seats, transcript, digest_every, config = _FOLDER_JOBS[index]
    outcome = play((scenario, seed, seats, transcript, digest_every, config))
    _, rows, rounds, _ = outcome
    lines = None if rows is None else episode_lines(config, seed, rows, rounds)  # None: failed
    return index, outcome, lines


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


ProgressFn = Callable[[int, int], None]


def play_shipped(job: tuple[Any, ...]) -> tuple[tuple[Any, ...], bytes | None]:
    """Worker on another machine: play one episode with its transcript written to a private
    temp dir, and ship the transcript back (compressed) for the driver to write, so a run's
    files all end up in its folder whichever node played the episode."""
    scenario, seed, seats, transcript, digest_every, config = job
    if transcript is None:
        return play(job), None
    tmp = tempfile.mkdtemp(prefix="gm-episode-")
    try:
        seed_, rows, rounds, error = play((scenario, seed, seats, tmp, digest_every, config))
        if rows is None:
            return (seed_, rows, rounds, error), None
        final = str(transcript_path(transcript, seed))
        for row in rows:
            row["transcript"] = final
        blob = zlib.compress((Path(tmp) / f"{seed}.jsonl").read_bytes(), 1)
        return (seed_, rows, rounds, error), blob
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
