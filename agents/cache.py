"""Deprecated module path: use ``agents.llm.cache`` (or the names re-exported by ``agents.llm``). This path
keeps working for one release and then goes away."""

import warnings

from agents.llm import cache as _moved

warnings.warn(
    "agents.cache is deprecated; import agents.llm.cache instead", DeprecationWarning, stacklevel=2
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
