"""Deprecated module path: use ``market.bench.fake_openai_server`` (or the names re-exported by ``market``). This path
keeps working for one release and then goes away."""

import warnings

from market.bench import fake_openai_server as _moved

warnings.warn(
    "market.fake_openai_server is deprecated; import market.bench.fake_openai_server instead",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    return getattr(_moved, name)


if __name__ == "__main__":  # ``python -m market.fake_openai_server``
    import runpy

    runpy.run_module("market.bench.fake_openai_server", run_name="__main__")
