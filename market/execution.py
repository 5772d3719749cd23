"""Deprecated module path: use ``market.core.execution`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import execution as _moved

warnings.warn(
    "market.execution is deprecated; import market.core.execution instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
