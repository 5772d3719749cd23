"""Deprecated module path: use ``market.bench.llm`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.bench import llm as _moved

warnings.warn(
    "market.llm_bench is deprecated; import market.bench.llm instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)


if __name__ == "__main__":  # ``python -m market.llm_bench``
    import runpy

    runpy.run_module("market.bench.llm", run_name="__main__")
