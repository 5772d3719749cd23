"""Deprecated module path: use ``market.run.rollout`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.run import rollout as _moved

warnings.warn(
    "market.rollout is deprecated; import market.run.rollout instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
