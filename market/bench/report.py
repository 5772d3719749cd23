"""Benchmark of the run report (:mod:`market.review.report.run_page`): the seconds and megabytes
of ``report.html`` for N synthetic episodes.

The rows are synthetic but shaped like ``market_round``'s (:data:`market.run.runner.ROW_KEYS`:
one designer and three bidder seats, their reward components, health counts, conduct, welfare
ratio), drawn from a seeded generator, so a figure depends only on N and the machine. No
transcript is involved: the report is built from the rows alone, and the sampled episode pages
(at most ``FIRST + 2 * EXTREMES + FLAGGED`` of them, whatever N) are timed by the transcript
figures of the run itself, not here.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from market.bench.config import BenchConfig, SectionResult, metric
from market.core.seats import DESIGNER, bidder_seat
from market.review.report.run_page import build_run_report

#: the report targets of a large run (docs/running.md): 3,000 episodes in at most 5 MB and 2 s
TARGET_EPISODES, TARGET_MB, TARGET_SECONDS = 3000, 5.0, 2.0


def synthetic_rows(episodes: int, seed: int = 0) -> list[dict[str, Any]]:
    """``episodes`` episodes of result rows shaped like a ``market_round`` run's."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    seats = [(DESIGNER, "fixed"), *((bidder_seat(i), "truthful") for i in range(3))]
    for s in range(episodes):
        welfare = float(rng.uniform(0.2, 0.9))
        fell_back = int(rng.random() < 0.01)
        for seat, agent in seats:
            value, paid = float(rng.uniform(0, 4)), float(rng.uniform(-2, 0))
            components = (
                {"composite": welfare / 2}
                if seat == DESIGNER
                else {"job_value": value, "auction_payments": paid}
            )
            rows.append(
                {
                    "scenario": "market_round",
                    "seed": s,
                    "seat": seat,
                    "agent": agent,
                    "return": float(sum(components.values())),
                    "components": components,
                    "invalid_actions": 0,
                    "decisions": 15,
                    "agent_errors": 0,
                    "timeouts": 0,
                    "fallbacks": fell_back if seat != DESIGNER else 0,
                    "repairs": 0,
                    "first_error": "timed out" if fell_back and seat != DESIGNER else None,
                    "conduct": {},
                    "welfare_ratio": welfare,
                    "rounds": 5,
                    "steps": 54,
                }
            )
    return rows


def time_report(episodes: int) -> dict[str, float]:
    """Seconds to build the run report of ``episodes`` synthetic episodes, and its size in MB
    (every 10th episode linked to a page, the others naming the command)."""
    rows = synthetic_rows(episodes)
    pages = {s: f"episodes/{s}.html" for s in range(0, episodes, 10)}
    start = time.perf_counter()
    text = build_run_report(rows, pages, "runs/market_round", set(range(episodes)))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "mb": len(text.encode("utf-8")) / 1e6}


def section_report(config: BenchConfig) -> SectionResult:
    """``report.<N>_episodes.seconds`` and ``.mb`` for each N of ``config.report_episodes``."""
    result = SectionResult(details={})
    for n in config.report_episodes:
        row = time_report(n)
        result.details[str(n)] = row
        result.metrics.append(
            metric(f"report.{n}_episodes.seconds", row["seconds"], "s", "lower", "report")
        )
        result.metrics.append(metric(f"report.{n}_episodes.mb", row["mb"], "MB", "lower", "report"))
    return result


__all__ = ["TARGET_EPISODES", "TARGET_MB", "TARGET_SECONDS", "section_report", "synthetic_rows"]
