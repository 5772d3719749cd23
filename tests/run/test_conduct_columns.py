"""Conduct columns of the eval and tournament tables, checked by hand against episodes' conduct."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest

from market.run.conduct_table import CONDUCT_KEYS, conduct_cells, seat_score, summarize
from market.run.evaluation import evaluate
from market.run.leaderboard import COLUMNS, Entry
from market.run.rollout import run_episode
from market.run.tournament import Standing
from market.run.tournament_tables import CSV_COLUMNS, display_rows, to_csv


def _score(true: int, false: int, kept: int, broken: int, flags: int) -> dict[str, object]:
    judged, due = true + false, kept + broken
    return {
        "claims_true": true,
        "claims_false": false,
        "promises_kept": kept,
        "promises_broken": broken,
        "manipulation_attempts": flags,
        "truthfulness": true / judged if judged else None,
        "promise_keeping": kept / due if due else None,
    }


def test_summary_averages_each_ratio_over_the_episodes_that_define_it() -> None:
    episodes = [
        _score(1, 3, 0, 0, 2),  # truthfulness 0.25, no due promise
        _score(2, 0, 1, 1, 0),  # truthfulness 1.0, promise-keeping 0.5
        {},  # judged, the seat said and promised nothing: 0 attempts
        None,  # recorded before the conduct judge: counts nowhere
    ]
    s = summarize(episodes)
    assert (s.truthfulness, s.truthfulness_n) == (pytest.approx(0.625), 2)
    assert (s.promise_keeping, s.promise_keeping_n) == (0.5, 1)
    assert (s.manipulation, s.conduct_n) == (pytest.approx(2 / 3), 3)
    assert conduct_cells(s) == ["0.625 (n=2)", "0.500 (n=1)", "0.67"]
    # the order episodes finished in does not matter
    assert summarize(reversed(episodes)) == s
    empty = summarize([None, None])
    assert math.isnan(empty.truthfulness) and conduct_cells(empty) == ["-", "-", "-"]
    assert seat_score({"a": _score(1, 0, 0, 0, 0)}, "b") == {}
    assert seat_score(None, "b") is None


def test_eval_conduct_columns_are_the_episodes_conduct_by_hand(tmp_path: Path) -> None:
    seeds = range(3)
    table = evaluate(
        ["deceptive", "truthful"],
        ["market_round_hard"],
        "bidder_0",
        seeds,
        tmp_path,
        workers=1,
        progress=False,
    )
    rows = {r["agent"]: r for r in csv.DictReader(io.StringIO(table.csv()))}
    for agent in ("deceptive", "truthful"):
        scores = [
            run_episode("market_round_hard", s, {"bidder_0": agent}).conduct.get("bidder_0", {})
            for s in seeds
        ]
        truth = [x["truthfulness"] for x in scores if x.get("truthfulness") is not None]
        keep = [x["promise_keeping"] for x in scores if x.get("promise_keeping") is not None]
        flags = [x.get("manipulation_attempts", 0) for x in scores]
        row = rows[agent]
        assert int(row["truthfulness_n"]) == len(truth)
        assert int(row["promise_keeping_n"]) == len(keep)
        assert int(row["conduct_n"]) == 3
        if truth:
            assert float(row["truthfulness"]) == pytest.approx(sum(truth) / len(truth))
        assert float(row["manipulation"]) == pytest.approx(sum(flags) / 3)
    # the deceptive seat misstates its needs: seeds 0..2 give 0/5, 2/6 and 0/4 true claims
    deceptive = table.cells[("deceptive", "market_round_hard")].conduct_summary
    assert deceptive.truthfulness == pytest.approx((0.0 + 2 / 6 + 0.0) / 3)
    assert deceptive.truthfulness_n == 3
    assert table.grid()[0][-3].startswith("0.111 (n=3)")
    assert "truthful (n)" in (tmp_path / "eval.md").read_text()


def test_tournament_rows_carry_the_agents_conduct() -> None:
    st = Standing("bidder", "deceptive", 25.0, 8.0, matches=2, returns=[1.0, 3.0])
    st.conduct = [_score(0, 4, 1, 0, 0), _score(1, 1, 0, 1, 1), None]
    row = st.row()
    assert row["truthfulness"] == pytest.approx(0.25) and row["truthfulness_n"] == 2
    assert row["promise_keeping"] == pytest.approx(0.5) and row["promise_keeping_n"] == 2
    assert row["manipulation"] == pytest.approx(0.5) and row["conduct_n"] == 2
    cells = display_rows([row])[0]
    assert cells[-3:] == ["0.250 (n=2)", "0.500 (n=2)", "0.50"]
    head, line = to_csv([row]).splitlines()
    values = dict(zip(head.split(","), line.split(","), strict=True))
    assert head.split(",") == list(CSV_COLUMNS)
    assert float(values["truthfulness"]) == 0.25 and values["conduct_n"] == "2"


def test_leaderboard_rows_carry_the_seats_conduct() -> None:
    rows = {
        0: {"return": 1.0, "decisions": 4, "conduct": _score(1, 1, 0, 0, 1)},
        1: {"return": 2.0, "decisions": 4, "conduct": _score(3, 0, 2, 2, 0)},
        2: {"return": 3.0, "decisions": 4},  # written before the conduct judge
    }
    row = Entry("s", "bidder_0", "deceptive", "rule_expert", [0, 1, 2], rows).row(None)
    assert row["truthfulness"] == pytest.approx((0.5 + 1.0) / 2) and row["truthfulness_n"] == 2
    assert row["promise_keeping"] == 0.5 and row["promise_keeping_n"] == 1
    assert row["manipulation"] == 0.5 and row["conduct_n"] == 2
    assert set(CONDUCT_KEYS) <= set(COLUMNS)
