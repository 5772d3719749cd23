"""The runner: a scenario over a seed range with an agent per seat, in parallel, resumable.

    >>> from market.run.runner import run_scenario
    >>> summary = run_scenario("market_round", range(20), {"bidder_0": "rule_expert"},
    ...                        "runs/rule_expert")                      # doctest: +SKIP
    >>> summary.returns("bidder_0")                                     # doctest: +SKIP
    {0: 1.93, 1: 0.87, ...}

What a run folder holds:

* ``run.json``: the manifest. The resolved scenario, the seat specs (every seat, defaults
  included), each agent's code (:mod:`market.run.agent_code`) and ``config_hash``, a hash of
  all three. One folder holds one configuration: a run with another scenario, other seats or an
  edited agent is refused (:class:`RunConfigError`) instead of mixed in.
* ``results.jsonl``: one JSON row per (episode, seat), appended and flushed as each episode
  finishes (all rows of an episode in one write): return, reward components, invalid actions,
  decisions, agent errors, timeouts, fallbacks and repairs, tokens and the agent's other stats,
  plus the episode's welfare ratio, revenue, mean clearing price, designer parts and LLM-judge
  fallbacks (the same in every row of the episode). See :data:`ROW_KEYS`.
* ``rounds.jsonl``: one line per episode with its round log (mechanism, bids, clearing,
  payments, designer parts per round), written just before the episode's rows.
* ``transcripts/<seed>.jsonl``: the episode transcripts (unless ``transcripts=False``).

Resuming: an episode is complete when ``results.jsonl`` holds a row for every seat. A run skips
the seeds already complete in its folder and plays only the others, so a run interrupted with
Ctrl-C (:class:`RunInterrupted`) or killed keeps every finished episode: run it again to finish.
Incomplete rows (an episode cut mid-write) are dropped when the folder is next opened.

Episodes are pure functions of (scenario, seed, seats), and each runs in one process from a
fresh environment, so rows are identical whether they were played serially, in a process pool
or resumed in several sittings; only ``seconds`` (wall time) differs.
"""

from __future__ import annotations

import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from market.core.scenario_schema import Scenario
from market.core.seats import seat_order
from market.record.writer import write_private
from market.run.async_runner import is_llm_spec, run_jobs_async
from market.run.folders import RunFolder, open_folder, read_results
from market.run.jobs import (
    DESIGNER_PARTS,
    ROW_KEYS,
    EpisodeLines,
    Job,
    ProgressFn,
    RunConfigError,
    RunInterrupted,
    default_workers,
    episode_rows,
    play,
    play_seed,
    play_shipped,
    start_pool_worker,
)
from market.run.ray_backend import RayBackendError, RayStats, ray_map
from market.run.rollout import mean_ci95, transcript_path
from market.run.worker_pool import TaskFailed, WorkerPool


