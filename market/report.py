"""Deprecated module path: use ``market.record.report`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.record import report as _moved

warnings.warn(
    "market.report is deprecated; import market.record.report instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
