"""The OpenEnv server against a client that is not honest (issue 30), on real servers bound to
127.0.0.1 (uvicorn, real WebSocket and HTTP clients, headless Chromium for the cross-origin case):

* sessions: an idle session is closed after ``idle_timeout_s`` (its slot freed, so idle sockets
  cannot lock the server), one remote address holds at most ``max_sessions_per_client``, OpenEnv's
  ``/mcp`` (whose ``openenv/session/create`` held sessions outside every limit) is not served, and
  a page of another origin can neither open a session nor post a reset;
* cost: overrides beyond ``EPISODE_MAXIMA`` are refused before the env is built, an ``agents``
  override is held to the line-up's allow-list and a judge override to the rule judge, a client
  that leaves stops its session's work, and SIGTERM stops a real ``gpumarket openenv`` promptly
  while sessions and requests are working;
* input: a binary frame, deep JSON, non-object JSON and huge integers get an error reply and the
  session plays on to the episode a local run gives; a lone surrogate is refused before anything
  is applied (WebSocket) or with 422 (HTTP); a scenario name never opens a file of the server;
* seeds: a reset without one draws 128 bits, never shown; such seeds record and replay.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv")

import httpx  # noqa: E402
from devtools import CHROMIUM, browser  # noqa: E402
from match_support import served_app, without_feedback  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import ClientConnection, connect  # noqa: E402

import market.serve.openenv_env as openenv_env  # noqa: E402
from agents.registry import make_agent  # noqa: E402
from agents.spec_policy import SpecPolicy  # noqa: E402
from market.core.actions import Bid, Wait  # noqa: E402
from market.environment.observations import Observation as SeatObservation  # noqa: E402
from market.review.replay import replay  # noqa: E402
from market.run.rollout import run_episode  # noqa: E402
from market.serve.openenv_app import OpenEnvServer, create_market_app  # noqa: E402
from market.serve.openenv_client import MarketEnvClient  # noqa: E402
from market.serve.openenv_env import EPISODE_MAXIMA, MarketEnvironment, SessionError  # noqa: E402
from scenarios import builtin_names, load_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SLOW_SPEC = "py:test_openenv_security:SlowBidder"
SLOW_ACT_S = 0.25
ACTS: list[float] = []  # when each SlowBidder decision began (in this process)


class SlowBidder:
    """A server seat that takes SLOW_ACT_S per decision and records it: work a test can see."""

    name = "slow"
    roles = frozenset({"bidder"})

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, observation: Any) -> Any:
        ACTS.append(time.monotonic())
        time.sleep(SLOW_ACT_S)
        return Bid(bids=[]) if observation.phase == "bidding" else Wait()


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/ws"


def ask(ws: ClientConnection, message: Any) -> dict[str, Any]:
    """Send one frame (a str or bytes as is, anything else as JSON) and read its reply."""
    ws.send(message if isinstance(message, str | bytes) else json.dumps(message))
    return dict(json.loads(ws.recv(timeout=60)))


def closed_code(ws: ClientConnection, limit: float = 30.0) -> int:
    """The close code the server ends ``ws`` with (waiting at most ``limit`` seconds)."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=limit)
    assert closed.value.rcvd is not None, "closed without a close frame"
    return int(closed.value.rcvd.code)


def play_raw(ws: ClientConnection, learner: str, **reset: Any) -> float:
    """A whole episode over a raw socket with a scripted learner; the learner's return."""
    policy = make_agent(learner, "bidder")
    policy.reset(0)
    reply = ask(ws, {"type": "reset", "data": reset})
    assert reply["type"] == "observation", reply
    total = reply["data"]["reward"]
    while not reply["data"]["done"]:
        obs = SeatObservation.model_validate(reply["data"]["observation"]["observation"])
        action = policy.act(obs).model_dump(mode="json", exclude_none=True)
        reply = ask(ws, {"type": "step", "data": {"action": action}})
        assert reply["type"] == "observation", reply
        assert reply["data"]["observation"]["error"] is None
        total += reply["data"]["reward"]
    return float(total)


