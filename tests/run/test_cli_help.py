"""Every command's ``--help`` works: the top level (as a user types it) and every subcommand."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from market import cli


def _subcommands() -> list[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_the_parser_knows_every_documented_command() -> None:
    # the list below is the README's command table; a new command must be documented there too
    assert {
        "run",
        "eval",
        "tournament",
        "replay",
        "report",
        "show",
        "train",
        "export-sft",
        "bench",
        "validate",
        "agents",
        "openenv",
    } <= set(_subcommands())


@pytest.mark.parametrize("argv", [["-m", "market", "--help"], ["-m", "market", "-h"]])
def test_top_level_help_in_a_fresh_interpreter(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    for command in _subcommands():
        assert command in out.stdout


@pytest.mark.parametrize("command", _subcommands())
def test_every_subcommand_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gpumarket {command}")
