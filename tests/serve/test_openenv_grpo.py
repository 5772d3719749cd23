"""GRPO through the OpenEnv server (market.serve.openenv_grpo), on the real server and client:
a completion's reward is the learner's return from its decision on, exactly as a local run of the
same play returns it; an unusable completion plays the fallback and pays the parse penalty; an
action the env rejects pays the env's penalty; the prompt rows are the LLM seat's messages."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("openenv")

from agents.registry import make_agent  # noqa: E402
from agents.scripted import TruthfulBidder  # noqa: E402
from market.core.actions import Wait  # noqa: E402
from market.run.rollout import run_episode  # noqa: E402
from market.serve.openenv_app import OpenEnvServer  # noqa: E402
from market.serve.openenv_client import MarketEnvClient  # noqa: E402
from market.serve.openenv_grpo import OpenEnvReward, openenv_prompts  # noqa: E402
from scenarios import load_scenario  # noqa: E402

SCENARIO, SEAT, SEED = "single_trade", "bidder_0", 3
PENALTY = load_scenario(SCENARIO).rewards.invalid_action_penalty


@pytest.fixture(scope="module")
def env() -> Any:
    with OpenEnvServer(max_sessions=2) as srv, MarketEnvClient(base_url=srv.url).sync() as client:
        yield client


class FirstThenTruthful(TruthfulBidder):
    """Plays ``first`` at its first decision, then as ``truthful``."""

    def __init__(self, first: Any) -> None:
        super().__init__()
        self.first: Any = first

    def act(self, observation: Any) -> Any:
        if self.first is not None:
            first, self.first = self.first, None
            return first
        return super().act(observation)


def local_return(first: Any) -> float:
    return run_episode(SCENARIO, SEED, {SEAT: lambda: FirstThenTruthful(first)}).returns[SEAT]


def before_first_decision(env: Any) -> float:
    return float(env.reset(scenario=SCENARIO, seat=SEAT, seed=SEED).reward)


def test_prompt_rows_are_the_llm_seats_first_messages(env: Any) -> None:
    rows = openenv_prompts(env, SCENARIO, SEAT, [SEED, SEED + 1], {"bidder_1": "truthful"})
    assert [r["seed"] for r in rows] == [SEED, SEED + 1]
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "user"]
    assert rows[0]["prompt"] != rows[1]["prompt"]  # two worlds
    assert json.loads(rows[0]["lineup"]) == {"bidder_1": "truthful"}
    again = openenv_prompts(env, SCENARIO, SEAT, [SEED], {"bidder_1": "truthful"})
    assert again[0]["prompt"] == rows[0]["prompt"]  # sessions are deterministic


def test_a_completion_scores_the_local_return_of_its_play(env: Any) -> None:
    obs = env.reset(scenario=SCENARIO, seat=SEAT, seed=SEED).observation.seat_observation()
    policy = make_agent("truthful", "bidder")
    policy.reset(0)
    action = policy.act(obs)
    text = "Here is my move:\n```json\n" + action.model_dump_json(exclude_none=True) + "\n```"
    reward = OpenEnvReward(env, "episode")
    got = reward([None], [[{"role": "assistant", "content": text}]], [SCENARIO], [SEAT], [SEED])
    expected = local_return(action) - before_first_decision(env)
    assert got == [expected] and expected != 0.0
    assert reward.parse_failures == 0 and reward.scored == 1


def test_an_unusable_completion_plays_the_fallback_and_pays(env: Any) -> None:
    reward = OpenEnvReward(env, "episode")
    got = reward.score(SCENARIO, SEAT, SEED, "I would rather not say.")
    assert got == local_return(Wait()) - before_first_decision(env) - PENALTY
    assert reward.parse_failures == 1


def test_an_action_the_env_rejects_pays_the_envs_penalty(env: Any) -> None:
    reward = OpenEnvReward(env, "episode")
    rejected = reward.score(
        SCENARIO, SEAT, SEED, '{"action_type": "accept_offer", "offer_id": "o9"}'
    )
    waited = reward.score(SCENARIO, SEAT, SEED, '{"action_type": "wait"}')
    assert rejected == waited - PENALTY
    assert reward.parse_failures == 0


def test_an_action_illegal_now_is_a_parse_failure(env: Any) -> None:
    reward = OpenEnvReward(env, "episode", parse_failure_penalty=0.5)
    illegal = reward.score(SCENARIO, SEAT, SEED, '{"action_type": "bid", "bids": [3]}')
    waited = reward.score(SCENARIO, SEAT, SEED, '{"action_type": "wait"}')
    assert illegal == waited - 0.5  # the bid is not legal in negotiation: the fallback waits
    assert reward.parse_failures == 1


def test_horizons_nest(env: Any) -> None:
    text = '{"action_type": "wait"}'
    step, rnd, episode = (
        OpenEnvReward(env, h).score(SCENARIO, SEAT, SEED, text)
        for h in ("step", "round", "episode")
    )
    result = env.reset(scenario=SCENARIO, seat=SEAT, seed=SEED)
    assert step == env.step({"action_type": "wait"}).reward
    assert episode == local_return(Wait()) - result.reward
    assert rnd != step  # the round's clearing is in the round horizon
    with pytest.raises(ValueError, match="horizon"):
        OpenEnvReward(env, "forever")
    with pytest.raises(ValueError, match="dataset columns"):
        OpenEnvReward(env)([None], ["{}"])
