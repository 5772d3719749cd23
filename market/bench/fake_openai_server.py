"""FakeOpenAIServer: a deterministic OpenAI-compatible chat.completions *test double*.

Not a model, and not a server to put in front of users: it ships in the package only so that the
LLM benchmarks (``python -m market.bench.llm --spawn-fake``, ``gpumarket bench``) and the tests can
run from an installed wheel without a model. It serves ``POST /v1/chat/completions`` and ``GET /v1/models`` on 127.0.0.1 from a
thread (stdlib ``http.server``, HTTP/1.1 keep-alive) so tests drive the real ``openai`` client over
real HTTP without any network.

What it answers:

- a *scripted* :class:`Reply` when one is queued (``server.script(...)``) whose ``match`` text occurs
  in the request's messages (first match wins; each reply is used once): any content (valid JSON,
  JSON in prose, malformed JSON, a wrong action kind), an HTTP error status, a delay beyond the
  client's timeout, fixed usage numbers;
- otherwise the built-in :func:`default_policy`: a legal action computed from the prompt (the
  designer rotates mechanisms, labs wait while negotiating and bid their job values);
- ``latency`` delays every reply (the fixed-latency mode for the concurrency benchmark);
- ``reject_json_schema`` answers ``response_format.type == "json_schema"`` with an error, as
  llama.cpp's server does; ``reject_null_content`` answers HTTP 500 to a message whose
  ``content`` is null, as llama.cpp's server does;
- tools: when the request sends ``tools``, the answer is a tool call (content null): the function
  ``tool_choice`` forces, else the tool named like the default policy's ``action_type`` with the
  rest of that action as arguments, else the first tool with ``{}`` (a scripted
  ``Reply(tool_calls=[...])`` or ``Reply(content=...)`` overrides it);
- reasoning: a request with ``reasoning_effort`` (not ``"none"``) gets a ``reasoning_content``
  field and ``completion_tokens_details.reasoning_tokens``; ``reasoning="think"`` puts it in a
  leading ``<think>`` block of the content instead; a scripted ``Reply(reasoning=...)`` always;
- tokens: ``POST /tokenize`` and ``/extras/tokenize/count`` count whitespace-separated words.

A request whose client goes away while the server waits out a delay is abandoned: the server
notices the closed connection within 10 ms, stops, and counts it in ``abandoned``;
``open_requests`` is the number being served right now.

Usage is deterministic: prompt tokens = characters of all messages // 4, completion tokens =
characters of the reply // 4 (at least 1), unless ``usage=(prompt, completion)`` fixes them for
every answer or a scripted reply fixes them for itself. Every request is recorded in
``server.requests`` (body, path, a sha256 of the bearer token, what was answered).

Run it standalone for benchmarks: ``python -m market.bench.fake_openai_server --latency-ms 50`` prints
``READY <base_url>`` and serves until killed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast


@dataclass
class Reply:
    """One scripted answer. ``content=None`` uses the default policy's content."""

    content: str | None = None
    status: int = 200
    error: str = "scripted error"
    delay: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    match: str | None = None
    retry: bool = False  # for error statuses: x-should-retry header for the client
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers (Retry-After...)
    tool_calls: list[dict[str, Any]] | None = None  # [{"name": ..., "arguments": "..."}]
    reasoning: str | None = None  # returned as reasoning_content


@dataclass
class Recorded:
    path: str
    body: dict[str, Any]
    bearer_sha256: str | None
    status: int = 200
    content: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    scripted: bool = False
    delay: float = 0.0  # a client with a shorter timeout never saw this answer
    at: float = 0.0  # time.monotonic() when the request arrived
    messages_text: str = field(default="", repr=False)


def _messages_text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body.get("messages", []))


def _first_user(body: dict[str, Any]) -> str:
    return next(
        (str(m.get("content") or "") for m in body.get("messages", []) if m.get("role") == "user"),
        "",
    )


def _json_after(label: str, text: str) -> Any:
    m = re.search(re.escape(label) + r"\s*(.*)", text)
    if not m:
        return None
    try:
        return json.loads(m.group(1))
    except json.JSONDecodeError:
        return None


