"""Deprecated module path: use ``market.core.negotiation`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import negotiation as _moved

warnings.warn(
    "market.negotiation is deprecated; import market.core.negotiation instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
