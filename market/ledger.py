"""Deprecated module path: use ``market.core.ledger`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.core import ledger as _moved

warnings.warn(
    "market.ledger is deprecated; import market.core.ledger instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
