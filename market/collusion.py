"""Deprecated module path: use ``market.core.collusion`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import collusion as _moved

warnings.warn(
    "market.collusion is deprecated; import market.core.collusion instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
