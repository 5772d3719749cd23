"""Semantic validation against the REAL llama.cpp server (SmolLM2-135M on 127.0.0.1): every
action the LLM seat sends the env passes ``validate_for``, so the env refuses none, whatever the
small model writes (what it gets wrong goes to the repair loop or the fallback)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from real_model_utils import (
    LLAMA_INSTALL,
    LLAMA_SERVER_MODULES,
    LlamaServer,
    recording,
    require_gguf,
    require_modules,
)

from agents.llm.backends.openai_backend import OpenAIBackend
from market.environment.aec import raw_env
from market.run.rollout import run_episode


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    gguf = require_gguf()
    require_modules(LLAMA_SERVER_MODULES, LLAMA_INSTALL)
    server = LlamaServer(gguf, n_ctx=4096)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.real_model
@pytest.mark.slow
def test_no_env_refusal_from_a_small_model(llama: LlamaServer, record_property: Any) -> None:
    from agents.llm.agent import LLMAgent

    backend = OpenAIBackend(
        model=llama.alias,
        base_url=llama.base_url,
        response_format="json_object",
        timeout=900.0,
        max_retries=0,
    )
    agent = recording(LLMAgent(backend, retries=2, max_tokens=96, memory="none", context=4096))
    env = raw_env("market_round", rounds=1, negotiation_turns=1, shocks=[])  # one round, no shock
    result = run_episode(
        env.scenario, seed=0, seats={"bidder_0": agent}, env=env, agent_timeout=1800.0
    )
    assert result.decisions["bidder_0"] >= 2
    assert result.invalid_actions["bidder_0"] == 0, [ex["errors"] for ex in agent.exchanges]
    record_property(
        "semantic",
        {k: agent.stats[k] for k in ("decisions", "semantic_refusals", "fallbacks", "retries")},
    )
