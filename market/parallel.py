"""Deprecated module path: use ``market.environment.parallel`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.environment import parallel as _moved

warnings.warn(
    "market.parallel is deprecated; import market.environment.parallel instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
