"""Deprecated module path: use ``market.train.rl_train`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.train import rl_train as _moved

warnings.warn(
    "market.rl_train is deprecated; import market.train.rl_train instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
