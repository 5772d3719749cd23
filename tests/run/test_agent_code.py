"""Run folders notice edited agents (issue 34, item 5): the fingerprint holds each agent's code
(market/run/agent_code.py), a rerun after an edit is refused naming the agent and what changed,
and the same code resumes, whatever the files' paths or modification times."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.registry import make_agent
from market.cli import main as cli
from market.run.agent_code import agent_record, module_sources
from market.run.folders import MANIFEST
from market.run.runner import RunConfigError, run_scenario
from market.version import __version__

ROOT = Path(__file__).resolve().parents[2]

AGENT = '''from agents.scripted import TruthfulBidder


class Sniper(TruthfulBidder):
    """Bids its values."""

    name = "sniper"
    margin = 0.5
'''


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for agent modules written by the test; its modules are forgotten
    afterwards (each test uses its own module names)."""
    folder = tmp_path / "agents_src"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


def test_editing_a_py_agent_is_refused_naming_it_and_the_same_code_resumes(
    plugin_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = plugin_dir / "sniper_edit.py"
    module.write_text(AGENT)
    spec = "bidder_0=py:sniper_edit:Sniper"
    base = ["run", "single_trade", "--workers", "1", "--out", str(tmp_path / "out")]
    base += ["--no-progress", "--no-report", "--seat", spec]
    assert cli([*base, "--seeds", "0:2"]) == 0
    capsys.readouterr()
    # the run folder, wherever --out puts it (OUT, or OUT/scenario)
    manifest = json.loads(next((tmp_path / "out").rglob(MANIFEST)).read_text())
    record = manifest["agent_code"]["py:sniper_edit:Sniper"]
    assert record["class"] == "sniper_edit.Sniper" and list(record["modules"]) == ["sniper_edit"]

    module.write_text(AGENT.replace("margin = 0.5", "margin = 0.75"))
    assert cli([*base, "--seeds", "0:3"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert "agent 'py:sniper_edit:Sniper' has other code now" in err
    assert f"module sniper_edit ({module}) changed since that run" in err
    assert "--fresh" in err and "Traceback" not in captured.err

    # the original bytes again (a newer modification time): the same agent, so it resumes
    module.write_text(AGENT)
    assert cli([*base, "--seeds", "0:3"]) == 0
    assert "2 episode(s) were already complete, 1 played now" in capsys.readouterr().out

    module.write_text(AGENT.replace("margin = 0.5", "margin = 0.75"))
    assert cli([*base, "--seeds", "0:1", "--fresh"]) == 0


def test_a_helper_module_of_the_agents_package_is_part_of_its_code(
    plugin_dir: Path, tmp_path: Path
) -> None:
    package = plugin_dir / "fp_pkg"
    (package / "strategies").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "strategies" / "__init__.py").write_text("")
    (package / "numbers.py").write_text("SHADE = 0.9\n")
    (package / "strategies" / "unused.py").write_text("X = 1\n")
    (package / "agent.py").write_text(
        "from agents.scripted import TruthfulBidder\n"
        "from . import numbers\n"
        "from .strategies import unused\n\n\n"
        "class Shaded(TruthfulBidder):\n"
        "    name = 'shaded'\n"
    )
    seats = {"bidder_0": "py:fp_pkg.agent:Shaded"}
    out = tmp_path / "run"
    run_scenario("single_trade", range(1), seats, out, workers=1, progress=False)
    record = json.loads((out / MANIFEST).read_text())["agent_code"]["py:fp_pkg.agent:Shaded"]
    # the defining module, what it imports from its own package (and those packages' inits);
    # not the modules of other top-level packages (gpumarket's own: its version says those)
    assert sorted(record["modules"]) == [
        "fp_pkg",
        "fp_pkg.agent",
        "fp_pkg.numbers",
        "fp_pkg.strategies",
        "fp_pkg.strategies.unused",
    ]
    assert record["distribution"] is None

    (package / "numbers.py").write_text("SHADE = 0.8\n")
    with pytest.raises(RunConfigError, match=r"agent 'py:fp_pkg\.agent:Shaded'.*fp_pkg\.numbers"):
        run_scenario("single_trade", range(1), seats, out, workers=1, progress=False)


def test_the_fingerprint_hashes_bytes_not_paths_times_or_line_endings(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for folder in (one, two):
        folder.mkdir()
    (one / "fp_same.py").write_text(AGENT)
    (two / "fp_same.py").write_bytes(AGENT.replace("\n", "\r\n").encode())
    hashes = []
    for folder in (one, two):
        sys.path.insert(0, str(folder))
        try:
            hashes.append(module_sources(["fp_same"]))  # found on sys.path, never imported
        finally:
            sys.path.remove(str(folder))
    assert "fp_same" not in sys.modules
    assert hashes[0] == hashes[1] and list(hashes[0]) == ["fp_same"]
    (two / "fp_same.py").write_text(AGENT + "# edited\n")
    sys.path.insert(0, str(two))
    try:
        assert module_sources(["fp_same"]) != hashes[0]
    finally:
        sys.path.remove(str(two))


def test_built_in_agents_have_the_same_fingerprint_in_every_process() -> None:
    here = {name: agent_record(name, type(make_agent(name))) for name in ("rule_expert", "fixed")}
    assert here["fixed"]["distribution"] == f"gpumarket {__version__}"
    assert set(here["rule_expert"]["modules"]) >= {
        "agents.population.expert",
        "agents.population.planning",
        "agents.base",
    }
    assert not any(m.startswith("market.") for m in here["rule_expert"]["modules"])
    code = (
        "import json; from agents.registry import make_agent; "
        "from market.run.agent_code import agent_record; "
        "print(json.dumps({n: agent_record(n, type(make_agent(n))) "
        "for n in ('rule_expert', 'fixed')}))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True
    )
    assert json.loads(other.stdout) == here


def test_a_folder_without_a_code_record_is_refused_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_scenario("single_trade", range(1), None, out, workers=1, progress=False)
    manifest = json.loads((out / MANIFEST).read_text())
    del manifest["agent_code"]
    manifest["config_hash"] = "0123456789abcdef"  # as an older gpumarket hashed it
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RunConfigError, match="does not record its agents' code.*--fresh"):
        run_scenario("single_trade", range(1), None, out, workers=1, progress=False)
    again = run_scenario("single_trade", range(2), None, out, workers=1, progress=False, fresh=True)
    assert again.played == [0, 1]
    assert run_scenario("single_trade", range(2), None, out, progress=False).skipped == [0, 1]


def test_a_built_in_agent_whose_module_changed_is_named(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_scenario("single_trade", range(1), None, out, workers=1, progress=False)
    manifest = json.loads((out / MANIFEST).read_text())
    # the folder as a gpumarket whose agents/scripted.py differed would have written it
    manifest["agent_code"]["truthful"]["modules"]["agents.scripted"] = "0" * 16
    manifest["config_hash"] = "0123456789abcdef"
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RunConfigError) as refused:
        run_scenario("single_trade", range(1), None, out, workers=1, progress=False)
    message = str(refused.value)
    assert "agent 'truthful' has other code now: module agents.scripted" in message
    assert str(ROOT / "agents" / "scripted.py") in message and "\n" not in message
