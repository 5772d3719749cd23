"""The state digest's caches (the market part per state version, the mechanism's JSON per
mechanism object) never change its value: at every step of played episodes, including the
designer's mechanism changes, the env's digest equals one computed from scratch."""

from __future__ import annotations

import pytest

from market.environment.aec import raw_env
from market.environment.digest import StateDigests, market_digest
from market.run.rollout import run_episode


@pytest.mark.parametrize("scenario", ["market_round", "coalition_market", "shock_storm"])
def test_cached_digest_equals_a_fresh_one_at_every_step(scenario: str) -> None:
    env = raw_env(scenario)
    original = env.step
    checked: list[str] = []
    mechanisms: set[str] = set()

    def step(action: object) -> None:
        original(action)
        fresh = StateDigests().digest(env, env._version, env._potential)
        cached = env.state_digest()
        assert cached == fresh, f"step {len(checked)}: cached digest differs"
        mechanisms.add(env.mechanism.model_dump_json())
        checked.append(cached)

    env.step = step  # type: ignore[method-assign]
    # a random designer changes the mechanism every round: the mechanism cache must follow
    run_episode(scenario, 5, {"designer_0": "random"}, env=env)
    assert len(checked) > 20
    assert len(set(checked)) > 10  # the digest does follow the state
    assert len(mechanisms) > 2


def test_mechanism_json_argument_is_what_the_digest_would_compute() -> None:
    env = raw_env("market_round")
    env.reset(seed=2)
    args = (env.world, env.book, env.coalitions, env.mechanism, env._potential, env.orders)
    plain = market_digest(*args)
    assert market_digest(*args, mechanism_json=env.mechanism.model_dump_json()) == plain
    assert market_digest(*args, mechanism_json="{}") != plain  # the argument is what is hashed
