"""Helpers for the served-match tests: the real ``gpumarket serve`` in a subprocess on a free
127.0.0.1 port, any ASGI app on real uvicorn in a thread (:func:`served_app`), and a scripted
client that plays a remote seat over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from real_model_utils import free_port

from agents.registry import make_agent
from market.environment import Observation
from market.environment.observations import FEEDBACK_FIELDS

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def served(out: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``gpumarket serve --out OUT`` with ``extra`` flags (and ``env`` added to the environment)
    on a free port; yields its base URL; SIGTERM at the end."""
    port = free_port()
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = [sys.executable, "-m", "market", "serve", "--port", str(port), "--out", str(out), *extra]
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, cwd=out.parent, env=full, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        yield base
    finally:
        stop(proc)


def wait_ready(base: str, proc: subprocess.Popen[str], limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not start within the limit")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def create(base: str, scenario: str, seed: int, seats: dict[str, str], **kw: Any) -> dict[str, Any]:
    reply = httpx.post(
        f"{base}/matches", json={"scenario": scenario, "seed": seed, "seats": seats, **kw}
    )
    assert reply.status_code == 201, reply.text
    return reply.json()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def play_seat(base: str, match_id: str, token: str, spec: str) -> dict[str, Any]:
    """Play a remote seat with the agent ``spec`` until the match ends; returns the last view.
    The agent is seeded with the seat seed the server gives, as a local run seeds it."""
    agent = make_agent(spec)
    seeded = False
    with httpx.Client(base_url=base, headers=auth(token), timeout=60) as client:
        while True:
            view = client.get(f"/matches/{match_id}/seat", params={"wait": 10}).json()
            if not seeded and view.get("seat_seed") is not None:
                agent.reset(view["seat_seed"])
                seeded = True
            if view["status"] == "your_turn":
                action = agent.act(Observation.model_validate(view["observation"]))
                body = action if isinstance(action, dict) else action.model_dump(mode="json")
                reply = client.post(
                    f"/matches/{match_id}/seat/action", json={"turn": view["turn"], "action": body}
                )
                assert reply.status_code == 200, reply.text
            elif view["status"] in ("done", "aborted"):
                return view


def wait_done(base: str, match_id: str, limit: float = 60.0) -> dict[str, Any]:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        view = httpx.get(f"{base}/matches/{match_id}").json()
        if view["status"] != "running":
            return view
        time.sleep(0.05)
    raise AssertionError(f"match {match_id} still running after {limit} s")


@contextmanager
def served_app(app: Any, **config: Any) -> Iterator[str]:
    """Any ASGI app on real uvicorn (``config``: more ``uvicorn.Config`` options) on a free
    127.0.0.1 port, in a thread; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def without_feedback(obs: dict[str, Any] | None) -> dict[str, Any]:
    """A seat's observation JSON without its feedback on its own last action
    (``FEEDBACK_FIELDS``: what the env made of that action), i.e. the market it sees."""
    return {k: v for k, v in (obs or {}).items() if k not in FEEDBACK_FIELDS}
