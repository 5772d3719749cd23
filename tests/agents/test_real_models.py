"""Episodes with a real (tiny) language model in LLM seats: SmolLM2-135M-Instruct.

(a) through llama.cpp's OpenAI-compatible server (``llama-cpp-python[server]``) started here on a
free 127.0.0.1 port, via :class:`~agents.llm.backends.openai_backend.OpenAIBackend`;
(b) in-process via :class:`~agents.llm.backends.hf_backend.HFBackend` (torch + transformers reading
the same GGUF), kept to two decisions because CPU decoding is slow.

The checks are structural, never about the model's text: every decision was a parsed action or a
counted fallback, tokens were counted, the episode completed without an agent exception. The
``real_model`` tests are skipped when the model or packages are absent, unless
``GPUMARKET_REQUIRE_REAL_MODELS=1`` (CI), which turns that into a failure. Install lines: see
``tests/real_model_utils.py``. The unmarked tests at the end need neither model nor torch.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_model_utils import (
    HF_INSTALL,
    HF_MODULES,
    LLAMA_INSTALL,
    LLAMA_SERVER_MODULES,
    LlamaServer,
    check_llm_seat,
    recording,
    require_gguf,
    require_modules,
)

from market.core.actions import Bid, Wait
from market.environment.aec import raw_env
from market.run.rollout import arun_episode, run_episode
from scenarios import load_scenario

real_model = pytest.mark.real_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the Hub: the model is local
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# small reply budgets: structure is what is tested, and a 135M model rambles
LLAMA_MAX_TOKENS = 128
HF_MAX_TOKENS = 48
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gguf() -> Path:
    return require_gguf()


@pytest.fixture(scope="module")
def llama_server(request: pytest.FixtureRequest, gguf: Path) -> Iterator[LlamaServer]:
    require_modules(LLAMA_SERVER_MODULES, LLAMA_INSTALL)
    server = LlamaServer(gguf)
    request.addfinalizer(server.stop)  # registered before start: a half-started server dies too
    server.start()
    yield server


@pytest.fixture
def llama(llama_server: LlamaServer) -> LlamaServer:
    """The module's llama.cpp server, restarted if an earlier test crashed it."""
    return llama_server.ensure_running()


def server_failure(server: LlamaServer, *agents: Any) -> str:
    """What went wrong, for an assertion message: the agents' errors and the server's log."""
    errors = [ex["errors"] for agent in agents for ex in agent.exchanges if ex["errors"]]
    state = "running" if server.running() else f"exited with {server.exit_code()}"
    return f"errors: {errors}\nserver {state}; log tail:\n{server.log_tail(1500)}"


def llama_agent(server: LlamaServer, retries: int = 1) -> Any:
    from agents.llm.agent import LLMAgent
    from agents.llm.backends.openai_backend import OpenAIBackend

    backend = OpenAIBackend(
        model=server.alias,
        base_url=server.base_url,
        response_format="json_object",
        timeout=300.0,
        max_retries=0,
    )
    return recording(LLMAgent(backend, retries=retries, max_tokens=LLAMA_MAX_TOKENS))


@real_model
def test_llama_server_bidder_single_trade(llama: LlamaServer, record_property: Any) -> None:
    """A bidder seat on llama.cpp (sync path: act -> complete), one round of single_trade:
    two negotiation turns and a bid."""
    agent = llama_agent(llama)
    env = raw_env("single_trade", rounds=1)
    start = time.perf_counter()
    # a CPU model on a loaded CI machine can take minutes per decision: not the scenario's limit
    result = run_episode(
        env.scenario, seed=0, seats={"bidder_0": agent}, env=env, agent_timeout=900.0
    )
    elapsed = time.perf_counter() - start
    assert len(result.round_log) == 1  # the episode ran to its end
    summary = check_llm_seat(result, "bidder_0", agent)
    assert summary["backend_errors"] == 0, server_failure(llama, agent)
    assert agent.exchanges[0]["phase"] == "negotiation"
    record_property(
        "summary",
        {
            **summary,
            "seconds": round(elapsed, 2),
            "server_startup_s": round(llama.startup_s or 0.0, 2),
        },
    )


