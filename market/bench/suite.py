"""``gpumarket bench``: the benchmark suite (throughput, scaling, memory) of this machine.

Sections, each selectable with ``--only`` (see ``docs/benchmarks.md`` for how each is measured):

- ``steps``: AEC steps/s per built-in scenario, scripted agents in every seat, one process;
- ``episodes``: episodes/s of :func:`market.run.runner.run_scenario` with 1, 2 and all cores;
- ``ray``: the same on the Ray backend (a private local Ray instance); skipped when Ray is missing
  or fails;
- ``clearing``: median time of :func:`market.core.mechanisms.clear` against the number of bidders, the
  growth exponent of each auction type next to the n log n reference, and the env's clearing step;
- ``memory``: RSS and traced Python/numpy memory per live, reset env;
- ``transcript``: steps/s without a transcript, with one, and with sparse digests;
- ``llm``: LLM decisions/s at concurrency 1, 8 and 32 against a local OpenAI-compatible server.

Targets (2-core machine): >= 10,000 AEC steps/s in ``market_round``; clearing a 1,000-bidder,
10,000-block market in < 20 ms; clearing time growing no faster than n log n.

A run is a JSON report (schema :data:`SCHEMA`): machine info and a flat list of named metrics,
each with a value, a unit and the better direction. :func:`compare_reports` compares two runs and
flags metrics that moved more than a threshold in the bad direction. Figures are measured, never
asserted in tests (shared machines are noisy).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# the env, numpy and the agents are imported inside the functions: the CLI imports this module
# to build its parser, and `gpumarket --help` should stay fast
SCHEMA = "gpumarket-bench/1"
# Ray last: its processes keep a core busy for a few seconds after shutdown
SECTIONS: tuple[str, ...] = ("steps", "episodes", "clearing", "memory", "transcript", "llm", "ray")
TARGET_STEPS_PER_SECOND = 10_000
TARGET_CLEARING_MS = 20.0
DEFAULT_THRESHOLD = 0.2
CLEARING_NOISE_MS = 0.1  # clearing a small market takes ~0.1 ms: changes below this are noise
#: glibc settings for the clearing timings (a fresh interpreter): keep freed memory rather than
#: hand it back to the OS between calls. Otherwise, depending on the allocator's state, a call
#: at 10,000 bidders may page-fault its megabytes of arrays back in (+30-60%), which bends the
#: growth curve by an amount that changes from run to run (see docs/benchmarks.md)
STEADY_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "67108864"}

Metric = dict[str, Any]


class BenchFileError(ValueError):
    """A bench JSON file that cannot be read or compared (the message is one line)."""


class SectionSkipped(RuntimeError):
    """A section that cannot run here (the message says why)."""


@dataclass(frozen=True)
class BenchConfig:
    """Budgets and sizes of every section. :func:`quick_config` shrinks them for smoke tests."""

    seconds: float = 2.0  # per scenario (steps) and per variant (transcript)
    scenarios: tuple[str, ...] = ()  # steps: () means every built-in scenario
    # about 2-3 s per batch on 2 cores: shorter batches make episodes/s swing by 20%
    episode_batches: tuple[tuple[str, int], ...] = (("market_round", 600), ("large_market", 20))
    clearing_sizes: tuple[int, ...] = (10, 30, 100, 300, 1000, 3000, 10000)
    clearing_fit_min: int = 300  # below it fixed per-call overhead dominates the time
    clearing_repeats: int = 15  # interleaved passes; the median resists load spikes
    blocks_per_bidder: int = 10
    units_per_bidder: int = 20
    env_clearing_labs: int = 1000
    memory_envs: tuple[tuple[str, int], ...] = (("market_round", 200), ("large_market", 20))
    transcript_scenario: str = "market_round"
    digest_every: int = 10
    llm_concurrency: tuple[int, ...] = (1, 8, 32)
    llm_decisions_per_slot: int = 20  # decisions at concurrency c: max(2 * this, this * c)
    llm_base_url: str | None = None  # None: spawn the fake server
    llm_model: str = "fake-model"
    llm_latency_ms: float = 50.0
    quick: bool = False


def quick_config(config: BenchConfig | None = None) -> BenchConfig:
    """Tiny budgets for tests and CI smoke runs: the figures are only sanity checks."""
    return replace(config or BenchConfig(), seconds=0.05, episode_batches=(("market_round", 6),),
                   clearing_sizes=(10, 30, 100, 300, 1000), clearing_fit_min=100,
                   clearing_repeats=3, env_clearing_labs=100,
                   memory_envs=(("market_round", 10), ("large_market", 2)),
                   llm_decisions_per_slot=2, llm_latency_ms=5.0, quick=True)


def parse_sections(text: str) -> tuple[str, ...]:
    """``--only steps,clearing`` -> ("steps", "clearing"), in the suite's order."""
    wanted = {s.strip() for s in text.split(",") if s.strip()}
    unknown = sorted(wanted - set(SECTIONS))
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"--only {text!r}: unknown section(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {','.join(SECTIONS)}")
    return tuple(s for s in SECTIONS if s in wanted)


