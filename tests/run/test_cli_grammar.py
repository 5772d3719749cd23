"""One command-line grammar (issue 34, item 9): ``--out`` is the folder a command writes into, for
run, play, eval and tournament alike; the same ``--seeds`` default and the same ``--workers``,
``--no-progress`` and ``--strict`` wherever episodes run; an unknown option answered with the
command's own usage; ``--version``; ``gpumarket`` alone prints its help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from market.cli import build_parser
from market.cli import main as cli
from market.cli.flags import DEFAULT_SEEDS, parse_seeds
from market.cli.parser import subcommands
from market.version import __version__

EPISODES = ("run", "eval", "tournament")


def gpumarket(*argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "market", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
        **kw,  # type: ignore[arg-type]
    )


def test_bare_gpumarket_prints_its_help_and_exits_0() -> None:
    done = gpumarket()
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: gpumarket [-h] [--version] COMMAND ...")
    for command in subcommands(build_parser()):
        assert f"\n    {command}" in done.stdout


def test_version() -> None:
    done = gpumarket("--version")
    assert done.returncode == 0 and done.stdout == f"gpumarket {__version__}\n"


@pytest.mark.parametrize("command", ["run", "eval", "tournament", "validate", "agents", "replay"])
def test_an_unknown_option_prints_the_commands_usage(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "--bogus"] + (["x.jsonl"] if command == "replay" else [])
    with pytest.raises(SystemExit) as stop:
        cli(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: gpumarket {command} ")
    assert err.strip().endswith(f"gpumarket {command}: error: unrecognized arguments: --bogus")


@pytest.mark.parametrize("command", EPISODES)
def test_every_episode_command_takes_the_same_options(command: str) -> None:
    parser = build_parser()
    args = parser.parse_args([command])
    seeds = args.seeds if isinstance(args.seeds, list) else parse_seeds(args.seeds)
    assert seeds == parse_seeds(DEFAULT_SEEDS) == list(range(10))
    flags = ["--no-progress", "--workers", "3", "--strict", "0.1", "--out", "somewhere"]
    args = parser.parse_args([command, *flags])
    assert args.no_progress and int(args.workers) == 3 and args.strict == 0.1
    assert args.out == Path("somewhere")
    text = subcommands(parser)[command].format_help()
    assert f"(default {DEFAULT_SEEDS})" in text
    assert "the folder this command writes its files into" in text


def test_play_takes_the_same_out(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    # no one at the keyboard: the game ends at once, its transcript kept in OUT itself
    done = gpumarket(
        "play", "single_trade", "--seat", "bidder_0", "--out", str(out), stdin=subprocess.DEVNULL
    )
    assert done.returncode == 130, done.stderr[-2000:]
    assert [p.name for p in out.iterdir()] == ["0.jsonl"]


def test_run_eval_and_tournament_write_into_out_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--seeds", "0:1", "--workers", "1", "--no-progress"]
    assert cli(["run", "single_trade", *common, "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "results.jsonl").is_file()
    assert (tmp_path / "r" / "transcripts" / "0.jsonl").is_file()
    argv = ["eval", "--agents", "truthful", "--scenarios", "single_trade", *common]
    assert cli([*argv, "--out", str(tmp_path / "e")]) == 0
    assert (tmp_path / "e" / "eval.csv").is_file()
    argv = ["tournament", "--bidders", "truthful,idle", "--scenario", "single_trade", *common]
    assert cli([*argv, "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "ratings.csv").is_file()
    capsys.readouterr()


def test_an_out_of_the_old_layout_is_pointed_at_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["run", "single_trade", "--seeds", "0:1", "--workers", "1", "--no-progress"]
    assert cli([*common, "--out", str(tmp_path / "runs" / "single_trade")]) == 0
    capsys.readouterr()
    # ``--out runs`` used to mean runs/single_trade: say so rather than start a second run
    assert cli([*common, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"resume it with --out {tmp_path / 'runs' / 'single_trade'}" in err
    assert not (tmp_path / "runs" / "results.jsonl").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--workers", "0"], "--workers '0': give at least 1"),
        (["eval", "--workers", "x"], "--workers 'x': give a whole number"),
        (["run", "--seeds", "5:2"], "selects no seed"),
    ],
)
def test_bad_values_are_usage_errors_of_the_command(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        cli(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: gpumarket {argv[0]} ") and message in err


def test_the_validate_argument_has_help() -> None:
    text = subcommands(build_parser())["validate"].format_help()
    assert "SCENARIO" in text
    assert "a scenario file (.toml) or a built-in scenario name" in text
