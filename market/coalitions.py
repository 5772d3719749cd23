"""Deprecated module path: use ``market.core.coalitions`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import coalitions as _moved

warnings.warn(
    "market.coalitions is deprecated; import market.core.coalitions instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
