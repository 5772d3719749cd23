"""The rule expert's cheaper turns change none of its decisions: a bid built with
:meth:`Bid.trusted` is the validated bid field for field; the plausible share folded in as
results arrive equals the share recomputed from the whole history; skipping delivery rounds
already offered to every rival takes the same actions as checking them again; the memoised
delivery-risk arithmetic equals the plain computation."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agents.population import RuleExpert
from agents.population.delivery_risk import (
    deliverable,
    expected_shortfall,
    survive_at_least,
)
from agents.population.planning import MarketMemory
from agents.registry import make_agent
from market.core.actions import Bid
from market.core.seats import is_bidder_seat
from market.environment import Observation
from market.environment.aec import raw_env

# ------------------------------------------------------------------------------------------
# Bid.trusted
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bids", "coalition"),
    [([], None), ([30.0, 30.0, 12.5], None), ([5, 4, 0], None), ([9.25], "coal_1")],
)
def test_trusted_bid_equals_the_validated_bid(bids: list[float], coalition: str | None) -> None:
    kwargs: dict[str, Any] = {} if coalition is None else {"coalition_id": coalition}
    validated = Bid(bids=bids, **kwargs)
    trusted = Bid.trusted(bids, coalition)
    assert trusted == validated
    assert trusted.model_dump_json() == validated.model_dump_json()
    assert trusted.model_fields_set == validated.model_fields_set
    assert all(type(b) is float for b in trusted.bids)  # ints become floats, as validated


@pytest.mark.parametrize(
    ("bids", "words"),
    [([1.0, 2.0], "non-increasing"), ([-1.0], "between 0 and 1e9"), ([math.nan], "between")],
)
def test_trusted_bid_still_refuses_an_invalid_schedule(bids: list[float], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Bid.trusted(bids)
    with pytest.raises(ValueError, match=words):
        Bid(bids=bids)


def test_trusted_bid_refuses_too_many_units() -> None:
    with pytest.raises(ValueError, match="at most 100000 units"):
        Bid.trusted([1.0] * 100_001)


# ------------------------------------------------------------------------------------------
# The expert's memory and rule 5 over whole episodes
# ------------------------------------------------------------------------------------------


def reference_share(memory: MarketMemory, obs: Observation) -> float:
    """The plausible share recomputed from the whole history (the rule as documented)."""
    share = min(1.0, 1.0 / max(1, len(obs.active_labs)))
    for r, units in memory.bid_units.items():
        won = memory.won.get(r)
        cap = memory.capacities.get(r)
        if won is not None and cap and units > won:
            share = max(share, min(1.0, won / cap))
    return max(share, memory.left_over or 0.0)


class EagerSeller(RuleExpert):
    """The rule expert that checks every delivery round again at every turn (no sold-out
    memory): the reference for the skip."""

    def act(self, obs: Observation) -> Any:
        self.sold_out.clear()
        return super().act(obs)


def play(scenario: str, seed: int, make: Any) -> tuple[list[str], list[float], list[float], int]:
    """Every action of one episode with ``make()`` in every bidder seat, the folded and the
    recomputed share at every expert turn, and how many delivery rounds went sold out."""
    env = raw_env(scenario)
    env.reset(seed=seed)
    agents: dict[str, Any] = {}
    for seat in env.possible_agents:
        agents[seat] = make() if is_bidder_seat(seat) else make_agent("fixed")
        agents[seat].reset(seed=seed)
    actions: list[str] = []
    folded: list[float] = []
    recomputed: list[float] = []
    for seat in env.agent_iter():
        obs, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        agent = agents[seat]
        action = agent.act(obs)
        if isinstance(agent, RuleExpert):
            folded.append(agent.memory.share(obs))
            recomputed.append(reference_share(agent.memory, obs))
        actions.append(f"{seat}: {action.model_dump_json()}")
        env.step(action)
    sold_out = sum(len(a.sold_out) for a in agents.values() if isinstance(a, RuleExpert))
    return actions, folded, recomputed, sold_out


@pytest.mark.parametrize(
    ("scenario", "seed"),
    [("market_round", 1), ("single_trade", 0), ("shock_storm", 2), ("coalition_market", 1)],
)
def test_folded_share_equals_the_recomputed_share(scenario: str, seed: int) -> None:
    _, folded, recomputed, _ = play(scenario, seed, lambda: make_agent("rule_expert"))
    assert len(folded) >= 10
    assert folded == recomputed
    assert len(set(folded)) > 1  # the history moved the share at least once


@pytest.mark.parametrize(
    ("scenario", "seed"),
    [("coalition_market_medium", 2), ("market_round_easy", 4), ("single_trade_easy", 0)],
)
def test_sold_out_skip_takes_the_eager_actions(scenario: str, seed: int) -> None:
    fast, _, _, sold_out = play(scenario, seed, lambda: make_agent("rule_expert"))
    eager, _, _, _ = play(scenario, seed, EagerSeller)
    assert sold_out > 0  # the skip had something to skip
    assert fast == eager
    assert any('"action_type":"send_offer"' in a for a in fast)


def test_memoised_delivery_risk_equals_the_plain_computation() -> None:
    for held in range(0, 9):
        for need in range(0, 10):
            for p in (0.0, 0.05, 0.3, 1.0):
                assert survive_at_least(held, need, p) == survive_at_least.__wrapped__(
                    held, need, p
                )
                assert expected_shortfall(held, need, p) == expected_shortfall.__wrapped__(
                    held, need, p
                )
                assert deliverable(held, need, p, 0.95) == deliverable.__wrapped__(
                    held, need, p, 0.95
                )
    assert deliverable(4, 0, 0.05, 0.95) == 3  # 4 held at 5% failure: 3 deliverable at 95%
