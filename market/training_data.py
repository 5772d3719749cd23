"""Deprecated module path: use ``market.train.training_data`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.train import training_data as _moved

warnings.warn(
    "market.training_data is deprecated; import market.train.training_data instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
