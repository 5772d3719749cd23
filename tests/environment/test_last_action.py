"""A seat's observation carries the env's verdict on its last action (``last_action``) and its
offers closed this round (``closed_offers``): plug-ins, LLM seats (the prompt) and remote seats
(the JSON) all see them, while the vector and the transcripts' obs digest stay as they were."""

from __future__ import annotations

import numpy as np

from agents.remote import RemoteAgent
from market.environment.aec import raw_env
from market.environment.observations import FEEDBACK_FIELDS, Observation
from market.environment.parallel import ParallelMarketEnv
from market.review.replay import obs_digest


def to_turn(env: raw_env, seat: str) -> Observation:
    """Wait with every other seat until it is ``seat``'s turn; its observation."""
    while env.agent_selection != seat:
        env.step({"action_type": "wait"})
    return env.observe(seat)


def test_a_refused_action_is_in_the_next_observation() -> None:
    env = raw_env("market_round")
    env.reset(seed=0)
    first = to_turn(env, "bidder_0")
    assert first.last_action is None  # nothing played yet
    env.step({"action_type": "accept_offer", "offer_id": "o9"})
    error = env.infos["bidder_0"]["error"]
    obs = to_turn(env, "bidder_0")  # every other seat waited: the env's version did not move
    last = obs.last_action
    assert last is not None and not last.accepted
    assert (last.action_type, last.round, last.phase) == ("accept_offer", 0, "negotiation")
    assert last.error == error and "offer 'o9' does not exist" in error
    assert last.penalty == env.scenario.rewards.invalid_action_penalty == 0.05
    assert (
        "Your last action (accept_offer, round 0, negotiation) was refused: offer 'o9' does not "
        "exist; use an offer_id from offers_received; it cost 0.05." in obs.to_prompt()
    )
    # the RL vector and the transcript digest do not see the feedback fields
    bare = obs.model_copy(update=dict.fromkeys(FEEDBACK_FIELDS))
    assert np.array_equal(obs.to_vector(), bare.to_vector())
    assert obs_digest(obs) == obs_digest(bare)
    # a remote seat gets it in the observation JSON and the prompt
    body = RemoteAgent.request(obs)
    assert body["observation"]["last_action"]["error"] == error
    assert "was refused" in body["prompt"]
    env.step("not json at all")
    unread = to_turn(env, "bidder_0").last_action
    assert (
        unread is not None
        and unread.action_type is None
        and "not valid JSON" in (unread.error or "")
    )


def test_an_accepted_action_and_an_accepted_offer() -> None:
    env = raw_env("market_round")
    env.reset(seed=0)
    to_turn(env, "bidder_0")
    env.step({"action_type": "send_offer", "to": "bidder_1", "blocks": 1, "price": 12.5})
    to_turn(env, "bidder_1")
    env.step({"action_type": "accept_offer", "offer_id": "o0"})
    obs = to_turn(env, "bidder_0")
    assert obs.last_action is not None and obs.last_action.accepted
    assert obs.last_action.result == {"offer_id": "o0"}
    assert [(o.offer_id, o.status) for o in obs.closed_offers or ()] == [("o0", "accepted")]
    assert obs.offers_sent == []
    assert 'Your offers closed this round: [{"offer_id":"o0"' in obs.to_prompt()
    seller = env.observe("bidder_1")
    assert seller.last_action is not None and seller.last_action.result == {
        "offer_id": "o0",
        "status": "accepted",
        "contract_id": None,
    }


def test_the_parallel_env_carries_it_too() -> None:
    env = ParallelMarketEnv("single_trade")
    observations, _ = env.reset(seed=1)
    while "bidder_0" not in env.acting_agents:
        observations, *_ = env.step({a: {"action_type": "wait"} for a in env.agents})
    observations, *_ = env.step(
        {a: {"action_type": "reject_offer", "offer_id": "o5"} for a in env.agents}
    )
    last = observations["bidder_0"].last_action
    assert last is not None and not last.accepted and "o5" in (last.error or "")
