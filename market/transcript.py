"""Deprecated module path: use ``market.record.transcript`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.record import transcript as _moved

warnings.warn(
    "market.transcript is deprecated; import market.record.transcript instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
