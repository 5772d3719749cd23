"""Start-up section of the bench suite (``startup``): how long the command line takes to answer.

Each figure is the wall time of one command in a fresh interpreter (``python -m market ARGS``,
its output discarded), the median of ``config.startup_runs`` runs: what a user waits for,
interpreter start included. Measured: ``gpumarket --help`` and ``gpumarket agents``, which must
answer in under :data:`~market.bench.config.TARGET_STARTUP_S` seconds (a command imports only the
modules it needs: docs/running.md, "Start-up"), and the bare interpreter (``python -c pass``), the
floor the other two are read against.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from market.bench.config import BenchConfig, SectionResult, metric

#: label -> the interpreter's arguments
COMMANDS: dict[str, tuple[str, ...]] = {
    "help": ("-m", "market", "--help"),
    "agents": ("-m", "market", "agents"),
    "python": ("-c", "pass"),
}


def time_command(args: tuple[str, ...], runs: int) -> list[float]:
    """Wall seconds of ``runs`` fresh interpreters running ``args`` (after one untimed run that
    warms the file cache and writes any missing bytecode)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, *args]
    subprocess.run(command, capture_output=True, env=env, check=True, timeout=120)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, env=env, check=True, timeout=120)
        times.append(time.perf_counter() - start)
    return times


def section_startup(config: BenchConfig) -> SectionResult:
    """``startup.<help|agents|python>.seconds``: the median wall time of each command."""
    result = SectionResult(details={"runs": config.startup_runs, "rows": []})
    for label, args in COMMANDS.items():
        times = time_command(args, config.startup_runs)
        median = statistics.median(times)
        result.details["rows"].append(
            {"command": label, "median_s": median, "min_s": min(times), "max_s": max(times)}
        )
        result.metrics.append(metric(f"startup.{label}.seconds", median, "s", "lower", "startup"))
    return result


__all__ = ["COMMANDS", "section_startup", "time_command"]
