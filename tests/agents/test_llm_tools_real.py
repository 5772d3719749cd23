"""Tool calls, the tool probe and token counts against the REAL llama.cpp server
(llama-cpp-python with SmolLM2-135M, started here on a free 127.0.0.1 port with
``--chat_format chatml-function-calling``). What is asserted is what that server was measured
to do: a forced tool choice and ``tool_choice="auto"`` both return parseable tool calls,
``tool_choice="required"`` is answered with HTTP 500 (so the llama.cpp preset sends ``auto``
and records it), a null message content is HTTP 500 while ``""`` works.

Skipped without the model or the server packages, unless ``GPUMARKET_REQUIRE_REAL_MODELS=1``
(see tests/real_model_utils.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_model_utils import (
    LLAMA_INSTALL,
    LLAMA_SERVER_MODULES,
    LlamaServer,
    require_gguf,
    require_modules,
)

from agents.llm.backends.base import BackendError
from agents.llm.backends.openai_backend import OpenAIBackend

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
MODEL = "smollm2-135m"
USER = [{"role": "user", "content": "You value a GPU block at 10. Bid for it."}]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bid",
            "description": "Place bids, one price per block.",
            "parameters": {
                "type": "object",
                "properties": {"bids": {"type": "array", "items": {"type": "number"}}},
                "required": ["bids"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "wait",
            "description": "Do nothing this turn.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
# greedy decoding and a short reply: the same answer on every run, and fast on CPU
PARAMS: dict[str, Any] = {"temperature": 0.0, "seed": 7, "max_tokens": 48}


@pytest.fixture(scope="module")
def tools_server(request: pytest.FixtureRequest) -> Iterator[LlamaServer]:
    require_modules(LLAMA_SERVER_MODULES, LLAMA_INSTALL)
    server = LlamaServer(require_gguf(), n_ctx=2048, chat_format="chatml-function-calling")
    request.addfinalizer(server.stop)
    server.start()
    yield server


@pytest.fixture
def llama(tools_server: LlamaServer) -> LlamaServer:
    return tools_server.ensure_running()


@pytest.fixture(autouse=True)
def fresh_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agents.llm.backends.openai_probe.TOOL_SUPPORT", {})
    monkeypatch.setattr("agents.llm.backends.openai_probe._TASKS", {})


def backend(server: LlamaServer, provider: str = "llama.cpp") -> OpenAIBackend:
    return OpenAIBackend(
        MODEL, base_url=server.base_url, provider=provider, timeout=300.0, max_retries=0
    )


def parsed(reply: Any) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for call in reply.tool_calls:
        arguments = json.loads(call.arguments)  # raises if the server's arguments are not JSON
        assert isinstance(arguments, dict), call
        out.append((call.name, arguments))
    return out


def test_forced_tool_call_is_parsed(llama: LlamaServer) -> None:
    forced = {"type": "function", "function": {"name": "bid"}}
    reply = backend(llama).complete(USER, None, {**PARAMS, "tools": TOOLS, "tool_choice": forced})
    calls = parsed(reply)
    assert [name for name, _ in calls] == ["bid"], llama.log_tail(800)
    assert isinstance(calls[0][1].get("bids"), list)
    assert reply.text == "" and reply.extra["finish_reason"] == "tool_calls"
    assert "degraded" not in reply.extra  # everything asked was sent


def test_auto_tool_choice_returns_a_parseable_tool_call(llama: LlamaServer) -> None:
    reply = backend(llama).complete(USER, None, {**PARAMS, "tools": TOOLS, "tool_choice": "auto"})
    calls = parsed(reply)
    assert calls and all(name in ("bid", "wait") for name, _ in calls), reply


def test_required_tool_choice_is_http_500_there_so_the_preset_sends_auto(
    llama: LlamaServer,
) -> None:
    asked = {**PARAMS, "tools": TOOLS, "tool_choice": "required"}
    with pytest.raises(BackendError) as info:  # sent as is: measured HTTP 500, empty message
        backend(llama, provider="openai").complete(USER, None, asked)
    assert info.value.status == 500 and "HTTP 500 from" in str(info.value)
    reply = backend(llama).complete(USER, None, asked)
    assert parsed(reply)
    assert reply.extra["degraded"] == ["tool_choice=required not supported by llama.cpp: sent auto"]


def test_supports_tools_and_history_without_null_content(llama: LlamaServer) -> None:
    b = backend(llama)
    assert b.supports_tools() is True, b.tool_probe
    history = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "wait", "arguments": "{}"}}
            ],
        },
        {"role": "user", "content": "Bid again."},
    ]
    reply = b.complete(history, None, {**PARAMS, "max_tokens": 8})  # sent with content ""
    assert reply.completion_tokens > 0
    with pytest.raises(Exception, match="500"):  # the null itself: what the backend avoids
        b.post_json(llama.base_url + "/chat/completions", {"model": MODEL, "messages": history})


def test_count_tokens_is_the_servers_tokenizer(llama: LlamaServer, tmp_path: Path) -> None:
    from llama_cpp import Llama

    vocab = Llama(model_path=str(llama.model), vocab_only=True, verbose=False)
    b = backend(llama)
    for text in ("Hello world", "bid [12.5, 3] on block 7 <|im_start|>", "ünïcödé GPU 🚀"):
        expected = len(vocab.tokenize(text.encode("utf-8"), special=True))
        assert b.count_tokens(text) == expected, text
    assert b.count_tokens("") == len(vocab.tokenize(b"", special=True))


def eval_runs(log: str) -> list[int]:
    """Tokens decoded per finished request, from llama.cpp's ``eval time = ... / N runs`` lines."""
    return [int(n) for n in re.findall(r"\beval time =.*?/\s*(\d+) runs", log)]


