"""The ``expert`` bench section: the rule expert's share of the step time, and its target line."""

from __future__ import annotations

import math

from market.bench import config, suite
from market.bench.expert import TARGET_SHARE, expert_episode, expert_share


def test_expert_episode_times_every_live_turn() -> None:
    acts, steps = expert_episode("single_trade", 0)
    assert len(acts) == len(steps) > 0
    assert all(a >= 0 for a in acts) and all(s >= 0 for s in steps)


def test_share_is_act_over_act_plus_step() -> None:
    row = expert_share("single_trade", seconds=0.0)
    assert row["episodes"] == 1 and row["turns"] > 0
    assert math.isclose(row["share"], row["act_s"] / (row["act_s"] + row["step_s"]))
    assert 0.0 < row["share"] < 1.0


def test_suite_reports_the_worst_share_against_the_target() -> None:
    cfg = config.quick_config(config.BenchConfig(scenarios=("single_trade", "market_round_easy")))
    report = suite.run_suite(cfg, ["expert"])
    names = [m["name"] for m in report["metrics"]]
    assert names == ["expert.single_trade.share", "expert.market_round_easy.share"]
    worst = max(m["value"] for m in report["metrics"])
    (target,) = [t for t in report["targets"] if t["target"].startswith("rule_expert")]
    assert target["value"] == worst and target["ok"] == (worst <= TARGET_SHARE)
