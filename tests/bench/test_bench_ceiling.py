"""The episodes section's parallel ceiling: every seed played once, split across the processes
after their warm-up, failures reported instead of waited for; and the section's rows."""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from market.bench import config, suite, throughput


def test_every_seed_is_played_once_across_the_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert multiprocessing.get_start_method() == "fork"  # the patch below reaches the children
    log = tmp_path / "played.log"

    def fake_episode(scenario: str, seed: int) -> None:
        with open(log, "a") as fh:  # one short append per line: lines never interleave
            fh.write(f"{os.getpid()} {scenario} {seed}\n")

    monkeypatch.setattr(throughput, "run_episode", fake_episode)
    seconds = throughput.ceiling_seconds("market_round", 10, 3)
    assert seconds > 0
    lines = [line.split() for line in log.read_text().splitlines()]
    by_pid: dict[str, list[int]] = {}
    for pid, scenario, seed in lines:
        assert scenario == "market_round"
        by_pid.setdefault(pid, []).append(int(seed))
    assert len(by_pid) == 3 and str(os.getpid()) not in by_pid
    # each process: a warm-up episode (its first seed), then seeds i, i + 3, i + 6, ...
    assert sorted(played for played in by_pid.values()) == [
        [0, 0, 3, 6, 9],
        [1, 1, 4, 7],
        [2, 2, 5, 8],
    ]
    assert Counter(int(s) for _, _, s in lines) == Counter([*range(10), 0, 1, 2])


def test_a_failing_process_is_reported_not_waited_for() -> None:
    with pytest.raises(RuntimeError, match="2 of 2 ceiling processes failed"):
        throughput.ceiling_seconds("no_such_scenario", 4, 2, timeout=120)
    with pytest.raises(ValueError, match="processes <= n_seeds"):
        throughput.ceiling_seconds("market_round", 2, 3)


def test_the_episodes_section_sets_the_runner_beside_its_ceiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(throughput, "default_workers", lambda: 2)
    report: dict[str, Any] = suite.run_suite(config.quick_config(), ["episodes"])
    rows = report["details"]["episodes"]["rows"]
    assert [(r["scenario"], r["workers"]) for r in rows] == [
        ("market_round", 1),
        ("market_round", 2),
    ]
    for row in rows:
        assert row["ceiling_episodes_per_s"] > 0
        assert row["share_of_ceiling"] == pytest.approx(
            row["episodes_per_s"] / row["ceiling_episodes_per_s"]
        )
    assert rows[0]["speedup"] == rows[0]["ceiling_speedup"] == 1.0
    assert rows[1]["ceiling_speedup"] == pytest.approx(
        rows[1]["ceiling_episodes_per_s"] / rows[0]["ceiling_episodes_per_s"]
    )
    names = {m["name"] for m in report["metrics"]}
    assert "episodes.market_round.workers_2.ceiling_episodes_per_s" in names
