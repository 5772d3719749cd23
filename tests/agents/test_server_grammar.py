"""The decision's grammar sent to OpenAI-compatible servers (agents/llm/server_grammar.py): the
dialect per provider preset, what each dialect rewrites or drops (and records), the strict reply
unwrapped, the same grammar behind a response cache, and the LLM designer's mechanism in credits."""

from __future__ import annotations

import json
from typing import Any

import pytest
from real_model_utils import require_modules
from test_llm_prompts import observations

import market
from agents.llm.agent import LLMAgent
from agents.llm.backends.base import Completion
from agents.llm.backends.openai_backend import OpenAIBackend
from agents.llm.cache import CachedBackend, cache_key
from agents.llm.decision_grammar import (
    decision_schema,
    estimated_counter,
    local_grammar,
    seat_schema,
    server_dialect,
)
from agents.llm.prompts import legal_action_schema
from agents.llm.providers import PRESETS
from agents.llm.server_grammar import (
    STRICT_ROOT,
    dialect_for,
    to_dialect,
    unwrap_strict,
)
from market.bench.fake_openai_server import FakeOpenAIServer, Reply
from market.core.actions import ActionParseError
from market.core.seats import DESIGNER
from market.environment import Observation

KEY_ENV = "GPUMARKET_TEST_SERVER_GRAMMAR_KEY"


def _nodes(node: Any) -> list[dict[str, Any]]:
    """Every schema object inside ``node`` (itself included)."""
    if isinstance(node, list):
        return [n for item in node for n in _nodes(item)]
    if not isinstance(node, dict):
        return []
    return [node] + [n for value in node.values() for n in _nodes(value)]


