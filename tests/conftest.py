"""pytest hooks: the --all-scenarios option and the sweeps it widens, a check that the tests
write nothing into the checkout (the local-model cache goes to a temporary folder), and a lock that lets one real-model test run at a time. Shared
helpers live in ``support.py``."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import sweep_skip_reason


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all-scenarios",
        action="store_true",
        help="also sweep scale scenarios and population variants of built-ins",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--all-scenarios"):
        return
    # deselected, not skipped: they are not part of the default run at all (no skip counts)
    keep, dropped = [], []
    for item in items:
        name = getattr(getattr(item, "callspec", None), "params", {}).get("scenario")
        (dropped if isinstance(name, str) and sweep_skip_reason(name) else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


# --- tests write only to temporary folders --------------------------------------------------
# A test that ran a CLI command with the checkout as its working directory once left runs/ there,
# after which a user's own `gpumarket run` was refused as "a run of another configuration".
_CHECKOUT = Path(__file__).resolve().parents[1]
_CHECKOUT_OUTPUTS = ("runs", "eval", "tournament", "sft.jsonl", "report.html")


def _outputs_in_checkout() -> set[str]:
    return {name for name in _CHECKOUT_OUTPUTS if (_CHECKOUT / name).exists()}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_outputs_key] = _outputs_in_checkout()
    # the local-model conversion cache (agents/llm/backends/hf_loading.py) goes to a temporary
    # folder of this session, not the user's ~/.cache, unless the caller chose one
    if not os.environ.get("GPUMARKET_CACHE_DIR"):
        folder = tempfile.mkdtemp(prefix="gpumarket-test-cache-")
        os.environ["GPUMARKET_CACHE_DIR"] = folder
        session.config.stash[_cache_key] = folder


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    cache = session.config.stash.get(_cache_key, None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop("GPUMARKET_CACHE_DIR", None)
    new = _outputs_in_checkout() - session.config.stash.get(_outputs_key, set())
    if new and not hasattr(session.config, "workerinput"):  # report once, from the controller
        print(
            f"\nERROR: the tests wrote {sorted(new)} into the checkout {_CHECKOUT}; tests must "
            "write only to tmp_path (pass --out / cwd=tmp_path)"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_outputs_key = pytest.StashKey[set[str]]()
_cache_key = pytest.StashKey[str]()


# --- one real model at a time ----------------------------------------------------------------
# Two llama.cpp servers (or torch decoders) decoding at once on a 2-core machine starve each
# other: CI saw 0.36 tokens/s and 300 s timeouts. xdist's loadgroup cannot help (with pytest 9
# its group suffix never reaches the scheduler), so pytest workers take turns through a file lock.


@pytest.fixture(autouse=True)
def _one_real_model_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    worker = getattr(request.config, "workerinput", None)
    uses_model = request.node.get_closest_marker("real_model") or "llama" in request.fixturenames
    if worker is None or not uses_model or os.name != "posix":
        yield
        return
    import fcntl

    lock = Path(tempfile.gettempdir()) / f"gpumarket-real-model-{worker['testrunuid']}.lock"
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
