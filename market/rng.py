"""Deprecated module path: use ``market.core.rng`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import rng as _moved

warnings.warn(
    "market.rng is deprecated; import market.core.rng instead", DeprecationWarning, stacklevel=2
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
