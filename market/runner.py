"""Deprecated module path: use ``market.run.runner`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.run import evaluation, folders, jobs, mechanism_comparison
from market.run import runner as _moved

warnings.warn(
    "market.runner is deprecated; import market.run.runner instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    for module in (_moved, evaluation, mechanism_comparison, folders, jobs):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module 'market.runner' has no attribute {name!r}")
