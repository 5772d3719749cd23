"""DAEDALUS parity: the card's robust mechanism (sent in DAEDALUS units), the uniform-random
designer over DAEDALUS's mechanism space and ``rule_designer`` on the ``daedalus`` family, 30
episodes each (docs/scenarios.md, "DAEDALUS parity"). The measured, significant ordering is kept:
paired 95% CIs (same seeds, same worlds) must lie entirely on one side of 0."""

from __future__ import annotations

from pathlib import Path

import pytest

import market
from agents.registry import make_agent
from market.core.seats import DESIGNER
from market.review.mechanism_comparison import PARITY_CANDIDATES, evaluate_mechanisms

SEEDS = range(30)


def compare(stage: int, out: Path) -> object:
    return evaluate_mechanisms(
        f"daedalus_stage_{stage}",
        SEEDS,
        out,
        workers=2,
        candidates=list(PARITY_CANDIDATES),
        deviations=False,
        progress=False,
    )


def above(report: object, a: str, b: str) -> tuple[float, float]:
    mean, half = report.paired(a, b)  # type: ignore[attr-defined]
    assert mean - half > 0, f"{a} - {b} = {mean:.3f} ± {half:.3f} is not above 0"
    return mean, half


@pytest.mark.slow
def test_ordering_on_the_truthful_stage(tmp_path: Path) -> None:
    # stage 0 (eight truthful bidders): rule_designer > the card's robust mechanism > random
    report = compare(0, tmp_path)
    assert report.failed == {}  # type: ignore[attr-defined]
    assert all(len(report.metrics[m]["composite"]) == 30 for m in PARITY_CANDIDATES)  # type: ignore[attr-defined]
    above(report, "daedalus_robust", "daedalus_random")
    above(report, "rule_designer", "daedalus_robust")


@pytest.mark.slow
def test_ordering_on_the_full_adversarial_stage(tmp_path: Path) -> None:
    # stage 4 (shaders, dropouts, a cartel, exploiters): rule_designer beats both; the card's
    # robust mechanism (no collusion penalty) is no better than random here
    report = compare(4, tmp_path)
    above(report, "rule_designer", "daedalus_robust")
    above(report, "rule_designer", "daedalus_random")
    mean, half = report.paired("daedalus_robust", "daedalus_random")  # type: ignore[attr-defined]
    assert abs(mean) < half  # not distinguishable at 30 episodes


def test_the_random_designer_draws_daedalus_space_in_daedalus_units() -> None:
    env = market.raw_env("daedalus_stage_0", rounds=100)  # 20 design steps
    env.reset(seed=3)
    designer = make_agent("random?space=daedalus")
    designer.reset(seed=env.seat_seed(DESIGNER))
    applied = []
    for agent in env.agent_iter():
        obs, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        if agent != DESIGNER:
            env.step({"action_type": "wait"})
            continue
        act = designer.act(obs)
        assert act.mechanism.units == "daedalus"
        env.step(act)
        info = env.infos[DESIGNER]
        assert "error" not in info and info["result"]["units"] == "daedalus"
        applied.append(env.mechanism)
    assert len(applied) == 20
    assert {m.auction_type for m in applied} == {"first_price", "second_price", "vcg"}
    for m in applied:  # DAEDALUS's ranges, times the value scale of 45 credits
        assert 0.0 <= m.reserve_price <= 0.9 * 45.0
        assert max(m.shill_penalty, m.withdrawal_penalty, m.collusion_penalty) <= 3.0 * 45.0
    assert len({m.reserve_price for m in applied}) == 20  # fresh draws every step
