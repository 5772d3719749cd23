"""Deprecated module path: use ``market.run.health`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.run import health as _moved

warnings.warn(
    "market.health is deprecated; import market.run.health instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
