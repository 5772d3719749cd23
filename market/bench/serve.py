"""The served-matches load benchmark: many concurrent sessions of scripted remote clients against
a real ``gpumarket serve`` on 127.0.0.1.

The server runs in its own process (as in use); the clients are asyncio tasks in this one, each
holding one remote seat (``bidder_0``, played by ``truthful``) of its own match and playing a
fixed number of decisions, starting a new match when one ends. Figures:

- ``serve_decisions_per_s``: remote decisions taken per second, all sessions together;
- ``serve_step_latency_p50_ms`` / ``_p99_ms``: a *step* is one remote decision's round trip as
  the client waits on it: from sending its action to holding its next observation (the server
  checks and applies the action, plays the server-run seats up to the seat's next turn, records
  every step in the transcript, and answers).
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agents.registry import make_agent
from market.bench.config import BenchConfig, SectionResult, SectionSkipped, metric
from market.core.actions import parse_action
from market.environment import Observation

ROOT = Path(__file__).resolve().parents[2]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank rule."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _session(
    client: httpx.AsyncClient,
    index: int,
    decisions: int,
    scenario: str,
    latencies: list[float],
    digest_every: int,
) -> int:
    """One client: ``decisions`` remote decisions over as many matches as it takes."""
    done, match = 0, 0
    while done < decisions:
        made = await client.post(
            "/matches",
            json={
                "scenario": scenario,
                "seed": index * 1000 + match,
                "seats": {"bidder_0": "remote"},
                "turn_deadline": 120,
                "digest_every": digest_every,
            },
        )
        made.raise_for_status()
        body = made.json()
        url = f"/matches/{body['match_id']}/seat"
        headers = {"Authorization": f"Bearer {body['tokens']['bidder_0']}"}
        agent = make_agent("truthful")
        view = (await client.get(url, params={"wait": 30}, headers=headers)).json()
        agent.reset(view["seat_seed"])  # set by the seat's first turn
        sent: float | None = None
        while view["status"] in ("waiting", "your_turn"):
            if view["status"] == "your_turn":
                if sent is not None:
                    latencies.append(time.perf_counter() - sent)
                if done >= decisions:
                    break
                action = parse_action(agent.act(Observation.model_validate(view["observation"])))
                sent = time.perf_counter()
                reply = await client.post(
                    f"{url}/action",
                    json={"turn": view["turn"], "action": action.model_dump(mode="json")},
                    headers=headers,
                )
                reply.raise_for_status()
                done += 1
            view = (await client.get(url, params={"wait": 30}, headers=headers)).json()
        if sent is not None and view["status"] not in ("waiting", "your_turn"):
            latencies.append(time.perf_counter() - sent)  # the last action ended the match
        match += 1
    return done


async def _load(
    base: str, sessions: int, decisions: int, scenario: str, digest_every: int
) -> dict[str, Any]:
    """Every session its own client and connection, as separate remote agents would be (one
    shared httpx pool spends time linear in its connections on every request)."""
    latencies: list[float] = []

    async def one(index: int) -> int:
        # verify=False: plain http on 127.0.0.1, and no CA bundle loaded per client
        async with httpx.AsyncClient(base_url=base, timeout=120, verify=False) as client:
            return await _session(client, index, decisions, scenario, latencies, digest_every)

    began = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(sessions)))
    seconds = time.perf_counter() - began
    return {"decisions": sum(counts), "seconds": seconds, "latencies": latencies}


def load_test(
    sessions: int = 64, decisions: int = 20, scenario: str = "market_round", digest_every: int = 10
) -> dict[str, Any]:
    """Start ``gpumarket serve`` on a free 127.0.0.1 port, run ``sessions`` concurrent clients of
    ``decisions`` remote decisions each (their matches recorded with digests every
    ``digest_every`` steps, as the transcript section does), stop the server; the figures and
    their inputs."""
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        raise SectionSkipped("needs the serve extra: pip install 'gpumarket[serve]'")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "market", "serve", "--port", str(port), "--out", tmp]
        cmd += ["--max-matches-per-client", "0"]  # every session comes from this one address
        proc = subprocess.Popen(
            cmd, cwd=tmp, env={**os.environ, "PYTHONPATH": path}, stderr=subprocess.DEVNULL
        )
        try:
            _wait_ready(base, proc)
            got = asyncio.run(_load(base, sessions, decisions, scenario, digest_every))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    lat = got["latencies"]
    return {
        "sessions": sessions,
        "decisions_per_session": decisions,
        "scenario": scenario,
        "digest_every": digest_every,
        "decisions": got["decisions"],
        "seconds": got["seconds"],
        "decisions_per_s": got["decisions"] / got["seconds"],
        "latency_p50_ms": 1000 * percentile(lat, 0.50),
        "latency_p99_ms": 1000 * percentile(lat, 0.99),
        "latency_samples": len(lat),
    }


def _wait_ready(base: str, proc: subprocess.Popen[bytes], limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"gpumarket serve exited with status {proc.returncode}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("gpumarket serve did not answer within 60 s")


def section_serve(config: BenchConfig) -> SectionResult:
    """The ``serve`` section: :func:`load_test` with the config's sizes."""
    got = load_test(
        config.serve_sessions, config.serve_decisions, config.serve_scenario, config.digest_every
    )
    context = {"sessions": got["sessions"], "scenario": got["scenario"]}
    return SectionResult(
        [
            metric(
                "serve_decisions_per_s", got["decisions_per_s"], "1/s", "higher", "serve", context
            ),
            metric(
                "serve_step_latency_p50_ms", got["latency_p50_ms"], "ms", "lower", "serve", context
            ),
            metric(
                "serve_step_latency_p99_ms", got["latency_p99_ms"], "ms", "lower", "serve", context
            ),
        ],
        got,
    )
