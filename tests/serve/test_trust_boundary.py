"""The trust boundary (docs/security.md): a line-up that comes over the network never imports
code, reads the server's terminal or makes the server call a URL unless the operator allowed it
at start-up (agents/spec_policy.py), the specs in a transcript are never run by
``replay --update``, and the guards in front of both servers (market/serve/guards.py) refuse
cross-origin browser requests and request bodies that are too large or too slow.

Every server here is real: uvicorn on a free 127.0.0.1 port (the OpenEnv server in a thread,
``gpumarket serve`` as a subprocess), driven by httpx and a raw socket."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv")

import httpx  # noqa: E402
from match_support import served, served_app  # noqa: E402

from agents.spec_policy import SpecPolicy, SpecRefused  # noqa: E402
from market.cli import main as cli  # noqa: E402
from market.core.actions import ActionParseError, parse_action  # noqa: E402
from market.record.transcript import read_transcript  # noqa: E402
from market.review.replay import replay  # noqa: E402
from market.run.rollout import run_episode  # noqa: E402
from market.serve.http_protocol import protocol_class  # noqa: E402
from market.serve.match_app import create_app  # noqa: E402
from market.serve.openenv_app import OpenEnvServer  # noqa: E402
from market.serve.openenv_client import MarketEnvClient  # noqa: E402

# --- the policy, read from the spec's text ------------------------------------------------------
ALLOWED = [
    ("truthful", [], []),
    ("rule_expert?hedge=false&confidence=0.9", [], []),
    ("remote?url=http://127.0.0.1:9000", ["remote"], ["http://127.0.0.1:9000"]),
    ("remote?url=http://127.0.0.1:9000/agents/a", ["remote"], ["http://127.0.0.1:9000/agents"]),
    (
        "llm:openai?model=m&base_url=http://127.0.0.1:8000/v1",
        ["llm:openai"],
        ["http://127.0.0.1:8000"],
    ),
    ("torch_policy?path=/models/p.pt", ["torch_policy?path=/models/p.pt"], []),  # pinned exactly
    ("py:agents.scripted:TruthfulBidder", ["py:agents.scripted:TruthfulBidder"], []),
]
REFUSED = [
    ("py:os:system?command=id", [], [], "--allow-agent py:os:system"),
    ("human", [], [], "--allow-agent human"),
    ("torch_policy?path=/tmp/x.pt", [], [], "--allow-agent torch_policy"),
    ("torch_policy?path=/tmp/x.pt", ["torch_policy"], [], "'path' names a file"),
    ("llm:hf?path=/models/m.gguf", ["llm:hf"], [], "'path' names a file"),
    ("llm:openai?model=m&cache=/etc/x", ["llm:openai"], [], "'cache' names a file"),
    ("remote?url=http://127.0.0.1:9000", [], ["http://127.0.0.1:9000"], "--allow-agent remote"),
    ("remote?url=http://127.0.0.1:9000", ["remote"], [], "--allow-url http://127.0.0.1:9000"),
    ("remote?url=http://127.0.0.1:9001", ["remote"], ["http://127.0.0.1:9000"], "--allow-url"),
    ("remote?url=https://127.0.0.1:9000", ["remote"], ["http://127.0.0.1:9000"], "--allow-url"),
    (
        "remote?url=http://127.0.0.1:9000@evil.example",
        ["remote"],
        ["http://127.0.0.1:9000"],
        "user name or password",
    ),
    ("remote?url=http://127.0.0.1:9000/v10", ["remote"], ["http://127.0.0.1:9000/v1"], "url="),
    (
        "remote?url=http://127.0.0.1:9000&token_env=HOME",
        ["remote"],
        ["http://127.0.0.1:9000"],
        "'token_env'",
    ),
    ("colluder?partners=http://10.0.0.1/x", [], [], "--allow-url http://10.0.0.1:80"),
    ("llm:openai?model=m", [], [], "--allow-agent llm:openai"),
]


@pytest.mark.parametrize(("spec", "agents", "urls"), ALLOWED)
def test_the_policy_allows_builtins_and_what_the_operator_listed(
    spec: str, agents: list[str], urls: list[str]
) -> None:
    SpecPolicy.from_lists(agents, urls).check(spec)


@pytest.mark.parametrize(("spec", "agents", "urls", "says"), REFUSED)
def test_the_policy_refuses_code_files_and_urls_not_listed(
    spec: str, agents: list[str], urls: list[str], says: str
) -> None:
    with pytest.raises(SpecRefused) as err:
        SpecPolicy.from_lists(agents, urls).check(spec)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_bad_allow_url_is_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match="--allow-url"):
        SpecPolicy.from_lists([], ["ftp://example.org"])
    assert cli(["openenv", "--allow-url", "not a url"]) == 2
    assert cli(["serve", "--allow-origin", "null"]) == 2
    assert cli(["serve", "--allow-any-spec"]) == 2  # gone: the message names its replacement


# --- the OpenEnv server: no code, no terminal, no URL from a line-up ------------------------
class _Recorder(BaseHTTPRequestHandler):
    """An agent service that records every request it gets and answers ``wait``."""

    seen: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (the http.server name)
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        type(self).seen.append(self.path)
        body = json.dumps({"ok": True, "action": {"action_type": "wait"}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def recorder() -> Iterator[str]:
    _Recorder.seen = []
    http = HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}"
    finally:
        http.shutdown()
        http.server_close()


def test_an_openenv_lineup_never_runs_code_reads_stdin_or_calls_out(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with recorder() as service, OpenEnvServer(max_sessions=2) as server:
        attacks = {
            f"py:os:system?command=touch {marker}": "--allow-agent py:os:system",
            "human": "--allow-agent human",
            f"remote?url={service}": "--allow-agent remote",
            f"torch_policy?path={tmp_path / 'p.pt'}": "--allow-agent torch_policy",
        }
        for spec, says in attacks.items():
            body = {"scenario": "single_trade", "seed": 1, "lineup": {"bidder_1": spec}}
            reply = httpx.post(server.url + "/reset", json=body, timeout=30)
            assert reply.status_code == 400, (spec, reply.text)
            assert says in reply.json()["detail"]
            with MarketEnvClient(base_url=server.url).sync() as env:  # the WebSocket session
                with pytest.raises(RuntimeError, match="not allowed from the network"):
                    env.reset(scenario="single_trade", seed=1, lineup={"bidder_1": spec})
                assert env.reset(scenario="single_trade", seed=1).observation.seat == "bidder_0"
        assert not marker.exists()
        assert _Recorder.seen == []  # no request reached the URL
        assert httpx.get(server.url + "/health").json()["status"] == "healthy"


def test_an_operator_allowed_agent_service_is_called(tmp_path: Path) -> None:
    """The positive control: with the agent and its URL allowed, the line-up's remote seat
    plays through the service."""
    with recorder() as service:
        policy = SpecPolicy.from_lists(["remote"], [service])
        with (
            OpenEnvServer(max_sessions=1, policy=policy) as server,
            MarketEnvClient(base_url=server.url).sync() as env,
        ):
            result = env.reset(
                scenario="single_trade", seed=1, lineup={"bidder_1": f"remote?url={service}"}
            )
            while not result.done:
                result = env.step({"action_type": "wait"})
        assert "/reset" in _Recorder.seen and "/act" in _Recorder.seen


# --- served matches -------------------------------------------------------------------------
def test_a_served_match_lineup_never_runs_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = f"py:os:system?command=touch {marker}"
    ok = "py:agents.scripted:TruthfulBidder"
    with served(tmp_path / "out", "--allow-agent", ok) as base:
        for spec in (evil, "human", "llm:openai?model=m&base_url=http://127.0.0.1:1"):
            body = {"scenario": "single_trade", "seats": {"bidder_0": "remote", "bidder_1": spec}}
            reply = httpx.post(f"{base}/matches", json=body, timeout=30)
            assert reply.status_code == 422 and "--allow-agent" in reply.json()["error"]
        body = {"scenario": "single_trade", "seats": {"bidder_0": "remote", "bidder_1": ok}}
        assert httpx.post(f"{base}/matches", json=body, timeout=30).status_code == 201
    assert not marker.exists()


# --- replay --update runs the user's specs, never the file's ----------------------------------
def _forge_seat(path: Path, seat: str, spec: str) -> None:
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["seats"][seat] = {**header["seats"][seat], "spec": spec, "name": spec}
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")


def test_replay_update_never_runs_the_specs_in_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "shared.jsonl"
    run_episode(
        "single_trade", 3, {"bidder_0": "truthful", "bidder_1": "truthful"}, transcript=path
    )
    marker = tmp_path / "pwned"
    _forge_seat(path, "bidder_1", f"py:os:system?command=touch {marker}")
    assert cli(["replay", "--update", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--seat bidder_1=SPEC" in err and "never run" in err
    assert not marker.exists()
    assert cli(["replay", "--update", str(path), "--seat", "bidder_1=truthful"]) == 0
    assert not marker.exists()
    t = read_transcript(path)
    assert t.header.seats["bidder_1"].spec == "truthful" and replay(t).ok
    assert cli(["replay", str(path), "--seat", "bidder_1=truthful"]) == 2  # --seat needs --update


# --- a lone surrogate is refused before it is applied ----------------------------------------
def test_parse_action_refuses_lone_surrogates_anywhere() -> None:
    for raw in (
        '{"action_type": "send_message", "to": "all", "text": "hi \\ud800"}',
        {"action_type": "wait", "reasoning": "\udfff"},
        {"action_type": "propose_offer", "to": "bidder_1", "conditions": ["\ud83d"]},
        {"action_type": "wait", "\ud800": 1},
    ):
        with pytest.raises(ActionParseError, match="lone UTF-16 surrogate"):
            parse_action(raw)
    text = parse_action('{"action_type": "send_message", "to": "all", "text": "\\ud83d\\ude00"}')
    assert text.text == "\U0001f600"  # a surrogate pair is one character, and fine


# --- the guards: origins, body size and time ---------------------------------------------------
MATCH = {"scenario": "single_trade", "seats": {"bidder_0": "remote"}}


def test_cross_origin_requests_are_refused_and_dns_rebinding_too(tmp_path: Path) -> None:
    app = create_app(tmp_path, allow_origins=["http://127.0.0.1:3000"])
    with served_app(app, http=protocol_class(1.0)) as base:
        port = base.rsplit(":", 1)[1]

        def post(**headers: str) -> int:
            return httpx.post(
                f"{base}/matches", json=MATCH, headers=headers, timeout=30
            ).status_code

        assert post() == 201  # no Origin: not a browser's cross-origin request
        assert post(origin=base) == 201  # the server's own page
        assert post(origin=f"http://localhost:{port}", host=f"localhost:{port}") == 201
        assert post(origin="http://127.0.0.1:3000") == 201  # listed by the operator
        assert post(origin="http://evil.example") == 403
        assert post(origin=f"http://127.0.0.1:{int(port) + 1}") == 403  # another port
        assert post(origin="null") == 403  # a sandboxed frame or a file: page
        # DNS rebinding: a page of a domain that resolves to 127.0.0.1 sends matching headers
        assert post(origin=f"http://rebind.example:{port}", host=f"rebind.example:{port}") == 403
        reply = httpx.post(f"{base}/matches", json=MATCH, headers={"origin": "http://e.x"})
        assert "--allow-origin" in reply.json()["error"]
        assert httpx.get(f"{base}/healthz", headers={"origin": "http://e.x"}).status_code == 200


def test_an_oversized_chunked_body_gets_413_and_a_slow_body_408(tmp_path: Path) -> None:
    app = create_app(tmp_path, max_body=4096, body_timeout_s=1.0)
    with served_app(app, http=protocol_class(1.0)) as base:

        def chunks() -> Iterator[bytes]:
            for _ in range(64):
                yield b"x" * 1024

        reply = httpx.post(f"{base}/matches", content=chunks(), timeout=30)
        assert reply.status_code == 413 and "too large" in reply.json()["error"]
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            head = f"POST /matches HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            sock.sendall(f"{head}content-length: 100\r\n\r\n".encode() + b'{"scen')
            started = time.monotonic()
            answer = b""
            while b"\r\n\r\n" not in answer:
                got = sock.recv(4096)
                if not got:
                    break
                answer += got
            waited = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert waited < 10  # answered at the deadline, not held while bytes trickle
        assert httpx.get(f"{base}/healthz", timeout=30).status_code == 200


def test_the_body_limit_passes_an_honest_body_through_intact(tmp_path: Path) -> None:
    app = create_app(tmp_path, max_body=4096, body_timeout_s=1.0)
    with served_app(app, http=protocol_class(1.0)) as base:

        def two() -> Iterator[bytes]:
            text = json.dumps(MATCH).encode()
            yield text[:10]
            yield text[10:]

        reply = httpx.post(
            f"{base}/matches", content=two(), headers={"content-type": "application/json"}
        )
        assert reply.status_code == 201, reply.text


def _closed_after(sock: socket.socket, trickle: bytes) -> float:
    """Send ``trickle`` a byte every 0.2 s until the server closes; seconds it took."""
    started = time.monotonic()
    sock.settimeout(0.2)
    for i in range(200):
        try:
            sock.sendall(trickle[i % len(trickle) : i % len(trickle) + 1])
            if sock.recv(1) == b"":
                break
        except TimeoutError:
            continue
        except OSError:  # reset by the server
            break
    return time.monotonic() - started


def test_a_request_head_that_trickles_or_never_comes_is_cut_off(tmp_path: Path) -> None:
    """Slowloris: a connection that sends its head a byte at a time, or nothing, is closed at
    the head deadline (1 s here; 10 s by default), and a keep-alive connection's next head has
    the same deadline; an honest keep-alive client is unaffected."""
    with served_app(create_app(tmp_path), http=protocol_class(1.0)) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            assert _closed_after(sock, b"GET /healthz HTTP/1.1\r\nx-pad: ") < 5
        with socket.create_connection((host, int(port))) as sock:  # says nothing at all
            sock.settimeout(5)
            started = time.monotonic()
            assert sock.recv(1) == b"" and time.monotonic() - started < 5
        with socket.create_connection((host, int(port))) as sock:  # keep-alive, then trickle
            sock.sendall(f"GET /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            assert _closed_after(sock, b"GET /healthz HTTP/1.1\r\nx-pad: ") < 5
        with httpx.Client(base_url=base) as client:  # one connection, several requests
            for _ in range(3):
                assert client.get("/healthz").status_code == 200
                time.sleep(0.6)
