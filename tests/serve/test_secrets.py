"""Secrets stay secret on the real servers (uvicorn on 127.0.0.1, real HTTP clients):

- a refused action's reason ("your bids add up to 99999.00 credits but you have 254.86") states
  the seat's private budget: spectators (the live event stream, ``GET /matches/{id}``) read only
  "bidder_0's action was refused";
- an agent service's token in a seat spec (``remote?url=...&token=SECRET``) is shown and written
  as ``token=***`` everywhere: the spectator view, the creation answer, the live stream, the
  transcript; a served match's transcript is mode 0600;
- the agent service (``gpumarket serve --agent``) checks its bearer token from the headers alone,
  before reading any body (a token-less 20 MB request: 401 at once, no memory spent), bounds
  bodies (413, chunked too), and takes its token from a file or the environment, never argv;
  a ``remote`` seat reads its token from ``token_env=`` or ``token_file=``.
"""

from __future__ import annotations

import html
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from match_support import ROOT, auth, create, free_port, served, stop, wait_done, wait_ready

from agents.registry import AgentSpecError, make_agent
from market.environment import Observation
from market.record.reader import read_transcript
from market.run.rollout import run_episode
from market.serve.agent_app import MAX_BODY

SECRET = "s3cret-Tok3n-9f2c"


