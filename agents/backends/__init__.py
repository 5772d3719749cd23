"""Deprecated package path: use ``agents.llm.backends``."""

import warnings

warnings.warn(
    "agents.backends is deprecated; import agents.llm.backends instead",
    DeprecationWarning,
    stacklevel=2,
)
