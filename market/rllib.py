"""Deprecated module path: use ``market.environment.rllib`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.environment import rllib as _moved

warnings.warn(
    "market.rllib is deprecated; import market.environment.rllib instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
