"""Env refusals in agent health: counted per seat, shown in the health table, and failing
``--strict`` when they exceed its share (exit code 3, docs/running.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from agents.base import BaseAgent
from market.cli import main as cli
from market.core.actions import ActionModel, AllocateToJob
from market.environment import Observation
from market.review.report import load_episodes
from market.run.health import STRICT_EXIT, from_episodes, from_rows, print_health, strict_failures


class Refused(BaseAgent):
    """Every action names a job it does not have: the env refuses each one."""

    name = "refused"
    roles = frozenset({"bidder"})

    def act(self, observation: Observation) -> ActionModel:
        return AllocateToJob(job_id="no_such_job", blocks=1)


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_six_refused_actions_in_six_decisions_fail_strict_ten_percent() -> None:
    rows = [
        {"seat": "bidder_0", "agent": "llm:hf", "decisions": 6, "invalid_actions": 6},
        {"seat": "bidder_1", "agent": "truthful", "decisions": 6, "invalid_actions": 0},
    ]
    health = from_rows(rows)
    seat = health[0]
    assert (seat.refused, seat.fallbacks, seat.refused_share) == (6, 0, 1.0)
    assert strict_failures(health, 0.10) == [
        "bidder_0 (llm:hf) had 6 of 6 actions refused by the env (100.0%), above --strict 0.1"
    ]
    console = Console(record=True, width=200)
    print_health(console, health, strict=0.10)
    out = flat(console.export_text())
    assert "refused" in out and "6 (100%)" in out
    assert "bidder_0 (llm:hf) had 6 of its 6 actions refused by the env (100%)" in out
    assert "bidder_1" not in out  # a healthy seat is not listed
    # one refusal in ten decisions is within 10%
    ok = from_rows([{"seat": "bidder_0", "agent": "x", "decisions": 10, "invalid_actions": 1}])
    assert strict_failures(ok, 0.10) == []


def test_run_strict_fails_on_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = [
        "run",
        "single_trade",
        "--seeds",
        "0:1",
        "--seat",
        "bidder_0=py:test_health_refusals:Refused",
        "--out",
        str(tmp_path),
        "--workers",
        "1",
        "--no-progress",
    ]
    assert cli(base) == 0  # without --strict the run succeeds, and says so
    out = flat(capsys.readouterr().out)
    match = re.search(r"py:test_health_refusals:Refused\) had (\d+) of its (\d+) actions", out)
    assert match is not None, out
    assert match.group(1) == match.group(2) and int(match.group(1)) >= 1
    assert cli([*base, "--strict", "10%"]) == STRICT_EXIT
    err = flat(capsys.readouterr().err)
    assert "actions refused by the env (100.0%), above --strict 0.1" in err
    # the transcripts say the same (the HTML report's health box)
    (seat,) = [h for h in from_episodes(load_episodes(tmp_path)) if h.seat == "bidder_0"]
    assert seat.refused == seat.decisions == int(match.group(1))