def test_abandoned_request_is_closed_but_llama_cpp_python_finishes_it(llama: LlamaServer) -> None:
    """Measured: when ``call_timeout`` (asyncio.wait_for) abandons a request, the client closes
    the connection (tests/agents/test_llm_tools.py shows the server side seeing it go), but
    llama-cpp-python checks for a closed connection only before it starts a non-streaming
    request (its server code), so one already decoding runs to ``max_tokens`` for nobody. So keep
    ``max_tokens`` small on a CPU server."""
    story = [{"role": "user", "content": "Write a very long story about GPUs."}]
    b = backend(llama)
    before = len(eval_runs(llama.log_tail(10**7)))
    # 160 tokens with both end tokens banned: the reply cannot stop early, and it takes seconds
    # even on a fast core, so the 0.5 s deadline always falls mid-decode (12 tokens once
    # finished inside a 1 s deadline on an idle CI core).
    no_end = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>
    params = {"temperature": 0.0, "max_tokens": 160, "logit_bias": no_end}

    async def abandon() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(b.acomplete(story, None, params), 0.5)

    asyncio.run(abandon())
    deadline = time.monotonic() + 600
    while len(eval_runs(llama.log_tail(10**7))) == before and time.monotonic() < deadline:
        time.sleep(0.5)
    runs = eval_runs(llama.log_tail(10**7))
    assert len(runs) == before + 1, llama.log_tail(1500)
    assert runs[-1] == 159  # all 160 tokens decoded (the first comes with the prompt) for nobody


def test_hf_backend_has_no_tools_and_counts_with_its_tokenizer() -> None:
    """The transformers backend on the same GGUF: no tool calls (a seat in mode=auto uses JSON),
    tools asked for are recorded as not used, and token counts are its tokenizer's, which for
    plain text agree with llama.cpp's tokenizer of the same file."""
    from real_model_utils import HF_INSTALL, HF_MODULES

    require_modules(HF_MODULES, HF_INSTALL)
    from llama_cpp import Llama

    from agents.llm.backends.hf_backend import HFBackend

    gguf = require_gguf()
    hf = HFBackend(path=gguf, max_new_tokens=2)
    assert hf.supports_tools() is False
    vocab = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    for text in ("Hello world", "bid 12.5 on block 7 in round 3"):
        assert hf.count_tokens(text) == len(vocab.tokenize(text.encode(), add_bos=False)), text
    reply = hf.complete(USER, None, {"max_tokens": 2, "tools": TOOLS, "tool_choice": "auto"})
    assert reply.tool_calls == []
    assert reply.extra["degraded"] == [
        "tools not supported by the hf backend: not used",
        "tool_choice not supported by the hf backend: not used",
    ]
