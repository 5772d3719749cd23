"""Benchmark of transcript recording: how many steps per second episodes run with and without
a transcript (the recording overhead)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from market.run.rollout import run_episode


def steps_per_second(
    scenario: str = "market_round",
    seconds: float = 1.0,
    digest_every: int = 1,
    seats: dict[str, str] | None = None,
) -> dict[str, float]:
    """Measure recording overhead: steps/s of episodes with and without a transcript."""

    def rate(record: bool) -> float:
        steps, start, seed = 0, time.perf_counter(), 0
        with tempfile.TemporaryDirectory() as d:
            while time.perf_counter() - start < seconds:
                res = run_episode(
                    scenario,
                    seed,
                    seats,
                    transcript=Path(d) / f"{seed}.jsonl" if record else None,
                    digest_every=digest_every,
                )
                steps += res.steps
                seed += 1
        return steps / (time.perf_counter() - start)

    rate(False)  # warm up
    plain, recorded = rate(False), rate(True)
    return {
        "plain_steps_per_s": plain,
        "recorded_steps_per_s": recorded,
        "overhead_pct": 100.0 * (plain / recorded - 1.0),
    }