def metric(name: str, value: float, unit: str, direction: str, section: str,
           context: dict[str, Any] | None = None, noise: float = 0.0) -> Metric:
    """One named figure. ``context`` holds what makes two values comparable (e.g. the LLM
    server); values whose contexts differ are reported as not comparable, never as regressions.
    ``noise``: an absolute change no larger than this is never flagged (timings of a few
    microseconds move by more than 20% from one run to the next)."""
    assert direction in ("higher", "lower"), direction
    out: Metric = {"name": name, "value": float(value), "unit": unit, "direction": direction,
                   "section": section}
    if context:
        out["context"] = context
    if noise:
        out["noise"] = float(noise)
    return out


@dataclass
class SectionResult:
    metrics: list[Metric] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------- steps


def bench_scenario(name: str, seconds: float = 2.0, seed0: int = 0) -> dict[str, Any]:
    """Episodes with the scenario's default scripted seats for about ``seconds`` (at least 3
    episodes), one process, one env reused across episodes after a warm-up episode."""
    from market.environment.aec import raw_env
    from market.run.rollout import default_seats, run_episode

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
    return {"scenario": name, "episodes": episodes, "steps": steps,
            "steps_per_s": steps / elapsed, "episodes_per_s": episodes / elapsed,
            "seats": _seat_counts(default_seats(env.scenario))}


def _seat_counts(seats: dict[str, str]) -> dict[str, int]:
    """Agent spec -> how many seats it fills (large_market has hundreds of seats)."""
    counts: dict[str, int] = {}
    for spec in seats.values():
        counts[spec] = counts.get(spec, 0) + 1
    return counts


def section_steps(config: BenchConfig) -> SectionResult:
    from scenarios import builtin_names

    rows = [bench_scenario(name, config.seconds) for name in (config.scenarios or builtin_names())]
    metrics = [metric(f"steps.{r['scenario']}.steps_per_s", r["steps_per_s"], "steps/s", "higher",
                      "steps") for r in rows]
    return SectionResult(metrics, {"rows": rows})


# ---------------------------------------------------------------------------------- episodes


def worker_levels(cores: int) -> list[int]:
    """1, 2 and every core, without duplicates (on a 2-core machine: 1 and 2)."""
    return sorted({1, min(2, cores), cores})


def time_run(scenario: str, n_seeds: int, out_dir: Path, **kwargs: Any) -> float:
    """Wall seconds of ``run_scenario`` over seeds ``0..n_seeds-1`` into a fresh folder, with
    transcripts and progress off; pool (or Ray task) start-up is part of the time, as in a run."""
    from market.run.runner import run_scenario

    start = time.perf_counter()
    summary = run_scenario(scenario, range(n_seeds), None, out_dir, transcripts=False,
                           progress=False, fresh=True, **kwargs)
    elapsed = time.perf_counter() - start
    if summary.failed:
        seed, error = next(iter(summary.failed.items()))
        raise RuntimeError(f"{scenario}: episode seed {seed} failed: {error}")
    return elapsed


def section_episodes(config: BenchConfig) -> SectionResult:
    from market.run.runner import default_workers

    cores = default_workers()
    result = SectionResult(details={"cores": cores, "rows": []})
    with tempfile.TemporaryDirectory(prefix="gpumarket-bench-") as tmp:
        for scenario, n_seeds in config.episode_batches:
            base = None
            for workers in worker_levels(cores):
                seconds = time_run(scenario, n_seeds, Path(tmp) / f"{scenario}-{workers}",
                                   workers=workers)
                rate = n_seeds / seconds
                base = base or rate
                result.details["rows"].append({"scenario": scenario, "workers": workers,
                                               "episodes": n_seeds, "seconds": seconds,
                                               "episodes_per_s": rate, "speedup": rate / base})
                result.metrics.append(metric(f"episodes.{scenario}.workers_{workers}.episodes_per_s",
                                             rate, "episodes/s", "higher", "episodes"))
    return result


