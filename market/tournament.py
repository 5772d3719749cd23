"""Deprecated module path: use ``market.run.tournament`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.run import tournament as _moved

warnings.warn(
    "market.tournament is deprecated; import market.run.tournament instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
