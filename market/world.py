"""Deprecated module path: use ``market.core.world`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import world as _moved

warnings.warn(
    "market.world is deprecated; import market.core.world instead", DeprecationWarning, stacklevel=2
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
