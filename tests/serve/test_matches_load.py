"""The served-matches load benchmark (``gpumarket bench --only serve``) on a tiny budget: it
plays exactly the decisions it was asked for against the real server, one latency sample per
decision, and the percentiles follow the nearest-rank rule. Figures are not asserted (the
machine is shared); the bench reports them."""

from __future__ import annotations

import math

from market.bench.config import BenchConfig, quick_config
from market.bench.serve import load_test, percentile, section_serve


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert math.isnan(percentile([], 0.5))


def test_the_load_test_plays_the_decisions_it_was_asked_for() -> None:
    # 3 sessions x 17 decisions: a market_round seat has 15 turns, so every session needs a
    # second match
    got = load_test(sessions=3, decisions=17)
    assert got["decisions"] == 51
    assert got["latency_samples"] == 51
    assert 0 < got["latency_p50_ms"] <= got["latency_p99_ms"]
    assert got["decisions_per_s"] > 0


def test_the_serve_section_reports_three_metrics() -> None:
    config = quick_config(BenchConfig())
    assert config.serve_sessions >= 50
    small = type(config)(**{**config.__dict__, "serve_sessions": 2, "serve_decisions": 1})
    result = section_serve(small)
    names = {m["name"]: m for m in result.metrics}
    assert set(names) == {
        "serve_decisions_per_s",
        "serve_step_latency_p50_ms",
        "serve_step_latency_p99_ms",
    }
    assert names["serve_decisions_per_s"]["direction"] == "higher"
    assert result.details["decisions"] == 2
