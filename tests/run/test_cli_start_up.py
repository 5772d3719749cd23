"""Start-up of the command line (issue 34, item 9): ``gpumarket agents`` lists the built-in agents
from :mod:`market.cli.agent_catalogue` without importing them, so the listing must be the
registry's; ``gpumarket bench`` times the start-up (``startup`` section and its targets).
Which modules ``--help`` and ``agents`` load is checked in tests/test_architecture.py; how long
they take is measured by the bench, never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.registry import OTHER_SPECS, REGISTRY, description
from market.bench import suite
from market.bench.config import SECTIONS, TARGET_STARTUP_S, quick_config
from market.bench.startup import section_startup
from market.cli import agent_catalogue
from market.cli import main as cli


def test_the_catalogue_is_the_registry() -> None:
    """If this fails, an agent was added or renamed, its roles changed or its docstring was
    edited: regenerate the listing with ``python -m market.cli.agent_catalogue``."""
    expected = [
        (name, ",".join(sorted(REGISTRY[name].roles)), description(REGISTRY[name]))
        for name in sorted(REGISTRY)
    ]
    assert list(agent_catalogue.BUILT_IN) == expected
    assert agent_catalogue.OTHER_SPECS == OTHER_SPECS
    assert agent_catalogue.generate() in Path(agent_catalogue.__file__).read_text(encoding="utf-8")


def test_agents_prints_every_registered_agent(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["agents"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in REGISTRY:
        roles = ",".join(sorted(REGISTRY[name].roles))
        assert f"{name:<18} {roles:<16} {description(REGISTRY[name])}" in lines
    assert lines[-1] == f"also: {OTHER_SPECS}"


def test_the_bench_times_the_start_up() -> None:
    assert SECTIONS[0] == "startup" and suite.RUNNERS["startup"] is section_startup
    result = section_startup(quick_config())
    figures = {m["name"]: m for m in result.metrics}
    assert set(figures) == {
        "startup.help.seconds",
        "startup.agents.seconds",
        "startup.python.seconds",
    }
    assert all(m["unit"] == "s" and m["direction"] == "lower" for m in figures.values())
    assert all(0 < m["value"] < 60 for m in figures.values())
    assert [r["command"] for r in result.details["rows"]] == ["help", "agents", "python"]
    report = {"metrics": result.metrics, "details": {"startup": result.details}}
    targets = suite.targets(report)
    assert [t["target"] for t in targets] == [
        f"gpumarket --help answers in < {TARGET_STARTUP_S:g} s (median, fresh interpreter)",
        f"gpumarket agents answers in < {TARGET_STARTUP_S:g} s (median, fresh interpreter)",
    ]
    assert [t["value"] for t in targets] == [
        figures["startup.help.seconds"]["value"],
        figures["startup.agents.seconds"]["value"],
    ]
