"""The PettingZoo AEC environment over the core: ``raw_env``, ``env``, ``parallel_env``, the
observation models, wrappers and the RLlib adapter."""

from market.environment.aec import env, parallel_env, raw_env
from market.environment.observations import Observation, vector_size

__all__ = ["env", "raw_env", "parallel_env", "Observation", "vector_size"]
