"""pytest hooks: the --all-scenarios option and the sweeps it widens, and a check that the tests
write nothing into the checkout. Shared helpers live in ``support.py``."""

from __future__ import annotations

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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    new = _outputs_in_checkout() - session.config.stash.get(_outputs_key, set())
    if new and not hasattr(session.config, "workerinput"):  # report once, from the controller
        print(
            f"\nERROR: the tests wrote {sorted(new)} into the checkout {_CHECKOUT}; tests must "
            "write only to tmp_path (pass --out / cwd=tmp_path)"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_outputs_key = pytest.StashKey[set[str]]()
