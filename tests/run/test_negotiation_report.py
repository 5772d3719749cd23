"""The negotiation report's figures against hand computations, and the talk-off twin.

The twin (agents/talk_off.py) must never talk and must bid as its agent does; the first-best
welfare, the round-log counts and the paired CI are checked on cases small enough to work out
by hand; a two-lab scenario whose welfare is known in closed form checks the whole report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agents.registry import AgentSpecError, make_agent
from agents.spec_policy import SpecPolicy, SpecRefused
from agents.talk_off import TalkOffAgent, inner_spec
from market.review.negotiation_report import (
    first_best,
    negotiation_report,
    paired,
    round_counts,
)
from market.run.rollout import run_episode

# two labs, two rounds, one block a round, one 2-block job each at 20 credits a block with
# partial credit, deadline round 1, no failures: every block sold creates exactly 20 credits
TINY = """
description = "two labs, one block a round"
rounds = 2
negotiation_turns = 1
designer_seat = false

[labs]
count = 2
budget = [100.0, 100.0]
jobs = [1, 1]
endowment = [0, 0]

[jobs]
size = [2, 2]
value_per_block = [20.0, 20.0]
slack = [1, 1]
partial_credit_prob = 1.0
min_reliability = [0.0, 0.0]
arrival_rate = 0.0

[capacity]
blocks = [1, 1]
reliability = 1.0

[mechanism]
auction_type = "second_price"
reserve_price = 5.0

