"""Throughput sections of the bench suite: AEC steps/s per scenario (``steps``), episodes/s of the
runner with 1, 2 and all cores against what those cores can do at most (``episodes``) and on
Ray (``ray``), and steps/s with and without transcripts (``transcript``)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import queue
import tempfile
import time
from pathlib import Path
from typing import Any

from market.bench.config import BenchConfig, SectionResult, SectionSkipped, first_line, metric
from market.environment.aec import raw_env
from market.run.ray_backend import ray_session
from market.run.rollout import default_seats, run_episode
from market.run.runner import default_workers, run_scenario
from scenarios import builtin_names


def bench_scenario(name: str, seconds: float = 2.0, seed0: int = 0) -> dict[str, Any]:
    """Episodes with the scenario's default scripted seats for about ``seconds`` (at least 3
    episodes), one process, one env reused across episodes after a warm-up episode."""
    env = raw_env(name)
    run_episode(name, seed0, env=env)  # warm-up
    steps = episodes = 0
    start = time.perf_counter()
    seed = seed0
    while time.perf_counter() - start < seconds or episodes < 3:
        steps += run_episode(name, seed, env=env).steps
        episodes += 1
        seed += 1
    elapsed = time.perf_counter() - start
    return {
        "scenario": name,
        "episodes": episodes,
        "steps": steps,
        "steps_per_s": steps / elapsed,
        "episodes_per_s": episodes / elapsed,
        "seats": seat_counts(default_seats(env.scenario)),
    }


def seat_counts(seats: dict[str, str]) -> dict[str, int]:
    """Agent spec -> how many seats it fills (large_market has hundreds of seats)."""
    counts: dict[str, int] = {}
    for spec in seats.values():
        counts[spec] = counts.get(spec, 0) + 1
    return counts


def section_steps(config: BenchConfig) -> SectionResult:
    rows = [bench_scenario(name, config.seconds) for name in (config.scenarios or builtin_names())]
    metrics = [
        metric(f"steps.{r['scenario']}.steps_per_s", r["steps_per_s"], "steps/s", "higher", "steps")
        for r in rows
    ]
    return SectionResult(metrics, {"rows": rows})


def worker_levels(cores: int) -> list[int]:
    """1, 2 and every core, without duplicates (on a 2-core machine: 1 and 2)."""
    return sorted({1, min(2, cores), cores})


def time_run(scenario: str, n_seeds: int, out_dir: Path, **kwargs: Any) -> float:
    """Wall seconds of ``run_scenario`` over seeds ``0..n_seeds-1`` into a fresh folder, with
    transcripts and progress off; pool (or Ray task) start-up is part of the time, as in a run."""
    start = time.perf_counter()
    summary = run_scenario(
        scenario,
        range(n_seeds),
        None,
        out_dir,
        transcripts=False,
        progress=False,
        fresh=True,
        **kwargs,
    )
    elapsed = time.perf_counter() - start
    if summary.failed:
        seed, error = next(iter(summary.failed.items()))
        raise RuntimeError(f"{scenario}: episode seed {seed} failed: {error}")
    return elapsed


def _ceiling_worker(scenario: str, seeds: list[int], ready: Any, go: Any) -> None:
    """One process of :func:`ceiling_seconds`: a warm-up episode, then its seeds on the signal."""
    run_episode(scenario, seeds[0])  # imports, caches and the allocator, off the clock
    ready.put(None)
    go.wait()
    for seed in seeds:
        run_episode(scenario, seed)


def ceiling_seconds(scenario: str, n_seeds: int, processes: int, timeout: float = 600.0) -> float:
    """Wall seconds for ``processes`` processes to play seeds ``0..n_seeds-1`` between them (seed
    ``i`` in process ``i % processes``) and exit, timed from the moment every one of them has
    started, imported the package and played a warm-up episode.

    Nothing else runs: no pool, no results to send back or write, no start-up on the clock. So
    ``n_seeds`` over this time is the most episodes per second any runner can get from that
    many cores here (their parallel ceiling): it falls short of ``processes`` times one
    process's rate when the cores share caches, memory bandwidth or a power budget, or are
    busy with other work. Processes start as the runner's pool does (the platform's default).
    """
    if not 1 <= processes <= n_seeds:
        raise ValueError(f"need 1 <= processes <= n_seeds, got {processes} and {n_seeds}")
    ctx = multiprocessing.get_context()
    ready, go = ctx.Queue(), ctx.Event()
    children = [
        ctx.Process(
            target=_ceiling_worker,
            args=(scenario, list(range(i, n_seeds, processes)), ready, go),
            daemon=True,
        )
        for i in range(processes)
    ]
    for child in children:
        child.start()
    try:
        deadline = time.monotonic() + timeout
        waiting = processes
        while waiting:
            try:
                ready.get(timeout=0.2)
                waiting -= 1
            except queue.Empty:
                if time.monotonic() > deadline or any(c.exitcode is not None for c in children):
                    break  # a process died (or hung) before its start line
        start = time.perf_counter()
        go.set()
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()) if not waiting else 0.0)
        elapsed = time.perf_counter() - start
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join()
        ready.close()
    failed = [c.exitcode for c in children if c.exitcode != 0]
    if waiting or failed:
        raise RuntimeError(
            f"{scenario}: {len(failed)} of {processes} ceiling processes failed or hung "
            f"(exit codes {failed}; a traceback, if any, is on stderr above)"
        )
    return elapsed


def section_episodes(config: BenchConfig) -> SectionResult:
    cores = default_workers()
    result = SectionResult(details={"cores": cores, "rows": []})
    with tempfile.TemporaryDirectory(prefix="gpumarket-bench-") as tmp:
        for scenario, n_seeds in config.episode_batches:
            base = ceiling_base = None
            for workers in worker_levels(cores):
                seconds = time_run(
                    scenario, n_seeds, Path(tmp) / f"{scenario}-{workers}", workers=workers
                )
                rate = n_seeds / seconds
                ceiling = n_seeds / ceiling_seconds(scenario, n_seeds, workers)
                base = base or rate
                ceiling_base = ceiling_base or ceiling
                speedup, ceiling_speedup = rate / base, ceiling / ceiling_base
                result.details["rows"].append(
                    {
                        "scenario": scenario,
                        "workers": workers,
                        "episodes": n_seeds,
                        "seconds": seconds,
                        "episodes_per_s": rate,
                        "speedup": speedup,
                        "ceiling_episodes_per_s": ceiling,
                        "ceiling_speedup": ceiling_speedup,
                        "share_of_ceiling": rate / ceiling,
                    }
                )
                name = f"episodes.{scenario}.workers_{workers}"
                result.metrics += [
                    metric(f"{name}.episodes_per_s", rate, "episodes/s", "higher", "episodes"),
                    metric(
                        f"{name}.ceiling_episodes_per_s",
                        ceiling,
                        "episodes/s",
                        "higher",
                        "episodes",
                    ),
                ]
    return result


def section_ray(config: BenchConfig) -> SectionResult:
    """Episodes/s on the Ray backend with a private local Ray instance. The bench opens one Ray
    session (:func:`market.run.ray_backend.ray_session`) for the whole section, which the runner
    reuses: ``ray.startup_s`` is starting it plus a 2-episode warm-up run (worker processes
    start and import the package), and the timed batches run warm after it."""
    if importlib.util.find_spec("ray") is None:
        raise SectionSkipped("Ray is not installed: pip install 'gpumarket[ray]'")
    result = SectionResult(details={"rows": []})
    try:
        with tempfile.TemporaryDirectory(prefix="gpumarket-bench-ray-") as tmp:
            began = time.perf_counter()
            with ray_session(None):
                result.details["session_start_s"] = time.perf_counter() - began
                time_run(config.episode_batches[0][0], 2, Path(tmp) / "warm-up", backend="ray")
                result.metrics.append(
                    metric("ray.startup_s", time.perf_counter() - began, "s", "lower", "ray")
                )
                for scenario, n_seeds in config.episode_batches:
                    seconds = time_run(scenario, n_seeds, Path(tmp) / scenario, backend="ray")
                    rate = n_seeds / seconds
                    result.details["rows"].append(
                        {
                            "scenario": scenario,
                            "episodes": n_seeds,
                            "seconds": seconds,
                            "episodes_per_s": rate,
                        }
                    )
                    result.metrics.append(
                        metric(
                            f"ray.{scenario}.episodes_per_s", rate, "episodes/s", "higher", "ray"
                        )
                    )
    except Exception as exc:  # the backend is optional: a failure is reported, not fatal
        raise SectionSkipped(
            f"Ray backend failed: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    return result


def transcript_rates(
    scenario: str, seconds: float, variants: dict[str, tuple[Path | None, int]], slices: int = 5
) -> dict[str, dict[str, float]]:
    """Steps/s of each variant ``name -> (folder or None for no transcript, digest_every)``,
    and its transcript bytes per step. Each variant plays episodes (seeds 0, 1, ... on one
    reused env, a transcript per episode in its folder) for ``seconds`` in total, cut into
    ``slices`` turns that alternate between the variants, so a change of load from other
    processes hits them alike rather than biasing the overhead."""
    env = raw_env(scenario)
    run_episode(scenario, 0, env=env)  # warm-up
    totals = {name: {"steps": 0, "episodes": 0, "seconds": 0.0} for name in variants}
    for _ in range(max(1, slices)):
        for name, (folder, every) in variants.items():
            acc, start = totals[name], time.perf_counter()
            played = 0
            while time.perf_counter() - start < seconds / slices or played < 1:
                acc["steps"] += run_episode(
                    scenario, int(acc["episodes"]), env=env, transcript=folder, digest_every=every
                ).steps
                acc["episodes"] += 1
                played += 1
            acc["seconds"] += time.perf_counter() - start
    out = {}
    for name, (folder, _) in variants.items():
        acc = totals[name]
        size = sum(p.stat().st_size for p in folder.glob("*.jsonl")) if folder else 0
        out[name] = {
            "steps_per_s": acc["steps"] / acc["seconds"],
            "bytes_per_step": size / acc["steps"],
            "episodes": int(acc["episodes"]),
        }
    return out


def section_transcript(config: BenchConfig) -> SectionResult:
    name, every = config.transcript_scenario, config.digest_every
    result = SectionResult(details={"scenario": name})
    with tempfile.TemporaryDirectory(prefix="gpumarket-bench-tr-") as tmp:
        variants = transcript_rates(
            name,
            config.seconds,
            {
                "none": (None, 1),
                "digest_1": (Path(tmp) / "d1", 1),
                f"digest_{every}": (Path(tmp) / "dn", every),
            },
        )
    base = variants["none"]["steps_per_s"]
    for variant, row in variants.items():
        result.metrics.append(
            metric(
                f"transcript.{name}.{variant}.steps_per_s",
                row["steps_per_s"],
                "steps/s",
                "higher",
                "transcript",
            )
        )
        if variant == "none":
            continue
        # extra time per step relative to no transcript: (1/with - 1/without) / (1/without)
        row["overhead_pct"] = 100.0 * (base / row["steps_per_s"] - 1.0)
        result.metrics.append(
            metric(
                f"transcript.{name}.{variant}.overhead_pct",
                row["overhead_pct"],
                "%",
                "lower",
                "transcript",
            )
        )
        result.metrics.append(
            metric(
                f"transcript.{name}.{variant}.bytes_per_step",
                row["bytes_per_step"],
                "B/step",
                "lower",
                "transcript",
            )
        )
    result.details["variants"] = variants
    return result