def _observation(body: dict[str, Any]) -> tuple[str, int, str, str]:
    """The latest user message showing a whole observation, the round and phase now, and what
    the conversation said after it: an LLM seat with memory shows the observation once, then
    lists what changed and says ``Now: round R, phase P.``."""
    said = [
        str(m.get("content") or "")
        for m in body.get("messages", [])
        if m.get("role") in ("user", "tool")
    ]
    at = next((i for i in range(len(said) - 1, -1, -1) if re.search(r"Round \d+", said[i])), None)
    prompt = _first_user(body) if at is None else said[at]
    later = "" if at is None else "\n".join(said[at + 1 :])
    phase = cast(str, (re.search(r"phase: (\w+)", prompt) or [None, "negotiation"])[1])
    rnd = int(cast(str, (re.search(r"Round (\d+)", prompt) or [None, "0"])[1]))
    now = re.findall(r"Now: round (\d+), phase (\w+)", later)
    if now:
        rnd, phase = int(now[-1][0]), now[-1][1]
    return prompt, rnd, phase, later


def _last(pattern: str, text: str, default: Any) -> Any:
    found = re.findall(pattern, text)
    return found[-1] if found else default


def default_policy(body: dict[str, Any]) -> str:
    """A legal action for the observation in the latest user message that shows one
    (deterministic)."""
    prompt, rnd, phase, later = _observation(body)
    if "(designer)" in prompt:
        if rnd % 3 == 1:
            return json.dumps(
                {
                    "action_type": "set_mechanism",
                    "mechanism": {"auction_type": "vcg", "reserve_price": 4.0},
                }
            )
        if rnd % 3 == 2:  # the flat DAEDALUS form
            return json.dumps(
                {"auction_type": "first_price", "reserve_price": 6.0, "reveal_clearing_price": True}
            )
        return json.dumps({"action_type": "wait"})
    if phase != "bidding":
        return json.dumps({"action_type": "wait"})
    jobs = _json_after("Your jobs:", prompt) or []
    budget = float(cast(str, (re.search(r"Your budget: ([\d.]+)", prompt) or [None, "0"])[1]))
    rel = float(cast(str, (re.search(r"block reliability ([\d.]+)", prompt) or [None, "1"])[1]))
    cap = int(cast(str, (re.search(r"This round: (\d+) blocks", prompt) or [None, "1"])[1]))
    owned = re.search(r"Blocks you own for rounds [^:]*: (\[[^\]]*\])", prompt)
    held = json.loads(owned.group(1)) if owned else [0]
    # what a conversation said changed after that observation
    budget = float(_last(r"your budget: [\d.]+ -> ([\d.]+)", later, budget))
    cap = int(_last(r"this round: (\d+) blocks", later, cap))
    rel = float(_last(r"this round: \d+ blocks, reliability ([\d.]+)", later, rel))
    held = json.loads(
        _last(r"blocks you own for rounds [^:]*: (\[[^\]]*\])", later, json.dumps(held))
    )
    by_id = {j.get("job_id"): j for j in jobs}
    for text in re.findall(r"(?:new job: |job \S+ now: )(\{[^\n]*\})", later):
        job = json.loads(text)
        by_id[job.get("job_id")] = job
    jobs = list(by_id.values())
    values: list[float] = []
    for job in jobs:
        if job.get("status") == "active" and job.get("min_reliability", 0) <= rel:
            values += [job["value"] / job["size"] * rel] * (job["size"] - job["progress"])
    values.sort(reverse=True)
    values = values[held[0] if held else 0 :]
    bids, total = [], 0.0
    for v in values[: max(1, cap)]:
        v = round(v * 0.9, 2)
        if total + v > budget:
            break
        bids.append(v)
        total += v
    return json.dumps(
        {"action_type": "bid", "bids": bids, "reasoning": f"round {rnd}: bid 90% of value"}
    )


