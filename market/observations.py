"""Deprecated module path: use ``market.environment.observations`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.environment import observations as _moved

warnings.warn(
    "market.observations is deprecated; import market.environment.observations instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
