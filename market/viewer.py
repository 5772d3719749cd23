"""Deprecated module path: use ``market.record.viewer`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.record import viewer as _moved

warnings.warn(
    "market.viewer is deprecated; import market.record.viewer instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
