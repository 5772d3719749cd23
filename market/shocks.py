"""Deprecated module path: use ``market.core.shocks`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import shocks as _moved

warnings.warn(
    "market.shocks is deprecated; import market.core.shocks instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
