"""``gpumarket bench --peer-arena DIR``: timing the GPU-arena seed's env against ours.

The seed itself is not part of this repository, so these tests use a stand-in package of the
same shape (``gpu_budget_arena`` with ``env``, ``models`` and ``baselines``): an env whose
episodes last a known number of steps and that refuses any action but its expert's, so the
tests can check which policy played and that every step was counted. No timing assertions.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from market.bench import config, peer, suite
from market.cli import main
from market.environment.aec import raw_env
from market.run.rollout import run_episode

STAND_IN_STEPS = {"single_trade": 3, "market_round": 5, "coalition_market": 9}


@pytest.fixture
def forget_seed() -> Iterator[None]:
    """Tests that import the stand-in in this process leave neither it nor its path behind, and
    find no other ``gpu_budget_arena`` already imported (tests/compat_seed holds the real one)."""
    path = list(sys.path)
    _forget_arena()
    yield
    sys.path[:] = path
    _forget_arena()


def _forget_arena() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "gpu_budget_arena"]:
        del sys.modules[name]


def stand_in_seed(root: Path) -> Path:
    """A checkout-shaped folder holding a stand-in ``gpu_budget_arena`` package."""
    package = root / "gpu_budget_arena"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass

            @dataclass
            class ResetConfig:
                task_type: str = "single_trade"
                seed: int = 42

            @dataclass
            class Observation:
                done: bool
                left: int
            """
        )
    )
    (package / "baselines.py").write_text(
        "def rule_based_expert_policy(obs):\n    return 'expert-move'\n"
    )
    (package / "env.py").write_text(
        textwrap.dedent(
            f"""
            from gpu_budget_arena.models import Observation

            LENGTHS = {STAND_IN_STEPS!r}

            class GpuBudgetNegotiationEnv:
                def reset(self, config):
                    self.left = LENGTHS[config.task_type]
                    return Observation(done=False, left=self.left)

                def step(self, action):
                    if action != "expert-move":
                        raise ValueError(f"not the expert's move: {{action!r}}")
                    self.left -= 1
                    return Observation(done=self.left == 0, left=self.left)
            """
        )
    )
    return root


def test_peer_dir_errors_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(peer.PeerArenaError, match="no such folder"):
        peer.check_peer_dir(tmp_path / "absent")
    (tmp_path / "gpu_budget_arena").mkdir()
    (tmp_path / "gpu_budget_arena" / "env.py").write_text("")
    with pytest.raises(peer.PeerArenaError) as err:
        peer.check_peer_dir(tmp_path)
    message = str(err.value)
    assert "gpu_budget_arena/models.py" in message and "gpu_budget_arena/baselines.py" in message
    assert "gpu_budget_arena/env.py" not in message and "\n" not in message


def test_peer_dir_accepts_the_checkout_or_its_package_folder(tmp_path: Path) -> None:
    root = stand_in_seed(tmp_path / "seed")
    assert peer.check_peer_dir(root) == root.resolve()
    assert peer.check_peer_dir(root / "gpu_budget_arena") == root.resolve()


def test_seed_player_plays_the_expert_and_counts_every_step(
    tmp_path: Path, forget_seed: None
) -> None:
    root = stand_in_seed(tmp_path / "seed")
    sys.path.insert(0, str(root))
    for task, length in STAND_IN_STEPS.items():
        play = peer.seed_player(task)
        assert play(0) == length
        episodes, steps, cpu = peer.cpu_rate(play, 0.0, seed=1)
        assert (episodes, steps) == (1, length)  # a zero budget still plays one episode
        assert cpu >= 0


def test_our_lineups_seats() -> None:
    seats = raw_env("market_round").possible_agents
    assert peer.lineup_seats(seats, "default") is None
    experts = peer.lineup_seats(seats, "rule_expert")
    assert experts == {s: "rule_expert" for s in seats if s != "designer_0"}
    assert len(experts) == len(seats) - 1
    with pytest.raises(ValueError, match="unknown line-up"):
        peer.lineup_seats(seats, "spam")


def test_our_player_plays_the_lineup() -> None:
    expert = peer.our_player("single_trade", "rule_expert")
    seats = peer.lineup_seats(raw_env("single_trade").possible_agents, "rule_expert")
    assert expert(3) == run_episode("single_trade", 3, seats).steps
    assert peer.our_player("single_trade", "default")(0) == run_episode("single_trade", 0).steps


def test_peer_rates_ratios_are_ours_over_the_seeds(tmp_path: Path, forget_seed: None) -> None:
    root = stand_in_seed(tmp_path / "seed")
    found = peer.peer_rates(str(root), seconds=0.03, passes=2)
    assert set(found["tasks"]) == set(peer.TASKS) and found["passes"] == 2
    for row in found["tasks"].values():
        for lineup in peer.LINEUPS:
            assert len(row[f"{lineup}_passes"]) == 2 and row[lineup] > 0
            lo, hi = sorted(row[f"{lineup}_passes"])
            assert row[lineup] == pytest.approx((lo + hi) / 2)  # the median of two passes
        assert row["default_ratio"] == pytest.approx(row["default"] / row["seed_expert"])
        assert row["rule_expert_ratio"] == pytest.approx(row["rule_expert"] / row["seed_expert"])


def test_peer_targets_check_each_ratio_at_its_bound() -> None:
    rows = {
        "market_round": {"default_ratio": 5.0, "rule_expert_ratio": 2.99},
        "single_trade": {"default_ratio": 2.9, "rule_expert_ratio": 3.0},
        "coalition_market": {"default_ratio": 9.0, "rule_expert_ratio": 3.5},
    }
    found = {
        t["target"].split(" (")[0] + ("/expert" if "rule_expert" in t["target"] else ""): t["ok"]
        for t in peer.peer_targets({"tasks": rows})
    }
    assert found == {
        "market_round": True,  # exactly 5x
        "single_trade": False,  # 2.9 < 3
        "single_trade/expert": True,
        "market_round/expert": False,
        "coalition_market/expert": True,
    }


def test_section_runs_in_a_subprocess_and_reports_targets(tmp_path: Path) -> None:
    root = stand_in_seed(tmp_path / "seed")
    cfg = config.BenchConfig(seconds=0.03, peer_arena=root)
    report = suite.run_suite(cfg, ["peer"])
    assert report["skipped"] == {}
    names = {m["name"] for m in report["metrics"]}
    for task in peer.TASKS:
        assert f"peer.{task}.seed_expert.steps_per_cpu_s" in names
        assert f"peer.{task}.default.ratio" in names
    assert sum("seed's expert" in t["target"] for t in report["targets"]) == 5
    assert report["details"]["peer"]["peer_dir"] == str(root.resolve())
    assert "gpu_budget_arena" not in sys.modules  # the seed ran in the subprocess only


def test_peer_only_with_a_checkout(tmp_path: Path) -> None:
    assert "peer" not in suite.default_sections(peer=False)
    assert suite.default_sections(peer=True)[-1] == "peer"
    report = suite.run_suite(config.BenchConfig(), ["peer"])
    assert "--peer-arena" in report["skipped"]["peer"]


def test_cli_rejects_a_folder_that_is_not_the_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--only", "peer", "--peer-arena", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a checkout of the GPU-arena seed" in err and "Traceback" not in err