def _decisions() -> list[Observation]:
    picked: list[Observation] = []
    for name in ("market_round", "coalition_market", "mechanism_stage_2"):
        obs = observations(name)
        picked += list(obs[:: max(1, len(obs) // 40)])
    return picked


@pytest.fixture(scope="module")
def decisions() -> list[Observation]:
    return _decisions()


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, "sk-test-server-grammar")
    return KEY_ENV


# --- the dialect per preset ---------------------------------------------------------------------


def test_the_dialect_follows_the_preset_the_format_and_the_url() -> None:
    assert dialect_for(PRESETS["llama.cpp"], "json_object", True) == "llama.cpp"
    assert dialect_for(PRESETS["vllm"], "json_schema", True) == "xgrammar"
    assert dialect_for(PRESETS["sglang"], "json_schema", True) == "xgrammar"
    assert dialect_for(PRESETS["openai"], "json_schema", False) == "openai-strict"
    # the default preset at a local URL is an unknown server: the generic schema, as before;
    # json_object with a schema is constrained only by llama.cpp, so a local one is llama.cpp
    assert dialect_for(PRESETS["openai"], "json_schema", True) is None
    assert dialect_for(PRESETS["openai"], "json_object", True) == "llama.cpp"
    assert dialect_for(PRESETS["deepseek"], "json_object", False) is None
    for preset in PRESETS.values():
        assert dialect_for(preset, "none", True) is None


# --- llama.cpp ----------------------------------------------------------------------------------


def test_llama_cpp_gets_integer_ranges_as_enums_and_a_designer_must_name_a_field(
    decisions: list[Observation],
) -> None:
    rewritten_ints = 0
    for obs in decisions:
        schema = decision_schema(obs, 96)
        assert schema is not None
        sent, notes = to_dialect(schema, "llama.cpp")
        # the input is left as it was (the cache key is the schema the seat made)
        assert schema == decision_schema(obs, 96)
        for node in _nodes(sent):
            assert "minProperties" not in node
            if node.get("type") == "integer" and "const" not in node:
                assert "enum" in node and "maximum" not in node, node
        originals = [
            n
            for n in _nodes(schema)
            if n.get("type") == "integer" and "maximum" in n and "const" not in n
        ]
        for original in originals:  # every bounded integer range is in the sent grammar, exact
            values = list(range(int(original["minimum"]), int(original["maximum"]) + 1))
            assert {"type": "integer", "enum": values} in _nodes(sent)
            rewritten_ints += 1
        if any(n.get("type") == "number" and "maximum" in n for n in _nodes(schema)):
            assert notes, "a bounded number was rewritten or loosened without a note"
    assert rewritten_ints > 20
    designer = next(
        o for o in decisions if o.role == "designer" and "set_mechanism" in o.legal_actions
    )
    # (the mechanism's longest reply needs ~263 tokens: at 96 the grammar leaves only wait)
    sent, _ = to_dialect(decision_schema(designer, 512) or {}, "llama.cpp")
    mechanisms = [
        n
        for n in _nodes(sent)
        if "anyOf" in n
        and n["anyOf"]
        and "properties" in n["anyOf"][0]
        and "auction_type" in n["anyOf"][0]["properties"]
    ]
    assert len(mechanisms) == 1
    fields = list(mechanisms[0]["anyOf"][0]["properties"])
    assert "units" not in fields  # the seat's mechanism is in credits (the agent says so)
    assert [v["required"] for v in mechanisms[0]["anyOf"]] == [[f] for f in fields]


def test_llama_cpps_own_converter_compiles_every_rewritten_grammar(
    decisions: list[Observation],
) -> None:
    require_modules(("llama_cpp",), "pip install llama-cpp-python")
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # noqa: PLC0415  (optional extra)

    for obs in decisions[::3]:
        sent, _ = to_dialect(decision_schema(obs, 96) or {}, "llama.cpp")
        gbnf = json_schema_to_gbnf(json.dumps(sent))
        assert "root ::=" in gbnf
        # the bounds are in the grammar itself: an integer enum is a list of literals
        if any(n.get("type") == "integer" and "enum" in n for n in _nodes(sent)):
            assert '"0"' in gbnf or '"1"' in gbnf


# --- OpenAI strict ------------------------------------------------------------------------------


def test_openai_strict_wraps_requires_every_field_and_drops_what_strict_refuses(
    decisions: list[Observation],
) -> None:
    dropped = ("minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum")
    for obs in decisions[::4]:
        schema = decision_schema(obs, 96) or {}
        sent, notes = to_dialect(schema, "openai-strict")
        assert sent["type"] == "object" and sent["required"] == [STRICT_ROOT]
        for node in _nodes(sent):
            assert not any(k in node for k in (*dropped, "minProperties"))
            if isinstance(node.get("properties"), dict):
                assert node["required"] == list(node["properties"])
                assert node["additionalProperties"] is False
        used = {k for n in _nodes(schema) for k in dropped if k in n}
        assert {n.split(" ")[0] for n in notes} == used


def test_a_strict_reply_unwraps_to_the_action_the_agent_plays() -> None:
    obs = next(o for o in observations("market_round") if "bid" in o.legal_actions)
    agent = LLMAgent(_Fixed("{}"))
    strict = json.dumps({STRICT_ROOT: {"action_type": "bid", "bids": [3.0], "coalition_id": None}})
    plain = agent.parse_reply(unwrap_strict(strict), obs, semantic=False)
    assert plain == agent.parse_reply('{"action_type": "bid", "bids": [3.0]}', obs, semantic=False)
    assert unwrap_strict('{"action_type": "wait"}') == '{"action_type": "wait"}'
    assert unwrap_strict("not json") == "not json"


def test_the_openai_preset_sends_strict_and_reads_the_wrapped_reply(key: str) -> None:
    backend = OpenAIBackend("gpt-x", provider="openai", api_key_env=key)
    obs = next(o for o in observations("market_round") if "bid" in o.legal_actions)
    schema = seat_schema(obs, backend, {"max_tokens": 96}, structured=True, reasoning=False)
    assert schema == decision_schema(obs, 96, count=estimated_counter)
    notes: list[str] = []
    body = backend._request([], schema, {}, "json_schema", notes)
    fmt = body["response_format"]["json_schema"]
    assert fmt["strict"] is True and fmt["schema"] == to_dialect(schema, "openai-strict")[0]
    assert notes == to_dialect(schema, "openai-strict")[1] and notes
    from openai.types.chat import ChatCompletion  # noqa: PLC0415

    reply = json.dumps({STRICT_ROOT: {"action_type": "wait", "reasoning": None}})
    response = ChatCompletion.model_validate(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-x",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": reply},
                }
            ],
        }
    )
    assert backend._completion(response, 0.1, "json_schema").text == '{"action_type": "wait"}'


# --- a real (fake) server, the cache ------------------------------------------------------------


class _Fixed:
    """An in-process backend that answers one fixed text and records the schemas it got."""

    model = "fixed"

    def __init__(self, text: str) -> None:
        self.text, self.schemas = text, []  # type: list[Any]

    def complete(self, messages: Any, schema: Any, params: dict[str, Any]) -> Completion:
        self.schemas.append(schema)
        return Completion(text=self.text, model=self.model)

    async def acomplete(self, messages: Any, schema: Any, params: dict[str, Any]) -> Completion:
        return self.complete(messages, schema, params)


class _Local(_Fixed):
    """Looks like the hf backend with its grammar on."""

    constrain = True
    max_new_tokens = 80

    def count_tokens(self, text: str) -> int:
        return len(text)