def section_ray(config: BenchConfig) -> SectionResult:
    """Episodes/s on the Ray backend with a private local Ray instance. The bench opens one Ray
    session (:func:`market.run.ray_backend.ray_session`) for the whole section, which the runner
    reuses: ``ray.startup_s`` is starting it plus a 2-episode warm-up run (worker processes
    start and import the package), and the timed batches run warm after it."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise SectionSkipped("Ray is not installed: pip install 'gpumarket[ray]'")
    try:
        from market.run.ray_backend import ray_session
    except ImportError as exc:
        raise SectionSkipped(f"this version has no Ray backend ({exc})") from None
    result = SectionResult(details={"rows": []})
    try:
        with tempfile.TemporaryDirectory(prefix="gpumarket-bench-ray-") as tmp:
            began = time.perf_counter()
            with ray_session(None):
                result.details["session_start_s"] = time.perf_counter() - began
                time_run(config.episode_batches[0][0], 2, Path(tmp) / "warm-up", backend="ray")
                result.metrics.append(metric("ray.startup_s", time.perf_counter() - began, "s",
                                             "lower", "ray"))
                for scenario, n_seeds in config.episode_batches:
                    seconds = time_run(scenario, n_seeds, Path(tmp) / scenario, backend="ray")
                    rate = n_seeds / seconds
                    result.details["rows"].append({"scenario": scenario, "episodes": n_seeds,
                                                   "seconds": seconds, "episodes_per_s": rate})
                    result.metrics.append(metric(f"ray.{scenario}.episodes_per_s", rate,
                                                 "episodes/s", "higher", "ray"))
    except Exception as exc:  # the backend is optional: a failure is reported, not fatal
        raise SectionSkipped(f"Ray backend failed: {type(exc).__name__}: {_first_line(exc)}") from None
    return result


# ---------------------------------------------------------------------------------- clearing


def growth_exponent(sizes: Sequence[float], times: Sequence[float]) -> float:
    """Least-squares slope of log(time) on log(size): time ~ size ** slope."""
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError("need at least two (size, time) pairs")
    xs = [math.log(s) for s in sizes]
    ys = [math.log(t) for t in times]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("need at least two different sizes")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def nlogn_exponent(sizes: Sequence[float]) -> float:
    """The slope that n log n itself shows over ``sizes`` (about 1.1-1.15 for 300..10,000)."""
    return growth_exponent(sizes, [n * math.log(n) for n in sizes])


def bench_env_clearing(n_labs: int = 1000, blocks: int = 10_000, repeats: int = 9) -> dict[str, float]:
    """Wall time of the env step that clears a round (auction, settlement, execution, rewards)
    in a market of ``n_labs`` truthful bidders and ``blocks`` blocks. Median over ``repeats``.
    As ``timeit`` does, the cyclic garbage collector is paused during the timed step (after a
    collection), so a collection of the set-up's garbage is not billed to the step."""
    import gc

    from agents.scripted import truthful_bid
    from market.environment.aec import raw_env

    samples = []
    for rep in range(repeats):
        env = raw_env("market_round", rounds=2, negotiation_turns=0, designer_seat=False,
                      labs={"count": n_labs, "jobs": [2, 4], "endowment": [0, 0]},
                      jobs={"size": [4, 12]}, capacity={"blocks": [blocks, blocks]},
                      shocks=[], shock_rates={})
        env.reset(seed=rep)
        while env.agent_selection != f"bidder_{n_labs - 1}":  # bid for everyone but the last lab
            env.step(truthful_bid(env.observe(env.agent_selection)))
        last = truthful_bid(env.observe(env.agent_selection))
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            env.step(last)
            samples.append((time.perf_counter() - start) * 1e3)
        finally:
            gc.enable()
    return {"median_ms": statistics.median(samples), "min_ms": min(samples)}


