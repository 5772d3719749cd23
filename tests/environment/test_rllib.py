"""The RL view inside RLlib's own PettingZoo wrappers (market.environment.rllib), and a real PPO iteration."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from market.environment.rllib import MASK_KEY, OBS_KEY, RLlibKeysWrapper, env_creator
from market.environment.wrappers import MENU, rl_env, rl_parallel_env

pytest.importorskip("ray.rllib")

from market.environment.rllib import rllib_env, rllib_parallel_env  # noqa: E402

SCENARIOS = ("market_round", "single_trade", "coalition_market")


def _masked_random(rng: np.random.Generator, obs: dict[str, np.ndarray]) -> int:
    return int(rng.choice(np.flatnonzero(obs[MASK_KEY])))


def _rllib_episode(scenario: str, seed: int) -> tuple[list[int], dict[str, float], int]:
    """Masked random play through RLlib's PettingZooEnv: (actions, summed rewards, errors)."""
    env = rllib_env(scenario)
    space = env.observation_space
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    actions: list[int] = []
    totals: dict[str, float] = defaultdict(float)
    errors = 0
    for _ in range(5000):
        for agent, o in obs.items():
            assert space[agent].contains(o), (agent, o)
        agent = env.env.agent_selection
        assert agent in obs  # the seat to act is always reported, with its mask
        action = _masked_random(rng, obs[agent])
        actions.append(action)
        obs, rewards, terms, truncs, _ = env.step({agent: action})
        errors += "error" in env.env.unwrapped.infos.get(agent, {})
        for a, r in rewards.items():
            totals[a] += r
        # besides the seat to act next, only seats that are done are reported
        live = [a for a in obs if not (terms[a] or truncs[a])]
        assert len(live) <= 1
        if terms["__all__"] or truncs["__all__"]:
            assert not env.env.agents
            return actions, dict(totals), errors
    raise AssertionError("episode did not end")


def _aec_returns(scenario: str, seed: int, actions: list[int]) -> dict[str, float]:
    """The same actions in the plain RL view: each seat's rewards from ``last()``, summed."""
    env = rl_env(scenario)
    env.reset(seed=seed)
    todo = iter(actions)
    totals: dict[str, float] = defaultdict(float)
    for agent in env.agent_iter():
        _, reward, term, trunc, _ = env.last()
        totals[agent] += reward
        env.step(None if term or trunc else next(todo))
    assert next(todo, None) is None
    return dict(totals)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rllib_wrapper_honours_masks_and_pays_the_envs_returns(scenario: str) -> None:
    for seed in (0, 1, 2):
        actions, totals, errors = _rllib_episode(scenario, seed)
        assert errors == 0  # a masked-in entry is always accepted by the AEC env
        expected = _aec_returns(scenario, seed, actions)
        for agent in {*expected, *totals}:
            assert totals.get(agent, 0.0) == pytest.approx(expected.get(agent, 0.0), abs=1e-9)
        assert any(abs(v) > 0 for v in totals.values())


def test_rllib_spaces_use_rllibs_mask_keys_for_every_possible_seat() -> None:
    env = rllib_env("coalition_market")  # one lab enters mid-episode: not present at reset
    raw = env.env.unwrapped
    assert len(raw.possible_agents) > len(env.env.agents)
    assert sorted(env.possible_agents) == sorted(raw.possible_agents)
    for agent in raw.possible_agents:
        space = env.observation_space[agent]
        assert set(space.spaces) == {OBS_KEY, MASK_KEY}
        assert space[MASK_KEY].shape == (len(MENU),) and space[MASK_KEY].dtype == np.float32
        assert space[OBS_KEY].shape == (44,) and space[OBS_KEY].dtype == np.float32
        assert env.action_space[agent].n == len(MENU)


def test_keys_wrapper_keeps_the_rl_view_values() -> None:
    plain, renamed = rl_env(), RLlibKeysWrapper(rl_env())
    plain.reset(seed=4)
    renamed.reset(seed=4)
    a, b = plain.observe(plain.agent_selection), renamed.observe(renamed.agent_selection)
    assert np.array_equal(a["observation"], b[OBS_KEY])
    assert np.array_equal(a["action_mask"], b[MASK_KEY]) and b[MASK_KEY].sum() >= 1


