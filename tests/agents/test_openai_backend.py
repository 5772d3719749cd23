"""OpenAIBackend over real HTTP (the official ``openai`` client) against the FakeOpenAIServer test
double on 127.0.0.1: request shape, response_format fallback, error mapping, API-key hygiene."""

from __future__ import annotations

import asyncio
import hashlib
import pickle

import pytest

from agents.llm.backends.base import BackendError, Completion
from agents.llm.backends.openai_backend import (
    LOCAL_DUMMY_KEY,
    OpenAIBackend,
    aiohttp_available,
    is_local_url,
)
from market.bench.fake_openai_server import FakeOpenAIServer, Reply

KEY_ENV = "GPUMARKET_TEST_OPENAI_KEY"
FAKE_KEY = "sk-test-ZEBRA-9f3c2a71-do-not-leak"
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "You are bidder_0 (bidder). phase: negotiation"},
]
SCHEMA = {
    "type": "object",
    "properties": {"action_type": {"const": "wait"}},
    "required": ["action_type"],
}


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, FAKE_KEY)
    return FAKE_KEY


def backend(server: FakeOpenAIServer, **kw) -> OpenAIBackend:
    kw.setdefault("max_retries", 0)
    kw.setdefault("api_key_env", KEY_ENV)
    return OpenAIBackend("fake-model", base_url=server.base_url, **kw)


def test_request_shape_per_response_format(server: FakeOpenAIServer, key: str) -> None:
    for fmt in ("json_schema", "json_object", "none"):
        b = backend(server, response_format=fmt)
        out = b.complete(
            MESSAGES, SCHEMA, {"temperature": 0.0, "max_tokens": 64, "seed": 7, "top_k": 5}
        )
        assert isinstance(out, Completion) and out.text == '{"action_type": "wait"}'
        body = server.requests[-1].body
        assert body["model"] == "fake-model" and body["messages"] == MESSAGES
        assert (body["temperature"], body["max_tokens"], body["seed"], body["top_k"]) == (
            0.0,
            64,
            7,
            5,
        )
        if fmt == "json_schema":
            assert body["response_format"] == {
                "type": "json_schema",
                "json_schema": {"name": "action", "schema": SCHEMA, "strict": False},
            }
        elif fmt == "json_object":
            assert body["response_format"] == {"type": "json_object", "schema": SCHEMA}
        else:
            assert "response_format" not in body
    # no schema: free text, whatever the format
    backend(server).complete(MESSAGES, None, {})
    assert "response_format" not in server.requests[-1].body


def test_usage_latency_and_key_sent(server: FakeOpenAIServer, key: str) -> None:
    server.script(Reply(content='{"action_type": "wait"}', prompt_tokens=123, completion_tokens=45))
    out = backend(server).complete(MESSAGES, SCHEMA, {})
    assert (out.prompt_tokens, out.completion_tokens, out.model, out.cached) == (
        123,
        45,
        "fake-model",
        False,
    )
    assert 0 < out.latency_s < 5
    assert server.requests[-1].bearer_sha256 == hashlib.sha256(FAKE_KEY.encode()).hexdigest()


@pytest.mark.parametrize("status", [400, 500])
def test_json_schema_rejected_falls_back_to_none_once(status: int, key: str) -> None:
    with FakeOpenAIServer(reject_json_schema=status) as srv:
        b = backend(srv, response_format="json_schema")
        first = b.complete(MESSAGES, SCHEMA, {})
        assert first.text and first.extra["response_format"] == "none"
        assert b.response_format == "none" and b.format_fallbacks == 1
        b.complete(MESSAGES, SCHEMA, {})
        second = asyncio.run(b.acomplete(MESSAGES, SCHEMA, {}))
        assert second.text
        kinds = [(r.body.get("response_format") or {}).get("type") for r in srv.requests]
        assert kinds == ["json_schema", None, None, None]  # remembered: asked with json_schema once
        assert [r.status for r in srv.requests] == [status, 200, 200, 200]
        assert b.format_fallbacks == 1


