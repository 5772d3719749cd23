"""The ``remote`` agent seats an agent service at a URL in a local run: against the real
``gpumarket serve --agent`` (uvicorn on 127.0.0.1) it plays exactly as the agent does locally;
a service that is down or refuses costs the seat its fallback, counted, never the episode."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from match_support import ROOT, free_port, stop, wait_ready

from agents.registry import AgentSpecError, make_agent
from market.cli import main
from market.run.rollout import arun_episode, run_episode, run_many


@contextmanager
def agent_service(spec: str, cwd: Path, token: str | None = None) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "market", "serve", "--agent", spec, "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUMARKET_AGENT_TOKEN", None)
    if token:  # never in argv: the environment variable (or --token-file)
        env["GPUMARKET_AGENT_TOKEN"] = token
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        yield base
    finally:
        stop(proc)


def test_a_remote_seat_plays_as_the_agent_does_locally(tmp_path: Path) -> None:
    with agent_service("random_valid", tmp_path, token="s3cret") as url:
        spec = f"remote?url={url}&token=s3cret"
        seats = {"bidder_0": spec}
        far = run_episode("market_round", 7, seats, transcript=tmp_path / "remote.jsonl")
        near = run_episode("market_round", 7, {"bidder_0": "random_valid"})
        assert far.returns == near.returns
        assert far.agent_errors["bidder_0"] == 0 and far.timeouts["bidder_0"] == 0
        assert far.agent_stats["bidder_0"]["remote_requests"] == 1 + far.decisions["bidder_0"]
        # the async path (aact) plays the same; so do episodes one after another (the service
        # holds one agent: it plays one seat of one episode at a time, reset between episodes)
        assert asyncio.run(arun_episode("market_round", 7, seats)).returns == near.returns
        both = run_many("market_round", [8, 7], seats)
        assert (
            both[0].returns == run_episode("market_round", 8, {"bidder_0": "random_valid"}).returns
        )
        assert both[1].returns == near.returns
        # a wrong token: every request refused (401); the episode ends, every decision a
        # counted fallback
        wrong = run_episode("single_trade", 0, {"bidder_0": f"remote?url={url}&token=nope"})
    assert wrong.agent_errors["bidder_0"] == wrong.decisions["bidder_0"] > 0
    assert "HTTP 401" in wrong.first_error["bidder_0"]


def test_an_unreachable_service_falls_back_and_is_counted() -> None:
    port = free_port()  # nobody listens there
    result = run_episode(
        "single_trade", 0, {"bidder_1": f"remote?url=http://127.0.0.1:{port}&timeout=2"}
    )
    assert result.agent_errors["bidder_1"] == result.decisions["bidder_1"] > 0
    assert "RemoteAgentError" in result.first_error["bidder_1"]
    idle = run_episode("single_trade", 0, {"bidder_1": "idle"})
    assert result.returns == idle.returns  # the fallback is what idle does


@pytest.mark.parametrize(
    "spec",
    ["remote", "remote?url=ftp://x", "remote?url=http://x&timeout=0", "remote?url=http://x&k=1"],
)
def test_bad_remote_specs_say_what_is_wrong(spec: str) -> None:
    with pytest.raises(AgentSpecError) as err:
        make_agent(spec)
    assert "remote" in str(err.value)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--port", "0"], "--port 0"),
        (["serve", "--agent", "no_such_agent"], "unknown agent 'no_such_agent'"),
        (["serve", "--keep", "0"], "--keep"),
        (["serve", "--agent", "truthful", "--token", "T"], "--token-file PATH"),
        (["serve", "--agent", "truthful", "--token-file", "/nonexistent/t"], "cannot read it"),
        (["serve", "--token-file", "/nonexistent/t"], "is for an agent service"),
    ],
)
def test_serve_refuses_bad_options_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err