# --- item 2: idle sessions, per-client limits, /mcp, origins -----------------------------------
def test_idle_sessions_are_closed_and_free_their_slots() -> None:
    with OpenEnvServer(max_sessions=3, idle_timeout_s=1.0) as srv, ExitStack() as stack:
        idle = [stack.enter_context(connect(ws_url(srv.url))) for _ in range(3)]
        with connect(ws_url(srv.url)) as extra:  # the server is full of idle sockets
            reply = json.loads(extra.recv(timeout=30))
            assert reply["data"]["code"] == "CAPACITY_REACHED"
        for ws in idle:
            assert closed_code(ws) == 1001  # going away: closed by the idle timeout
        assert srv.sessions.active == 0
        with connect(ws_url(srv.url)) as ws:  # the slots are free again
            reply = ask(ws, {"type": "reset", "data": {"scenario": "single_trade"}})
            assert reply["type"] == "observation"


def test_a_session_at_work_is_not_idle_and_the_client_reconnects_after_idling() -> None:
    with (
        OpenEnvServer(max_sessions=2, idle_timeout_s=1.5) as srv,
        MarketEnvClient(base_url=srv.url).sync() as env,
    ):
        result = env.reset(scenario="single_trade", seat="bidder_0", seed=3)
        for _ in range(4):  # 2 s in all, never 1.5 s without a message
            time.sleep(0.5)
            result = env.step({"action_type": "wait"})
            assert result.observation.error is None
        assert env.state().step_count == 4
        deadline = time.monotonic() + 30
        while srv.sessions.active:  # idle past the timeout: the server closes the session
            assert time.monotonic() < deadline
            time.sleep(0.1)
        again = env.reset(scenario="single_trade", seat="bidder_0", seed=3)  # reconnects
        assert again.observation.seat == "bidder_0" and env.state().step_count == 0


def _from(address: str, base: str) -> ClientConnection:
    """A WebSocket session opened from local address ``address`` (127.0.0.x)."""
    port = int(base.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(address, 0))
    return connect(ws_url(base), sock=sock)


def test_one_client_holds_at_most_its_share_of_sessions() -> None:
    reset = {"type": "reset", "data": {"scenario": "single_trade", "seed": 1}}
    with (
        OpenEnvServer(max_sessions=4, max_sessions_per_client=2) as srv,
        _from("127.0.0.1", srv.url) as first,
        _from("127.0.0.1", srv.url) as second,
    ):
        assert ask(first, reset)["type"] == ask(second, reset)["type"] == "observation"
        with _from("127.0.0.1", srv.url) as third:
            refused = json.loads(third.recv(timeout=30))
        assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED"
        assert "--max-sessions-per-client" in refused["data"]["message"]
        with _from("127.0.0.2", srv.url) as other:  # another client still gets one
            assert ask(other, reset)["type"] == "observation"
        first.close()
        deadline = time.monotonic() + 30
        while srv.sessions.active > 1:  # the closed session's slot is given back
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with _from("127.0.0.1", srv.url) as again:
            assert ask(again, reset)["type"] == "observation"
        wait = {"type": "step", "data": {"action": {"action_type": "wait"}}}
        assert ask(second, wait)["data"]["observation"]["error"] is None  # unharmed