def random_market(n: int, units_per_bidder: int, seed: int = 0) -> tuple[Any, Any]:
    """The bid matrix and priorities of ``market.core.mechanisms.bench_clearing``: each of ``n``
    bidders wants between half and all of ``units_per_bidder`` blocks, with sorted
    ``Uniform[0, 100)`` marginal bids padded with -1; priorities are a random permutation."""
    import numpy as np

    rng = np.random.default_rng(seed)
    m = max(int(units_per_bidder), 1)
    values = -np.sort(-rng.uniform(0.0, 100.0, size=(n, m)), axis=1)
    wanted = rng.integers((m + 1) // 2, m + 1, size=n)
    bids = np.where(np.arange(m)[None, :] < wanted[:, None], values, -1.0)
    return bids, rng.permutation(n)


def time_clearing(sizes: Sequence[int], blocks_per_bidder: int, units_per_bidder: int,
                  repeats: int) -> dict[int, dict[str, dict[str, float]]]:
    """Milliseconds of one ``clear()`` call per (size, auction type): median and min of
    ``repeats``. The repeats are interleaved (every size and type once per pass) so that load
    from other processes, which comes and goes, hits all sizes alike instead of bending the
    growth curve. The reserve is 10, so demand exceeds capacity and posted_price rations.
    :func:`section_clearing` runs it in a fresh interpreter with :data:`STEADY_ALLOCATOR`."""
    import numpy as np

    from market.core.mechanisms import AUCTION_TYPES, clear

    markets = {n: random_market(n, units_per_bidder) for n in sizes}
    lottery = np.random.default_rng(1)
    samples: dict[tuple[int, str], list[float]] = {(n, a): [] for n in sizes for a in AUCTION_TYPES}
    for _ in range(max(1, repeats)):
        for n, (bids, priority) in markets.items():
            for auction in AUCTION_TYPES:
                start = time.perf_counter()
                clear(bids, blocks_per_bidder * n, auction, 10.0, priority, lottery)
                samples[n, auction].append((time.perf_counter() - start) * 1e3)
    return {n: {a: {"median": statistics.median(samples[n, a]), "min": min(samples[n, a])}
                for a in AUCTION_TYPES} for n in sizes}


def section_clearing(config: BenchConfig) -> SectionResult:
    """``clear()`` against market size (see :func:`time_clearing`), the growth exponent of the
    median times over the larger sizes per auction type, and the env's whole clearing step."""
    from market.core.mechanisms import AUCTION_TYPES

    sizes = list(config.clearing_sizes)
    raw = run_in_subprocess("time_clearing", sizes, config.blocks_per_bidder,
                            config.units_per_bidder, config.clearing_repeats,
                            env=STEADY_ALLOCATOR)
    timed = {int(n): row for n, row in raw.items()}  # JSON made the sizes strings
    fit = [n for n in sizes if n >= config.clearing_fit_min]
    context = {"fit_sizes": fit, "allocator": "steady", "blocks_per_bidder": config.blocks_per_bidder,
               "units_per_bidder": config.units_per_bidder}
    result = SectionResult(details={
        "sizes": sizes, "fit_sizes": fit, "repeats": config.clearing_repeats,
        "ms": {n: {a: t["median"] for a, t in row.items()} for n, row in timed.items()},
        "min_ms": {n: {a: t["min"] for a, t in row.items()} for n, row in timed.items()},
        "nlogn_exponent": nlogn_exponent(fit), "exponents": {}, "exponents_of_min": {},
        "allocator": STEADY_ALLOCATOR})
    for auction in AUCTION_TYPES:
        for n in sizes:
            result.metrics.append(metric(f"clearing.{auction}.n{n}.ms", timed[n][auction]["median"],
                                         "ms", "lower", "clearing",
                                         {"blocks": config.blocks_per_bidder * n,
                                          "allocator": "steady"}, noise=CLEARING_NOISE_MS))
        slope = growth_exponent(fit, [timed[n][auction]["median"] for n in fit])
        result.details["exponents"][auction] = slope
        # the same fit on the fastest repeat: closer to the idle machine when others load it
        result.details["exponents_of_min"][auction] = growth_exponent(
            fit, [timed[n][auction]["min"] for n in fit])
        result.metrics.append(metric(f"clearing.{auction}.exponent", slope, "", "lower",
                                     "clearing", context))
    labs = config.env_clearing_labs
    env_step = bench_env_clearing(labs, config.blocks_per_bidder * labs)
    result.details["env_step"] = {"labs": labs, "blocks": config.blocks_per_bidder * labs, **env_step}
    result.metrics.append(metric(f"clearing.env_step.n{labs}.ms", env_step["median_ms"], "ms",
                                 "lower", "clearing", {"blocks": config.blocks_per_bidder * labs}))
    return result


# ------------------------------------------------------------------------------------ memory


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def env_memory(scenario: str, count: int) -> dict[str, float]:
    """Memory per live, reset env of ``scenario``, in KiB, measured two ways in this process.

    After a warm-up env (imports, caches), ``count`` envs are built and reset (seeds 1..count)
    and kept alive: ``rss_kib`` is the RSS growth / count, ``traced_kib`` (a second batch under
    ``tracemalloc``, which traces numpy buffers too) the traced bytes still held / count. RSS
    includes allocator slack, tracemalloc only live Python and numpy allocations.
    """
    import gc
    import tracemalloc

    from market.environment.aec import raw_env

    warm = raw_env(scenario)
    warm.reset(seed=0)
    gc.collect()
    before = rss_bytes()
    envs = [_reset_env(scenario, seed) for seed in range(1, count + 1)]
    gc.collect()
    rss = (rss_bytes() - before) / count
    tracemalloc.start()
    traced_envs = [_reset_env(scenario, seed) for seed in range(1, count + 1)]
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] / count
    tracemalloc.stop()
    del envs, traced_envs
    return {"rss_kib": rss / 1024, "traced_kib": traced / 1024}


def _reset_env(scenario: str, seed: int) -> Any:
    from market.environment.aec import raw_env

    env = raw_env(scenario)
    env.reset(seed=seed)
    return env


def run_in_subprocess(function: str, *args: Any, env: dict[str, str] | None = None) -> Any:
    """``market.bench.suite.<function>(*args)`` in a fresh interpreter (JSON in, JSON out), so that
    what earlier sections left in this process's allocator cannot colour the figure."""
    code = ("import json, sys; from market.bench import suite as bench; "
            "print(json.dumps(getattr(bench, sys.argv[1])(*json.loads(sys.argv[2]))))")
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code, function, json.dumps(args)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": path, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"{function} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def env_memory_in_subprocess(scenario: str, count: int) -> dict[str, float]:
    """:func:`env_memory` in a fresh interpreter, so memory freed by earlier sections (which the
    allocator reuses without growing RSS) cannot hide the envs' footprint."""
    return run_in_subprocess("env_memory", scenario, count)


