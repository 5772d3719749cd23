"""Every example in ``gpumarket COMMAND --help`` works (issue 34, item 7): each ``gpumarket ...``
line of :data:`market.cli.EXAMPLES` is parsed by the real parser, its agent specs are built with
:func:`agents.registry.make_agent` in the seats they name and its scenarios loaded, and the
examples that run in seconds are run, on a tiny seed range, in one folder in the order a user
would type them (``run`` first, then ``replay``, ``report``, ``show``, ``export-sft`` of its
folder). Examples that need a server, a cluster, torch or minutes are parsed and resolved only.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from agents.registry import WITH_PARAMS, make_agent, parse_spec
from market.cli import EXAMPLES, build_parser
from market.cli import main as cli
from market.cli.flags import parse_specs
from scenarios import load_scenario

COMMAND = re.compile(r"gpumarket [a-z-]+(?:[^()\n]*?)(?=\s{3}\(|\)|\n|$)")

#: the examples run for real (after shrinking): none needs a server, a cluster, torch or minutes
RUN = {"run", "eval", "tournament", "validate", "agents", "replay", "report", "show", "export-sft"}
#: examples that stay parsed only, though their command is run elsewhere: Ray, the mechanism
#: comparison and the expert matrix (minutes), an LLM leaderboard (a model server), a torch policy
PARSE_ONLY = ("--backend ray", "--mechanisms", "--expert-matrix", "--leaderboard", "torch_policy")


#: the run example whose folder the reading examples (:data:`READERS`) open
RUN_EXAMPLE = "gpumarket run market_round --seeds 0:20 --seat bidder_0=rule_expert"
READERS = ("replay", "report", "show", "export-sft")


def examples() -> list[str]:
    found = []
    for text in EXAMPLES.values():
        found += [m.group(0).strip() for m in COMMAND.finditer(text)]
    return list(dict.fromkeys(found))


def test_every_command_has_an_example_found_here() -> None:
    commands = {shlex.split(line)[1] for line in examples()}
    assert commands == set(EXAMPLES)
    assert len(examples()) >= 25  # continuation lines and "(then: gpumarket ...)" ones included


def role(seat: str) -> str:
    return "designer" if seat.startswith("designer") else "bidder"


def resolve(spec: str, seat_role: str) -> None:
    """Build the agent as a run would; an agent that needs a file it names (a torch policy
    checkpoint written by the train example) is checked by name only."""
    name, _ = parse_spec(spec)
    if name in WITH_PARAMS and name != "remote":
        return
    make_agent(spec, seat_role)


def specs_and_scenarios(args: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """(spec, role) pairs and scenario names of parsed arguments."""
    specs: list[tuple[str, str]] = []
    for item in getattr(args, "seat", None) or []:
        if isinstance(item, tuple):
            specs.append((item[1], role(item[0])))
        elif "=" in item:  # play: SEAT=AGENT beside the bare seat you play
            seat, _, spec = item.partition("=")
            specs.append((spec, role(seat)))
    if args.command == "eval" and args.agents:
        specs += [(s, role(args.seat)) for s in parse_specs(args.agents)]
    if args.command == "tournament":
        specs += [(s, "bidder") for s in parse_specs(args.bidders)]
        specs += [(s, "designer") for s in parse_specs(args.designers)]
    if args.command == "serve" and args.agent:
        specs.append((args.agent, "bidder"))
    scenarios = [getattr(args, "scenario", None)] + list(getattr(args, "scenarios", None) or [])
    if args.command == "eval" and args.scenarios:
        scenarios = parse_specs(args.scenarios) + ([args.scenario] if args.mechanisms else [])
    return specs, [s for s in scenarios if s]


def shrink(argv: list[str]) -> list[str]:
    """The example on a tiny seed range, one worker, no progress bar."""
    out = list(argv)
    for flag, value in (
        ("--seeds", "0:1" if argv[0] == "tournament" else "0:2"),
        ("--workers", "1"),
    ):
        if flag in out:
            out[out.index(flag) + 1] = value
        elif argv[0] in ("run", "eval", "tournament"):
            out += [flag, value]
    if argv[0] in ("run", "eval", "tournament"):
        out.append("--no-progress")
    return out


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the examples run in: ``my_scenario.toml`` (the validate example's file)."""
    folder = tmp_path_factory.mktemp("examples")
    (folder / "my_scenario.toml").write_text('extends = "market_round"\n', encoding="utf-8")
    return folder


@pytest.mark.parametrize("line", examples())
def test_the_example_works(
    line: str, workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(workspace)
    argv = shlex.split(line)[1:]
    args = build_parser().parse_args(argv)  # an unknown flag or a bad value: SystemExit
    specs, scenarios = specs_and_scenarios(args)
    for spec, seat_role in specs:
        resolve(spec, seat_role)
    for name in scenarios:
        load_scenario(name)
    if args.command not in RUN or any(flag in line for flag in PARSE_ONLY):
        return
    if argv[0] in READERS and not (workspace / "runs" / "market_round").exists():
        # xdist may give this example a worker that has not run the run example: run it here
        assert cli(shrink(shlex.split(RUN_EXAMPLE)[1:])) == 0
        capsys.readouterr()
    code = cli(shrink(argv))
    got = capsys.readouterr()
    assert code == 0, got.err[-2000:]
    assert "Traceback" not in got.err


def test_examples_run_in_a_users_order() -> None:
    """The run example comes before the examples that read its folder, so the parametrized
    test runs them in that order."""
    lines = examples()
    first_run = lines.index(RUN_EXAMPLE)
    for command in READERS:
        later = [i for i, line in enumerate(lines) if line.startswith(f"gpumarket {command} ")]
        assert later and min(later) > first_run, command