def test_openenv_mcp_routes_cannot_hold_sessions() -> None:
    """OpenEnv's HTTP /mcp created sessions (``openenv/session/create``) that no idle timeout or
    limit covered: a few posts locked the server. They are not served."""
    create = {"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 1}
    with OpenEnvServer(max_sessions=2) as srv:
        for _ in range(4):
            reply = httpx.post(srv.url + "/mcp", json=create, timeout=30)
            assert reply.status_code in (404, 405), reply.text
        with pytest.raises(Exception):  # noqa: B017 (the handshake is refused)
            connect(srv.url.replace("http://", "ws://") + "/mcp", open_timeout=30).recv(5)
        with connect(ws_url(srv.url)) as ws:
            reset = {"type": "reset", "data": {"scenario": "single_trade"}}
            assert ask(ws, reset)["type"] == "observation"


class Spy:
    """ASGI wrapper recording what the server answered: HTTP statuses and WebSocket handshakes."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def spy(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.seen.append(("http", scope["path"], message["status"]))
            elif message["type"] in ("websocket.accept", "websocket.close"):
                self.seen.append(("websocket", scope["path"], message["type"]))
            await send(message)

        await self.app(scope, receive, spy)

    def outcome(self, kind: str, path: str) -> Any:
        found = [what for k, p, what in self.seen if k == kind and p == path]
        return found[0] if found else None


PAGE = """<!doctype html><html><body><script>
window.result = {ws: [], fetch: null};
const target = new URLSearchParams(location.search).get("target");
const ws = new WebSocket(target.replace("http://", "ws://") + "/ws");
ws.onopen = () => {
  window.result.ws.push("open");
  ws.send(JSON.stringify({type: "reset", data: {scenario: "single_trade", seed: 1}}));
};
ws.onmessage = (e) => window.result.ws.push("message:" + JSON.parse(e.data).type);
ws.onerror = () => window.result.ws.push("error");
ws.onclose = () => window.result.ws.push("close");
fetch(target + "/reset", {method: "POST", mode: "no-cors", headers: {"content-type": "text/plain"},
                         body: JSON.stringify({scenario: "single_trade"})})
  .then(() => { window.result.fetch = "done"; }, () => { window.result.fetch = "failed"; });
</script></body></html>"""


@contextmanager
def page_server() -> Iterator[str]:
    """A page on another 127.0.0.1 port (another origin; yields it) whose script drives the
    server its ``?target=`` names."""
    html = PAGE.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path.startswith("/?") else 404)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(html)))
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed")
def test_a_page_of_another_origin_cannot_drive_the_server(tmp_path: Path) -> None:
    """A page of another 127.0.0.1 port, in headless Chromium: its WebSocket to ``/ws`` is
    refused at the handshake and its POST of ``/reset`` gets 403; a server whose operator
    allowed that origin serves both (the control)."""
    outcomes = {}
    with page_server() as origin:
        for allowed in (False, True):
            spy = Spy(create_market_app(4, allow_origins=[origin] if allowed else []))
            with (
                served_app(spy, ws_max_size=1 << 20) as base,
                browser(tmp_path / f"profile-{allowed}") as page,
            ):
                page.goto(f"{origin}/?target={base}")
                done = "message:observation" if allowed else "close"
                page.wait_for(f"window.result.ws.includes({json.dumps(done)})", 60)
                page.wait_for("window.result.fetch !== null", 60)
                deadline = time.monotonic() + 30
                while spy.outcome("http", "/reset") is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                outcomes[allowed] = (
                    page.js("window.result.ws"),
                    spy.outcome("websocket", "/ws"),
                    spy.outcome("http", "/reset"),
                )
    ws_events, handshake, post = outcomes[False]
    assert "open" not in ws_events and handshake == "websocket.close", outcomes
    assert post == 403, outcomes
    ws_events, handshake, post = outcomes[True]
    assert ws_events[:2] == ["open", "message:observation"] and handshake == "websocket.accept"
    assert post not in (None, 403), outcomes  # reached the app (which wants JSON: 422)


# --- item 10: bounded overrides, a leaving client, SIGTERM --------------------------------------
def test_every_built_in_scenario_is_within_the_maxima() -> None:
    for name in builtin_names():
        MarketEnvironment._scenario(name, None)  # no SessionError


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"labs__count": 5000}, "labs.count"),
        ({"labs": {"count": 301}}, "labs.count"),
        ({"rounds": 10000}, "rounds"),
        ({"negotiation_turns": 50}, "negotiation_turns"),
        ({"labs__jobs": [1, 100000]}, "labs.jobs"),
        ({"labs__entrants": 1000}, "labs.entrants"),
        ({"jobs__arrival_rate": 20.0}, "jobs.arrival_rate"),
        ({"capacity__blocks": [1, 10_000_000]}, "capacity.blocks"),
        ({"shocks": [{"kind": "windfall", "round": 0}] * 65}, "shocks"),
        ({"agent_timeout": 1e6}, "agent_timeout"),
    ],
)
def test_overrides_beyond_the_maxima_are_refused_before_the_env_is_built(
    monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any], key: str
) -> None:
    built: list[Any] = []
    real = openenv_env.raw_env

    def counting(sc: Any) -> Any:
        built.append(sc)
        return real(sc)

    monkeypatch.setattr(openenv_env, "raw_env", counting)
    maximum = f"{EPISODE_MAXIMA[key]:g}"
    with OpenEnvServer(max_sessions=2) as srv:
        began = time.monotonic()
        with connect(ws_url(srv.url)) as ws:
            reply = ask(
                ws, {"type": "reset", "data": {"scenario": "market_round", "overrides": overrides}}
            )
        assert reply["type"] == "error" and reply["data"]["code"] == "EXECUTION_ERROR"
        message = reply["data"]["message"]
        assert f"{key} = " in message and f"maximum of {maximum}" in message, message
        assert "\n" not in message
        http = httpx.post(
            srv.url + "/reset", json={"scenario": "market_round", "overrides": overrides}
        )
        assert http.status_code == 400 and key in http.json()["detail"]
        assert time.monotonic() - began < 30  # generous: the refusal does no work
    assert built == []  # no env of that size was ever made


def test_agents_and_judge_overrides_cannot_load_code_or_call_out(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    cases = [
        ({"agents__bidders": [f"py:os:system?command=touch {marker}"]}, "not allowed"),
        ({"agents": {"designer": "py:os:system?command=id"}}, "not allowed"),
        ({"judge": "llm:openai?model=m&base_url=http://127.0.0.1:9"}, "judge must be 'rule'"),
        ({"conduct_judge": "llm:openai?model=m&base_url=http://127.0.0.1:9"}, "conduct_judge"),
    ]
    with OpenEnvServer(max_sessions=2) as srv, connect(ws_url(srv.url)) as ws:
        for overrides, reason in cases:
            data = {"scenario": "market_round", "seat": "bidder_0", "overrides": overrides}
            reply = ask(ws, {"type": "reset", "data": data})
            assert reply["type"] == "error" and reason in reply["data"]["message"], reply
        honest = {"agents__bidders": ["truthful", "shader"]}  # built-in agents stay allowed
        data = {"scenario": "market_round", "seat": "bidder_0", "seed": 2, "overrides": honest}
        assert ask(ws, {"type": "reset", "data": data})["type"] == "observation"
        assert ask(ws, {"type": "state"})["data"]["lineup"]["bidder_1"] == "shader"
    assert not marker.exists()


def _slow_lineup(labs: int) -> dict[str, Any]:
    """market_round with ``labs`` labs, the learner last: the reset plays every slow seat
    before the learner's first turn ((labs - 1) x SLOW_ACT_S seconds of work)."""
    return {
        "scenario": "market_round",
        "seat": f"bidder_{labs - 1}",
        "seed": 5,
        "overrides": {"labs__count": labs},
        "lineup": {f"bidder_{i}": SLOW_SPEC for i in range(labs - 1)},
    }


def test_a_client_that_leaves_stops_its_session_work() -> None:
    ACTS.clear()
    policy = SpecPolicy.from_lists([SLOW_SPEC])
    with OpenEnvServer(max_sessions=2, policy=policy) as srv:
        with connect(ws_url(srv.url)) as ws:
            ws.send(json.dumps({"type": "reset", "data": _slow_lineup(40)}))  # ~10 s of work
            time.sleep(1.0)
        # the client left mid-reset
        time.sleep(2 * SLOW_ACT_S + 0.5)
        stopped_at = len(ACTS)
        time.sleep(1.5)
        assert len(ACTS) == stopped_at, "the session kept working after its client left"
        assert stopped_at < 15  # far from the 39 decisions the reset needed
        deadline = time.monotonic() + 30
        while srv.sessions.active:  # and its slot is free
            assert time.monotonic() < deadline
            time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_sigterm_stops_the_server_promptly_while_sessions_work(tmp_path: Path) -> None:
    """A real ``gpumarket openenv``: a WebSocket reset and an HTTP reset each with ~20 s of
    server seats' work are in progress when SIGTERM comes; the process is gone in seconds."""
    port = _free_port()
    paths = os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "serve")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "market", "openenv", "--port", str(port)]
        + ["--allow-agent", SLOW_SPEC],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": paths},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        with connect(ws_url(base)) as ws:
            ws.send(json.dumps({"type": "reset", "data": _slow_lineup(80)}))
            posting = threading.Thread(
                target=lambda: httpx.post(base + "/reset", json=_slow_lineup(80), timeout=120),
                daemon=True,
            )
            posting.start()
            time.sleep(2.0)
            assert proc.poll() is None  # both are working
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            took = time.monotonic() - began
        assert took < 8.0, f"the server took {took:.1f} s to stop"
        _, err = proc.communicate()
        assert "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- item 11: frames that are not messages, scenario files, surrogates ----------------------------
