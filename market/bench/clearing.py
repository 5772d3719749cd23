"""The ``clearing`` section of the bench suite: ``clear()`` time against the number of bidders
per auction type, its growth exponent next to the n log n reference, and the env's whole
clearing step."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from agents.scripted import truthful_bid
from market.bench.config import (
    CLEARING_NOISE_MS,
    STEADY_ALLOCATOR,
    BenchConfig,
    SectionResult,
    metric,
    run_in_subprocess,
)
from market.core.mechanisms import AUCTION_TYPES, clear
from market.core.seats import bidder_seat
from market.environment.aec import raw_env


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


def bench_env_clearing(
    n_labs: int = 1000, blocks: int = 10_000, repeats: int = 9
) -> dict[str, float]:
    """Wall time of the env step that clears a round (auction, settlement, execution, rewards)
    in a market of ``n_labs`` truthful bidders and ``blocks`` blocks. Median over ``repeats``.
    As ``timeit`` does, the cyclic garbage collector is paused during the timed step (after a
    collection), so a collection of the set-up's garbage is not billed to the step.

    What the process held before (modules, earlier benchmarks' objects) is frozen out of those
    collections (:func:`gc.freeze`, undone at the end): a full collection walks every object,
    and run just before the step it left the caches cold, which made the step up to a third
    slower than in a process that had just started (see docs/benchmarks.md)."""
    samples = []
    frozen_before = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    try:
        for rep in range(repeats):
            samples.append(_time_clearing_step(n_labs, blocks, rep))
    finally:
        if not frozen_before:  # leave a caller's own frozen objects frozen
            gc.unfreeze()
    return {"median_ms": statistics.median(samples), "min_ms": min(samples)}


def _time_clearing_step(n_labs: int, blocks: int, rep: int) -> float:
    """Milliseconds of the step that clears the first round of a fresh env (seed ``rep``)."""
    env = raw_env(
        "market_round",
        rounds=2,
        negotiation_turns=0,
        designer_seat=False,
        labs={"count": n_labs, "jobs": [2, 4], "endowment": [0, 0]},
        jobs={"size": [4, 12]},
        capacity={"blocks": [blocks, blocks]},
        shocks=[],
        shock_rates={},
    )
    env.reset(seed=rep)
    while env.agent_selection != bidder_seat(n_labs - 1):  # bid for everyone but the last lab
        env.step(truthful_bid(env.observe(env.agent_selection)))
    last = truthful_bid(env.observe(env.agent_selection))
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        env.step(last)
        return (time.perf_counter() - start) * 1e3
    finally:
        gc.enable()


def random_market(n: int, units_per_bidder: int, seed: int = 0) -> tuple[Any, Any]:
    """The bid matrix and priorities of ``market.core.mechanisms.bench_clearing``: each of ``n``
    bidders wants between half and all of ``units_per_bidder`` blocks, with sorted
    ``Uniform[0, 100)`` marginal bids padded with -1; priorities are a random permutation."""
    rng = np.random.default_rng(seed)
    m = max(int(units_per_bidder), 1)
    values = -np.sort(-rng.uniform(0.0, 100.0, size=(n, m)), axis=1)
    wanted = rng.integers((m + 1) // 2, m + 1, size=n)
    bids = np.where(np.arange(m)[None, :] < wanted[:, None], values, -1.0)
    return bids, rng.permutation(n)


def time_clearing(
    sizes: Sequence[int], blocks_per_bidder: int, units_per_bidder: int, repeats: int
) -> dict[int, dict[str, dict[str, float]]]:
    """Milliseconds of one ``clear()`` call per (size, auction type): median and min of
    ``repeats``. The repeats are interleaved (every size and type once per pass) so that load
    from other processes, which comes and goes, hits all sizes alike instead of bending the
    growth curve. The reserve is 10, so demand exceeds capacity and posted_price rations.
    :func:`section_clearing` runs it in a fresh interpreter with :data:`STEADY_ALLOCATOR`."""
    markets = {n: random_market(n, units_per_bidder) for n in sizes}
    lottery = np.random.default_rng(1)
    samples: dict[tuple[int, str], list[float]] = {(n, a): [] for n in sizes for a in AUCTION_TYPES}
    for _ in range(max(1, repeats)):
        for n, (bids, priority) in markets.items():
            for auction in AUCTION_TYPES:
                start = time.perf_counter()
                clear(bids, blocks_per_bidder * n, auction, 10.0, priority, lottery)
                samples[n, auction].append((time.perf_counter() - start) * 1e3)
    return {
        n: {
            a: {"median": statistics.median(samples[n, a]), "min": min(samples[n, a])}
            for a in AUCTION_TYPES
        }
        for n in sizes
    }


def section_clearing(config: BenchConfig) -> SectionResult:
    """``clear()`` against market size (see :func:`time_clearing`), the growth exponent of the
    median times over the larger sizes per auction type, and the env's whole clearing step."""
    sizes = list(config.clearing_sizes)
    raw = run_in_subprocess(
        __name__,
        "time_clearing",
        sizes,
        config.blocks_per_bidder,
        config.units_per_bidder,
        config.clearing_repeats,
        env=STEADY_ALLOCATOR,
    )
    timed = {int(n): row for n, row in raw.items()}  # JSON made the sizes strings
    fit = [n for n in sizes if n >= config.clearing_fit_min]
    context = {
        "fit_sizes": fit,
        "allocator": "steady",
        "blocks_per_bidder": config.blocks_per_bidder,
        "units_per_bidder": config.units_per_bidder,
    }
    result = SectionResult(
        details={
            "sizes": sizes,
            "fit_sizes": fit,
            "repeats": config.clearing_repeats,
            "ms": {n: {a: t["median"] for a, t in row.items()} for n, row in timed.items()},
            "min_ms": {n: {a: t["min"] for a, t in row.items()} for n, row in timed.items()},
            "nlogn_exponent": nlogn_exponent(fit),
            "exponents": {},
            "exponents_of_min": {},
            "allocator": STEADY_ALLOCATOR,
        }
    )
    for auction in AUCTION_TYPES:
        for n in sizes:
            result.metrics.append(
                metric(
                    f"clearing.{auction}.n{n}.ms",
                    timed[n][auction]["median"],
                    "ms",
                    "lower",
                    "clearing",
                    {"blocks": config.blocks_per_bidder * n, "allocator": "steady"},
                    noise=CLEARING_NOISE_MS,
                )
            )
        slope = growth_exponent(fit, [timed[n][auction]["median"] for n in fit])
        result.details["exponents"][auction] = slope
        # the same fit on the fastest repeat: closer to the idle machine when others load it
        result.details["exponents_of_min"][auction] = growth_exponent(
            fit, [timed[n][auction]["min"] for n in fit]
        )
        result.metrics.append(
            metric(f"clearing.{auction}.exponent", slope, "", "lower", "clearing", context)
        )
    labs = config.env_clearing_labs
    env_step = bench_env_clearing(labs, config.blocks_per_bidder * labs)
    result.details["env_step"] = {
        "labs": labs,
        "blocks": config.blocks_per_bidder * labs,
        **env_step,
    }
    result.metrics.append(
        metric(
            f"clearing.env_step.n{labs}.ms",
            env_step["median_ms"],
            "ms",
            "lower",
            "clearing",
            {"blocks": config.blocks_per_bidder * labs},
        )
    )
    return result