@real_model
def test_llama_server_designer_market_round(llama: LlamaServer, record_property: Any) -> None:
    """The designer seat and a bidder on llama.cpp (async path: aact -> acomplete), 1 round
    with one negotiation pass."""
    designer, bidder = llama_agent(llama), llama_agent(llama)
    sc = load_scenario("market_round", rounds=1, negotiation_turns=1, shocks=[])
    start = time.perf_counter()
    result = asyncio.run(
        arun_episode(
            sc, seed=0, seats={"designer_0": designer, "bidder_1": bidder}, agent_timeout=900.0
        )
    )
    elapsed = time.perf_counter() - start
    assert len(result.round_log) == 1
    summaries = {
        seat: check_llm_seat(result, seat, agent)
        for seat, agent in (("designer_0", designer), ("bidder_1", bidder))
    }
    for seat, agent in (("designer_0", designer), ("bidder_1", bidder)):
        assert summaries[seat]["backend_errors"] == 0, server_failure(llama, agent)
    assert {ex["phase"] for ex in designer.exchanges} == {"design"}
    record_property("summary", {**summaries, "seconds": round(elapsed, 2)})


@real_model
def test_llama_server_serial_decision_rate(llama: LlamaServer, record_property: Any) -> None:
    """Decisions per second at concurrency 1 through ``LLMAgent.aact``, one decision per phase
    (recorded as a junit property, not asserted)."""
    env = raw_env("market_round", rounds=1, shocks=[])
    env.reset(seed=0)
    observations: dict[str, Any] = {}
    for _ in env.agent_iter():  # the first observation of each phase of one scripted round
        obs, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        observations.setdefault(obs.phase, obs)
        env.step(Bid(bids=[]) if obs.phase == "bidding" else Wait())
    assert set(observations) == {"design", "negotiation", "bidding"}
    agent = llama_agent(llama, retries=0)
    agent.reset(0)

    async def serial() -> float:
        start = time.perf_counter()
        for obs in observations.values():
            await agent.aact(obs)
        return time.perf_counter() - start

    seconds = asyncio.run(serial())
    assert agent.stats["decisions"] == len(observations)
    assert agent.stats["backend_errors"] == 0, server_failure(llama, agent)
    record_property("decisions_per_s", round(len(observations) / seconds, 4))
    record_property("prompt_tokens", agent.stats["prompt_tokens"])
    record_property("completion_tokens", agent.stats["completion_tokens"])


@pytest.fixture(scope="module")
def hf_backend(gguf: Path) -> Any:
    require_modules(HF_MODULES, HF_INSTALL)
    from agents.llm.backends.hf_backend import HFBackend

    start = time.perf_counter()
    backend = HFBackend(path=gguf, max_new_tokens=HF_MAX_TOKENS).load()
    backend.load_seconds = time.perf_counter() - start
    return backend


@real_model
def test_hf_backend_complete(hf_backend: Any) -> None:
    """The backend alone: greedy is deterministic, a seeded sample repeats, tokens are counted,
    the discriminator value is constrained to the schema's constants."""
    from agents.llm.backends.base import Completion

    messages = [{"role": "user", "content": 'Reply with the JSON object {"action_type": "wait"}.'}]
    schema = {
        "type": "object",
        "properties": {"action_type": {"enum": ["wait", "finish"]}},
        "required": ["action_type"],
    }
    first = hf_backend.complete(messages, schema, {"max_tokens": 8})
    again = hf_backend.complete(messages, schema, {"max_tokens": 8})
    assert isinstance(first, Completion) and first.text == again.text
    assert first.text.startswith('{"action_type": "')
    assert first.text[len('{"action_type": "') :].split('"')[0] in ("wait", "finish")
    assert first.prompt_tokens > 0 and 0 < first.completion_tokens <= 8 and first.latency_s > 0
    sampled = [
        hf_backend.complete(messages, None, {"max_tokens": 6, "temperature": 1.0, "seed": 7}).text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]
    free = asyncio.run(hf_backend.acomplete(messages, None, {"max_tokens": 4}))
    assert 0 < free.completion_tokens <= 4


