"""The PettingZoo AEC environment over the core: ``raw_env``, ``env``, ``parallel_env``, the
observation models, wrappers and the RLlib adapter."""

from market.environment.aec import env, parallel_env, raw_env

__all__ = ["env", "raw_env", "parallel_env"]