def progress_bar(enabled: bool, label: str) -> Any:
    """A rich progress bar on stderr (a no-op context when disabled)."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("episodes"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not enabled,
    )


def execute(
    folders: Sequence[RunFolder],
    *,
    workers: int | None = None,
    backend: str = "local",
    address: str | None = None,
    progress: bool | ProgressFn = True,
    label: str = "running",
    llm: Mapping[str, Any] | None = None,
) -> None:
    """Play every pending episode of ``folders`` in one pool, recording each as it finishes.

    ``progress``: True for a progress bar on stderr, False for none, or a callable
    ``(done, total)``. Raises :class:`RunInterrupted` on Ctrl-C (after closing the files).
    ``backend="async"`` (chosen for "local" when a seat is an LLM): episodes as asyncio tasks in
    this process sharing one client pool; ``llm`` holds the keyword arguments of
    :func:`market.run.async_runner.run_jobs_async` (limits, episodes in flight, budget).
    """
    if backend == "local" and any(is_llm_spec(s) for f in folders for s in f.seats.values()):
        backend = "async"
    if backend not in ("local", "ray", "async"):
        raise RunConfigError(f"backend {backend!r}: use 'local' (a process pool), 'async' or 'ray'")
    jobs = [(i, f.job(seed)) for i, f in enumerate(folders) for seed in f.pending]
    total = len(jobs)
    workers = default_workers() if workers is None else max(1, int(workers))
    done = 0
    bar = progress_bar(progress is True and total > 0, label)
    callback = progress if callable(progress) else None

    def finished(
        index: int, outcome: tuple[int, Any, Any, str | None], lines: EpisodeLines | None = None
    ) -> None:
        nonlocal done
        seed, rows, rounds, error = outcome
        folder = folders[index]
        if error is not None or rows is None:
            folder.failed[seed] = error or "no result"
        else:
            folder.record(seed, rows, rounds, lines)
        done += 1
        bar.update(task, completed=done)
        if callback is not None:
            callback(done, total)

    # the pool is forked before the progress bar starts its refresh thread
    pool = (
        WorkerPool(
            play_seed,
            min(workers, total),
            initializer=start_pool_worker,
            initargs=(tuple(f.job(0) for f in folders),),  # each task puts in its seed
        )
        if backend == "local" and workers > 1 and total > 1
        else None
    )
    for f in folders:
        f.open()
    try:
        with bar:
            task = bar.add_task(label, total=total)
            if backend == "ray":
                _run_ray(
                    jobs,
                    address,
                    finished,
                    say=(lambda line: print(line, file=sys.stderr)) if progress else None,
                )
            elif backend == "async":
                run_jobs_async(jobs, finished, **dict(llm or {}))
            elif pool is not None:
                tasks = [(index, job[1]) for index, job in jobs]
                for position, result in pool.imap_unordered(tasks):
                    if isinstance(result, TaskFailed):  # its worker died: the seed is retried
                        index, seed = tasks[position]  # when the run is resumed
                        finished(index, (seed, None, [], f"episode not finished: {result}"))
                    else:
                        finished(*result)
                pool.close()
            else:
                for index, job in jobs:
                    finished(index, play(job))
    except KeyboardInterrupt:
        raise RunInterrupted(
            sum(len(f.done) for f in folders),
            sum(len(f.seeds) for f in folders),
            [f.out for f in folders],
        ) from None
    finally:
        if pool is not None:
            pool.terminate()  # after close() nothing is left; on Ctrl-C or a crash it stops them
        for f in folders:
            f.close()


def _run_ray(
    jobs: list[Job],
    address: str | None,
    finished: Callable[[int, Any], None],
    say: Callable[[str], None] | None = None,
) -> None:
    """Play ``jobs`` on Ray (:mod:`market.run.ray_backend`), writing each shipped transcript before
    its rows are recorded (rows are the completion mark); ``say`` gets a line on where they ran."""
    stats = RayStats()
    try:
        for position, (outcome, blob) in ray_map(
            play_shipped, [job for _, job in jobs], address=address, stats=stats
        ):
            index, job = jobs[position]
            if blob is not None:
                path = transcript_path(job[3], job[1])
                tmp = path.with_name(path.name + ".part")
                write_private(tmp, zlib.decompress(blob))  # mode 0600, as every transcript
                tmp.replace(path)
            finished(index, outcome)
    except RayBackendError as exc:
        raise RunConfigError(str(exc)) from None
    if say is not None and stats.per_node:
        say(stats.summary())


# ----------------------------------------------------------------------------- the API


@dataclass
class RunSummary:
    """What a run folder holds for the requested seeds after :func:`run_scenario`."""

    out_dir: Path
    scenario: Scenario
    seats: dict[str, str]
    seeds: list[int]
    config_hash: str
    rows: list[dict[str, Any]]  # one per (complete episode, seat), in seed then seat order
    played: list[int]  # seeds played by this call
    skipped: list[int]  # seeds already complete in the folder
    failed: dict[int, str]  # seeds whose episode raised (not recorded; retried next time)
    round_logs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.failed and len(self.episodes) == len(self.seeds)

    @property
    def episodes(self) -> list[int]:
        return sorted({r["seed"] for r in self.rows})

    def returns(self, seat: str) -> dict[int, float]:
        """Seed -> the seat's return."""
        return {r["seed"]: r["return"] for r in self.rows if r["seat"] == seat}

    def episode(self, key: str) -> dict[int, Any]:
        """Seed -> an episode-level value (``welfare_ratio``, ``revenue``, ``designer`` ...)."""
        return {r["seed"]: r[key] for r in self.rows if r["seat"] == next(iter(self.seats))}

    def table(self) -> list[dict[str, Any]]:
        return summarise_rows(self.rows)


