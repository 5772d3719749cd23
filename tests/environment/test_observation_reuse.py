"""The env's observation caches (a seat's views fixed for the round, message views built once
per message, the delivery view reused while the collateral is unchanged, whole observations
reused while the state version is unchanged) never show a seat anything other than what an
observation built afresh from the same state shows: checked for every seat, live or not, at
every step of whole episodes with the scenarios' own line-ups."""

from __future__ import annotations

import pytest

from agents.registry import make_agent
from market.core.phases import LEGAL
from market.environment.aec import raw_env
from market.environment.observe import SeatViews
from market.run.rollout import default_seats


def fresh(env: raw_env, seat: str) -> dict[str, object]:
    """``seat``'s observation built by a new builder with empty caches."""
    acting = env.agent_selection == seat and env.is_live(seat)
    legal = list(LEGAL[env.phase]) if acting else []
    return SeatViews().observation(env, seat, legal).model_dump()


@pytest.mark.parametrize(
    ("scenario", "seed"),
    [("market_round", 0), ("coalition_market", 1), ("shock_storm", 2), ("single_trade", 0)],
)
def test_cached_observations_equal_fresh_ones(scenario: str, seed: int) -> None:
    env = raw_env(scenario)
    env.reset(seed=seed)
    agents = {seat: make_agent(spec) for seat, spec in default_seats(env.scenario).items()}
    for seat, agent in agents.items():
        agent.reset(env.seat_seed(seat))
    checked = messages = offers = 0
    for seat in env.agent_iter():
        for other in env.agents:
            seen = env.observe(other).model_dump()
            assert seen == fresh(env, other), (other, env.round, env.phase)
            checked += 1
            messages += len(seen["messages"])  # type: ignore[arg-type]
            offers += len(seen["offers_received"] or [])  # type: ignore[arg-type]
        obs, _, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else agents[seat].act(obs))
    assert checked > 30
    assert messages + offers > 0 or scenario == "single_trade"  # the cached views had work


def test_a_message_view_is_shared_by_the_seats_that_see_it() -> None:
    env = raw_env("market_round")
    env.reset(seed=0)
    env.step({"action_type": "wait"})  # the designer's turn
    sender = env.agent_selection
    env.step({"action_type": "send_message", "to": "all", "text": "selling two blocks"})
    a, b = (s for s in env.agents if s.startswith("bidder_") and s != sender)
    seen_a, seen_b = env.observe(a).messages, env.observe(b).messages
    assert [m.text for m in seen_a] == ["selling two blocks"]
    assert seen_a[0] is seen_b[0]  # one view for every seat that may see the message
    assert seen_a[0].sender == sender and seen_a[0].to == "all"
