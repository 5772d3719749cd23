"""Deprecated module path: use ``market.record.replay`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import sys
import types
import warnings

from market.record import replay as _moved

warnings.warn(
    "market.replay is deprecated; import market.record.replay instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)


class _CallableModule(types.ModuleType):
    """Importing this module sets ``market.replay`` to it; calling it still replays, as the
    scripting API's ``market.replay`` does."""

    def __call__(self, *args: object, **kwargs: object) -> object:
        return _moved.replay(*args, **kwargs)  # type: ignore[arg-type]


sys.modules[__name__].__class__ = _CallableModule
