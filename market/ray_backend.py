"""Deprecated module path: use ``market.run.ray_backend`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.run import ray_backend as _moved

warnings.warn(
    "market.ray_backend is deprecated; import market.run.ray_backend instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