def test_parallel_rllib_wrapper_pays_the_parallel_envs_returns() -> None:
    env = rllib_parallel_env("market_round")
    ref = rl_parallel_env("market_round")
    obs, _ = env.reset(seed=7)
    ref_obs, _ = ref.reset(seed=7)
    rng = np.random.default_rng(7)
    totals: dict[str, float] = defaultdict(float)
    expected: dict[str, float] = defaultdict(float)
    for _ in range(500):
        assert set(obs) == set(ref_obs)
        for agent, o in obs.items():
            assert env.observation_space[agent].contains(o)
            assert np.array_equal(o[MASK_KEY], ref_obs[agent]["action_mask"])
        actions = {a: _masked_random(rng, o) for a, o in obs.items() if o[MASK_KEY].any()}
        obs, rewards, terms, truncs, _ = env.step(actions)
        ref_obs, ref_rewards, *_ = ref.step(actions)
        for a, r in rewards.items():
            totals[a] += r
        for a, r in ref_rewards.items():
            expected[a] += r
        if terms["__all__"] or truncs["__all__"]:
            break
    else:
        raise AssertionError("episode did not end")
    assert dict(totals) == pytest.approx(dict(expected), abs=1e-12)
    assert any(abs(v) > 0 for v in totals.values())


def test_env_creator_reads_scenario_and_view() -> None:
    aec = env_creator({"scenario": "single_trade"})
    assert sorted(aec.possible_agents) == ["bidder_0", "bidder_1"]
    assert type(aec).__name__ == "PettingZooEnv"
    par = env_creator({"scenario": "market_round", "parallel": True})
    assert type(par).__name__ == "ParallelPettingZooEnv"


def test_importing_market_does_not_import_ray_or_torch() -> None:
    code = (
        "import sys, market, market.environment.wrappers, market.environment.rllib, market.cli, agents.registry; "
        "market.env; bad = [m for m in ('ray', 'torch') if m in sys.modules]; "
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _ppo_config(scenario: str) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.rl_modules.classes.action_masking_rlm import (
        ActionMaskingTorchRLModule,
    )

    module = RLModuleSpec(
        module_class=ActionMaskingTorchRLModule,
        model_config={"fcnet_hiddens": [32], "head_fcnet_hiddens": [32]},
    )
    return (
        PPOConfig()
        .environment("gpumarket", env_config={"scenario": scenario})
        .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, *a, **k: "shared")
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={"shared": module}))
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=200, minibatch_size=50, num_epochs=1)
        .debugging(seed=0)
    )


@pytest.mark.slow
def test_rllib_ppo_trains_one_iteration_with_the_action_masking_module() -> None:
    """A real PPO (new API stack) with RLlib's example ActionMaskingTorchRLModule, one shared
    policy for every seat; ~15 s (ray start ~4 s, build ~5 s, one iteration ~2 s)."""
    import ray
    from ray.tune.registry import register_env

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # address="local": never join another Ray cluster running on this host
    with tempfile.TemporaryDirectory(prefix="rl-", dir="/tmp", ignore_cleanup_errors=True) as tmp:
        ray.init(
            address="local",
            include_dashboard=False,
            num_cpus=2,
            object_store_memory=80_000_000,
            _temp_dir=tmp,
            log_to_driver=False,
        )
        try:
            register_env("gpumarket", env_creator)
            algo = _ppo_config("market_round").build_algo()
            try:
                result = algo.train()
            finally:
                algo.stop()
        finally:
            ray.shutdown()
    runners = result["env_runners"]
    assert runners["num_env_steps_sampled_lifetime"] >= 200
    assert runners["num_episodes_lifetime"] >= 1
    assert np.isfinite(runners["episode_return_mean"])
    assert np.isfinite(result["learners"]["shared"]["total_loss"])