[agents]
bidders = ["truthful"]
"""


def test_first_best_moves_a_block_to_serve_a_better_job() -> None:
    # supply one block in rounds 0 and 1. B (30/block, 1 block, rounds 0-1) is served first and
    # takes round 0; C (20/block, round 0 only) is served only by moving B's block to round 1;
    # A (5/block, 3 blocks, rounds 0-1) then finds no block: 30 + 20 = 50 credits
    jobs = [(5.0, 3, 0, 1), (30.0, 1, 0, 1), (20.0, 1, 0, 0)]
    assert first_best(jobs, [1, 1]) == pytest.approx(50.0)
    assert first_best(jobs, [1, 1], unit=100.0) == pytest.approx(0.5)
    # a third block (round 1) goes to A: 55; blocks never go to a round outside a job's window
    assert first_best(jobs, [1, 2]) == pytest.approx(55.0)
    assert first_best([(10.0, 2, 1, 1)], [5, 0]) == 0.0


def test_paired_ci_is_the_student_t_interval_of_the_differences() -> None:
    # differences 1 and 3: mean 2, sd sqrt(2), half-width t(1) x sd / sqrt(2) = 12.706
    mean, half, n = paired({0: 1.0, 1: 3.0, 7: 9.0}, {0: 0.0, 1: 0.0})
    assert (mean, n) == (2.0, 2)
    assert half == pytest.approx(12.706)


def test_round_counts_read_breaches_defaults_cascades_and_grants() -> None:
    rounds = [
        {
            "breaches": [{"seller": "bidder_1"}, {"seller": "bidder_0"}],
            "pools": [{"defaults": {"bidder_2": 1}, "cut": {"bidder_1": 2, "bidder_3": 1}}],
            "judge": [{"lab": "bidder_0", "granted": 2}, {"lab": "bidder_1", "granted": 1}],
            "won": {"bidder_0": 3},
            "paid": {"bidder_0": 30.0},
        },
        {
            "breaches": [],
            "pools": [],
            "judge": [],
            "won": {"bidder_0": 1},
            "paid": {"bidder_0": 12.0},
        },
    ]
    got = round_counts(rounds)
    # bidder_1 was cut by the pool and breached its own sale in that round: one cascade
    assert got == {
        "breaches": 2,
        "breached": 1,
        "defaults": 1,
        "cuts": 2,
        "cascades": 1,
        "granted": 2,
        "won": 4,
        "paid": 42.0,
    }


def test_the_talk_off_twin_is_a_spec_of_any_agent() -> None:
    twin = make_agent("talk_off:rule_expert?hedge=false", "bidder")
    assert isinstance(twin, TalkOffAgent)
    assert twin.inner.hedge is False and twin.roles == frozenset({"bidder"})
    assert inner_spec("talk_off:liar") == "liar" and inner_spec("liar") is None
    with pytest.raises(AgentSpecError, match="write talk_off:SPEC"):
        make_agent("talk_off:", "bidder")
    with pytest.raises(AgentSpecError, match="cannot fill a bidder seat"):
        make_agent("talk_off:fixed", "bidder")
    # a server allows the twin exactly when it allows the inner spec
    SpecPolicy().check("talk_off:rule_expert?hedge=false")
    with pytest.raises(SpecRefused, match="imports code"):
        SpecPolicy().check("talk_off:py:os:getcwd")
    SpecPolicy.from_lists(["py:os:getcwd"]).check("talk_off:py:os:getcwd")


@pytest.mark.parametrize("agent", ["rule_expert", "liar", "promise_breaker", "deceptive"])
def test_the_talk_off_twin_never_talks(agent: str, tmp_path: Path) -> None:
    for seed in range(3):
        path = tmp_path / f"{agent}-{seed}.jsonl"
        run_episode("coalition_market", seed, {"bidder_0": f"talk_off:{agent}"}, transcript=path)
        steps = [json.loads(line) for line in path.read_text().splitlines()]
        mine = [
            s for s in steps if s.get("type") == "step" and s["seat"] == "bidder_0" and s["live"]
        ]
        talk = [s for s in mine if s["phase"] == "negotiation"]
        assert talk and all(s["action"]["action_type"] == "wait" for s in talk)
        assert any(s["phase"] == "bidding" and s["action"]["action_type"] == "bid" for s in mine)


def test_the_talk_off_twin_bids_as_its_agent() -> None:
    # truthful never negotiates, so its twin plays the same episode, reward for reward
    for seed in range(3):
        a = run_episode("market_round", seed, {"bidder_0": "truthful"})
        b = run_episode("market_round", seed, {"bidder_0": "talk_off:truthful"})
        assert a.returns == b.returns and a.round_log == b.round_log


def test_the_report_on_two_labs_matches_the_hand_computation(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY, encoding="utf-8")
    out = tmp_path / "report"
    report = negotiation_report(out, range(3), scenarios=[scenario], workers=1, progress=False)
    assert not report.failed
    # two blocks, each worth 20 credits to either lab (partial credit, no failures): the first
    # best is 40 credits = 0.4 reward units, and truthful bidders (above the 5-credit reserve)
    # buy and run both blocks, so actual and spot-only welfare are 0.4 too
    for metric, value in (("negotiable", 0.0), ("captured", 0.0), ("left", 0.0)):
        f = report.get("tiny", "welfare", metric)
        assert f is not None and f.n == 3
        assert f.mean == pytest.approx(value, abs=1e-9)
    best = report.get("tiny", "welfare", "negotiable")
    assert best is not None and best.subject_mean == pytest.approx(0.4)
    # nobody trades forward, breaches or defaults here
    for metric in ("forward_contracts", "breaches", "defaults", "cascades"):
        f = report.get("tiny", "rates", metric)
        assert f is not None and f.mean == 0.0
    # the value of talk is rule_expert's return minus its twin's, seed by seed, from the folders
    rows = {}
    for cell in ("rule_expert", "talk_off_rule_expert"):
        folder = next(p for p in (out / "tiny").iterdir() if p.name.startswith(cell))
        for line in (folder / "results.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r["seat"] == "bidder_0":
                rows.setdefault(cell, {})[r["seed"]] = r["return"]
    diffs = [rows["rule_expert"][s] - rows["talk_off_rule_expert"][s] for s in range(3)]
    talk = report.get("tiny", "value_of_talk", "return", "rule_expert")
    assert talk is not None and talk.mean == pytest.approx(math.fsum(diffs) / 3)
    for name in ("negotiation.csv", "negotiation.md", "negotiation.svg"):
        assert (out / name).is_file()
    assert (
        "![" in (out / "negotiation.md").read_text()
        and "<svg" in (out / "negotiation.svg").read_text()
    )
    # resuming plays nothing and gives the same table
    again = negotiation_report(out, range(3), scenarios=[scenario], workers=1, progress=False)
    assert again.csv() == report.csv()