def test_other_http_errors_do_not_drop_the_format(server: FakeOpenAIServer, key: str) -> None:
    server.script(Reply(status=500, error="model crashed"))
    b = backend(server)
    with pytest.raises(BackendError, match="HTTP 500.*model crashed"):
        b.complete(MESSAGES, SCHEMA, {})
    assert b.response_format == "json_schema" and b.format_fallbacks == 0


def _error(b: OpenAIBackend, use_async: bool) -> BackendError:
    try:
        if use_async:
            asyncio.run(b.acomplete(MESSAGES, SCHEMA, {}))
        else:
            b.complete(MESSAGES, SCHEMA, {})
    except BackendError as exc:
        return exc
    raise AssertionError("no BackendError")


@pytest.mark.parametrize("use_async", [False, True])
def test_errors_are_mapped(server: FakeOpenAIServer, key: str, use_async: bool) -> None:
    b = backend(server, timeout=0.3)
    server.script(Reply(status=500, error="boom"))
    assert "HTTP 500" in str(_error(b, use_async))
    server.script(Reply(status=429, error="slow down"))
    assert "rate limited" in str(_error(b, use_async))
    server.script(Reply(delay=1.0))
    exc = _error(b, use_async)
    assert "timed out after 0.3s" in str(exc)
    # the exception carries no chained openai error (whose request holds the headers)
    assert exc.__cause__ is None and exc.__context__ is None
    with FakeOpenAIServer() as other:
        dead_url = other.base_url
    dead = OpenAIBackend(
        "fake-model", base_url=dead_url, api_key_env=KEY_ENV, max_retries=0, timeout=2
    )
    assert "cannot connect" in str(_error(dead, use_async))


def test_api_key_never_in_repr_errors_or_pickles(server: FakeOpenAIServer, key: str) -> None:
    b = backend(server)
    b.complete(MESSAGES, SCHEMA, {})  # builds the client (which holds the key)
    server.script(Reply(status=401, error=f"Incorrect API key provided: {FAKE_KEY}"))
    exc = _error(b, use_async=False)
    assert "HTTP 401" in str(exc) and "[redacted]" in str(exc)
    for text in (repr(b), str(b), str(exc), repr(exc), repr(exc.args)):
        assert FAKE_KEY not in text
    assert FAKE_KEY.encode() not in pickle.dumps(b)
    assert FAKE_KEY not in repr(vars(b))


def test_missing_key(monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(BackendError, match=KEY_ENV):
        OpenAIBackend("gpt-4o-mini", base_url="https://api.example.com/v1", api_key_env=KEY_ENV)
    backend(server).complete(MESSAGES, None, {})  # local server: a dummy key
    assert server.requests[-1].bearer_sha256 == hashlib.sha256(LOCAL_DUMMY_KEY.encode()).hexdigest()
    assert is_local_url("http://localhost:11434/v1") and is_local_url("http://192.168.1.5:8000/v1")
    assert not is_local_url("https://api.openai.com/v1") and not is_local_url(None)


def test_clients_are_reused(server: FakeOpenAIServer, key: str) -> None:
    b = backend(server)
    b.complete(MESSAGES, None, {})
    client = b._client
    b.complete(MESSAGES, None, {})
    assert b._client is client

    async def twice() -> tuple[object, object]:
        await b.acomplete(MESSAGES, None, {})
        first = await b._async_client()
        await b.acomplete(MESSAGES, None, {})
        return first, await b._async_client()

    first, second = asyncio.run(twice())
    assert first is second
    third, _ = asyncio.run(twice())  # a new event loop gets its own client
    assert third is not first
    b.close()


@pytest.mark.skipif(not aiohttp_available(), reason="aiohttp is not installed")
def test_aiohttp_transport(server: FakeOpenAIServer, key: str) -> None:
    for kind in ("aiohttp", "auto"):
        b = backend(server, http_client=kind, timeout=0.3)

        async def run(b: OpenAIBackend = b) -> tuple[Completion, str]:
            out = await b.acomplete(MESSAGES, SCHEMA, {})
            name = type((await b._async_client())._client).__name__
            await b.aclose()
            return out, name

        out, transport = asyncio.run(run())
        assert out.text and "aiohttp" in transport.lower()
        server.script(Reply(delay=1.0))
        assert "timed out" in str(_error(b, use_async=True))