def section_memory(config: BenchConfig) -> SectionResult:
    result = SectionResult(details={"rows": []})
    for scenario, count in config.memory_envs:
        row = env_memory_in_subprocess(scenario, count)
        result.details["rows"].append({"scenario": scenario, "envs": count, **row})
        result.metrics.append(metric(f"memory.{scenario}.rss_kib_per_env", row["rss_kib"], "KiB",
                                     "lower", "memory"))
        result.metrics.append(metric(f"memory.{scenario}.traced_kib_per_env", row["traced_kib"],
                                     "KiB", "lower", "memory"))
    return result


# -------------------------------------------------------------------------------- transcript


def transcript_rates(scenario: str, seconds: float, variants: dict[str, tuple[Path | None, int]],
                     slices: int = 5) -> dict[str, dict[str, float]]:
    """Steps/s of each variant ``name -> (folder or None for no transcript, digest_every)``,
    and its transcript bytes per step. Each variant plays episodes (seeds 0, 1, ... on one
    reused env, a transcript per episode in its folder) for ``seconds`` in total, cut into
    ``slices`` turns that alternate between the variants, so a change of load from other
    processes hits them alike rather than biasing the overhead."""
    from market.environment.aec import raw_env
    from market.run.rollout import run_episode

    env = raw_env(scenario)
    run_episode(scenario, 0, env=env)  # warm-up
    totals = {name: {"steps": 0, "episodes": 0, "seconds": 0.0} for name in variants}
    for _ in range(max(1, slices)):
        for name, (folder, every) in variants.items():
            acc, start = totals[name], time.perf_counter()
            played = 0
            while time.perf_counter() - start < seconds / slices or played < 1:
                acc["steps"] += run_episode(scenario, int(acc["episodes"]), env=env,
                                            transcript=folder, digest_every=every).steps
                acc["episodes"] += 1
                played += 1
            acc["seconds"] += time.perf_counter() - start
    out = {}
    for name, (folder, _) in variants.items():
        acc = totals[name]
        size = sum(p.stat().st_size for p in folder.glob("*.jsonl")) if folder else 0
        out[name] = {"steps_per_s": acc["steps"] / acc["seconds"],
                     "bytes_per_step": size / acc["steps"], "episodes": int(acc["episodes"])}
    return out


def section_transcript(config: BenchConfig) -> SectionResult:
    name, every = config.transcript_scenario, config.digest_every
    result = SectionResult(details={"scenario": name})
    with tempfile.TemporaryDirectory(prefix="gpumarket-bench-tr-") as tmp:
        variants = transcript_rates(name, config.seconds, {
            "none": (None, 1), "digest_1": (Path(tmp) / "d1", 1),
            f"digest_{every}": (Path(tmp) / "dn", every)})
    base = variants["none"]["steps_per_s"]
    for variant, row in variants.items():
        result.metrics.append(metric(f"transcript.{name}.{variant}.steps_per_s", row["steps_per_s"],
                                     "steps/s", "higher", "transcript"))
        if variant == "none":
            continue
        # extra time per step relative to no transcript: (1/with - 1/without) / (1/without)
        row["overhead_pct"] = 100.0 * (base / row["steps_per_s"] - 1.0)
        result.metrics.append(metric(f"transcript.{name}.{variant}.overhead_pct",
                                     row["overhead_pct"], "%", "lower", "transcript"))
        result.metrics.append(metric(f"transcript.{name}.{variant}.bytes_per_step",
                                     row["bytes_per_step"], "B/step", "lower", "transcript"))
    result.details["variants"] = variants
    return result


# ---------------------------------------------------------------------------------------- llm


def section_llm(config: BenchConfig) -> SectionResult:
    """Decisions/s through ``LLMAgent.aact`` (see :mod:`market.bench.llm`) at each concurrency,
    against ``llm_base_url`` or, by default, the fake server answering after a fixed latency:
    that measures the client stack (agent, limiter, openai client, HTTP), not a model."""
    from market.bench.llm import spawn_fake_server

    if config.llm_base_url:
        server = {"server": config.llm_base_url, "model": config.llm_model}
        rows = _llm_levels(config, config.llm_base_url)
    else:
        server = {"server": "fake", "latency_ms": config.llm_latency_ms}
        try:
            with spawn_fake_server(config.llm_latency_ms) as url:
                rows = _llm_levels(config, url)
        except FileNotFoundError as exc:
            raise SectionSkipped(str(exc)) from None
    if not any(r["answered_per_s"] for r in rows):
        raise SectionSkipped(f"the server at {server['server']} answered no request "
                             f"({rows[0]['backend_errors']} errors at concurrency {rows[0]['concurrency']})")
    result = SectionResult(details={**server, "rows": rows})
    for r in rows:
        c = r["concurrency"]
        result.metrics.append(metric(f"llm.c{c}.decisions_per_s", r["decisions_per_s"],
                                     "decisions/s", "higher", "llm", server))
        result.metrics.append(metric(f"llm.c{c}.answered_per_s", r["answered_per_s"],
                                     "requests/s", "higher", "llm", server))
        result.metrics.append(metric(f"llm.c{c}.mean_latency_ms", r["mean_latency_ms"], "ms",
                                     "lower", "llm", server))
        result.metrics.append(metric(f"llm.c{c}.cpu_ms_per_decision", r["cpu_ms_per_decision"],
                                     "ms", "lower", "llm", server))
    return result


