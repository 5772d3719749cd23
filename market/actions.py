"""Deprecated module path: use ``market.core.actions`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import actions as _moved

warnings.warn(
    "market.actions is deprecated; import market.core.actions instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
