"""The RL view (:mod:`market.environment.wrappers`) inside RLlib's own PettingZoo wrappers.

RLlib's action-masking RLModule (``ray.rllib.examples.rl_modules.classes.action_masking_rlm``)
reads a dict observation ``{"observations": ..., "action_mask": ...}``; our RL view says
``"observation"``. :class:`RLlibKeysWrapper` (AEC) and :class:`ParallelRLlibKeysWrapper` rename
the key and give the mask as float32 0/1 (the module takes ``log(mask)``). They need no ray.
:func:`rllib_env` / :func:`rllib_parallel_env` put them in RLlib's ``PettingZooEnv`` /
``ParallelPettingZooEnv`` (``ray.rllib.env.wrappers.pettingzoo_env``); only these import ray
(``import market`` never imports this module).

What RLlib's ``PettingZooEnv`` does with the AEC env, and why it fits:

* after a step it reports only the next seat to act, with ``env.last()``: that seat's reward
  accumulated since its own previous action (``infos["reward_components"]`` says the same), so
  a seat's rewards summed over an episode are its return;
* seats that are done are stepped with ``None`` and reported once with their last reward;
  ``"__all__"`` is true when no seat is left;
* it takes the spaces of the seats present after ``reset()``. Labs that enter mid-episode
  (``coalition_market``) would be missing, so :func:`rllib_env` sets every possible seat's
  spaces (all seats' spaces are equal) and ``possible_agents`` after construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import BaseParallelWrapper, BaseWrapper

from market.core.scenario_schema import Scenario
from market.environment.spaces import Info, Options
from market.environment.wrappers import MENU, OBS_BOUND, rl_env, rl_parallel_env

OBS_KEY = "observations"  # the key RLlib's ActionMaskingRLModule reads the features from
MASK_KEY = "action_mask"
RAY_HINT = "needs ray[rllib]: pip install 'gpumarket[rl]'"
RLObs = dict[str, np.ndarray]


def rllib_observation_space(obs_size: int) -> spaces.Dict:
    """``{"observations": Box(float32), "action_mask": Box(0, 1, float32)}`` for one seat."""
    return spaces.Dict(
        {
            OBS_KEY: spaces.Box(-OBS_BOUND, OBS_BOUND, shape=(obs_size,), dtype=np.float32),
            MASK_KEY: spaces.Box(0.0, 1.0, shape=(len(MENU),), dtype=np.float32),
        }
    )


def to_rllib(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An RL-view observation with RLlib's keys: the vector as ``observations``, a float mask."""
    return {OBS_KEY: obs["observation"], MASK_KEY: obs["action_mask"].astype(np.float32)}


def _spaces(env: AECEnv | ParallelEnv) -> dict[str, spaces.Dict]:
    size = env.observation_space(env.possible_agents[0])["observation"].shape[0]
    return {a: rllib_observation_space(size) for a in env.possible_agents}


class RLlibKeysWrapper(BaseWrapper):  # type: ignore[misc]  # pettingzoo ships no type hints
    """AEC: the RL view (``rl_env``) with RLlib's observation keys; actions are unchanged."""

    def __init__(self, env: AECEnv) -> None:
        super().__init__(env)
        self.observation_spaces = _spaces(env)

    def observation_space(self, agent: str) -> spaces.Dict:
        return self.observation_spaces[agent]

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        return to_rllib(self.env.observe(agent))


class ParallelRLlibKeysWrapper(BaseParallelWrapper):  # type: ignore[misc]  # (no type hints)
    """Parallel: the RL view (``rl_parallel_env``) with RLlib's observation keys."""

    def __init__(self, env: ParallelEnv) -> None:
        super().__init__(env)
        self.observation_spaces = _spaces(env)

    def observation_space(self, agent: str) -> spaces.Dict:
        return self.observation_spaces[agent]

    def reset(
        self, seed: int | None = None, options: Options | None = None
    ) -> tuple[dict[str, RLObs], dict[str, Info]]:
        observations, infos = self.env.reset(seed=seed, options=options)
        return {a: to_rllib(o) for a, o in observations.items()}, infos

    def step(
        self, actions: Mapping[str, object]
    ) -> tuple[
        dict[str, RLObs], dict[str, float], dict[str, bool], dict[str, bool], dict[str, Info]
    ]:
        observations, rewards, terms, truncs, infos = self.env.step(actions)
        return {a: to_rllib(o) for a, o in observations.items()}, rewards, terms, truncs, infos


def _ray_wrappers() -> ModuleType:
    try:
        from ray.rllib.env.wrappers import pettingzoo_env
    except ImportError as exc:
        raise ImportError(f"market.environment.rllib {RAY_HINT} ({exc})") from None
    return pettingzoo_env


def _all_seats(wrapped: Any, env: AECEnv | ParallelEnv) -> Any:  # ray's wrapper
    """Give RLlib's wrapper every possible seat, not only those present after reset."""
    wrapped.possible_agents = list(env.possible_agents)
    spaces_ = {a: env.observation_space(a) for a in env.possible_agents}
    actions = {a: env.action_space(a) for a in env.possible_agents}
    if hasattr(wrapped, "observation_spaces"):
        wrapped.observation_spaces, wrapped.action_spaces = spaces_, actions
    wrapped.observation_space = spaces.Dict(spaces_)
    wrapped.action_space = spaces.Dict(actions)
    return wrapped


def rllib_env(scenario: str | Path | Scenario = "market_round", **overrides: Any) -> Any:
    """RLlib's ``PettingZooEnv`` around the AEC RL view with RLlib's mask keys (needs ray)."""
    aec = RLlibKeysWrapper(rl_env(scenario, **overrides))
    return _all_seats(_ray_wrappers().PettingZooEnv(aec), aec)


def rllib_parallel_env(scenario: str | Path | Scenario = "market_round", **overrides: Any) -> Any:
    """RLlib's ``ParallelPettingZooEnv`` around the parallel RL view (needs ray)."""
    par = ParallelRLlibKeysWrapper(rl_parallel_env(scenario, **overrides))
    return _all_seats(_ray_wrappers().ParallelPettingZooEnv(par), par)


def env_creator(config: Mapping[str, Any] | None = None) -> Any:
    """For ``ray.tune.register_env``: ``{"scenario": ..., "parallel": bool, **overrides}``."""
    config = dict(config or {})
    scenario = config.pop("scenario", "market_round")
    parallel = bool(config.pop("parallel", False))
    return (rllib_parallel_env if parallel else rllib_env)(scenario, **config)