def test_frames_that_are_not_messages_get_an_error_and_the_episode_plays_on() -> None:
    deep_array = "[" * 100_000 + "]" * 100_000  # past json's own recursion limit
    deep_object = json.dumps({"type": "step", "data": json.loads('{"a": ' * 40 + "1" + "}" * 40)})
    frames = [
        (b"\x00\x01binary", "INVALID_JSON"),
        (deep_array, "INVALID_JSON"),
        (deep_object, "INVALID_JSON"),
        ("null", "INVALID_JSON"),
        ("[1, 2]", "INVALID_JSON"),
        ('"reset"', "INVALID_JSON"),
        ('{"type": "step", "data": {"action": ' + "9" * 5000 + "}}", "INVALID_JSON"),
        ({"type": "step", "data": []}, "VALIDATION_ERROR"),
        ({"type": ["step"]}, "UNKNOWN_TYPE"),
        ({"type": "mcp", "data": {}}, "UNKNOWN_TYPE"),
    ]
    with OpenEnvServer(max_sessions=2) as srv, connect(ws_url(srv.url)) as ws:
        first = ask(ws, {"type": "reset", "data": {"scenario": "single_trade", "seed": 12}})
        assert first["type"] == "observation"
        for frame, code in frames:
            reply = ask(ws, frame)
            assert reply["type"] == "error" and reply["data"]["code"] == code, (frame, reply)
            assert "\n" not in reply["data"]["message"]
        state = ask(ws, {"type": "state"})["data"]
        assert state["step_count"] == 0  # nothing was applied
        got = play_raw(ws, "truthful", scenario="single_trade", seat="bidder_0", seed=12)
    local = run_episode("single_trade", 12, {"bidder_0": "truthful"})
    assert got == local.returns["bidder_0"]