@real_model
def test_hf_backend_market_round(hf_backend: Any, record_property: Any) -> None:
    """The designer and one bidder in-process on HFBackend: 1 round, no negotiation, no retries
    (2 decisions on ~1k-token prompts)."""
    from agents.llm.agent import LLMAgent

    designer = recording(LLMAgent(hf_backend, retries=0, max_tokens=HF_MAX_TOKENS))
    bidder = recording(LLMAgent(hf_backend, retries=0, max_tokens=HF_MAX_TOKENS))
    sc = load_scenario("market_round", rounds=1, negotiation_turns=0, shocks=[])
    start = time.perf_counter()
    result = run_episode(
        sc, seed=0, seats={"designer_0": designer, "bidder_0": bidder}, agent_timeout=900.0
    )
    elapsed = time.perf_counter() - start
    assert len(result.round_log) == 1
    summaries = {
        seat: check_llm_seat(result, seat, agent)
        for seat, agent in (("designer_0", designer), ("bidder_0", bidder))
    }
    for summary in summaries.values():
        assert summary["backend_errors"] == 0
        assert summary["decisions"] == 1
    record_property(
        "summary",
        {
            **summaries,
            "seconds": round(elapsed, 2),
            "load_seconds": round(hf_backend.load_seconds, 2),
        },
    )


# --- no model needed ---------------------------------------------------------------------------


def test_hf_backend_imports_without_torch() -> None:
    """``import agents`` and the backend module never import torch or transformers."""
    code = (
        "import sys, agents, agents.llm.backends.hf_backend; "
        "assert not {'torch', 'transformers'} & set(sys.modules), 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_hf_backend_missing_extra_names_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from agents.llm.backends import hf_backend

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch" else real_find_spec(name, *a),
    )
    with pytest.raises(ModuleNotFoundError) as info:
        hf_backend.HFBackend(path=model)
    assert "pip install 'gpumarket[hf]'" in str(info.value)
    assert "torch==2.13.0" in str(info.value)


def test_hf_backend_paths(tmp_path: Path) -> None:
    from agents.llm.backends.hf_loading import resolve_model_path

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert resolve_model_path(model) == (str(tmp_path.resolve()), "m.gguf")
    assert resolve_model_path(tmp_path, "m.gguf") == (str(tmp_path.resolve()), "m.gguf")
    assert resolve_model_path(tmp_path) == (str(tmp_path.resolve()), None)
    assert resolve_model_path("org/some-model") == ("org/some-model", None)  # a Hub id
    for bad in (tmp_path / "missing.gguf", (tmp_path, "other.gguf")):
        with pytest.raises(ValueError):
            resolve_model_path(*bad) if isinstance(bad, tuple) else resolve_model_path(bad)


@real_model
def test_llama_server_designer_on_the_daedalus_family(
    llama: LlamaServer, record_property: Any
) -> None:
    """An LLM designer on llama.cpp in daedalus_stage_0 (two design steps of 5 rounds): it is
    asked only at the start of each step, and the schema it is shown names the units field."""
    designer = llama_agent(llama)
    sc = load_scenario("daedalus_stage_0", rounds=6)  # design steps start in rounds 0 and 5
    result = run_episode(sc, seed=0, seats={"designer_0": designer}, agent_timeout=900.0)
    assert len(result.round_log) == 6
    # every decision is a parsed action or a counted fallback that says why (a slow CPU server
    # may time a request out: that is counted, not hidden)
    summary = check_llm_seat(result, "designer_0", designer)
    assert summary["requests"] >= 2, server_failure(llama, designer)
    assert [(ex["round"], ex["phase"]) for ex in designer.exchanges] == [
        (0, "design"),
        (5, "design"),
    ]
    prompt = " ".join(str(m.get("content", "")) for m in designer.exchanges[0]["messages"])
    assert '"units"' in prompt and "daedalus" in prompt
    record_property("summary", summary)
