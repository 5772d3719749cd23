"""Deprecated module path: use ``market.record.replay`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.record import replay as _moved

warnings.warn("market.replay is deprecated; import market.record.replay instead", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