def test_a_scenario_name_never_opens_a_file_of_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    evil = 'extends = "market_round"\nname = "evil"\nrounds = 1\nshocks = []\n'
    (tmp_path / "evil").write_text(evil)
    (tmp_path / "evil.toml").write_text(evil)
    monkeypatch.chdir(tmp_path)
    assert load_scenario("evil").name == "evil"  # a loadable scenario file, were names paths
    with OpenEnvServer(max_sessions=2) as srv, connect(ws_url(srv.url)) as ws:
        for name in ("evil", "evil.toml", "./evil", str(tmp_path / "evil.toml")):
            reply = ask(ws, {"type": "reset", "data": {"scenario": name}})
            assert reply["type"] == "error", (name, reply)
            assert "not a built-in scenario name" in reply["data"]["message"]
            http = httpx.post(srv.url + "/reset", json={"scenario": name}, timeout=30)
            assert http.status_code == 400 and "not a built-in" in http.json()["detail"]


def test_a_lone_surrogate_is_refused_before_anything_is_applied() -> None:
    seed = 31
    message = '{"action_type": "send_message", "to": "all", "text": "hi \\ud800"}'
    with OpenEnvServer(max_sessions=2) as srv, connect(ws_url(srv.url)) as ws:
        assert ask(ws, {"type": "reset", "data": {"scenario": "single_trade", "seed": seed}})
        reply = ask(ws, '{"type": "step", "data": {"action": ' + message + "}}")
        assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON"
        assert "surrogate" in reply["data"]["message"]
        reply = ask(ws, '{"type": "reset", "data": {"episode_id": "\\udc00"}}')
        assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON"
        state = ask(ws, {"type": "state"})["data"]
        assert state["step_count"] == 0 and state["invalid_actions"] == 0  # nothing applied
        # the episode goes on as if the frames had never come (the reset replays the same one)
        got = play_raw(ws, "truthful", scenario="single_trade", seat="bidder_0", seed=seed)
        for body in ('{"seed": "\\ud800"}', '{"scenario": "x\\udfff"}'):
            http = httpx.post(
                srv.url + "/reset",
                content=body,
                headers={"content-type": "application/json"},
                timeout=30,
            )
            assert http.status_code == 422 and "surrogate" in http.json()["detail"], http.text
        deep = httpx.post(
            srv.url + "/reset",
            content="[" * 5000 + "]" * 5000,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert deep.status_code == 422 and "deeper" in deep.json()["detail"]
    assert got == run_episode("single_trade", seed, {"bidder_0": "truthful"}).returns["bidder_0"]


def test_a_surrogate_inside_an_action_text_is_an_ordinary_rejected_action() -> None:
    """Inside the action's own JSON text (escaped once more), the surrogate reaches the env's
    parser, which refuses it: the documented penalty, the market unchanged, a clean reply."""
    penalty = load_scenario("single_trade").rewards.invalid_action_penalty
    text = json.dumps({"action_type": "send_message", "to": "all", "text": "\ud800"})
    assert "\\ud800" in text
    with OpenEnvServer(max_sessions=2) as srv:
        with connect(ws_url(srv.url)) as a, connect(ws_url(srv.url)) as b:
            for ws in (a, b):
                ask(ws, {"type": "reset", "data": {"scenario": "single_trade", "seed": 4}})
            ra = ask(a, {"type": "step", "data": {"action": text}})
            rb = ask(b, {"type": "step", "data": {"action": {"action_type": "wait"}}})
        assert ra["type"] == "observation" and ra["data"]["observation"]["error"]
        assert ra["data"]["reward"] == rb["data"]["reward"] - penalty
        seen_a, seen_b = (
            ra["data"]["observation"]["observation"],
            rb["data"]["observation"]["observation"],
        )
        assert without_feedback(seen_a) == without_feedback(seen_b)  # the same market
        assert seen_a["last_action"]["accepted"] is False and seen_b["last_action"]["accepted"]


# --- item 5: seeds ----------------------------------------------------------------------------
def test_a_reset_without_a_seed_draws_128_bits_never_shown() -> None:
    env = MarketEnvironment()
    seeds = []
    for _ in range(6):
        obs = env.reset(scenario="single_trade")
        assert env._episode is not None
        seed = env._episode.seed
        seeds.append(seed)
        blob = obs.model_dump_json() + env.state.model_dump_json()
        assert str(seed) not in blob
    assert all(0 <= s < 2**128 for s in seeds) and len(set(seeds)) == 6
    assert max(seeds) >= 2**100  # 63-bit draws would all fall short (chance 2**-168 otherwise)
    with pytest.raises(SessionError, match="below 2\\*\\*128"):
        env.reset(scenario="single_trade", seed=2**128)


def test_a_128_bit_seed_plays_records_and_replays(tmp_path: Path) -> None:
    seed = 2**127 + 987654321
    path = tmp_path / "big-seed.jsonl"
    local = run_episode("single_trade", seed, {"bidder_0": "truthful"}, transcript=path)
    report = replay(path)
    assert report.mismatch is None and report.seed == seed
    with OpenEnvServer(max_sessions=2) as srv, connect(ws_url(srv.url)) as ws:
        got = play_raw(ws, "truthful", scenario="single_trade", seat="bidder_0", seed=seed)
    assert got == local.returns["bidder_0"]


# --- honest load: 50 sessions at once, each its local run ---------------------------------------
@pytest.mark.slow
def test_fifty_sessions_at_once_each_equal_their_local_run() -> None:
    """The default limits leave room for honest load from one machine: 50 sessions of one
    client at once, each episode bit for bit its local run."""
    results: dict[int, float] = {}
    errors: list[BaseException] = []
    together = threading.Barrier(50, timeout=120)

    def one(seed: int) -> None:
        try:
            with connect(ws_url(srv.url)) as ws:
                together.wait()  # all 50 sessions are open at once
                results[seed] = play_raw(
                    ws, "truthful", scenario="single_trade", seat="bidder_0", seed=seed
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    with OpenEnvServer() as srv:
        threads = [threading.Thread(target=one, args=(seed,)) for seed in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert not errors, errors[:3]
    for seed, value in results.items():
        assert (
            value == run_episode("single_trade", seed, {"bidder_0": "truthful"}).returns["bidder_0"]
        )
    assert len(results) == 50
