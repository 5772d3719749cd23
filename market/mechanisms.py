"""Deprecated module path: use ``market.core.mechanisms`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import mechanisms as _moved

warnings.warn(
    "market.mechanisms is deprecated; import market.core.mechanisms instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
