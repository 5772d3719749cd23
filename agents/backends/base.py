"""Deprecated module path: use ``agents.llm.backends.base`` (or the names re-exported by ``agents.llm``). This path
keeps working for one release and then goes away."""

import warnings

from agents.llm.backends import base as _moved

warnings.warn(
    "agents.backends.base is deprecated; import agents.llm.backends.base instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
