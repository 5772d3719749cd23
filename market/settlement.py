"""Deprecated module path: use ``market.core.settlement`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import settlement as _moved

warnings.warn(
    "market.settlement is deprecated; import market.core.settlement instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