def _summary(folder: RunFolder, skipped: list[int], began: float) -> RunSummary:
    seeds = [s for s in folder.seeds if s in folder.done]
    return RunSummary(
        out_dir=folder.out,
        scenario=folder.scenario,
        seats=folder.seats,
        seeds=folder.seeds,
        config_hash=folder.config,
        rows=[r for s in seeds for r in folder.done[s]],
        played=sorted(folder.played),
        skipped=skipped,
        failed=dict(folder.failed),
        round_logs={s: folder.rounds.get(s, []) for s in seeds},
        seconds=time.perf_counter() - began,
    )


def run_scenario(
    scenario: str | Path | Scenario,
    seeds: Iterable[int],
    seats: Mapping[str, str] | None,
    out_dir: str | Path,
    workers: int | None = None,
    backend: str = "local",
    transcripts: bool = True,
    progress: bool | ProgressFn = True,
    *,
    fresh: bool = False,
    address: str | None = None,
    digest_every: int = 1,
    llm: Mapping[str, Any] | None = None,
    agent_timeout: float | None = None,
) -> RunSummary:
    """Play ``scenario`` over ``seeds`` with ``seats`` (seat -> agent spec; the scenario's
    ``[agents]`` fill the rest) and record every episode in ``out_dir`` (see the module doc).

    ``workers``: processes of the local pool (default: every core; 1 plays in this process).
    ``backend``: ``"local"``, or ``"ray"`` (episodes as Ray tasks on the cluster at ``address``).
    ``transcripts``: also write ``out_dir/transcripts/<seed>.jsonl``. ``progress``: a progress
    bar on stderr (True), none (False), or a callable ``(done, total)``.
    ``fresh``: discard what the folder holds first; otherwise complete seeds are skipped.
    ``llm``: options of the async path that runs with LLM seats take (``max_in_flight``,
    ``per_endpoint``, ``max_episodes``, ``budget``; see :func:`market.run.async_runner.run_jobs_async`).
    ``agent_timeout``: seconds one decision may take (None: the scenario's ``agent_timeout``;
    0: no limit); past it the seat plays its fallback action and the row counts a timeout.
    It is not part of the folder's configuration: a run may be resumed with another limit.

    Raises ``scenarios.ScenarioError`` for a bad scenario, :class:`RunConfigError` for bad seats or
    a folder holding another configuration, and :class:`RunInterrupted` on Ctrl-C.
    """
    began = time.perf_counter()
    folder = open_folder(
        scenario, seeds, seats, out_dir, transcripts, fresh, digest_every, agent_timeout
    )
    skipped = [s for s in folder.seeds if s in folder.done]
    execute(
        [folder],
        workers=workers,
        backend=backend,
        address=address,
        progress=progress,
        label=folder.scenario.name,
        llm=llm,
    )
    return _summary(folder, skipped, began)


def summarise_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (seat, component) with mean and 95% CI over episodes, 'return' first."""
    by_seat: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_seat[row["seat"]].append(row)
    out = []
    for seat in sorted(by_seat, key=seat_order):
        seat_rows = by_seat[seat]
        names = sorted({c for r in seat_rows for c in r["components"]})
        for name in ["return", *names]:
            values = [
                r["return"] if name == "return" else r["components"].get(name, 0.0)
                for r in seat_rows
            ]
            mean, half = mean_ci95(values)
            out.append(
                {
                    "seat": seat,
                    "agent": seat_rows[0]["agent"],
                    "component": name,
                    "mean": mean,
                    "ci95": half,
                    "n": len(values),
                }
            )
    return out


__all__ = [
    "DESIGNER_PARTS",
    "ROW_KEYS",
    "RunConfigError",
    "RunInterrupted",
    "RunSummary",
    "default_workers",
    "episode_rows",
    "execute",
    "read_results",
    "run_scenario",
    "summarise_rows",
]

if __name__ == "__main__":  # pragma: no cover
    sys.exit("use gpumarket run / gpumarket eval, or import market.run.runner")
