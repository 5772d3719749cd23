"""Delivery risk in play (slow): breaches and pledge defaults happen in ``coalition_market`` and
``shock_storm`` (with each scenario's own seats too), selling forward everything one does not own loses money against ``rule_expert``,
and the expert's hedging is worth more the more owned blocks fail. Seeded, so deterministic;
the figures are printed (``pytest -s``) for the issue's closing note."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support import run_episode

import market
from agents.registry import make_agent

LINEUP = ["rule_expert", "short_seller", "truthful", "always_accept"]


def _episode(scenario: str, lineup: list[str], seed: int, **overrides: Any) -> Any:
    env = market.raw_env(scenario, **overrides)
    agents = {
        a: make_agent("fixed" if a == "designer_0" else lineup[i % len(lineup)])
        for i, a in enumerate(a for a in env.possible_agents if a != "designer_0")
    }
    if "designer_0" in env.possible_agents:
        agents["designer_0"] = make_agent("fixed")
    ep = run_episode(env, agents, seed=seed)
    return env, ep


def _ci(d: list[float]) -> tuple[float, float, float]:
    a = np.array(d)
    half = 1.96 * float(a.std(ddof=1)) / math.sqrt(len(a))
    return float(a.mean()), float(a.mean()) - half, float(a.mean()) + half


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["coalition_market", "shock_storm"])
def test_breaches_and_defaults_happen_in_play(scenario: str) -> None:
    """With a short seller in the market, owned blocks fail and forward contracts breach at
    plausible rates (neither never nor always); in coalition_market coalition pledges default."""
    contracts = breaches = failed = pledges = defaults = 0
    for seed in range(40):
        env, _ = _episode(scenario, LINEUP, seed)
        contracts += env.book.next_contract
        for r in env.round_log:
            breaches += len(r["breaches"])
            failed += sum(f["failed"] for f in r["failures"])
            for p in r["pools"]:
                pledges += len(p["pledged"])
                defaults += len(p["defaults"])
        assert env.credit_balance() == pytest.approx(0.0, abs=1e-6)
    breach_rate, default_rate = breaches / max(1, contracts), defaults / max(1, pledges)
    print(
        f"{scenario}: {contracts} contracts, {breaches} breaches ({breach_rate:.2f}), "
        f"{failed} failed blocks, {pledges} pledges, {defaults} defaults ({default_rate:.2f})"
    )
    assert failed > 0 and contracts >= 40
    assert 0.05 <= breach_rate <= 0.95, breach_rate
    assert default_rate <= 1.0
    # rule_expert pledges its spare blocks to block pools (paid the clearing price per block
    # drawn), so pledges and their defaults arise in both scenarios
    assert pledges >= 1 and defaults >= 1


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["coalition_market", "shock_storm"])
def test_own_seats_pledge_for_pay_and_sometimes_default(scenario: str) -> None:
    """With each scenario's own seats (no deliberately bad seat): spare blocks are pledged to
    pools, members that draw them pay their givers the round's clearing price, and at least one
    pledge defaults in 30 episodes (owned blocks fail); credits are conserved."""
    from market.run.rollout import default_seats
    from scenarios import load_scenario

    own = [
        spec
        for seat, spec in default_seats(load_scenario(scenario)).items()
        if seat != "designer_0"
    ]
    pledges = defaults = episodes_with_default = paid = 0
    for seed in range(30):
        env, _ = _episode(scenario, own, seed)
        before = defaults
        for r in env.round_log:
            for p in r["pools"]:
                pledges += len(p["pledged"])
                defaults += len(p["defaults"])
                for pay in p["payments"]:
                    assert pay["credits"] <= p["price"] * pay["blocks"] + 1e-9
                    paid += pay["credits"] > 0
        episodes_with_default += defaults > before
        assert env.credit_balance() == pytest.approx(0.0, abs=1e-6)
    print(f"{scenario} own seats: {pledges} pledges, {paid} paid draws, {defaults} defaults")
    assert pledges >= 10 and paid >= 1
    assert episodes_with_default >= 1


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["coalition_market", "shock_storm"])
def test_selling_forward_everything_loses_against_rule_expert(scenario: str) -> None:
    """bidder_0 as ``short_seller`` minus bidder_0 as ``rule_expert``, same seeds and rivals:
    the paired 95% CI of the return difference lies below zero."""
    rivals = ["truthful", "always_accept", "rule_expert"]
    diffs = []
    for seed in range(30):
        short = _episode(scenario, ["short_seller", *rivals], seed)[1].returns["bidder_0"]
        expert = _episode(scenario, ["rule_expert", *rivals], seed)[1].returns["bidder_0"]
        diffs.append(short - expert)
    mean, low, high = _ci(diffs)
    print(f"{scenario}: short_seller - rule_expert = {mean:.3f} [{low:.3f}, {high:.3f}]")
    assert high < 0.0, (mean, low, high)


@pytest.mark.slow
def test_hedging_is_worth_more_when_more_blocks_fail() -> None:
    """``rule_expert`` minus its unhedged self (``hedge=false``: sells forward every spare block
    and buys no cover) in ``coalition_market`` with endowments in every round (so forward sales
    happen): the paired advantage at a 30% owned-block failure rate exceeds the one at 0% and
    its 95% CI lies above zero, and the unhedged seller breaches more."""
    rivals = ["truthful", "always_accept", "rule_expert", "truthful", "always_accept"]
    overrides = {"labs__endowment": [1, 3], "labs__endowment_rounds": 9}
    advantage: dict[float, list[float]] = {}
    breaches: dict[tuple[float, str], int] = {}
    for rate in (0.0, 0.15, 0.3):
        for seed in range(60):
            got = {}
            for spec in ("rule_expert", "rule_expert?hedge=false"):
                env, ep = _episode(
                    "coalition_market",
                    [spec, *rivals],
                    seed,
                    delivery__owned_failure_rate=rate,
                    **overrides,
                )
                got[spec] = ep.returns["bidder_0"]
                breaches[(rate, spec)] = breaches.get((rate, spec), 0) + sum(
                    1 for r in env.round_log for b in r["breaches"] if b["seller"] == "bidder_0"
                )
            advantage.setdefault(rate, []).append(
                got["rule_expert"] - got["rule_expert?hedge=false"]
            )
    low_rate, high_rate = _ci(advantage[0.0]), _ci(advantage[0.3])
    for rate, d in advantage.items():
        mean, low, high = _ci(d)
        print(f"hedging advantage at {rate:.0%}: {mean:.3f} [{low:.3f}, {high:.3f}]")
    print(f"seat-0 breaches: {breaches}")
    assert high_rate[0] > low_rate[0]
    assert high_rate[1] > 0.0  # the paired 95% CI at 30% lies above zero
    assert breaches[(0.3, "rule_expert")] < breaches[(0.3, "rule_expert?hedge=false")]
