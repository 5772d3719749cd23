"""LLM decisions/s through the runner's async path (:mod:`market.run.async_runner`), against an
OpenAI-compatible server or the test double:
``python -m market.bench.async_decisions --spawn-fake --latency-ms 50 --episodes 32 --levels 1 8 32``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from agents.llm.backends.pool import ClientPool
from market.bench.llm import spawn_fake_server
from market.run.runner import run_scenario


def bench_runner(
    base_url: str,
    episodes: int = 32,
    levels: Sequence[int] = (1, 8, 32),
    scenario: str = "market_round",
    seats: Sequence[str] = ("designer_0", "bidder_0"),
    max_in_flight: int = 32,
    model: str = "fake-model",
) -> list[dict[str, Any]]:
    """LLM decisions/s and requests in flight through the runner's async path: ``episodes``
    episodes of ``scenario`` with ``seats`` played by ``llm:openai`` at ``base_url``, at each
    level of episodes in flight. One row per level (a fresh temporary run folder each)."""
    spec = f"llm:openai?model={model}&base_url={base_url}&max_retries=0"
    rows = []
    for level in levels:
        pool = ClientPool(max_in_flight)
        with tempfile.TemporaryDirectory() as out:
            cpu, wall = time.process_time(), time.perf_counter()
            summary = run_scenario(
                scenario,
                range(episodes),
                dict.fromkeys(seats, spec),
                out,
                transcripts=False,
                progress=False,
                llm={"pool": pool, "max_episodes": level},
            )
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        decisions = sum(r["stats"].get("decisions", 0) for r in summary.rows)
        snap = pool.snapshot()
        rows.append(
            {
                "episodes_in_flight": level,
                "episodes": len(summary.played),
                "seconds": round(wall, 2),
                "decisions": int(decisions),
                "decisions_per_s": round(decisions / wall, 1),
                "mean_requests_in_flight": snap["mean_in_flight"],
                "peak_requests_in_flight": snap["peak_in_flight"],
                "driver_cpu_ms_per_decision": round(1000 * cpu / max(1, decisions), 2),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    """``python -m market.bench.async_decisions --spawn-fake --latency-ms 50 --episodes 32 --levels 1 8 32``"""
    parser = argparse.ArgumentParser(
        prog="python -m market.bench.async_decisions",
        description="LLM decisions/s through the runner's async path",
    )
    parser.add_argument("--base-url", help="an OpenAI-compatible server (.../v1)")
    parser.add_argument(
        "--spawn-fake", action="store_true", help="start the test double in a subprocess"
    )
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-in-flight", type=int, default=32)
    args = parser.parse_args(argv)
    if not (args.base_url or args.spawn_fake):
        parser.error("give --base-url or --spawn-fake")
    if args.spawn_fake:
        with spawn_fake_server(args.latency_ms) as url:
            rows = bench_runner(url, args.episodes, args.levels, max_in_flight=args.max_in_flight)
    else:
        rows = bench_runner(
            args.base_url,
            args.episodes,
            args.levels,
            max_in_flight=args.max_in_flight,
            model=args.model,
        )
    print(json.dumps(rows, indent=1))


__all__ = ["bench_runner", "main"]

if __name__ == "__main__":
    main()
