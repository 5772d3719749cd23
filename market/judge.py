"""Deprecated module path: use ``market.core.judge`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import claims as _claims
from market.core import judge as _moved

warnings.warn(
    "market.judge is deprecated; import market.core.judge (or market.core.claims) instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name) if hasattr(_moved, name) else getattr(_claims, name)
