"""The scripting API re-exported by ``market`` (docs/running.md, "Scripting API"), and the old
module paths that keep importing, with a DeprecationWarning, for one release."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

import market
from market.core.mechanisms import clear
from market.review.mechanism_comparison import evaluate_mechanisms
from market.review.replay import replay
from market.run.evaluation import evaluate
from market.run.rollout import run_episode
from market.run.runner import run_scenario
from market.run.tournament import run_tournament

API = {
    "run_episode": run_episode,
    "run_scenario": run_scenario,
    "evaluate": evaluate,
    "compare_mechanisms": evaluate_mechanisms,
    "run_tournament": run_tournament,
    "replay": replay,
    "clear": clear,
}


def test_every_scripting_name_is_exported_and_is_the_real_function() -> None:
    for name, fn in API.items():
        assert name in market.__all__
        assert getattr(market, name) is fn, name
    for name in ("env", "raw_env", "parallel_env", "__version__", "TournamentConfig"):
        assert name in market.__all__ and hasattr(market, name)


def test_a_two_seed_run_through_the_package_replays(tmp_path: Path) -> None:
    summary = market.run_scenario(
        "single_trade",
        range(2),
        {"bidder_0": "truthful"},
        tmp_path / "run",
        workers=1,
        progress=False,
    )
    assert summary.complete and summary.episodes == [0, 1]
    direct = market.run_episode("single_trade", 1, {"bidder_0": "truthful"})
    assert summary.returns("bidder_0")[1] == direct.returns["bidder_0"]
    for seed in (0, 1):
        assert market.replay(tmp_path / "run" / "transcripts" / f"{seed}.jsonl").ok


def test_clear_through_the_package() -> None:
    bids = np.array([[10.0, 8.0], [9.0, 3.0], [7.0, -1.0]])
    c = market.clear(bids, 3, "vcg", 0.0, np.arange(3), np.random.default_rng(0))
    np.testing.assert_allclose(c.payments, [10.0, 7.0, 0.0])


def test_evaluate_and_compare_mechanisms_through_the_package(tmp_path: Path) -> None:
    table = market.evaluate(
        ["truthful", "random_valid"],
        ["single_trade"],
        "bidder_0",
        range(2),
        tmp_path / "eval",
        workers=1,
        progress=False,
    )
    assert {r["agent"] for r in table.rows()} == {"truthful", "random_valid"}
    report = market.compare_mechanisms(
        "single_trade",
        range(2),
        tmp_path / "mech",
        workers=1,
        candidates=["robust", "first_price"],
        deviations=False,
        progress=False,
    )
    assert report.mechanisms == ["robust", "first_price"]
    result = market.run_tournament(
        market.TournamentConfig("single_trade", bidders=("truthful", "random_valid"), seeds=(0,)),
        tmp_path / "tournament",
    )
    assert result.complete


# the flat layout's module paths (0.1.0), removed: each name lives in a room and in ``market``
REMOVED = (
    "market.rollout",
    "market.mechanisms",
    "market.runner",
    "market.tournament",
    "market.replay",
    "market.world",
    "market.rl_train",
    "agents.backends",
    "agents.cache",
)


@pytest.mark.parametrize("path", REMOVED)
def test_the_flat_layouts_module_paths_are_gone(path: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(path)
