"""Deprecated module path: use ``market.run.runner`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.run import runner as _moved

warnings.warn("market.runner is deprecated; import market.run.runner instead", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
