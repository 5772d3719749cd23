"""An LLM seat with memory against the REAL llama.cpp server (SmolLM2-135M on 127.0.0.1): its
second decision's request carries its first decision's reply, and every request fits the
configured context (the seat's own count, and the server's prompt token count)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from real_model_utils import (
    LLAMA_INSTALL,
    LLAMA_SERVER_MODULES,
    LlamaServer,
    check_llm_seat,
    recording,
    require_gguf,
    require_modules,
)

from agents.llm.backends.openai_backend import OpenAIBackend
from agents.llm.reasoning import split_think
from market.environment.aec import raw_env
from market.run.rollout import run_episode

CONTEXT = 4096  # the server's n_ctx below, and the seat's context=


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    gguf = require_gguf()
    require_modules(LLAMA_SERVER_MODULES, LLAMA_INSTALL)
    server = LlamaServer(gguf, n_ctx=CONTEXT)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.real_model
@pytest.mark.slow
def test_memory_window_on_llama_cpp(llama: LlamaServer, record_property: Any) -> None:
    from agents.llm.agent import LLMAgent

    backend = OpenAIBackend(
        model=llama.alias,
        base_url=llama.base_url,
        response_format="json_object",
        timeout=900.0,  # a loaded 2-core CI machine evaluates a few thousand prompt tokens slowly
        max_retries=0,
    )
    agent = recording(
        LLMAgent(backend, retries=0, max_tokens=96, memory="window:4", context=CONTEXT)
    )
    env = raw_env("single_trade", rounds=1, negotiation_turns=1)  # a negotiation turn, a bid
    start = time.perf_counter()
    result = run_episode(
        env.scenario, seed=0, seats={"bidder_0": agent}, env=env, agent_timeout=1800.0
    )
    summary = check_llm_seat(result, "bidder_0", agent)
    errors = [e for ex in agent.exchanges for e in ex["errors"] if e.startswith("backend")]
    assert summary["backend_errors"] == 0, f"{errors}\n{llama.log_tail(1500)}"
    assert len(agent.exchanges) == 2
    first, second = agent.exchanges
    # the first request is system + user; the second carries the first turn and its reply
    assert [m["role"] for m in first["messages"][:2]] == ["system", "user"]
    reply = split_think(first["raw_replies"][-1])[0]
    sent = second["messages"]
    assert sent[0]["role"] == "system"
    assert sent[1] == first["messages"][1]
    assert sent[2] == {"role": "assistant", "content": reply}
    assert "What changed since your last turn" in sent[3]["content"]
    # every request fit the budget, by the seat's count and by the server's
    budget = CONTEXT - 96
    assert all(ex["memory"]["prompt_tokens"] <= budget for ex in agent.exchanges)
    assert agent.stats["prompt_tokens"] <= budget * agent.stats["requests"]
    record_property(
        "summary",
        {
            **summary,
            "seconds": round(time.perf_counter() - start, 2),
            "prompt_chars": [
                sum(len(m["content"]) for m in ex["messages"]) for ex in agent.exchanges
            ],
        },
    )
