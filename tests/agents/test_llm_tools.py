"""The OpenAI-compatible backend's tool calls, reasoning, provider presets and recorded
degradation, the tool probe, server token counts, request cancellation, error messages and the
response cache's new fields, all against the FakeOpenAIServer test double over real HTTP.
The same paths against the real llama.cpp server: tests/agents/test_llm_tools_real.py."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from agents.llm.backends.base import BackendError, Completion, ToolCall, describe_error
from agents.llm.backends.openai_backend import OpenAIBackend
from agents.llm.backends.openai_reply import ERROR_CHARS, split_think
from agents.llm.cache import CachedBackend, cache_key
from agents.llm.providers import PRESETS, adapt_request, preset, presets_table
from agents.registry import AgentSpecError, make_agent
from market.bench.fake_openai_server import FakeOpenAIServer, Reply

ROOT = Path(__file__).resolve().parents[2]
USER = [{"role": "user", "content": "You play seat bidder_0. Round 1, phase: bidding"}]


def tool(name: str, **properties: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} action",
            "parameters": {"type": "object", "properties": properties},
        },
    }


TOOLS = [tool("bid", bids={"type": "array", "items": {"type": "number"}}), tool("wait")]
FORCE_BID = {"type": "function", "function": {"name": "bid"}}


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture(autouse=True)
def fresh_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no tool probe cached in this process."""
    monkeypatch.setattr("agents.llm.backends.openai_probe.TOOL_SUPPORT", {})
    monkeypatch.setattr("agents.llm.backends.openai_probe._TASKS", {})


def backend(server: FakeOpenAIServer, **kw: Any) -> OpenAIBackend:
    kw.setdefault("max_retries", 0)
    return OpenAIBackend("fake-model", base_url=server.base_url, **kw)


# --- tools ---------------------------------------------------------------------------------------
def test_tools_are_forwarded_and_the_tool_call_parsed(server: FakeOpenAIServer) -> None:
    server.script(
        Reply(tool_calls=[{"name": "bid", "arguments": '{"bids": [7.5, 3]}'}]),
    )
    reply = backend(server).complete(USER, None, {"tools": TOOLS, "tool_choice": FORCE_BID})
    sent = server.requests[-1].body
    assert sent["tools"] == TOOLS and sent["tool_choice"] == FORCE_BID
    assert sent["parallel_tool_calls"] is False  # one action per reply
    assert reply.tool_calls == [ToolCall(id="call_0_0", name="bid", arguments='{"bids": [7.5, 3]}')]
    assert reply.text == "" and reply.extra["finish_reason"] == "tool_calls"
    assert "degraded" not in reply.extra  # openai supports all of it


def test_default_tool_call_follows_the_policy_and_no_tools_means_no_tool_fields(
    server: FakeOpenAIServer,
) -> None:
    b = backend(server)
    reply = b.complete(USER, None, {"tools": [tool("wait"), tool("bid")], "tool_choice": "auto"})
    # the fake policy bids in the bidding phase: its action, without action_type, as arguments
    assert [c.name for c in reply.tool_calls] == ["bid"]
    arguments = json.loads(reply.tool_calls[0].arguments)
    assert arguments["bids"] == [] and "action_type" not in arguments
    plain = b.complete(USER, None, {"tools": None, "tool_choice": "auto"})
    assert plain.tool_calls == [] and plain.text
    sent = server.requests[-1].body
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(sent)


# --- reasoning -----------------------------------------------------------------------------------
def test_reasoning_content_is_parsed_and_its_tokens_counted(server: FakeOpenAIServer) -> None:
    reply = backend(server, provider="vllm").complete(USER, None, {"reasoning_effort": "low"})
    assert server.requests[-1].body["reasoning_effort"] == "low"
    assert reply.reasoning == "fake reasoning at effort low: the action follows the policy"
    assert json.loads(reply.text)["action_type"] == "bid"  # the text is the action only
    assert reply.extra["reasoning_tokens"] == len(reply.reasoning) // 4