def test_llama_cpp_server_seat_sends_the_decisions_grammar_and_a_cache_sends_the_same(
    tmp_path: Any,
) -> None:
    obs = next(o for o in observations("coalition_market") if o.phase == "negotiation")
    with FakeOpenAIServer() as server:
        server.script(Reply(content='{"action_type": "wait"}'))
        backend = OpenAIBackend(
            "m", base_url=server.base_url, provider="llama.cpp", max_retries=0, timeout=30
        )
        agent = LLMAgent(backend, max_tokens=96, memory="none")
        agent.reset(0)
        agent.act(obs)
        # counted with the server's tokenizer (the fake's counts words), not the estimate
        grammar = decision_schema(obs, 96, count=backend.count_tokens)
        assert grammar != decision_schema(obs, 96, count=estimated_counter)
        chat = [r for r in server.requests if r.path.endswith("/chat/completions")]
        assert chat[-1].body["response_format"] == {
            "type": "json_object",
            "schema": to_dialect(grammar or {}, "llama.cpp")[0],
        }
        assert agent.last_exchange is not None
        assert agent.last_exchange["degraded"] == to_dialect(grammar or {}, "llama.cpp")[1]
        cached = CachedBackend(backend, tmp_path / "c.sqlite", model="m")
        assert server_dialect(cached) == "llama.cpp"
        assert seat_schema(obs, cached, {"max_tokens": 96}, structured=True, reasoning=False) == (
            grammar
        )
    # offline, without the backend: the recorded grammar and token counts give the same schema
    replay = CachedBackend(None, tmp_path / "c.sqlite", mode="read", model="m")
    assert server_dialect(replay) == "llama.cpp"
    assert seat_schema(obs, replay, {"max_tokens": 96}, structured=True, reasoning=False) == grammar
    assert (
        server_dialect(CachedBackend(None, tmp_path / "new.sqlite", mode="read", model="m")) is None
    )
    local = _Local("{}")
    wrapped = CachedBackend(local, tmp_path / "l.sqlite")
    assert local_grammar(wrapped) and not local_grammar(_Fixed("{}"))
    expected = decision_schema(obs, 64, count=local.count_tokens)
    assert seat_schema(obs, wrapped, {"max_tokens": 64}, structured=True, reasoning=False) == (
        expected
    )
    # a backend without a grammar still gets the generic schema, cached or not
    plain = CachedBackend(_Fixed("{}"), tmp_path / "p.sqlite")
    assert seat_schema(obs, plain, {}, structured=True, reasoning=False) is legal_action_schema(
        obs.legal_actions, False
    )
    # the schema is in the cache key: the same request under another grammar is another entry
    messages = [{"role": "user", "content": "x"}]
    assert cache_key("m", messages, expected, {}) != cache_key("m", messages, grammar, {})


# --- the LLM designer in the daedalus family ----------------------------------------------------


@pytest.mark.parametrize("reply_units", [None, "credits"])
def test_the_llm_designers_reserve_is_the_number_it_wrote_in_credits(
    reply_units: str | None,
) -> None:
    env = market.raw_env("daedalus_stage_0")
    env.reset(seed=0)
    assert env.agent_selection == DESIGNER and env.phase == "design"
    reserve = 12.5  # in credits; read in DAEDALUS units it would be 562.5 credits (refused)
    mechanism: dict[str, Any] = {"reserve_price": reserve}
    if reply_units:
        mechanism["units"] = reply_units
    backend = _Fixed(json.dumps({"action_type": "set_mechanism", "mechanism": mechanism}))
    agent = LLMAgent(backend, memory="none")
    agent.reset(0)
    action = agent.act(env.observe(DESIGNER))
    assert agent.last_exchange is not None and not agent.last_exchange["fallback"]
    env.step(action)
    assert "error" not in env.infos[DESIGNER]
    assert env.mechanism.reserve_price == pytest.approx(reserve)


def test_a_designer_that_names_daedalus_units_keeps_them() -> None:
    obs = market.raw_env("daedalus_stage_0")
    obs.reset(seed=0)
    agent = LLMAgent(_Fixed("{}"))
    reply = (
        '{"action_type": "set_mechanism", "mechanism": {"units": "daedalus", "reserve_price": 0.2}}'
    )
    action = agent.parse_reply(reply, obs.observe(DESIGNER), semantic=False)
    assert action.mechanism.units == "daedalus"  # type: ignore[attr-defined]
    with pytest.raises(ActionParseError):
        agent.parse_reply('{"action_type": "bid"}', obs.observe(DESIGNER))
