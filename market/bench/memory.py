"""The ``memory`` section of the bench suite: RSS and traced Python/numpy memory per live, reset
env, measured in a fresh interpreter."""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from typing import Any, cast

from market.bench.config import BenchConfig, SectionResult, metric, run_in_subprocess
from market.environment.aec import raw_env

try:
    import resource
except ImportError:  # Windows has none; read only where /proc is missing
    resource = None  # type: ignore[assignment]


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def env_memory(scenario: str, count: int) -> dict[str, float]:
    """Memory per live, reset env of ``scenario``, in KiB, measured two ways in this process.

    After a warm-up env (imports, caches), ``count`` envs are built and reset (seeds 1..count)
    and kept alive: ``rss_kib`` is the RSS growth / count, ``traced_kib`` (a second batch under
    ``tracemalloc``, which traces numpy buffers too) the traced bytes still held / count. RSS
    includes allocator slack, tracemalloc only live Python and numpy allocations.
    """
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
    env = raw_env(scenario)
    env.reset(seed=seed)
    return env


def env_memory_in_subprocess(scenario: str, count: int) -> dict[str, float]:
    """:func:`env_memory` in a fresh interpreter, so memory freed by earlier sections (which the
    allocator reuses without growing RSS) cannot hide the envs' footprint."""
    return cast(dict[str, float], run_in_subprocess(__name__, "env_memory", scenario, count))


def section_memory(config: BenchConfig) -> SectionResult:
    result = SectionResult(details={"rows": []})
    for scenario, count in config.memory_envs:
        row = env_memory_in_subprocess(scenario, count)
        result.details["rows"].append({"scenario": scenario, "envs": count, **row})
        result.metrics.append(
            metric(f"memory.{scenario}.rss_kib_per_env", row["rss_kib"], "KiB", "lower", "memory")
        )
        result.metrics.append(
            metric(
                f"memory.{scenario}.traced_kib_per_env", row["traced_kib"], "KiB", "lower", "memory"
            )
        )
    return result