def test_think_block_is_reasoning_and_cut_from_the_text() -> None:
    with FakeOpenAIServer(reasoning="think") as srv:
        srv.script(Reply(content='{"action_type": "wait"}', reasoning="I should wait."))
        reply = backend(srv).complete(USER, None, {})
    assert reply.reasoning == "I should wait."
    assert reply.text == '{"action_type": "wait"}'
    assert split_think("<think>a</think>\nB") == ("B", "a")
    assert split_think("<think>ran out of tok") == ("", "ran out of tok")  # unclosed: all thought
    assert split_think("no <think>x</think> here") == ("no <think>x</think> here", None)


# --- presets and degradation ---------------------------------------------------------------------
FULL = {
    "seed": 1,
    "reasoning_effort": "low",
    "logprobs": True,
    "tools": TOOLS,
    "tool_choice": "required",
    "temperature": 0.2,
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_sends_what_it_supports_and_records_what_it_drops(
    server: FakeOpenAIServer, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = PRESETS[name]
    monkeypatch.setenv(p.api_key_env, "sk-test-preset")
    caps = p.capabilities
    reply = backend(server, provider=name).complete(USER, {"type": "object"}, dict(FULL))
    sent = server.requests[-1].body
    notes = reply.extra.get("degraded", [])
    for field, supported in (
        ("seed", caps.seed),
        ("reasoning_effort", caps.reasoning_effort),
        ("logprobs", caps.logprobs),
    ):
        assert (field in sent) is supported, (name, field)
        assert any(n.startswith(f"{field} not supported by {name}") for n in notes) is not supported
    if "required" in caps.tool_choice:
        assert sent["tool_choice"] == "required"
    else:  # nearest form: auto (two tools, so no forced call)
        assert sent["tool_choice"] == "auto"
        assert f"tool_choice=required not supported by {name}: sent auto" in notes
    assert ("parallel_tool_calls" in sent) is caps.parallel_tool_calls
    fmt = (sent.get("response_format") or {}).get("type", "none")
    assert fmt == (caps.response_formats[0] if caps.response_formats else "none")
    dropped_format = f"response_format not supported by {name}: not sent"
    assert (dropped_format in notes) is (not caps.response_formats)
    assert sent["temperature"] == 0.2  # never touched
    assert len(notes) == len(set(notes))


def test_degradation_notes_by_hand() -> None:
    body = {"seed": 3, "tools": TOOLS[:1], "tool_choice": "required", "reasoning_effort": "x"}
    notes = adapt_request(body, preset("llamacpp"))
    # one tool: "required" becomes the forced call of that tool, which llama.cpp honours
    assert body["tool_choice"] == {"type": "function", "function": {"name": "bid"}}
    assert notes == [
        "reasoning_effort not supported by llama.cpp: not sent",
        "tool_choice=required not supported by llama.cpp: sent forced",
    ]
    body = {"seed": 3, "logprobs": True, "top_logprobs": 2}
    assert adapt_request(body, preset("groq")) == [
        "logprobs not supported by groq: not sent",
        "top_logprobs not supported by groq: not sent",
    ]
    assert body == {"seed": 3}
    body = {"seed": 3, "tool_choice": FORCE_BID, "tools": TOOLS}
    assert adapt_request(body, preset("ollama")) == [
        "tool_choice=forced not supported by ollama: sent auto"
    ]
    body = {"seed": 3}
    assert adapt_request(body, preset("anthropic")) == ["seed not supported by anthropic: not sent"]
    with pytest.raises(ValueError, match="unknown provider 'vlm'.*vllm"):
        preset("vlm")


def test_rejected_response_format_is_recorded_on_every_later_reply() -> None:
    with FakeOpenAIServer(reject_json_schema=400) as srv:
        b = backend(srv)
        first = b.complete(USER, {"type": "object"}, {})
        second = b.complete(USER, {"type": "object"}, {})
    note = "response_format=json_schema rejected by the server: sent none"
    assert note in first.extra["degraded"] and note in second.extra["degraded"]


def test_spec_names_a_preset(server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = make_agent("llm:vllm?model=Qwen/Qwen2.5-7B-Instruct")
    b = agent.backend
    assert b.provider.name == "vllm" and b.base_url == "http://127.0.0.1:8000/v1"
    assert b.response_format == "json_schema" and b.api_key_env == "VLLM_API_KEY"
    b = make_agent("llm:llamacpp?model=m").backend
    assert b.provider.name == "llama.cpp" and b.response_format == "json_object"
    b = make_agent(f"llm:llama.cpp?model=m&base_url={server.base_url}").backend
    assert b.base_url == server.base_url  # the spec wins over the preset
    monkeypatch.setenv("GROQ_API_KEY", "sk-test-groq")
    b = make_agent("llm:openai?provider=groq&model=m").backend
    assert b.provider.name == "groq" and b.base_url == "https://api.groq.com/openai/v1"
    monkeypatch.delenv("GROQ_API_KEY")
    with pytest.raises(AgentSpecError, match="GROQ_API_KEY is not set"):
        make_agent("llm:groq?model=m")
    with pytest.raises(AgentSpecError, match="keep one of them"):
        make_agent("llm:vllm?model=m&provider=ollama")


def test_presets_table_in_the_docs_is_generated() -> None:
    doc = (ROOT / "docs" / "llm-seats.md").read_text()
    assert presets_table() in doc, "regenerate the table: python -c 'from agents.llm.providers "
    "import presets_table; print(presets_table())'"
    for name in PRESETS:
        assert f"| `{name}` |" in doc


# --- null content, errors ------------------------------------------------------------------------
def test_null_content_is_sent_as_empty_string() -> None:
    history = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "wait", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": "again"},
    ]
    with FakeOpenAIServer(reject_null_content=True) as srv:
        b = backend(srv)
        reply = b.complete(history, None, {})
        assert reply.text and srv.requests[-1].body["messages"][1]["content"] == ""
        assert history[1]["content"] is None  # the caller's messages are not changed
        # what the server does to a null sent as is, as llama.cpp's does
        with pytest.raises(openai.InternalServerError, match="got null"):
            b.post_json(srv.base_url + "/chat/completions", {"model": "m", "messages": history})


def test_backend_error_carries_status_and_server_text(server: FakeOpenAIServer) -> None:
    crash = "grammar too large: number of rules exceeds sane defaults " + "x" * 900
    server.script(Reply(status=500, error=crash), Reply(status=400, error=""))
    b = backend(server)
    with pytest.raises(BackendError) as info:
        b.complete(USER, None, {})
    text = str(info.value)
    assert info.value.status == 500
    assert "HTTP 500 from" in text and "number of rules exceeds sane defaults" in text
    assert len(text) < ERROR_CHARS + 150  # the server's text is cut, the cause kept
    assert describe_error(info.value) == text  # what the agent and the judge log
    with pytest.raises(BackendError) as info:
        b.complete(USER, None, {})
    assert info.value.status == 400 and "empty error message" in str(info.value)
    assert describe_error(ValueError()) == "ValueError (no message)"


# --- probe and token counts -------------------------------------------------------------------------
def probes(server: FakeOpenAIServer) -> int:
    return sum(
        1
        for r in server.requests
        if any(t["function"]["name"] == "ping" for t in r.body.get("tools") or [])
    )


def test_tool_probe_runs_once_per_base_url_and_model(server: FakeOpenAIServer) -> None:
    a, b = backend(server), backend(server)
    assert a.supports_tools() is True and b.supports_tools() is True
    assert probes(server) == 1
    assert a.tool_probe == {"supported": True, "reason": "a valid ping tool call came back"}
    sent = next(r.body for r in server.requests if r.body.get("tools"))
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "ping"}}
    other = OpenAIBackend("other-model", base_url=server.base_url, max_retries=0)
    assert other.supports_tools() is True and probes(server) == 2

    async def many() -> list[bool]:
        fresh = [OpenAIBackend("async-model", base_url=server.base_url) for _ in range(6)]
        return await asyncio.gather(*(x.asupports_tools() for x in fresh))

    assert asyncio.run(many()) == [True] * 6 and probes(server) == 3  # six callers, one probe


