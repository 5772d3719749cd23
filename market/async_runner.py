"""Deprecated module path: use ``market.run.async_runner`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.run import async_bench
from market.run import async_runner as _moved

warnings.warn(
    "market.async_runner is deprecated; import market.run.async_runner instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved if hasattr(_moved, name) else async_bench, name)
