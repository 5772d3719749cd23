"""Deprecated module path: use ``agents.llm.backends.hf_backend`` (or the names re-exported by ``agents.llm``). This path
keeps working for one release and then goes away."""

import warnings

from agents.llm.backends import hf_backend as _moved

warnings.warn(
    "agents.backends.hf_backend is deprecated; import agents.llm.backends.hf_backend instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)
