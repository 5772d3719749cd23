"""gpumarket: a PettingZoo AEC environment of a scarce-GPU economy.

``market.env(scenario="market_round")`` builds the wrapped AEC env, ``market.raw_env`` the bare
one and ``market.parallel_env`` the parallel view. They are imported lazily so that importing a
submodule (``market.core.mechanisms``) stays cheap.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["env", "raw_env", "parallel_env", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("env", "raw_env", "parallel_env"):
        from market.environment import aec as environment

        return getattr(environment, name)
    raise AttributeError(f"module 'market' has no attribute {name!r}")