@contextmanager
def agent_service(
    spec: str, cwd: Path, *extra: str, env_token: str | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``gpumarket serve --agent SPEC`` on a free port; the token (if any) from the environment."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUMARKET_AGENT_TOKEN", None)
    if env_token is not None:
        env["GPUMARKET_AGENT_TOKEN"] = env_token
    cmd = [sys.executable, "-m", "market", "serve", "--agent", spec, "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        yield base, proc
    finally:
        stop(proc)


def read_events(url: str, into: list[tuple[str, dict[str, Any]]]) -> None:
    """A plain server-sent-events client: every event's (name, JSON data) until the stream ends."""
    name, data = "message", ""
    with httpx.stream("GET", url, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and data:
                into.append((name, json.loads(data)))
                name, data = "message", ""


def play_overbidding(base: str, match_id: str, token: str) -> list[float]:
    """Play a seat truthfully, except that its first bid asks 99999 credits for one block (over
    any budget: the market refuses it); returns the budgets its observations showed then."""
    inner = make_agent("truthful", "bidder")
    budgets: list[float] = []
    with httpx.Client(base_url=base, headers=auth(token), timeout=60) as client:
        while True:
            view = client.get(f"/matches/{match_id}/seat", params={"wait": 10}).json()
            if view["status"] in ("done", "aborted"):
                return budgets
            if view["status"] != "your_turn":
                continue
            if not budgets and view.get("seat_seed") is not None:
                inner.reset(view["seat_seed"])
            obs = view["observation"]
            if not budgets and obs["phase"] == "bidding":
                budgets.append(float(obs["budget"]))
                body: Any = {"action_type": "bid", "bids": [99999.0]}
            else:
                body = inner.act(Observation.model_validate(obs)).model_dump(mode="json")
            reply = client.post(
                f"/matches/{match_id}/seat/action", json={"turn": view["turn"], "action": body}
            )
            assert reply.status_code == 200, reply.text  # parsed and legal: refused by the market


def test_a_refused_actions_reason_never_reaches_spectators(tmp_path: Path) -> None:
    out = tmp_path / "served"
    with served(out) as base:
        made = create(base, "market_round", 11, {"bidder_0": "remote"}, turn_deadline=30)
        mid = made["match_id"]
        events: list[tuple[str, dict[str, Any]]] = []
        reader = threading.Thread(
            target=read_events, args=(f"{base}/matches/{mid}/live/events", events)
        )
        reader.start()
        views: list[str] = []
        budgets: list[float] = []
        player = threading.Thread(
            target=lambda: budgets.extend(play_overbidding(base, mid, made["tokens"]["bidder_0"]))
        )
        player.start()
        while player.is_alive():  # the spectator endpoint, polled while the match runs
            views.append(httpx.get(f"{base}/matches/{mid}").text)
            time.sleep(0.05)
        player.join()
        views.append(json.dumps(wait_done(base, mid)))
        reader.join(120)
        assert not reader.is_alive()
        owner = httpx.get(f"{base}/matches/{mid}/transcript", headers=auth(made["owner_token"]))
    assert owner.status_code == 200

    # the market refused the bid, and the transcript (the owner's) keeps the reason
    transcript = read_transcript(out / f"{mid}.jsonl")
    refused = [s for s in transcript.steps if s.seat == "bidder_0" and s.info.error]
    assert refused, "the over-budget bid was not refused"
    reason = refused[0].info.error
    budget = f"{budgets[0]:.2f}"
    assert "99999.00" in reason and budget in reason

    # spectators: that the action was refused, never why
    stream = json.dumps([d for _, d in events])
    assert [n for n, _ in events][-1] == "end"
    public = "\n".join(views)
    for where, text in (("live stream", stream), ("GET /matches/{id}", public)):
        i = text.find("credits but you have")
        assert i < 0, f"{where}: {text[max(0, i - 300) : i + 100]}"
        assert reason not in text and html.escape(reason) not in text, where
        assert not re.search(rf"(?<![\d.]){re.escape(budget)}(?!\d)", text), (where, budget)
    assert html.escape("bidder_0's action was refused") in stream  # in the page's HTML


def test_tokens_are_masked_in_every_view_and_in_the_transcript(tmp_path: Path) -> None:
    with agent_service("truthful", tmp_path, env_token=SECRET) as (svc, _):
        spec = f"remote?url={svc}&token={SECRET}"
        out = tmp_path / "served"
        allow = ("--allow-agent", "remote", "--allow-url", svc)
        with served(out, *allow) as base:
            made = create(
                base, "single_trade", 3, {"bidder_0": "remote", "bidder_1": spec}, turn_deadline=30
            )
            mid = made["match_id"]
            events: list[tuple[str, dict[str, Any]]] = []
            reader = threading.Thread(
                target=read_events, args=(f"{base}/matches/{mid}/live/events", events)
            )
            reader.start()
            running = httpx.get(f"{base}/matches/{mid}").json()
            inner = make_agent("truthful", "bidder")
            with httpx.Client(
                base_url=base, headers=auth(made["tokens"]["bidder_0"]), timeout=60
            ) as client:
                while True:
                    view = client.get(f"/matches/{mid}/seat", params={"wait": 10}).json()
                    if view["status"] in ("done", "aborted"):
                        break
                    if view["status"] == "your_turn":
                        action = inner.act(Observation.model_validate(view["observation"]))
                        client.post(
                            f"/matches/{mid}/seat/action",
                            json={"turn": view["turn"], "action": action.model_dump(mode="json")},
                        )
            done = wait_done(base, mid)
            reader.join(120)
            owner = httpx.get(f"{base}/matches/{mid}/transcript", headers=auth(made["owner_token"]))
        path = out / f"{mid}.jsonl"
        mode = stat.S_IMODE(path.stat().st_mode)
    masked = f"remote?url={svc}&token=***"
    assert done["status"] == "done"
    assert made["seats"]["bidder_1"] == running["seats"]["bidder_1"] == masked
    assert done["seats"]["bidder_1"] == masked
    # the service really played: no agent errors, so the token reached it
    t = read_transcript(path)
    assert t.footer is not None and t.footer.agent_errors.get("bidder_1", 0) == 0
    assert t.header.seats["bidder_1"].spec == masked
    assert not t.header.seats["bidder_1"].rebuildable  # a masked spec cannot rebuild the agent
    everything = [json.dumps(made), json.dumps(running), json.dumps(done), owner.text]
    everything += [json.dumps([d for _, d in events]), path.read_text(encoding="utf-8")]
    for text in everything:
        assert SECRET not in text
    assert masked in json.dumps(events[-2][1])  # the live view's seats table
    assert mode == 0o600, oct(mode)


def _status_of(sock: socket.socket, limit: float) -> bytes:
    sock.settimeout(limit)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def _peak_kb(pid: int) -> int:
    """The process's peak resident memory (VmHWM, kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_the_agent_service_checks_the_token_before_reading_the_body(tmp_path: Path) -> None:
    with agent_service("truthful", tmp_path, env_token=SECRET) as (svc, proc):
        port = int(svc.rsplit(":", 1)[1])
        before = _peak_kb(proc.pid)
        # a token-less 20 MB request: answered from its headers, while the body has barely begun
        with socket.create_connection(("127.0.0.1", port)) as sock:
            head = (
                "POST /act HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                "Content-Length: 20000000\r\n\r\n"
            )
            sock.sendall(head.encode() + b"[" * 65536)
            began = time.monotonic()
            answer = _status_of(sock, 10)
            took = time.monotonic() - began
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert took < 5  # generous: it does not wait for the 20 MB that never come
        # the same sent in full through a real client: refused, and no memory spent on it
        try:
            reply = httpx.post(
                f"{svc}/act",
                content=b"x" * 20_000_000,
                headers={"content-type": "application/json"},
                timeout=30,
            )
            assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer"
        except httpx.TransportError:
            pass  # the service closed the connection while the client was still writing
        assert _peak_kb(proc.pid) - before < 8 * 1024  # under 8 MB, for a 20 MB body
        # a wrong token, another scheme: 401 too; liveness needs no token, the docs do
        for header in ({"authorization": "Bearer nope"}, {"authorization": f"Basic {SECRET}"}):
            assert httpx.post(f"{svc}/reset", json={}, headers=header).status_code == 401
        assert httpx.get(f"{svc}/healthz").status_code == 200
        assert httpx.get(f"{svc}/openapi.json").status_code == 401
        good = {"authorization": f"Bearer {SECRET}"}
        assert httpx.post(f"{svc}/reset", json={"seed": 1}, headers=good).json() == {"ok": True}
        # bodies are bounded: 413 over the limit, declared or chunked
        big = b" " * (MAX_BODY + 1)
        assert httpx.post(f"{svc}/act", content=big, headers=good).status_code == 413

        def chunks() -> Iterator[bytes]:
            for _ in range(MAX_BODY // 65536 + 2):
                yield b" " * 65536

        chunked = httpx.post(f"{svc}/act", content=chunks(), headers=good, timeout=30)
        assert chunked.status_code == 413 and "too large" in chunked.text
    assert SECRET not in (proc.stderr.read() if proc.stderr else "")


def test_tokens_come_from_a_file_or_the_environment_never_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")
    token_file.chmod(0o600)
    with agent_service("random_valid", tmp_path, "--token-file", str(token_file)) as (svc, proc):
        monkeypatch.setenv("AGENT_SVC_TOKEN", SECRET)
        local = run_episode("single_trade", 5, {"bidder_0": "random_valid"})
        for spec in (
            f"remote?url={svc}&token_env=AGENT_SVC_TOKEN",
            f"remote?url={svc}&token_file={token_file}",
        ):
            far = run_episode(
                "single_trade", 5, {"bidder_0": spec}, transcript=tmp_path / "t.jsonl"
            )
            assert far.agent_errors["bidder_0"] == 0 and far.returns == local.returns
            assert read_transcript(tmp_path / "t.jsonl").header.seats["bidder_0"].spec == spec
        # without the token the service refuses every request (each decision a counted fallback)
        bare = run_episode("single_trade", 5, {"bidder_0": f"remote?url={svc}&timeout=5"})
        assert bare.agent_errors["bidder_0"] == bare.decisions["bidder_0"] > 0
        assert "HTTP 401" in bare.first_error["bidder_0"]
    started = proc.stderr.read() if proc.stderr else ""
    assert "bearer token required" in started and SECRET not in started


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            "remote?url=http://127.0.0.1:9&token_env=GM_TEST_UNSET_VAR",
            "GM_TEST_UNSET_VAR is not set",
        ),
        ("remote?url=http://127.0.0.1:9&token_file=/nonexistent/tok", "cannot read it"),
        ("remote?url=http://127.0.0.1:9&token=a&token_env=B", "one way"),
    ],
)
def test_bad_token_sources_say_what_is_wrong(spec: str, says: str) -> None:
    os.environ.pop("GM_TEST_UNSET_VAR", None)
    with pytest.raises(AgentSpecError) as err:
        make_agent(spec)
    assert says in str(err.value) and len(str(err.value).splitlines()) == 1


def test_a_remote_agents_errors_never_show_the_urls_secrets() -> None:
    port = free_port()  # nobody listens there
    result = run_episode(
        "single_trade",
        0,
        {
            "bidder_1": f"remote?url=http://user:{SECRET}@127.0.0.1:{port}/x?token={SECRET}&timeout=2"
        },
    )
    assert result.agent_errors["bidder_1"] > 0
    assert SECRET not in result.first_error["bidder_1"]
    assert "http://***@127.0.0.1" in result.first_error["bidder_1"]
    assert SECRET not in result.seats["bidder_1"]


def test_the_agent_services_own_start_up_line_and_title_mask_its_spec(tmp_path: Path) -> None:
    spec = f"remote?url=http://127.0.0.1:{free_port()}&token={SECRET}"  # a relay: valid, if odd
    with agent_service(spec, tmp_path) as (svc, proc):
        title = httpx.get(f"{svc}/openapi.json").json()["info"]["title"]
    started = proc.stderr.read() if proc.stderr else ""
    assert SECRET not in title + started
    assert "token=***" in title and "token=***" in started and "with no token" in started
