"""Deprecated module path: use ``market.core.rewards`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import rewards as _moved

warnings.warn(
    "market.rewards is deprecated; import market.core.rewards instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
