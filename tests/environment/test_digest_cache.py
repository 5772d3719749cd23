"""The state digest's caches (the market part per state version, the mechanism's JSON per
mechanism object, the text of parts unchanged since the last version) never change its value:
at every step of played episodes, including the designer's mechanism changes, the env's digest
equals one computed from scratch and the plain formula."""

from __future__ import annotations

import hashlib

import pytest

from market.environment.aec import raw_env
from market.environment.digest import ReprMemo, StateDigests, market_digest
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


def test_repr_memo_reuses_text_only_for_bit_equal_plain_data() -> None:
    """Equal by ``==`` is not enough: ``0.0``/``-0.0`` and ``1``/``1.0``/``True`` write other
    text, so the memo must write each afresh; an unchanged value reuses its text."""
    memo = ReprMemo()
    sequence = [(0.0, 1), (-0.0, 1), (-0.0, 1.0), (-0.0, True), (-0.0, True), [0.1 + 0.2]]
    for value in sequence:
        assert memo.join([("slot", value)]) == repr(value).encode()
    assert memo.join([("a", 1.5), ("b", [2, "x"])]) == b"1.5[2, 'x']"
    flags = {"bidder_1": False, "bidder_0": True}
    assert memo.flags(flags, {}) == f"{sorted(flags.items())!r}, []"
    flags["bidder_0"] = 1  # type: ignore[assignment]  # equal to True, written otherwise
    assert memo.flags(flags, {}) == f"{sorted(flags.items())!r}, []"


@pytest.mark.parametrize("scenario", ["market_round", "coalition_market", "shock_storm"])
def test_memoised_digest_equals_the_plain_formula(scenario: str) -> None:
    """The digest spelled out without the memo: SHA-256 of the repr of the turn tuple whose
    market part is market_digest() of the plain text of every part."""
    env = raw_env(scenario)
    original = env.step
    checked: list[str] = []

    def step(action: object) -> None:
        original(action)
        args = (env.world, env.book, env.coalitions, env.mechanism, env._potential, env.orders)
        turn = (
            market_digest(*args),
            env.round,
            env.phase,
            env.turn,
            env.agent_selection,
            len(env.results),
            sorted(env.terminations.items()),
            sorted(env.truncations.items()),
        )
        plain = hashlib.sha256(repr(turn).encode()).hexdigest()
        assert env.state_digest() == plain, f"step {len(checked)}"
        checked.append(plain)

    env.step = step  # type: ignore[method-assign]
    run_episode(scenario, 4, {"designer_0": "random"}, env=env)
    assert len(set(checked)) > 10
