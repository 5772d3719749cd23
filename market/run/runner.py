"""The runner: a scenario over a seed range with an agent per seat, in parallel, resumable.

    >>> from market.run.runner import run_scenario
    >>> summary = run_scenario("market_round", range(20), {"bidder_0": "rule_expert"},
    ...                        "runs/rule_expert")                      # doctest: +SKIP
    >>> summary.returns("bidder_0")                                     # doctest: +SKIP
    {0: 1.93, 1: 0.87, ...}

What a run folder holds:

* ``run.json``: the manifest. The resolved scenario, the seat specs (every seat, defaults
  included) and ``config_hash``, a hash of both. One folder holds one configuration: a run with
  another scenario or other seats is refused (:class:`RunConfigError`) instead of mixed in.
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

import csv
import hashlib
import io
import json
import math
import multiprocessing
import os
import re
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from market.core.rewards import DESIGNER_COMPONENTS
from market.environment.aec import DESIGNER
from market.run.rollout import (
    EpisodeResult,
    mean_ci95,
    resolve_seats,
    run_episode,
    transcript_path,
    with_agent_timeout,
)
from scenarios import deep_merge, load_scenario
from scenarios.schema import RUN_ONLY_KEYS, Scenario

if TYPE_CHECKING:
    from market.run.health import SeatHealth

FORMAT = 1
MANIFEST = "run.json"
RESULTS = "results.jsonl"
ROUNDS = "rounds.jsonl"
TRANSCRIPTS = "transcripts"

#: the keys of a results row, in order
ROW_KEYS = (
    "config", "scenario", "seed", "seat", "agent", "role",
    "return", "components", "invalid_actions", "decisions", "agent_errors", "timeouts",
    "fallbacks", "repairs", "tokens", "stats", "first_error", "last_agent_error",
    "welfare_ratio", "revenue", "mean_price", "designer", "judge", "rounds", "steps", "seconds",
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
        where = ", ".join(str(f) for f in self.folders[:3]) + (" ..." if len(self.folders) > 3 else "")
        super().__init__(f"interrupted: {done} of {total} episode(s) finished and kept in {where}; "
                         "run the same command again to resume")


# ----------------------------------------------------------------------------- rows


def _tokens(stats: Mapping[str, float]) -> dict[str, int]:
    prompt = int(stats.get("prompt_tokens", 0) or 0)
    completion = int(stats.get("completion_tokens", 0) or 0)
    return {"prompt": prompt, "completion": completion, "total": prompt + completion}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def episode_rows(result: EpisodeResult, config: str) -> list[dict[str, Any]]:
    """One row per seat of a finished episode (see :data:`ROW_KEYS`)."""
    from market.run.health import judge_counts, seat_counts

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
        stats = {k: v for k, v in (result.agent_stats.get(seat) or {}).items()
                 if isinstance(v, int | float)}
        counts = health[seat]
        rows.append({
            "config": config, "scenario": result.scenario, "seed": result.seed, "seat": seat,
            "agent": agent, "role": "designer" if seat == DESIGNER else "bidder",
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
            "tokens": _tokens(stats),
            "stats": stats,
            "first_error": counts["first_error"],
            "last_agent_error": result.last_agent_error.get(seat),
            **episode,
        })
    return rows


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=True)


# ----------------------------------------------------------------------------- configuration


#: scenario keys left out of a run's configuration (e.g. agent_timeout: a run can be resumed
#: with another --agent-timeout)
NOT_CONFIG = RUN_ONLY_KEYS


def config_hash(scenario: Scenario, seats: Mapping[str, str]) -> str:
    """A hash of everything an episode's rows depend on besides the seed."""
    payload = {"scenario": scenario.model_dump(mode="json", exclude=NOT_CONFIG),
               "seats": dict(sorted(seats.items()))}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def scenario_digest(scenario: Scenario) -> str:
    text = json.dumps(scenario.model_dump(mode="json", exclude=NOT_CONFIG), sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_seats(scenario: Scenario, seats: Mapping[str, Any] | None) -> dict[str, str]:
    """Every seat's spec (scenario defaults plus ``seats``), each checked by building it once."""
    from agents.registry import AgentSpecError, make_agent

    for seat, spec in (seats or {}).items():
        if not isinstance(spec, str):
            raise RunConfigError(
                f"seat {seat}: the runner takes agent spec strings (e.g. 'truthful', "
                "'py:package.module:Class?key=value'), so that worker processes can build the "
                f"agent and the run folder can record it; got {type(spec).__name__}")
    try:
        resolved = resolve_seats(scenario, seats)
        for seat, spec in resolved.items():
            make_agent(spec, "designer" if seat == DESIGNER else "bidder")
    except AgentSpecError as exc:
        raise RunConfigError(str(exc)) from None
    except ValueError as exc:
        raise RunConfigError(str(exc)) from None
    return resolved


def _scenario(scenario: str | Path | Scenario) -> Scenario:
    return load_scenario(scenario)  # ScenarioError (a ValueError) names the file, key, problem


# ----------------------------------------------------------------------------- one folder


@dataclass
class _Folder:
    """One run folder: its configuration, what is already complete, and the open results file."""

    out: Path
    scenario: Scenario
    seats: dict[str, str]
    seeds: list[int]
    config: str
    transcripts: bool
    digest_every: int
    done: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    rounds: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    played: list[int] = field(default_factory=list)
    _results: io.TextIOWrapper | None = None
    _rounds: io.TextIOWrapper | None = None

    @property
    def pending(self) -> list[int]:
        return [s for s in self.seeds if s not in self.done]

    def manifest(self) -> dict[str, Any]:
        from market import __version__

        return {
            "format": FORMAT,
            "kind": "gpumarket run",
            "config_hash": self.config,
            "scenario_name": self.scenario.name,
            "scenario_digest": scenario_digest(self.scenario),
            "seats": self.seats,
            "scenario": self.scenario.model_dump(mode="json"),
            "package_version": __version__,
        }

    def open(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        if self.transcripts:
            (self.out / TRANSCRIPTS).mkdir(exist_ok=True)
        self._rounds = open(self.out / ROUNDS, "a", encoding="utf-8")  # noqa: SIM115
        self._results = open(self.out / RESULTS, "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        for fh in (self._rounds, self._results):
            if fh is not None:
                fh.close()
        self._rounds = self._results = None

    def record(self, seed: int, rows: list[dict[str, Any]], rounds: list[dict[str, Any]]) -> None:
        """Append the episode: its round log, then its rows in one write (the completion mark)."""
        assert self._results is not None and self._rounds is not None
        self._rounds.write(_dumps({"config": self.config, "seed": seed, "rounds": rounds}) + "\n")
        self._rounds.flush()
        self._results.write("".join(_dumps(r) + "\n" for r in rows))
        self._results.flush()
        self.done[seed] = rows
        self.rounds[seed] = rounds
        self.played.append(seed)

    def job(self, seed: int) -> tuple[Any, ...]:
        transcript = str(self.out / TRANSCRIPTS) if self.transcripts else None
        return (self.scenario, seed, self.seats, transcript, self.digest_every, self.config)


def _read_jsonl(path: Path) -> Iterator[dict[str, Any] | None]:
    """Each line parsed, or None for a line that is not a JSON object (e.g. cut by a crash)."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except ValueError:
                yield None
                continue
            yield obj if isinstance(obj, dict) and line.endswith("\n") else None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _describe_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    from market.record.replay import first_difference

    if old.get("seats") != new["seats"]:
        seats = sorted(set(old.get("seats") or {}) | set(new["seats"]))
        for seat in seats:
            was, now = (old.get("seats") or {}).get(seat), new["seats"].get(seat)
            if was != now:
                return f"seat {seat} holds {was!r} there but {now!r} now"
    def config(scenario: Any) -> Any:
        if not isinstance(scenario, dict):
            return scenario
        return {k: v for k, v in scenario.items() if k not in NOT_CONFIG}

    diff = first_difference(config(old.get("scenario")), config(new["scenario"]), "scenario")
    if diff is not None:
        return f"{diff[0]} is {diff[1]!r} there but {diff[2]!r} now"
    return "its configuration differs"


def _load(folder: _Folder, fresh: bool) -> None:
    """Check the manifest (or write it), and collect the complete episodes already there."""
    out = folder.out
    manifest_path, results_path, rounds_path = out / MANIFEST, out / RESULTS, out / ROUNDS
    if fresh:
        for path in (manifest_path, results_path, rounds_path, out / "report.html"):
            path.unlink(missing_ok=True)
        tdir = out / TRANSCRIPTS
        if tdir.is_dir():
            for path in tdir.glob("*.jsonl"):
                if path.stem.lstrip("-").isdigit():
                    path.unlink()
    new = folder.manifest()
    if out.exists() and not out.is_dir():
        raise RunConfigError(f"{out} is a file, not a run folder")
    if manifest_path.is_file():
        try:
            old = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RunConfigError(
                f"{manifest_path} is unreadable ({exc}); remove it or use --fresh") from None
        if not isinstance(old, dict) or old.get("config_hash") != folder.config:
            what = _describe_difference(old if isinstance(old, dict) else {}, new)
            raise RunConfigError(
                f"{out} holds a run of another configuration ({what}); use another output folder, "
                "or start over with --fresh (fresh=True in Python)")
    rows_by_seed: dict[int, list[dict[str, Any]]] = defaultdict(list)
    dropped = 0
    for row in _read_jsonl(results_path):
        if row is None or not isinstance(row.get("seed"), int):
            dropped += 1
            continue
        if row.get("config") != folder.config:
            raise RunConfigError(
                f"{results_path} holds rows of another configuration (config {row.get('config')}, "
                f"this run is {folder.config}); use another output folder, or start over with --fresh")
        rows_by_seed[row["seed"]].append(row)
    need = set(folder.seats)
    for seed, rows in rows_by_seed.items():
        by_seat = {r["seat"]: r for r in rows}
        if set(by_seat) >= need and len(rows) == len(need):
            folder.done[seed] = [by_seat[s] for s in folder.seats]
        else:
            dropped += len(rows)
    for entry in _read_jsonl(rounds_path):
        if entry is not None and entry.get("seed") in folder.done:
            folder.rounds[entry["seed"]] = entry.get("rounds", [])
    out.mkdir(parents=True, exist_ok=True)
    if not manifest_path.is_file():
        _write_atomic(manifest_path, json.dumps(new, indent=1) + "\n")
    if dropped or len(folder.rounds) != sum(1 for _ in _read_jsonl(rounds_path)):
        # rewrite both files with the complete episodes only (in seed order)
        order = sorted(folder.done)
        _write_atomic(results_path, "".join(_dumps(r) + "\n" for s in order for r in folder.done[s]))
        _write_atomic(rounds_path, "".join(
            _dumps({"config": folder.config, "seed": s, "rounds": folder.rounds.get(s, [])}) + "\n"
            for s in order))


def _folder(scenario: str | Path | Scenario, seeds: Iterable[int], seats: Mapping[str, Any] | None,
            out_dir: str | Path, transcripts: bool, fresh: bool, digest_every: int,
            agent_timeout: float | None = None) -> _Folder:
    sc = _scenario(scenario)
    try:
        sc = with_agent_timeout(sc, agent_timeout)
    except ValueError as exc:
        raise RunConfigError(str(exc)) from None
    resolved = check_seats(sc, seats)
    seed_list = list(dict.fromkeys(int(s) for s in seeds))
    folder = _Folder(Path(out_dir), sc, resolved, seed_list, config_hash(sc, resolved),
                     transcripts, digest_every)
    _load(folder, fresh)
    return folder


# ----------------------------------------------------------------------------- execution


def _play(job: tuple[Any, ...]) -> tuple[int, list[dict[str, Any]] | None, list[Any], str | None]:
    """Worker: one episode -> (seed, rows, round log, error). Never raises for an episode bug."""
    scenario, seed, seats, transcript, digest_every, config = job
    try:
        result = run_episode(scenario, seed, seats, transcript=transcript, digest_every=digest_every)
    except Exception as exc:  # an env or agent-construction bug: report it, keep the run going
        return seed, None, [], f"{type(exc).__name__}: {exc}"[:1000]
    return seed, episode_rows(result, config), result.round_log, None


def _play_indexed(item: tuple[int, tuple[Any, ...]]) -> tuple[int, tuple[Any, ...]]:
    index, job = item
    return index, _play(job)


def _ignore_sigint() -> None:
    """Pool workers ignore Ctrl-C; the parent stops them, so finished episodes are kept."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


ProgressFn = Callable[[int, int], None]


def _progress_bar(enabled: bool, label: str) -> Any:
    """A rich progress bar on stderr (a no-op context when disabled)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("episodes"),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=True, disable=not enabled)


def execute(folders: Sequence[_Folder], *, workers: int | None = None, backend: str = "local",
            address: str | None = None, progress: bool | ProgressFn = True,
            label: str = "running", llm: Mapping[str, Any] | None = None) -> None:
    """Play every pending episode of ``folders`` in one pool, recording each as it finishes.

    ``progress``: True for a progress bar on stderr, False for none, or a callable
    ``(done, total)``. Raises :class:`RunInterrupted` on Ctrl-C (after closing the files).
    ``backend="async"`` (chosen for "local" when a seat is an LLM): episodes as asyncio tasks in
    this process sharing one client pool; ``llm`` holds the keyword arguments of
    :func:`market.run.async_runner.run_jobs_async` (limits, episodes in flight, budget).
    """
    from market.run.async_runner import is_llm_spec, run_jobs_async

    if backend == "local" and any(is_llm_spec(s) for f in folders for s in f.seats.values()):
        backend = "async"
    if backend not in ("local", "ray", "async"):
        raise RunConfigError(f"backend {backend!r}: use 'local' (a process pool), 'async' or 'ray'")
    jobs = [(i, f.job(seed)) for i, f in enumerate(folders) for seed in f.pending]
    total = len(jobs)
    workers = default_workers() if workers is None else max(1, int(workers))
    done = 0
    bar = _progress_bar(progress is True and total > 0, label)
    callback = progress if callable(progress) else None

    def finished(index: int, outcome: tuple[int, Any, Any, str | None]) -> None:
        nonlocal done
        seed, rows, rounds, error = outcome
        folder = folders[index]
        if error is not None or rows is None:
            folder.failed[seed] = error or "no result"
        else:
            folder.record(seed, rows, rounds)
        done += 1
        bar.update(task, completed=done)
        if callback is not None:
            callback(done, total)

    # the pool is forked before the progress bar starts its refresh thread
    pool = (multiprocessing.get_context().Pool(min(workers, total), initializer=_ignore_sigint)
            if backend == "local" and workers > 1 and total > 1 else None)
    for f in folders:
        f.open()
    try:
        with bar:
            task = bar.add_task(label, total=total)
            if backend == "ray":
                _run_ray(jobs, address, finished,
                         say=(lambda line: print(line, file=sys.stderr)) if progress else None)
            elif backend == "async":
                run_jobs_async(jobs, finished, **dict(llm or {}))
            elif pool is not None:
                for index, outcome in pool.imap_unordered(_play_indexed, jobs, chunksize=1):
                    finished(index, outcome)
                pool.close()
            else:
                for index, job in jobs:
                    finished(index, _play(job))
    except KeyboardInterrupt:
        raise RunInterrupted(
            sum(len(f.done) for f in folders), sum(len(f.seeds) for f in folders),
            [f.out for f in folders]) from None
    finally:
        if pool is not None:
            pool.terminate()  # after close() a no-op wait; on Ctrl-C or a crash it stops them
            pool.join()
        for f in folders:
            f.close()


def _play_shipped(job: tuple[Any, ...]) -> tuple[tuple[Any, ...], bytes | None]:
    """Worker on another machine: play one episode with its transcript written to a private
    temp dir, and ship the transcript back (compressed) for the driver to write, so a run's
    files all end up in its folder whichever node played the episode."""
    import shutil
    import tempfile
    import zlib

    scenario, seed, seats, transcript, digest_every, config = job
    if transcript is None:
        return _play(job), None
    tmp = tempfile.mkdtemp(prefix="gm-episode-")
    try:
        seed_, rows, rounds, error = _play((scenario, seed, seats, tmp, digest_every, config))
        if rows is None:
            return (seed_, rows, rounds, error), None
        final = str(transcript_path(transcript, seed))
        for row in rows:
            row["transcript"] = final
        blob = zlib.compress((Path(tmp) / f"{seed}.jsonl").read_bytes(), 1)
        return (seed_, rows, rounds, error), blob
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_ray(jobs: list[tuple[int, tuple[Any, ...]]], address: str | None,
             finished: Callable[[int, Any], None], say: Callable[[str], None] | None = None) -> None:
    """Play ``jobs`` on Ray (:mod:`market.run.ray_backend`), writing each shipped transcript before
    its rows are recorded (rows are the completion mark); ``say`` gets a line on where they ran."""
    import zlib

    from market.run.ray_backend import RayBackendError, RayStats, ray_map

    stats = RayStats()
    try:
        for position, (outcome, blob) in ray_map(_play_shipped, [job for _, job in jobs],
                                                 address=address, stats=stats):
            index, job = jobs[position]
            if blob is not None:
                path = transcript_path(job[3], job[1])
                tmp = path.with_name(path.name + ".part")
                tmp.write_bytes(zlib.decompress(blob))
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


def _summary(folder: _Folder, skipped: list[int], began: float) -> RunSummary:
    seeds = [s for s in folder.seeds if s in folder.done]
    return RunSummary(
        out_dir=folder.out, scenario=folder.scenario, seats=folder.seats, seeds=folder.seeds,
        config_hash=folder.config, rows=[r for s in seeds for r in folder.done[s]],
        played=sorted(folder.played), skipped=skipped, failed=dict(folder.failed),
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
    folder = _folder(scenario, seeds, seats, out_dir, transcripts, fresh, digest_every,
                     agent_timeout)
    skipped = [s for s in folder.seeds if s in folder.done]
    execute([folder], workers=workers, backend=backend, address=address, progress=progress,
            label=folder.scenario.name, llm=llm)
    return _summary(folder, skipped, began)


def read_results(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every complete row of a run folder's ``results.jsonl``."""
    return [r for r in _read_jsonl(Path(out_dir) / RESULTS) if r is not None]


def summarise_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (seat, component) with mean and 95% CI over episodes, 'return' first."""
    by_seat: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_seat[row["seat"]].append(row)
    out = []
    for seat in sorted(by_seat, key=_seat_order):
        seat_rows = by_seat[seat]
        names = sorted({c for r in seat_rows for c in r["components"]})
        for name in ["return", *names]:
            values = [r["return"] if name == "return" else r["components"].get(name, 0.0)
                      for r in seat_rows]
            mean, half = mean_ci95(values)
            out.append({"seat": seat, "agent": seat_rows[0]["agent"], "component": name,
                        "mean": mean, "ci95": half, "n": len(values)})
    return out


def _seat_order(seat: str) -> tuple[int, int]:
    if seat == DESIGNER:
        return (0, 0)
    tail = seat.rsplit("_", 1)[-1]
    return (1, int(tail) if tail.isdigit() else 0)


# ----------------------------------------------------------------------------- eval


def slug(spec: str) -> str:
    """A folder name for an agent spec: readable, and unique per spec."""
    text = re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec).strip("_")[:48] or "agent"
    if text == spec:
        return text
    return f"{text}-{hashlib.sha256(spec.encode()).hexdigest()[:6]}"


@dataclass
class Cell:
    """The seat's returns with one agent in one scenario."""

    agent: str
    scenario: str
    seat: str
    returns: dict[int, float]
    tokens: int = 0  # the seat's model tokens (prompt + completion) over these episodes
    cost_usd: float = 0.0  # and their cost (priced by the seat's spec or --price)

    @property
    def n(self) -> int:
        return len(self.returns)

    @property
    def mean_ci(self) -> tuple[float, float]:
        return mean_ci95([self.returns[s] for s in sorted(self.returns)])


@dataclass
class EvalTable:
    agents: list[str]
    scenarios: list[str]
    seat: str
    seeds: list[int]
    cells: dict[tuple[str, str], Cell]
    failed: dict[str, dict[int, str]] = field(default_factory=dict)
    health: list[SeatHealth] = field(default_factory=list)  # per run folder and seat

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for scenario in self.scenarios:
            for agent in self.agents:
                cell = self.cells[(agent, scenario)]
                mean, half = cell.mean_ci
                out.append({"scenario": scenario, "agent": agent, "seat": self.seat, "n": cell.n,
                            "mean": mean, "ci95": half, "low": mean - half, "high": mean + half,
                            "tokens": cell.tokens, "cost_usd": cell.cost_usd})
        return out

    def paired(self, agent: str, other: str, scenario: str) -> tuple[float, float]:
        """Mean and 95% CI of ``agent``'s return minus ``other``'s, per seed (the same worlds)."""
        a = self.cells[(agent, scenario)].returns
        b = self.cells[(other, scenario)].returns
        return mean_ci95([a[s] - b[s] for s in sorted(set(a) & set(b))])

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        keys = ("scenario", "agent", "seat", "n", "mean", "ci95", "low", "high", "tokens",
                "cost_usd")
        writer.writerow(keys)
        for row in self.rows():
            writer.writerow([_csv_value(row[k]) for k in keys])
        return buf.getvalue()

    def grid(self) -> list[list[str]]:
        """Agents x scenarios cells ``mean ± ci``, the best mean per scenario marked ``*``; then
        the agent's tokens and USD cost over every scenario and seed (:data:`USAGE_COLUMNS`)."""
        best = {}
        for scenario in self.scenarios:
            means = {a: self.cells[(a, scenario)].mean_ci[0] for a in self.agents}
            finite = {a: m for a, m in means.items() if math.isfinite(m)}
            best[scenario] = max(finite, key=finite.__getitem__) if finite else None
        out = []
        for agent in self.agents:
            line = [agent]
            for scenario in self.scenarios:
                mean, half = self.cells[(agent, scenario)].mean_ci
                mark = "*" if best[scenario] == agent and len(self.agents) > 1 else ""
                line.append(f"{mean:.3f} ± {half:.3f}{mark}")
            cells = [self.cells[(agent, scenario)] for scenario in self.scenarios]
            line += [f"{sum(c.tokens for c in cells):,}", f"{math.fsum(c.cost_usd for c in cells):.4f}"]
            out.append(line)
        return out

    def markdown(self) -> str:
        head = ["agent", *self.scenarios, *USAGE_COLUMNS]
        lines = [
            f"Mean return of `{self.seat}` ± 95% CI over {len(self.seeds)} seed(s) "
            f"({_seed_text(self.seeds)}); the other seats hold each scenario's own agents. "
            "`*` marks the best mean per scenario. Tokens (prompt + completion) and cost (USD, "
            "where the model has a price) are the seat's, over every scenario and seed.",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
        ]
        lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in self.grid()]
        if len(self.agents) > 1:
            first = self.agents[0]
            lines += ["", f"Paired difference `{first}` minus each other agent (same seeds, so "
                          "the same worlds), mean ± 95% CI; `>` marks a CI above 0.", "",
                      "| " + " | ".join([f"{first} minus", *self.scenarios]) + " |",
                      "|" + "|".join(["---"] + ["---:"] * len(self.scenarios)) + "|"]
            for other in self.agents[1:]:
                cells = [other]
                for scenario in self.scenarios:
                    mean, half = self.paired(first, other, scenario)
                    cells.append(f"{mean:+.3f} ± {half:.3f}{'>' if mean - half > 0 else ''}")
                lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
        return "\n".join(lines) + "\n"


#: the usage columns after the scenarios in :meth:`EvalTable.grid`
USAGE_COLUMNS = ("tokens", "cost USD")


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _csv_value(value: Any) -> Any:
    return repr(value) if isinstance(value, float) else value  # full precision for scripts


def _seed_text(seeds: Sequence[int]) -> str:
    if seeds and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}..{seeds[-1]}"
    return ",".join(str(s) for s in seeds)


def _cell(agent: str, scenario: str, seat: str, folder: _Folder) -> Cell:
    """The seat's return, tokens and cost in each complete episode of ``folder``."""
    rows = [next(r for r in folder.done[s] if r["seat"] == seat)
            for s in folder.seeds if s in folder.done]
    return Cell(agent, scenario, seat, {r["seed"]: r["return"] for r in rows},
                tokens=sum(int(r["tokens"]["total"]) for r in rows),
                cost_usd=math.fsum(float(r["stats"].get("cost_usd", 0.0)) for r in rows))


def _health(folders: Iterable[_Folder], out: Path) -> list[SeatHealth]:
    """Per-seat agent health of every folder, each seat labelled with its folder under ``out``."""
    from market.run.health import from_rows

    health: list[SeatHealth] = []
    for f in folders:
        where = f.out.relative_to(out).as_posix() if f.out.is_relative_to(out) else str(f.out)
        health += from_rows([r for s in f.seeds if s in f.done for r in f.done[s]],
                            prefix=f"{where}: ")
    return health


def evaluate(
    agents: Sequence[str],
    scenarios: Sequence[str | Path],
    seat: str,
    seeds: Iterable[int],
    out_dir: str | Path,
    workers: int | None = None,
    *,
    backend: str = "local",
    address: str | None = None,
    transcripts: bool = False,
    progress: bool | ProgressFn = True,
    fresh: bool = False,
    llm: Mapping[str, Any] | None = None,
    agent_timeout: float | None = None,
) -> EvalTable:
    """Each agent in ``seat`` of each scenario (other seats: the scenario's own agents).

    Every (scenario, agent) pair is one resumable run folder ``out_dir/<scenario>/<agent>``;
    all episodes run in one pool. ``out_dir/eval.csv`` and ``out_dir/eval.md`` hold the table.
    ``backend``, ``address``, ``llm`` and ``agent_timeout`` as in :func:`run_scenario`.
    """
    seeds = list(seeds)
    if not agents:
        raise RunConfigError("no agents to evaluate: give at least one agent spec")
    if not scenarios:
        raise RunConfigError("no scenarios to evaluate on: give at least one")
    out = Path(out_dir)
    folders: dict[tuple[str, str], _Folder] = {}
    names = []
    for scenario in scenarios:
        sc = _scenario(scenario)
        if sc.name in names:
            raise RunConfigError(f"scenario {sc.name!r} is listed twice")
        names.append(sc.name)
        for agent in agents:
            if (agent, sc.name) in folders:
                raise RunConfigError(f"agent {agent!r} is listed twice")
            folders[(agent, sc.name)] = _folder(sc, seeds, {seat: agent}, out / sc.name / slug(agent),
                                                transcripts, fresh, 1, agent_timeout)
    execute(list(folders.values()), workers=workers, backend=backend, address=address,
            progress=progress, label="eval", llm=llm)
    table = EvalTable(list(agents), names, seat, seeds, {
        key: _cell(key[0], key[1], seat, f) for key, f in folders.items()
    }, {f"{k[1]}/{k[0]}": f.failed for k, f in folders.items() if f.failed})
    table.health = _health(folders.values(), out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.csv").write_text(table.csv(), encoding="utf-8")
    (out / "eval.md").write_text(table.markdown(), encoding="utf-8")
    return table


# ----------------------------------------------------------------------------- mechanisms


#: the robust fixed mechanism of the DAEDALUS headline
ROBUST = {"auction_type": "second_price", "reserve_price": 2.0, "reveal_clearing_price": True,
          "reveal_reserve": True, "coalition_policy": "penalize_suspected",
          "collusion_penalty": 30.0}
#: candidate mechanisms: name -> (designer spec, [mechanism] overrides or None for the scenario's)
CANDIDATES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "robust": ("fixed", ROBUST),
    "first_price": ("fixed", {**ROBUST, "auction_type": "first_price"}),
    "vcg": ("fixed", {**ROBUST, "auction_type": "vcg"}),
    "fair_share": ("fixed", {**ROBUST, "auction_type": "fair_share"}),
    "posted_price": ("fixed", {**ROBUST, "auction_type": "posted_price", "reserve_price": 20.0}),
    "random": ("random", None),
}
#: built-in bidder strategies a bidder type may deviate to
ALTERNATIVES = ("truthful", "shader", "colluder", "dropout", "exploiter", "greedy_hoarder",
                "no_negotiation", "rule_expert", "always_accept", "random_valid")
METRICS = ("composite", "welfare_ratio", "revenue", "fairness", "participation", "stability")


@dataclass
class Deviation:
    """One bidder type's best unilateral deviation under one mechanism (paired over seeds)."""

    mechanism: str
    bidder_type: str
    seat: str
    base: dict[int, float]
    alternatives: dict[str, dict[int, float]]

    def gain(self, alternative: str) -> tuple[float, float]:
        alt = self.alternatives[alternative]
        seeds = sorted(set(alt) & set(self.base))
        return mean_ci95([alt[s] - self.base[s] for s in seeds])

    @property
    def best(self) -> tuple[str | None, float, float]:
        """(alternative, mean gain, 95% CI half-width) of the best alternative."""
        scored = [(a, *self.gain(a)) for a in self.alternatives]
        scored = [t for t in scored if math.isfinite(t[1])]
        return max(scored, key=lambda t: t[1]) if scored else (None, float("nan"), float("nan"))


@dataclass
class MechanismReport:
    scenario: str
    seeds: list[int]
    mechanisms: list[str]
    metrics: dict[str, dict[str, dict[int, float]]]  # mechanism -> metric -> seed -> value
    deviations: dict[str, list[Deviation]]  # mechanism -> one per bidder type
    notes: list[str] = field(default_factory=list)
    failed: dict[str, dict[int, str]] = field(default_factory=dict)
    health: list[SeatHealth] = field(default_factory=list)  # per run folder and seat

    def metric(self, mechanism: str, name: str) -> tuple[float, float]:
        values = self.metrics[mechanism][name]
        return mean_ci95([values[s] for s in sorted(values)])

    def paired(self, a: str, b: str, name: str = "composite") -> tuple[float, float]:
        """Mean and CI of ``a - b`` per seed (the same worlds under both mechanisms)."""
        x, y = self.metrics[a][name], self.metrics[b][name]
        return mean_ci95([x[s] - y[s] for s in sorted(set(x) & set(y))])

    def max_regret(self, mechanism: str) -> tuple[str | None, str | None, float, float]:
        """(type, alternative, gain, ci) of the most profitable deviation under ``mechanism``."""
        best: tuple[str | None, str | None, float, float] = (None, None, float("nan"), float("nan"))
        for dev in self.deviations.get(mechanism, []):
            alt, gain, half = dev.best
            if alt is not None and not (gain <= best[2]):
                best = (dev.bidder_type, alt, gain, half)
        return best

    def table(self) -> list[dict[str, Any]]:
        out = []
        for m in self.mechanisms:
            row: dict[str, Any] = {"mechanism": m, "n": len(self.metrics[m]["composite"])}
            for name in METRICS:
                row[name], row[f"{name}_ci95"] = self.metric(m, name)
            kind, alt, gain, half = self.max_regret(m)
            row.update({"max_regret": gain, "max_regret_ci95": half, "regret_type": kind,
                        "regret_alternative": alt})
            out.append(row)
        return out

    def deviation_rows(self) -> list[dict[str, Any]]:
        out = []
        for m in self.mechanisms:
            for dev in self.deviations.get(m, []):
                for alt in dev.alternatives:
                    gain, half = dev.gain(alt)
                    out.append({"mechanism": m, "bidder_type": dev.bidder_type, "seat": dev.seat,
                                "alternative": alt, "gain": gain, "ci95": half,
                                "best": alt == dev.best[0]})
        return out

    def csv(self) -> str:
        return _to_csv(self.table())

    def deviations_csv(self) -> str:
        return _to_csv(self.deviation_rows())

    def markdown(self) -> str:
        types = sorted({d.bidder_type for devs in self.deviations.values() for d in devs})
        head = ["mechanism", *METRICS, *(f"gain: {t}" for t in types)]
        lines = [
            f"Mechanisms on `{self.scenario}` over {len(self.seeds)} seed(s) "
            f"({_seed_text(self.seeds)}): per-round means of the designer parts (revenue in "
            "credits per episode), mean ± 95% CI over episodes. `gain: T` is bidder type T's "
            "gain from deviating to its best alternative built-in strategy (one seat swapped, "
            "same seeds, paired difference of that seat's return; > 0 means the mechanism is not "
            "incentive compatible for T among the built-ins).",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
        ]
        for m in self.mechanisms:
            cells = [m]
            for name in METRICS:
                mean, half = self.metric(m, name)
                cells.append(f"{mean:.1f} ± {half:.1f}" if name == "revenue"
                             else f"{mean:.3f} ± {half:.3f}")
            devs = {d.bidder_type: d for d in self.deviations.get(m, [])}
            for t in types:
                dev = devs.get(t)
                if dev is None or dev.best[0] is None:
                    cells.append("")
                    continue
                alt, gain, half = dev.best
                cells.append(f"{gain:+.3f} ± {half:.3f} ({alt})")
            lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
        lines += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        from market.record.report import CSS, Safe, bar_chart, content_security_policy, h

        charts = []
        for i, name in enumerate(METRICS):
            bars = [(m, *self.metric(m, name)) for m in self.mechanisms]
            charts.append(bar_chart(name, bars, plot_id=f"m{i}",
                                    y_label="credits" if name == "revenue" else ""))
        regret = [(m, *self.max_regret(m)[2:]) for m in self.mechanisms]
        charts.append(bar_chart("max gain from deviating (any bidder type)", regret,
                                plot_id="regret", y_label="return"))
        for j, m in enumerate(self.mechanisms):
            bars = [(d.bidder_type, d.best[1], d.best[2])
                    for d in self.deviations.get(m, []) if d.best[0] is not None]
            if bars:
                charts.append(bar_chart(f"{m}: best deviation's gain per bidder type", bars,
                                        plot_id=f"d{j}", y_label="return"))
        table = [h("tr", [h("th", k) for k in ("mechanism", *METRICS, "max regret")])]
        for row in self.table():
            cells = [h("td", row["mechanism"])]
            cells += [h("td", f"{row[k]:.{1 if k == 'revenue' else 3}f} ± "
                              f"{row[k + '_ci95']:.{1 if k == 'revenue' else 3}f}", class_="num")
                      for k in METRICS]
            cells.append(h("td", "" if row["regret_type"] is None else
                           f"{row['max_regret']:+.3f} ± {row['max_regret_ci95']:.3f} "
                           f"({row['regret_type']}→{row['regret_alternative']})", class_="num"))
            table.append(h("tr", cells))
        title = f"gpumarket mechanisms: {self.scenario}"
        head = h("head", h("meta", charset="utf-8"),
                 h("meta", http_equiv="Content-Security-Policy", content=content_security_policy()),
                 h("title", title), Safe(f"<style>{CSS}</style>"))
        body = h("body", h("header", h("h1", title), h("p", f"{len(self.seeds)} seed(s), "
                                                            f"{_seed_text(self.seeds)}", class_="muted")),
                 h("main", h("div", h("table", table), class_="tw"),
                   h("div", charts, class_="plots"), h("ul", [h("li", n) for n in self.notes])))
        return "<!DOCTYPE html>\n" + h("html", head, body, lang="en") + "\n"


def _to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    if rows:
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(list(rows[0]))
        for row in rows:
            writer.writerow([_csv_value(v) for v in row.values()])
    return buf.getvalue()


def _with_mechanism(sc: Scenario, overrides: dict[str, Any] | None) -> Scenario:
    if overrides is None:
        return sc
    table = sc.model_dump(mode="python")
    table["mechanism"] = deep_merge(table["mechanism"], overrides)
    return load_scenario(Scenario.model_validate(table))


def _episode_metrics(folder: _Folder) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {name: {} for name in METRICS}
    for seed in folder.seeds:
        rows = folder.done.get(seed)
        if not rows:
            continue
        row = rows[0]
        for name in METRICS:
            out[name][seed] = row["revenue"] if name == "revenue" else row["designer"][name]
    return out


def evaluate_mechanisms(
    scenario: str | Path | Scenario,
    seeds: Iterable[int],
    out_dir: str | Path,
    workers: int | None = None,
    *,
    candidates: Sequence[str] | None = None,
    alternatives: Sequence[str] | None = None,
    deviations: bool = True,
    backend: str = "local",
    address: str | None = None,
    progress: bool | ProgressFn = True,
    fresh: bool = False,
    agent_timeout: float | None = None,
) -> MechanismReport:
    """Compare mechanisms (:data:`CANDIDATES`) on ``scenario``; for each, every bidder type's
    gain from deviating to its best alternative strategy (:data:`ALTERNATIVES`).

    The bidder types are the distinct agent specs of the scenario's bidder seats; a type deviates
    in its first seat. Writes ``mechanisms.csv``, ``mechanisms.md``, ``deviations.csv`` and
    ``mechanisms.html`` (plots) to ``out_dir``; every run is a resumable folder inside it.
    ``agent_timeout`` as in :func:`run_scenario`.
    """
    seeds = list(seeds)
    sc = _scenario(scenario)
    names = list(candidates or CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise RunConfigError(f"unknown mechanism(s) {', '.join(unknown)}; "
                             f"choose from {', '.join(CANDIDATES)}")
    alts = list(alternatives or ALTERNATIVES)
    notes = []
    if not sc.designer_seat and "random" in names:
        names.remove("random")
        notes.append(f"{sc.name} has no designer seat: the random designer was left out")
    if not names:
        raise RunConfigError("no mechanism left to compare")
    base_seats = check_seats(sc, None)
    types: dict[str, str] = {}
    for seat, spec in base_seats.items():
        if seat != DESIGNER and seat.startswith("bidder_") and spec not in types:
            types[spec] = seat
    out = Path(out_dir)
    base: dict[str, _Folder] = {}
    devs: dict[tuple[str, str, str], _Folder] = {}
    for m in names:
        designer, overrides = CANDIDATES[m]
        msc = _with_mechanism(sc, overrides)
        seats = {DESIGNER: designer} if sc.designer_seat else {}
        base[m] = _folder(msc, seeds, seats, out / m / "base", False, fresh, 1, agent_timeout)
        if not deviations:
            continue
        for kind, seat in types.items():
            for alt in alts:
                if alt != kind:
                    devs[(m, kind, alt)] = _folder(msc, seeds, {**seats, seat: alt},
                                                   out / m / f"{slug(kind)}@{seat}-{slug(alt)}",
                                                   False, fresh, 1, agent_timeout)
    execute([*base.values(), *devs.values()], workers=workers, backend=backend, address=address,
            progress=progress, label="mechanisms")

    def seat_returns(folder: _Folder, seat: str) -> dict[int, float]:
        return {s: next(r["return"] for r in folder.done[s] if r["seat"] == seat)
                for s in folder.seeds if s in folder.done}

    report = MechanismReport(sc.name, seeds, names,
                             {m: _episode_metrics(f) for m, f in base.items()}, {}, notes)
    for m in names:
        report.deviations[m] = [
            Deviation(m, kind, seat, seat_returns(base[m], seat),
                      {alt: seat_returns(devs[(m, kind, alt)], seat)
                       for alt in alts if (m, kind, alt) in devs})
            for kind, seat in types.items()
        ] if deviations else []
    report.failed = {str(f.out): f.failed for f in [*base.values(), *devs.values()] if f.failed}
    report.health = _health([*base.values(), *devs.values()], out)
    report.notes.append(
        "revenue: auction revenue in credits per episode; the other metrics are per-round means of "
        "the designer parts (round_log[r]['designer']); composite is the designer's reward")
    if deviations:
        report.notes.append(
            "the best of several alternatives is picked on the same seeds it is measured on, so "
            "its gain is biased upwards (a conservative incentive-compatibility check)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "mechanisms.csv").write_text(report.csv(), encoding="utf-8")
    (out / "deviations.csv").write_text(report.deviations_csv(), encoding="utf-8")
    (out / "mechanisms.md").write_text(report.markdown(), encoding="utf-8")
    (out / "mechanisms.html").write_text(report.html(), encoding="utf-8")
    return report


__all__ = [
    "ALTERNATIVES", "CANDIDATES", "DESIGNER_PARTS", "ROBUST", "ROW_KEYS", "EvalTable",
    "MechanismReport", "RunConfigError", "RunInterrupted", "RunSummary", "evaluate",
    "evaluate_mechanisms", "execute", "read_results", "run_scenario", "summarise_rows",
]

if __name__ == "__main__":  # pragma: no cover
    sys.exit("use gpumarket run / gpumarket eval, or import market.run.runner")