def _llm_levels(config: BenchConfig, url: str) -> list[dict[str, Any]]:
    from market.bench.llm import run_llm_bench

    rows = []
    for c in config.llm_concurrency:
        # about the same wall time per level: more decisions where more run at once
        decisions = max(2 * config.llm_decisions_per_slot, config.llm_decisions_per_slot * c)
        rows.extend(run_llm_bench(url, (c,), decisions, model=config.llm_model))
    for r in rows:  # each level ran alone: relative to the first level, not to itself
        r["speedup"] = r["decisions_per_s"] / rows[0]["decisions_per_s"]
        base = rows[0]["answered_per_s"]
        r["answered_speedup"] = r["answered_per_s"] / base if base else None
    return rows


# -------------------------------------------------------------------------------------- suite

RUNNERS: dict[str, Callable[[BenchConfig], SectionResult]] = {
    "steps": section_steps, "episodes": section_episodes, "ray": section_ray,
    "clearing": section_clearing, "memory": section_memory, "transcript": section_transcript,
    "llm": section_llm,
}


def machine_info() -> dict[str, Any]:
    """Cores, Python, package version, git commit (if a checkout), time and load average."""
    from market import __version__
    from market.run.runner import default_workers

    info: dict[str, Any] = {
        "cores": default_workers(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "platform": platform.platform(), "package_version": _package_version(__version__),
        "git_commit": _git_commit(), "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return info


def _package_version(fallback: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpumarket")
    except PackageNotFoundError:
        return fallback


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[1]
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        return None
    try:
        out = subprocess.run([git, "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run([git, "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return None
    return commit + ("+dirty" if dirty.stdout.strip() else "")


def run_suite(config: BenchConfig, sections: Iterable[str] = SECTIONS,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the selected sections; a section that cannot run (or fails) is listed in
    ``skipped`` with the reason and the others still run."""
    report: dict[str, Any] = {"schema": SCHEMA, "machine": machine_info(),
                              "options": {"quick": config.quick, "sections": list(sections)},
                              "metrics": [], "skipped": {}, "details": {}}
    for name in report["options"]["sections"]:
        if log:
            log(f"bench: {name} ...")
        began = time.perf_counter()
        try:
            result = RUNNERS[name](config)
        except SectionSkipped as exc:
            report["skipped"][name] = str(exc)
            continue
        except Exception as exc:  # one broken section must not lose the others' figures
            report["skipped"][name] = f"error: {type(exc).__name__}: {_first_line(exc)}"
            continue
        report["metrics"].extend(result.metrics)
        report["details"][name] = {**result.details, "seconds": time.perf_counter() - began}
    report["targets"] = targets(report)
    return report


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The design targets that the report's figures can check: name, measured value, ok."""
    values = {m["name"]: m["value"] for m in report["metrics"]}
    out = []
    steps = values.get("steps.market_round.steps_per_s")
    if steps is not None:
        out.append({"target": f"market_round >= {TARGET_STEPS_PER_SECOND:,} AEC steps/s",
                    "value": steps, "ok": steps >= TARGET_STEPS_PER_SECOND})
    clearing = report["details"].get("clearing")
    if clearing:
        ref = clearing["nlogn_exponent"]
        for auction, slope in clearing["exponents"].items():
            out.append({"target": f"{auction} clearing grows <= n log n (exponent <= {ref:.3f})",
                        "value": slope, "ok": slope <= ref})
        if 1000 in clearing["ms"]:
            worst = max(clearing["ms"][1000].values())
            out.append({"target": f"clear() at 1,000 bidders < {TARGET_CLEARING_MS:g} ms (slowest type)",
                        "value": worst, "ok": worst < TARGET_CLEARING_MS})
        env_step = clearing["env_step"]
        if env_step["labs"] == 1000:
            out.append({"target": f"env clearing step at 1,000 labs < {TARGET_CLEARING_MS:g} ms",
                        "value": env_step["median_ms"], "ok": env_step["median_ms"] < TARGET_CLEARING_MS})
    return out


# ----------------------------------------------------------------------------------- compare


def load_report(path: Path) -> dict[str, Any]:
    """Read and check a bench JSON file; :class:`BenchFileError` (one line) when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise BenchFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BenchFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), list):
        raise BenchFileError(f"{path}: not a gpumarket bench file (no 'metrics' list)")
    if data.get("schema") != SCHEMA:
        raise BenchFileError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    seen: set[str] = set()
    for i, m in enumerate(data["metrics"]):
        problem = _metric_problem(m)
        if problem:
            raise BenchFileError(f"{path}: metric #{i}: {problem}")
        if m["name"] in seen:
            raise BenchFileError(f"{path}: metric {m['name']!r} appears twice")
        seen.add(m["name"])
    return data


def _metric_problem(m: Any) -> str | None:
    if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
        return "needs a non-empty string 'name'"
    value = m.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"{m['name']!r}: 'value' must be a finite number, got {value!r}"
    if m.get("direction") not in ("higher", "lower"):
        return f"{m['name']!r}: 'direction' must be 'higher' or 'lower', got {m.get('direction')!r}"
    noise = m.get("noise", 0.0)
    if isinstance(noise, bool) or not isinstance(noise, int | float) or not noise >= 0:
        return f"{m['name']!r}: 'noise' must be a number >= 0, got {noise!r}"
    return None


@dataclass
class Comparison:
    rows: list[dict[str, Any]]  # name, unit, direction, old, new, change, status
    only_old: list[str]
    only_new: list[str]
    threshold: float

    @property
    def regressions(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] == "regression"]


def classify(old: float, new: float, direction: str, threshold: float,
             noise: float = 0.0) -> tuple[float | None, str]:
    """Relative change (new - old) / |old| and a status: ``regression`` when it moved more than
    ``threshold`` in the bad direction, ``improved`` when as much in the good one, else ``ok``;
    always ``ok`` when the absolute change is within ``noise``."""
    if old == 0:
        return None, "ok" if new == 0 else "n/a"  # no relative change from zero
    change = (new - old) / abs(old)
    if abs(new - old) <= noise:
        return change, "ok"
    worse = -change if direction == "higher" else change
    if worse > threshold:
        return change, "regression"
    if -worse > threshold:
        return change, "improved"
    return change, "ok"


def compare_reports(old: dict[str, Any], new: dict[str, Any],
                    threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """Metric by metric, in the new report's order. The direction is the new file's. Values whose
    ``context`` differs (another LLM server, other fit sizes) are ``not comparable``."""
    olds = {m["name"]: m for m in old["metrics"]}
    news = {m["name"]: m for m in new["metrics"]}
    rows = []
    for name, m in news.items():
        if name not in olds:
            continue
        o = olds[name]
        if o.get("direction") != m["direction"]:
            raise BenchFileError(f"metric {name!r}: direction {o.get('direction')!r} in the old "
                                 f"file but {m['direction']!r} in the new one")
        if o.get("context") != m.get("context"):
            change, status = None, "not comparable"
        else:
            noise = max(float(o.get("noise", 0.0)), float(m.get("noise", 0.0)))
            change, status = classify(o["value"], m["value"], m["direction"], threshold, noise)
        rows.append({"name": name, "unit": m.get("unit", ""), "direction": m["direction"],
                     "old": o["value"], "new": m["value"], "change": change, "status": status})
    if not rows:
        raise BenchFileError("the two files share no metric")
    return Comparison(rows, [n for n in olds if n not in news], [n for n in news if n not in olds],
                      threshold)


# ------------------------------------------------------------------------------------- output


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:,.2f}"


def print_report(report: dict[str, Any], console: Any = None) -> None:
    """Every metric grouped by section, then the skipped sections and the targets."""
    from rich.table import Table

    console = console or _console()
    notes = {
        "steps": "scripted agents in every seat, one process, one env reused",
        "episodes": "run_scenario, local process pool, transcripts off; pool start-up included",
        "ray": "run_scenario(backend='ray') on a private local Ray instance, after a warm-up run",
        "clearing": "median ms of clear() per call; exponent = slope of log(time) on log(n)",
        "memory": "per live reset env, fresh interpreter (RSS growth; tracemalloc bytes held)",
        "transcript": "steps/s without / with a transcript file per episode; digest_N = digests "
                      "every N steps",
        "llm": _llm_note(report["details"].get("llm")),
    }
    for section in report["options"]["sections"]:
        metrics = [m for m in report["metrics"] if m["section"] == section]
        if not metrics:
            continue
        table = Table(title=f"{section}: {notes[section]}", title_justify="left")
        table.add_column("metric", no_wrap=True, min_width=max(len(m["name"]) for m in metrics))
        for col in ("value", "unit", "better"):
            table.add_column(col, justify="right")
        for m in metrics:
            table.add_row(m["name"], _fmt(m["value"]), m["unit"], m["direction"])
        console.print(table)
    clearing = report["details"].get("clearing")
    if clearing:
        console.print(f"n log n reference exponent over n in {clearing['fit_sizes']}: "
                      f"{clearing['nlogn_exponent']:.3f}")
    for row in (report["details"].get("llm") or {}).get("rows", []):
        if row["fallbacks"] or row["backend_errors"]:
            console.print(f"[yellow]llm at concurrency {row['concurrency']}: {row['fallbacks']} "
                          f"fallback(s), {row['backend_errors']} backend error(s)[/yellow]")
    for section, reason in report["skipped"].items():
        console.print(f"[yellow]skipped {section}[/yellow]: {reason}")
    for t in report["targets"]:
        mark = "[green]OK[/green]" if t["ok"] else "[red]MISSED[/red]"
        console.print(f"target {t['target']}: {_fmt(t['value'])} {mark}")
    load = report["machine"].get("load_average")
    if load and load[0] > 0.5 * report["machine"]["cores"]:
        console.print(f"[yellow]the machine was busy (load average {load[0]:g} on "
                      f"{report['machine']['cores']} cores at the start): the figures understate "
                      "an idle machine[/yellow]")
    if report["options"].get("quick"):
        console.print("[yellow]--quick: tiny budgets, the figures are smoke checks only[/yellow]")


def _console() -> Any:
    """A rich console; when the output is not a terminal (a file, CI) it is 120 columns wide
    rather than rich's 80, so that metric names are not cut."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=120)


def _llm_note(details: dict[str, Any] | None) -> str:
    if not details:
        return "LLM decisions/s"
    if details["server"] == "fake":
        return (f"fake OpenAI-compatible server, fixed {details['latency_ms']:g} ms latency: "
                "measures the client stack, not a model")
    return f"server {details['server']}, model {details['model']}"


def print_comparison(cmp: Comparison, old_label: str, new_label: str, console: Any = None) -> None:
    from rich.table import Table

    console = console or _console()
    table = Table(title=f"{old_label} -> {new_label} (flag: > {cmp.threshold:.0%} worse)",
                  title_justify="left")
    table.add_column("metric", no_wrap=True, min_width=max(len(r["name"]) for r in cmp.rows))
    for col in ("unit", "better", "old", "new", "change", "status"):
        table.add_column(col, justify="left" if col == "status" else "right")
    colours = {"regression": "red", "improved": "green"}
    for r in cmp.rows:
        change = "" if r["change"] is None else f"{r['change']:+.1%}"
        status = r["status"]
        if status in colours:
            status = f"[{colours[status]}]{status}[/{colours[status]}]"
        table.add_row(r["name"], r["unit"], r["direction"], _fmt(r["old"]), _fmt(r["new"]),
                      change, status)
    console.print(table)
    if cmp.only_old:
        console.print(f"only in {old_label} ({len(cmp.only_old)}): {', '.join(cmp.only_old)}")
    if cmp.only_new:
        console.print(f"only in {new_label} ({len(cmp.only_new)}): {', '.join(cmp.only_new)}")
    bad = cmp.regressions
    if bad:
        console.print(f"[red]{len(bad)} regression(s) > {cmp.threshold:.0%}[/red]: "
                      + ", ".join(r["name"] for r in bad))
    else:
        console.print(f"no regression > {cmp.threshold:.0%}")


# ---------------------------------------------------------------------------------------- cli


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    config = BenchConfig(seconds=args.seconds, scenarios=tuple(args.scenario or ()),
                         llm_base_url=args.llm_base_url, llm_model=args.llm_model)
    if args.quick:
        config = quick_config(config)
        if args.seconds != 2.0:  # an explicit --seconds wins over the quick budget
            config = replace(config, seconds=args.seconds)
    elif args.llm_base_url:  # a real model answers in ~0.1-1 s, not 50 ms: fewer decisions
        config = replace(config, llm_decisions_per_slot=4)
    if args.llm_latency_ms is not None:
        config = replace(config, llm_latency_ms=args.llm_latency_ms)
    return config


def bench_command(args: argparse.Namespace) -> int:
    """``gpumarket bench``: run (unless two files are compared), print, write, compare.

    Exit codes: 0 fine, 1 a regression was flagged, 2 a bad file or option.
    """
    compare = list(args.compare or [])
    if len(compare) > 2:
        return _fail("--compare takes OLD.json, or OLD.json NEW.json")
    if not 0 < args.threshold < 10:
        return _fail(f"--threshold {args.threshold}: give a fraction such as 0.2 (20%)")
    if args.json and not args.json.parent.is_dir() and str(args.json.parent) not in ("", "."):
        return _fail(f"--json {args.json}: folder {args.json.parent} does not exist")
    try:
        old = load_report(Path(compare[0])) if compare else None
        if len(compare) == 2:
            new, new_label = load_report(Path(compare[1])), compare[1]
        else:
            new = run_suite(config_from_args(args), args.only or SECTIONS,
                            log=lambda text: print(text, file=sys.stderr))
            print_report(new)
            new_label = str(args.json) if args.json else "this run"
            if args.json:
                args.json.write_text(json.dumps(new, indent=1, default=str) + "\n")
                print(f"wrote {args.json}")
        if old is None:
            return 0
        cmp = compare_reports(old, new, args.threshold)
    except BenchFileError as exc:
        return _fail(str(exc))
    print_comparison(cmp, compare[0], new_label)
    return 1 if cmp.regressions else 0


def _fail(message: str) -> int:
    print(f"gpumarket bench: {message}", file=sys.stderr)
    return 2