def test_tool_probe_says_no_when_no_tool_call_comes_back(server: FakeOpenAIServer) -> None:
    server.script(Reply(match="Call the function ping", content="pong, in prose"))
    b = backend(server)
    assert b.supports_tools() is False and b.supports_tools() is False
    assert probes(server) == 1 and "no ping tool call came back" in b.tool_probe["reason"]
    server.script(
        Reply(match="Call the function ping", tool_calls=[{"name": "ping", "arguments": "{ok"}])
    )
    c = OpenAIBackend("m2", base_url=server.base_url, max_retries=0)
    assert c.supports_tools() is False and "not JSON" in c.tool_probe["reason"]
    server.script(Reply(match="Call the function ping", status=500, error="tools unsupported"))
    d = OpenAIBackend("m3", base_url=server.base_url, max_retries=0)
    assert d.supports_tools() is False and "tools unsupported" in d.tool_probe["reason"]
    assert d.supports_tools() is False and probes(server) == 3  # an HTTP refusal is final


def test_tool_probe_after_a_transport_failure_probes_again(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    server.script(Reply(match="Call the function ping", delay=1.0))
    cached = CachedBackend(backend(server, timeout=0.2), tmp_path / "c.sqlite")
    b = cached.backend
    assert cached.supports_tools() is False and "probe failed" in b.tool_probe["reason"]
    assert cached.supports_tools() is True and probes(server) == 2  # the failure was not kept
    assert cached.supports_tools() is True and probes(server) == 2


def test_count_tokens_uses_the_servers_tokenizer_where_there_is_one(
    server: FakeOpenAIServer,
) -> None:
    assert backend(server, provider="vllm").count_tokens("one two three four") == 4
    assert backend(server, provider="llama.cpp").count_tokens("one two") == 2
    tokenized = [r for r in server.requests if "tokenize" in r.path]
    assert tokenized == []  # token counts are not chat requests
    with pytest.raises(NotImplementedError, match="groq has no tokenize endpoint"):
        OpenAIBackend(
            "m", base_url=server.base_url, provider="groq", api_key_env="PATH"
        ).count_tokens("x")


# --- cancellation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("http_client", ["httpx", "aiohttp"])
def test_cancelled_request_is_closed_on_the_server(http_client: str) -> None:
    """An asyncio timeout (the agent's call_timeout is asyncio.wait_for) closes the HTTP request:
    the server sees the connection go and stops serving it, instead of working on for nobody."""
    with FakeOpenAIServer() as srv:
        srv.script(Reply(delay=30.0))
        b = OpenAIBackend("m", base_url=srv.base_url, http_client=http_client, max_retries=0)

        async def call() -> float:
            start = time.perf_counter()
            with pytest.raises(TimeoutError):
                # 2 s: on a loaded box the request may take a second to reach the server at all
                await asyncio.wait_for(b.acomplete(USER, None, {}), 2.0)
            return time.perf_counter() - start

        async def run() -> tuple[float, int, int]:
            waited = await call()
            for _ in range(500):  # the server notices within 10 ms; allow 5 s on a loaded box
                if srv.abandoned:
                    break
                await asyncio.sleep(0.01)
            return waited, srv.open_requests, srv.abandoned

        waited, still_open, abandoned = asyncio.run(run())
    assert waited < 10.0  # not the reply's 30 s
    assert (still_open, abandoned) == (0, 1)


# --- the response cache --------------------------------------------------------------------------
def test_cache_replays_reasoning_tool_calls_and_degradation(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path = tmp_path / "cache.sqlite"
    params = {"tools": TOOLS, "tool_choice": "required", "reasoning_effort": "low", "seed": 1}
    server.script(Reply(reasoning="<b>because</b> & so"))
    live = CachedBackend(backend(server, provider="llama.cpp"), path)
    recorded = live.complete(USER, None, params)
    assert recorded.tool_calls and recorded.reasoning and recorded.extra["degraded"]
    assert live.supports_tools() is True
    assert live.count_tokens("a b c") == 3
    live.close()
    offline = CachedBackend(None, path, mode="read", model="fake-model")
    replayed = offline.complete(USER, None, params)
    for name in ("text", "reasoning", "tool_calls", "prompt_tokens", "completion_tokens", "model"):
        assert getattr(replayed, name) == getattr(recorded, name), name
    for name in ("degraded", "reasoning_tokens", "finish_reason", "response_format"):
        assert replayed.extra[name] == recorded.extra[name], name
    assert replayed.cached and offline.supports_tools() is True
    assert offline.count_tokens("a b c") == 3
    with pytest.raises(NotImplementedError):
        offline.count_tokens("never counted")
    assert asyncio.run(offline.asupports_tools()) is True


def test_cache_key_includes_tools_and_reasoning_params() -> None:
    base = {"temperature": 0.0}
    keys = {
        cache_key("m", USER, None, {**base, **extra})
        for extra in (
            {},
            {"tools": TOOLS},
            {"tools": TOOLS[:1]},
            {"tools": TOOLS, "tool_choice": "auto"},
            {"tools": TOOLS, "tool_choice": FORCE_BID},
            {"reasoning_effort": "low"},
            {"reasoning_effort": "high"},
        )
    }
    assert len(keys) == 7


def test_an_older_cache_file_gains_the_new_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE responses (key TEXT NOT NULL, occurrence INTEGER NOT NULL, model TEXT NOT "
        "NULL, text TEXT, error TEXT, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER "
        "NOT NULL, latency_s REAL NOT NULL, created REAL NOT NULL, PRIMARY KEY (key, occurrence))"
    )
    key = cache_key("m", USER, None, {})
    db.execute("INSERT INTO responses VALUES (?, 0, 'm', 'old', NULL, 1, 2, 0.5, 0)", (key,))
    db.commit()
    db.close()
    cached = CachedBackend(None, path, mode="read", model="m")
    old = cached.complete(USER, None, {})
    assert (old.text, old.reasoning, old.tool_calls) == ("old", None, [])
    cached.cache.put("k", 0, Completion("new", "m", reasoning="r"))
    assert cached.cache.get("k").completion.reasoning == "r"


# --- secrets ----------------------------------------------------------------------------------------
SECRET = "sk-test-SECRET-5b1f0c2e-do-not-record"


def test_no_api_key_or_authorization_header_reaches_transcript_log_or_report(
    server: FakeOpenAIServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from market.review.report import write_report
    from market.run.runner import run_scenario

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.script(  # a server that echoes the key back in an error, and one that thinks aloud
        Reply(match="You play seat bidder_0 ", status=401, error=f"Incorrect API key: {SECRET}"),
        Reply(match="You play seat bidder_1 ", reasoning="thinking aloud before acting"),
    )
    spec = f"llm:openai?model=fake-model&base_url={server.base_url}&max_retries=0"
    caplog.set_level(logging.DEBUG)
    run_scenario(
        "market_round",
        [0],
        {"bidder_0": spec, "bidder_1": spec, "bidder_2": spec},
        tmp_path / "run",
        workers=1,
        progress=False,
    )
    assert server.requests and all(r.bearer_sha256 for r in server.requests)  # the key was sent
    transcripts = sorted((tmp_path / "run" / "transcripts").glob("*.jsonl"))
    assert transcripts
    report = tmp_path / "report.html"
    write_report(transcripts, report)
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    texts = {str(p): p.read_text(errors="replace") for p in [*written, report]}
    texts["log"] = caplog.text + "\n".join(str(r.__dict__) for r in caplog.records)
    assert "HTTP 401" in "".join(texts.values())  # the failure itself was recorded
    for name, text in texts.items():
        assert SECRET not in text, name
        assert SECRET[:20] not in text, name
        assert "authorization" not in text.lower(), name
        assert "Bearer " not in text, name


def test_llm_judge_records_the_servers_message(server: FakeOpenAIServer) -> None:
    """The judge's failure names the HTTP status and the server's text, not just the type."""
    from agents.llm.judge import LLMJudge

    crash = "number of rules exceeds sane defaults"
    server.script(Reply(status=500, error=crash))
    judge = LLMJudge(backend(server), retries=0)
    with pytest.raises(RuntimeError) as info:
        judge._ask(USER)
    assert str(info.value).startswith(
        "backend error: BackendError: model fake-model: HTTP 500 from"
    )
    assert crash in str(info.value)
