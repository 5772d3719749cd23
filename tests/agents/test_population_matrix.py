"""``rule_expert`` against the whole scripted population (``market.run.expert_matrix``): the paired
statistics by hand, the cells against episodes played directly, the CLI, bad input, and (slow)
the published matrix: rule_expert ahead of every scripted bidder in every built-in scenario, and
``truthful`` ahead of doing nothing.

Run the slow test with ``-s`` to see the matrix."""

from __future__ import annotations

import csv
import io
import math
import time
from pathlib import Path

import pytest

from market.cli import main as cli
from market.run.expert_matrix import (
    ARENA_TASK_VARIANTS,
    BASELINE,
    DEFAULT_SEEDS,
    DESIGNER_BENCHMARKS,
    ExpertMatrix,
    bidder_scenarios,
    expert_matrix,
    matrix_scenarios,
    population,
)
from market.run.rollout import run_episode
from market.run.runner import RunConfigError
from scenarios import builtin_names


def test_population_is_every_scripted_bidder_but_the_expert() -> None:
    members = population()
    assert "rule_expert" not in members
    assert {
        "idle",
        "truthful",
        "random_valid",
        "always_accept",
        "spam_offers",
        "spam_coalitions",
        "spam_pitches",
        "shader",
        "colluder",
        "dropout",
        "exploiter",
        "greedy_hoarder",
        "no_negotiation",
        "cooperative",
        "selfish",
        "deadline_panicked",
        "deceptive",
        "retaliatory",
        "reciprocal",
        "short_seller",
        "liar",
        "promise_breaker",
    } == set(members)
    assert bidder_scenarios() == builtin_names()  # every built-in scenario has bidder_0
    # the default matrix is every built-in but the DAEDALUS parity family (a designer benchmark
    # with sealed bids only; docs/running.md has rule_expert's measured cells there)
    left_out = {*DESIGNER_BENCHMARKS, *ARENA_TASK_VARIANTS}
    assert left_out <= set(builtin_names())
    assert matrix_scenarios() == [n for n in builtin_names() if n not in left_out]


def test_paired_cells_by_hand() -> None:
    # seed by seed the expert is 1, 2, 3 ahead of a; 0 ahead of b on one seed b failed
    m = ExpertMatrix(
        "x",
        ["a", "b"],
        ["s"],
        "bidder_0",
        [0, 1, 2],
        {
            ("s", "x"): {0: 2.0, 1: 3.0, 2: 4.0},
            ("s", "a"): {0: 1.0, 1: 1.0, 2: 1.0},
            ("s", "b"): {0: 2.0, 1: 3.0},
        },
        {("s", "x"): 0, ("s", "a"): 0, ("s", "b"): 0},
    )
    a, b = m.cells()
    # differences 1, 2, 3: mean 2, sample sd 1, t(0.975, 2 df) = 4.303 -> half-width 4.303/sqrt(3)
    assert (a["n"], a["diff"]) == (3, 2.0)
    assert a["ci95"] == pytest.approx(4.303 / math.sqrt(3))
    assert (a["expert_mean"], a["member_mean"]) == (3.0, 1.0)
    assert (b["n"], b["diff"], b["ci95"]) == (2, 0.0, 0.0)  # only the two common seeds count
    assert [c["member"] for c in m.not_beaten()] == ["a", "b"]  # a's CI reaches below 0
    rows = list(csv.DictReader(io.StringIO(m.csv())))
    assert [r["member"] for r in rows] == ["a", "b"] and float(rows[0]["diff"]) == 2.0
    assert "| s | +2.000 ± 2.484 | +0.000 ± 0.000 |" in m.markdown()
    assert m.baseline() == []  # neither truthful nor idle is a member