def default_tool_call(body: dict[str, Any], policy: Any) -> dict[str, Any]:
    """The function call answering a request with ``tools`` (see the module docstring)."""
    names = [t.get("function", {}).get("name", "") for t in body.get("tools") or []]
    choice = body.get("tool_choice")
    try:
        action = json.loads(policy(body))
    except (TypeError, ValueError):
        action = {}
    action = action if isinstance(action, dict) else {}
    kind = action.pop("action_type", None)
    if isinstance(choice, dict):
        name = choice.get("function", {}).get("name", "")
        args = action if name == kind else {"ok": True} if name == "ping" else {}
    elif kind in names:
        name, args = str(kind), action
    else:
        name, args = (names[0] if names else ""), ({"ok": True} if names[:1] == ["ping"] else {})
    return {"name": name, "arguments": json.dumps(args)}


def _word_count(body: dict[str, Any]) -> int:
    text = next(
        (body[k] for k in ("prompt", "input", "content") if isinstance(body.get(k), str)), ""
    )
    return len(text.split())


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many concurrent connections in the benchmark


class FakeOpenAIServer:
    """See the module docstring. Use as a context manager or ``start()`` / ``stop()``."""

    def __init__(
        self,
        latency: float = 0.0,
        reject_json_schema: int | None = None,
        policy: Any = default_policy,
        host: str = "127.0.0.1",
        port: int = 0,
        usage: tuple[int, int] | None = None,
        reject_null_content: bool = False,
        reasoning: str = "field",
    ) -> None:
        self.latency = latency
        self.reject_null_content = reject_null_content
        self.reasoning = reasoning  # "field": reasoning_content; "think": a <think> block
        self.open_requests = 0
        self.abandoned = 0
        self.usage = usage  # fixed (prompt, completion) tokens of every answer, for cost tests
        self.reject_json_schema = reject_json_schema
        self.policy = policy
        self.requests: list[Recorded] = []
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        self._httpd = _HTTPServer((host, port), self._handler_class())
        self._thread: threading.Thread | None = None

    # --- control ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-openai-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def usage_totals(self, timeout: float = float("inf")) -> tuple[int, int]:
        """Tokens of the successful answers a client with ``timeout`` received."""
        with self._lock:
            ok = [r for r in self.requests if r.status == 200 and r.delay < timeout]
            return sum(r.prompt_tokens for r in ok), sum(r.completion_tokens for r in ok)

    # --- serving ---------------------------------------------------------------------------
    def _take(self, text: str) -> Reply | None:
        with self._lock:
            for i, reply in enumerate(self._script):
                if reply.match is None or reply.match in text:
                    return self._script.pop(i)
        return None

    def _answer(
        self, path: str, body: dict[str, Any], bearer: str | None
    ) -> tuple[int, dict[str, Any], dict[str, str], float]:
        text = _messages_text(body)
        rec = Recorded(
            path=path,
            body=body,
            messages_text=text,
            at=time.monotonic(),
            bearer_sha256=hashlib.sha256(bearer.encode()).hexdigest() if bearer else None,
        )
        fmt = (body.get("response_format") or {}).get("type")
        null_content = self.reject_null_content and any(
            m.get("content") is None for m in body.get("messages", [])
        )
        rejected = (self.reject_json_schema and fmt == "json_schema") or null_content
        reply = None if rejected else self._take(text)
        delay = self.latency + (reply.delay if reply else 0.0)
        headers: dict[str, str] = {}
        if null_content:
            status = 500
            payload: dict[str, Any] = {
                "error": {"message": "messages: content should be a valid string, got null"}
            }
            headers["x-should-retry"] = "false"
        elif self.reject_json_schema and fmt == "json_schema":
            status = self.reject_json_schema
            payload = {
                "error": {
                    "message": "response_format type json_schema is not supported by this server",
                    "type": "invalid_request_error",
                    "code": status,
                }
            }
            headers["x-should-retry"] = "false"
        elif reply is not None and reply.status != 200:
            status = reply.status
            payload = {"error": {"message": reply.error, "type": "server_error", "code": status}}
            headers["x-should-retry"] = "true" if reply.retry else "false"
            headers.update(reply.headers)
        else:
            status = 200
            message, content = self._message(body, reply)
            usage = self.usage or (len(text) // 4, max(1, len(content) // 4))
            prompt_tokens = (
                reply.prompt_tokens if reply and reply.prompt_tokens is not None else usage[0]
            )
            completion_tokens = (
                reply.completion_tokens
                if reply and reply.completion_tokens is not None
                else usage[1]
            )
            rec.content, rec.prompt_tokens, rec.completion_tokens = (
                content,
                prompt_tokens,
                completion_tokens,
            )
            payload = {
                "id": f"chatcmpl-fake-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "fake"),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                        "message": message,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
            thought = message.get("reasoning_content") or ""
            if "<think>" in (message.get("content") or ""):
                thought = message["content"]
            if thought:
                payload["usage"]["completion_tokens_details"] = {
                    "reasoning_tokens": max(1, len(thought) // 4)
                }
        rec.status, rec.scripted, rec.delay = status, reply is not None, delay
        with self._lock:
            self.requests.append(rec)
        return status, payload, headers, delay

    def _message(self, body: dict[str, Any], reply: Reply | None) -> tuple[dict[str, Any], str]:
        """The assistant message of a successful answer, and its text for the usage count."""
        message: dict[str, Any] = {"role": "assistant"}
        calls = reply.tool_calls if reply is not None else None
        if calls is None and body.get("tools") and (reply is None or reply.content is None):
            calls = [default_tool_call(body, self.policy)]
        content: str | None
        if calls:
            content = None
            message["tool_calls"] = [
                {
                    "id": f"call_{len(self.requests)}_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for i, c in enumerate(calls)
            ]
        elif reply is not None and reply.content is not None:
            content = reply.content
        else:
            content = self.policy(body)
        thought = reply.reasoning if reply is not None else None
        effort = body.get("reasoning_effort")
        if thought is None and effort not in (None, "none"):
            thought = f"fake reasoning at effort {effort}: the action follows the policy"
        if thought is not None and self.reasoning == "think":
            content = f"<think>{thought}</think>\n{content or ''}"
        elif thought is not None:
            message["reasoning_content"] = thought
        message["content"] = content
        counted = (content or "") + "".join(c["arguments"] for c in calls or [])
        return message, counted

    def _wait(self, handler: BaseHTTPRequestHandler, delay: float) -> bool:
        """Sleep ``delay`` seconds unless the client closes the connection first (False)."""
        deadline = time.monotonic() + delay
        conn: socket.socket = handler.connection
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([conn], [], [], min(left, 0.01))
            if readable:
                try:
                    if not conn.recv(1, socket.MSG_PEEK):
                        return False  # EOF: the client is gone
                except OSError:
                    return False
                time.sleep(0.01)  # the client sent more (not EOF): keep waiting, without spinning
        return True

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else delayed ACKs add ~40 ms to every reply
            _headers_buffer: list[bytes]  # http.server's own buffer, not in its stubs

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _send(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self._headers_buffer.append(b"\r\n" + data)  # headers and body in one write
                    self.flush_headers()
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    self.close_connection = True

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(
                        200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
                    )
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/") in ("/tokenize", "/extras/tokenize/count"):
                    self._send(200, {"count": _word_count(json.loads(raw or b"{}"))})
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "request body is not JSON"}})
                    return
                auth = self.headers.get("Authorization") or ""
                bearer = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
                status, payload, headers, delay = server._answer(self.path, body, bearer)
                with server._lock:
                    server.open_requests += 1
                try:
                    if delay > 0 and not server._wait(self, delay):
                        with server._lock:
                            server.abandoned += 1
                        self.close_connection = True
                        return
                    self._send(status, payload, headers)
                finally:
                    with server._lock:
                        server.open_requests -= 1

        return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m market.bench.fake_openai_server",
        description="FakeOpenAIServer: a test double for benchmarks and tests (not a model)",
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    server = FakeOpenAIServer(latency=args.latency_ms / 1000.0, port=args.port)
    print(f"READY {server.base_url}", flush=True)
    try:
        server._httpd.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass
    finally:
        server._httpd.server_close()
        sys.exit(0)


if __name__ == "__main__":
    main()
