"""An OpenEnv session whose line-up seats an LLM against the REAL llama.cpp server
(SmolLM2-135M on 127.0.0.1): the server asks the model for that seat's decisions, and the
learner's return equals a local run of the same line-up, which replays the same replies from the
seat's response cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from real_model_utils import (
    LLAMA_INSTALL,
    LLAMA_SERVER_MODULES,
    LlamaServer,
    require_gguf,
    require_modules,
)

pytest.importorskip("openenv")

from agents.registry import make_agent  # noqa: E402
from agents.spec_policy import SpecPolicy  # noqa: E402
from market.run.rollout import run_episode  # noqa: E402
from market.serve.openenv_app import OpenEnvServer  # noqa: E402
from market.serve.openenv_client import MarketEnvClient  # noqa: E402
from scenarios import load_scenario  # noqa: E402

CONTEXT = 4096
OVERRIDES = {"rounds": 1, "negotiation_turns": 1}  # a negotiation turn and a bid per seat


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
def test_a_lineup_llm_seat_plays_through_the_server(llama: LlamaServer, tmp_path: Path) -> None:
    cache = tmp_path / "llm.sqlite"
    spec = (
        f"llm:openai?model={llama.alias}&base_url={llama.base_url}&response_format=json_object"
        f"&max_tokens=64&context={CONTEXT}&timeout=900&cache={cache}"
    )
    policy = make_agent("truthful", "bidder")
    policy.reset(0)
    with (
        OpenEnvServer(max_sessions=2, policy=SpecPolicy.from_lists([spec])) as server,
        MarketEnvClient(base_url=server.url, message_timeout_s=1800).sync() as env,
    ):
        result = env.reset(
            scenario="single_trade",
            seat="bidder_0",
            seed=5,
            lineup={"bidder_1": spec},
            overrides=OVERRIDES,
        )
        total = result.reward
        while not result.done:
            result = env.step(policy.act(result.observation.seat_observation()))
            assert result.observation.error is None
            total += result.reward
        assert env.state().lineup["bidder_1"] == spec
    local = run_episode(
        load_scenario("single_trade", **OVERRIDES), 5, {"bidder_0": "truthful", "bidder_1": spec}
    )
    stats = local.agent_stats["bidder_1"]
    # every request of the local seat was answered from the cache: the server's seat had asked
    # the model exactly these requests (the cache was empty before the session)
    assert stats["decisions"] == 2 and stats["cache_hits"] == stats["requests"] >= 2
    assert total == local.returns["bidder_0"]
