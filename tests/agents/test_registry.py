"""Agent specs, plug-ins (a real distribution installed in the test) and crash-proof seats."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agents.registry import AgentSpecError, make_agent, parse_spec, plugin_status, registered
from agents.scripted import TruthfulBidder
from market.run.rollout import run_concurrent, run_episode

PLUGIN_MODULE = '''
from agents.base import BaseAgent
from market.core.actions import Bid, Wait


class FlatBidder(BaseAgent):
    """Bids one block at a fixed price every bidding turn (a plug-in used by the tests)."""

    name = "flat_bidder"
    roles = frozenset({"bidder"})

    def __init__(self, price: float = 7.0) -> None:
        super().__init__()
        self.price = float(price)

    def act(self, obs):
        return Bid(bids=[self.price]) if obs.phase == "bidding" else Wait()
'''

PLUGIN_PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "gm-flat-plugin"
version = "0.0.1"

[project.entry-points."gpumarket.agents"]
flat_bidder = "gm_flat_plugin:FlatBidder"

[tool.setuptools]
py-modules = ["gm_flat_plugin"]
"""


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build and install a throwaway plug-in distribution into a private target folder."""
    root = tmp_path_factory.mktemp("plugin")
    src, target = root / "src", root / "site"
    src.mkdir()
    (src / "pyproject.toml").write_text(textwrap.dedent(PLUGIN_PYPROJECT))
    (src / "gm_flat_plugin.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert any(p.name.startswith("gm_flat_plugin-0.0.1.dist-info") for p in target.iterdir())
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))
    sys.modules.pop("gm_flat_plugin", None)


def test_installed_plugin_fills_a_seat_by_its_spec(plugin_dir: Path) -> None:
    assert "flat_bidder" in registered()
    agent = make_agent("flat_bidder?price=9", "bidder")
    assert type(agent).__module__ == "gm_flat_plugin" and agent.price == 9.0
    result = run_episode("single_trade", seed=0, seats={"bidder_0": "flat_bidder?price=9"})
    assert result.seats["bidder_0"] == "flat_bidder?price=9"
    # the plug-in's schedule is what the market saw in every round
    assert all(r["bids"].get("bidder_0") == [9.0] for r in result.round_log)
    assert result.invalid_actions["bidder_0"] == 0


def test_plugin_works_through_the_cli(plugin_dir: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "market",
            "run",
            "single_trade",
            "--seeds",
            "0:2",
            "--workers",
            "2",
            "--seat",
            "bidder_0=flat_bidder?price=4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,  # runs/ goes there
    )
    assert proc.returncode == 0, proc.stderr
    assert "flat_bidder" in proc.stdout
    episodes = json.loads(out.read_text())
    assert [e["seed"] for e in episodes] == [0, 1]
    assert all(r["bids"]["bidder_0"] == [4.0] for e in episodes for r in e["rounds"])


BROKEN_ENTRY_POINTS = """\
[gpumarket.agents]
broken_bidder = gm_no_such_module:Bidder
not_an_agent = json:dumps
"""


@pytest.fixture
def broken_plugins(tmp_path: Path) -> Path:
    """A distribution (a bare dist-info folder) whose entry points do not load as agents."""
    site = tmp_path / "site"
    info = site / "gm_broken_plugin-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: gm-broken-plugin\nVersion: 0.0.1\n"
    )
    (info / "entry_points.txt").write_text(BROKEN_ENTRY_POINTS)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    yield site
    sys.path.remove(str(site))


def test_a_broken_plugin_is_listed_broken_with_its_error(
    broken_plugins: Path, plugin_dir: Path, tmp_path: Path
) -> None:
    status = {p.name: p for p in plugin_status()}
    assert status["broken_bidder"].error is not None
    assert "ModuleNotFoundError" in status["broken_bidder"].error
    assert "gm_no_such_module" in status["broken_bidder"].error
    assert status["not_an_agent"].error == "loads, but is not an agent (no roles)"
    assert status["flat_bidder"].error is None and status["flat_bidder"].roles == ("bidder",)
    with pytest.raises(AgentSpecError, match="failed to load"):
        make_agent("broken_bidder")
    # the CLI, in a fresh interpreter that finds both distributions on PYTHONPATH
    path = os.pathsep.join([str(broken_plugins), str(plugin_dir), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "market", "agents"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert "BROKEN" in lines["broken_bidder"] and "gm_no_such_module" in lines["broken_bidder"]
    assert "BROKEN" in lines["not_an_agent"] and "not an agent" in lines["not_an_agent"]
    assert "BROKEN" not in lines["flat_bidder"] and lines["flat_bidder"].split()[1] == "bidder"
    assert "BROKEN" not in lines["truthful"]
    assert "2 plug-in(s) cannot be used (broken_bidder, not_an_agent)" in proc.stderr


def test_py_spec_loads_any_importable_class() -> None:
    agent = make_agent("py:agents.scripted:TruthfulBidder", "bidder")
    assert isinstance(agent, TruthfulBidder)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", ["empty agent spec"]),
        ("no_such_agent", ["unknown agent", "truthful"]),
        ("truthful?colour=blue", ["unknown parameter 'colour'", "truthful parameters: (none)"]),
        (
            "colluder?partner=bidder_1",
            ["unknown parameter 'partner'", "did you mean 'partners'?", "partners, adapt, token"],
        ),
        ("py:agents.scripted", ["py:package.module:ClassName"]),
        ("py:no_such_pkg.mod:Thing", ["cannot import", "no_such_pkg"]),
        ("py:agents.scripted:NoSuchClass", ["has no attribute", "NoSuchClass"]),
        ("truthful?a=1&&=", ["key=value"]),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, words: list[str]) -> None:
    with pytest.raises(AgentSpecError) as info:
        make_agent(spec)
    for word in words:
        assert word in str(info.value)


def test_role_is_checked() -> None:
    with pytest.raises(AgentSpecError, match="cannot fill a bidder seat"):
        make_agent("fixed", "bidder")
    with pytest.raises(AgentSpecError, match="cannot fill a designer seat"):
        make_agent("truthful", "designer")


def test_spec_values_are_coerced() -> None:
    assert parse_spec("x?a=1&b=2.5&c=true&d=False&e=bidder_1,bidder_2") == (
        "x",
        {"a": 1, "b": 2.5, "c": True, "d": False, "e": "bidder_1,bidder_2"},
    )


class _Exploding(TruthfulBidder):
    name = "exploding"

    def act(self, obs):  # type: ignore[override]
        if obs.phase == "bidding":
            raise RuntimeError("agent bug")
        return super().act(obs)

    async def aact(self, obs):  # type: ignore[override]
        return self.act(obs)


def test_an_agent_exception_becomes_a_counted_fallback() -> None:
    result = run_episode("market_round", seed=3, seats={"bidder_0": _Exploding()})
    rounds = len(result.round_log)
    assert rounds == 5
    assert result.agent_errors["bidder_0"] == rounds  # one failed bidding turn per round
    assert result.last_agent_error["bidder_0"] == "RuntimeError: agent bug"
    assert all("bidder_0" not in r["bids"] or r["bids"]["bidder_0"] == [] for r in result.round_log)
    assert result.invalid_actions["bidder_0"] == 0  # the fallback is a valid abstention
    assert all(v == 0 for s, v in result.agent_errors.items() if s != "bidder_0")


class _Sleepy(TruthfulBidder):
    name = "sleepy"

    async def aact(self, obs):  # type: ignore[override]
        import asyncio

        if obs.phase == "bidding":
            await asyncio.sleep(30)
        return self.act(obs)


def test_a_hanging_async_agent_times_out_and_falls_back() -> None:
    results = run_concurrent(
        "market_round", [0, 1], seats={"bidder_1": _Sleepy}, agent_timeout=0.05
    )
    for r in results:  # a cancelled coroutine is not left running: one timeout per bidding turn
        assert r.timeouts["bidder_1"] == len(r.round_log) and r.agent_errors["bidder_1"] == 0
        assert r.last_agent_error["bidder_1"].startswith("AgentTimeout")


def test_concurrent_runs_match_serial_runs() -> None:
    seats = {"bidder_2": "truthful"}
    serial = [run_episode("market_round", seed=s, seats=seats) for s in range(3)]
    concurrent = run_concurrent("market_round", range(3), seats=seats)
    for a, b in zip(serial, concurrent, strict=True):
        assert a.returns == b.returns and a.round_log == b.round_log


def test_concurrent_runs_refuse_a_shared_agent_object() -> None:
    with pytest.raises(ValueError, match="factory"):
        run_concurrent("market_round", [0], seats={"bidder_0": TruthfulBidder()})