def test_cells_are_the_returns_of_episodes_played_directly(tmp_path: Path) -> None:
    m = expert_matrix(
        range(3),
        tmp_path,
        workers=2,
        members=["idle", "truthful"],
        scenarios=["single_trade"],
        progress=False,
    )
    for agent in ("rule_expert", "idle", "truthful"):
        direct = {
            s: run_episode("single_trade", s, {"bidder_0": agent}).returns["bidder_0"]
            for s in range(3)
        }
        assert m.returns[("single_trade", agent)] == direct
        assert m.invalid[("single_trade", agent)] == 0
    base = m.baseline()
    assert [r["scenario"] for r in base] == ["single_trade"] and base[0]["n"] == 3
    assert (tmp_path / "expert_matrix.csv").read_text() == m.csv()
    assert "Baseline: `truthful` minus `idle`" in (tmp_path / "expert_matrix.md").read_text()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"members": ["nosuch"]}, "unknown agent 'nosuch'"),
        ({"members": ["rule_designer"]}, "cannot fill a bidder seat"),
        ({"members": ["rule_expert"]}, "other than the expert"),
        ({"members": ["idle", "idle"]}, "distinct"),
        ({"members": []}, "no members"),
        ({"scenarios": ["single_trade", "single_trade"]}, "listed twice"),
        ({"scenarios": ["no_such_scenario"]}, "no_such_scenario"),
        ({"seat": "bidder_9", "scenarios": ["single_trade"]}, "bidder_9"),
    ],
)
def test_bad_input_is_refused_with_a_reason(kwargs: dict, message: str) -> None:
    with pytest.raises(RunConfigError, match=message):
        expert_matrix(range(2), workers=1, progress=False, **{"members": ["idle"], **kwargs})


def test_cli_expert_matrix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli(
        [
            "eval",
            "--expert-matrix",
            "--seeds",
            "0:3",
            "--scenarios",
            "single_trade",
            "--agents",
            "idle,truthful",
            "--workers",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "rule_expert minus each scripted bidder" in out.out and "cells above 0" in out.out
    assert "truthful minus idle in single_trade" in out.out
    assert (tmp_path / "expert_matrix.md").is_file() and (tmp_path / "expert_matrix.csv").is_file()
    assert cli(["eval", "--expert-matrix", "--mechanisms", "--seeds", "0:2"]) == 2
    assert "give one" in capsys.readouterr().err
    assert cli(["eval", "--expert-matrix", "--agents", "nosuch", "--seeds", "0:2"]) == 2
    assert "unknown agent 'nosuch'" in capsys.readouterr().err


#: cells the expert does not yet beat with 100 seeds (docs/running.md, The expert matrix): with
#: trust-reading seats in market_round, exploiter's cheap bids come within noise of the expert
#: (+0.104 +/- 0.186), and in large_market's single negotiation turn a liar's lies cost it almost
#: nothing (+0.011 +/- 0.030). Known gaps, not passes: any other cell not beaten fails.
KNOWN_GAPS = {("market_round", "exploiter"), ("large_market", "liar")}


@pytest.mark.slow
def test_rule_expert_beats_every_scripted_bidder_in_every_scenario(tmp_path: Path) -> None:
    """The published matrix (``gpumarket eval --expert-matrix``, seeds 0-99): in every built-in
    scenario, rule_expert's return in bidder_0 minus each scripted bidder's, paired on the same
    seeds and opponents, has a 95% CI above 0 (but for :data:`KNOWN_GAPS`); it never makes an
    invalid action; and truthful earns more than doing nothing (idle) in every scenario, CI
    above 0."""
    began = time.perf_counter()
    m = expert_matrix(DEFAULT_SEEDS, tmp_path, workers=2, progress=False)
    print(f"\n{m.markdown()}\nwall time {time.perf_counter() - began:.0f} s")
    assert not m.failed
    assert len(m.seeds) >= 30 and m.scenarios == matrix_scenarios() and m.members == population()
    assert all(m.invalid[(s, "rule_expert")] == 0 for s in m.scenarios)
    cells = m.cells()
    assert len(cells) == len(m.scenarios) * len(m.members)
    assert all(c["n"] == len(m.seeds) for c in cells)
    gaps = {(c["scenario"], c["member"]) for c in m.not_beaten()}
    assert gaps <= KNOWN_GAPS, sorted(gaps - KNOWN_GAPS)
    base = m.baseline()
    assert len(base) == len(m.scenarios) and BASELINE == ("truthful", "idle")
    assert all(r["low"] > 0 for r in base), [r for r in base if not r["low"] > 0]
