"""Deprecated module path: use ``market.environment.wrappers`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.environment import wrappers as _moved

warnings.warn(
    "market.wrappers is deprecated; import market.environment.wrappers instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
