"""The grammar of one decision (agents.llm.decision_grammar): only legal types, ids from the
observation, bounded numbers and text, the longest reply within max_tokens, and the hf engine
compiling it unchanged by ``bounded``."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from real_model_utils import HF_INSTALL, HF_MODULES, require_gguf, require_modules
from test_llm_prompts import observations

from agents.llm.backends.hf_engine import bounded
from agents.llm.decision_grammar import (
    MIN_TEXT_CHARS,
    REPLY_MARGIN,
    TEXT_CHARS,
    decision_schema,
    estimated_counter,
    longest_reply_tokens,
    seat_schema,
)
from agents.llm.prompts import estimate_tokens, legal_action_schema
from market.core.action_checks import unit_cap, validate_for
from market.core.actions import ActionParseError, parse_action
from market.environment import Observation
from scenarios import builtin_names

#: id fields and what the observation says they may name
ID_FIELDS = ("to", "target", "offer_id", "coalition_id", "job_id")


def _variants(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return schema.get("anyOf", [schema])


def _kind(variant: dict[str, Any]) -> str:
    return str(variant["properties"]["action_type"]["const"])


def _sample(n_per_scenario: int) -> list[Observation]:
    """Up to ``n_per_scenario`` observations of each built-in scenario (seed-0 episodes with the
    scenario's own seats; large_market's first 300), spread evenly."""
    out = []
    for name in builtin_names():
        obs = observations(name)
        step = max(1, len(obs) // n_per_scenario)
        out += list(obs[::step][:n_per_scenario])
    return out


def _maximal_reply(variant: dict[str, Any]) -> str:
    """The longest reply ``variant`` allows, written out: every field, each at its longest value
    (free text filled with 'x'; numbers with every allowed digit), xgrammar's separators."""

    def value(prop: dict[str, Any]) -> str:
        if "const" in prop:
            return json.dumps(prop["const"])
        if "enum" in prop:
            return max((json.dumps(v) for v in prop["enum"]), key=len)
        kind = prop.get("type")
        if kind == "boolean":
            return "false"
        if kind in ("integer", "number"):
            digits = max(len(str(int(abs(x)))) for x in (prop["minimum"], prop["maximum"]))
            return "9" * digits + (".999999" if kind == "number" else "")
        if kind == "array":
            return "[" + ", ".join([value(prop["items"])] * int(prop["maxItems"])) + "]"
        if kind == "object":
            return obj(prop)
        if kind == "string":  # the pattern's upper repetition bound
            chars = int(prop["pattern"].rsplit(",", 1)[1].split("}")[0])
            return json.dumps("x" * chars)
        raise AssertionError(prop)

    def obj(schema: dict[str, Any]) -> str:
        items = [f"{json.dumps(k)}: {value(p)}" for k, p in schema["properties"].items()]
        return "{" + ", ".join(items) + "}"

    return obj(variant)


@pytest.mark.slow
def test_every_maximal_reply_fits_and_every_id_enum_is_real_over_1000_observations() -> None:
    """Property sweep: >= 1,000 observations from every built-in scenario, each with a random
    max_tokens; every variant's longest reply fits it, and every id field is a non-empty enum of
    ids the observation holds (else its type is gone)."""
    rng = random.Random(0)
    sample = _sample(60)
    assert len(sample) >= 1_000 and len({o.seat for o in sample}) > 10
    kinds_seen: set[str] = set()
    for obs in sample:
        max_tokens = rng.choice([48, 96, 160, 256, 384, 512])
        schema = decision_schema(obs, max_tokens)
        assert schema is not None
        assert bounded(schema) == schema  # the engine compiles exactly this grammar
        assert longest_reply_tokens(schema) <= max_tokens - REPLY_MARGIN
        received = {o.offer_id for o in obs.offers_received or ()}
        sent = {o.offer_id for o in obs.offers_sent or ()}
        jobs = {j.job_id for j in obs.jobs or () if j.status == "active"}
        labs = set(obs.active_labs) - {obs.seat}
        for variant in _variants(schema):
            kind = _kind(variant)
            kinds_seen.add(kind)
            assert kind in obs.legal_actions
            text = _maximal_reply(variant)
            # the written-out longest reply fits too, by the estimate with its margin
            assert estimated_counter(text) <= max_tokens, (kind, max_tokens, text)
            for name, prop in variant["properties"].items():
                if name == "members":
                    prop = prop["items"]
                if name not in (*ID_FIELDS, "members"):
                    continue
                ids = set(prop.get("enum", [prop.get("const")]))
                assert ids and None not in ids, (kind, name)
                if name in ("to", "target", "members"):
                    assert ids <= labs | {"all"}
                elif name == "offer_id":
                    assert ids <= (received | sent if kind == "reject_offer" else received)
                elif name == "job_id":
                    assert ids <= jobs
                else:
                    mine = {c.coalition_id for c in obs.coalitions or ()}
                    public = {c.coalition_id for c in obs.public_coalitions}
                    assert ids <= mine | public
            if kind == "bid":
                assert variant["properties"]["bids"]["maxItems"] <= unit_cap(obs)
    assert {"bid", "send_offer", "accept_offer", "set_mechanism", "wait"} <= kinds_seen


def test_only_legal_types_and_required_ids_or_the_type_goes() -> None:
    obs = next(
        o for o in observations("market_round") if o.phase == "negotiation" and o.role == "bidder"
    )
    bare = obs.model_copy(update={"offers_received": [], "offers_sent": [], "coalitions": []})
    kinds = [_kind(v) for v in _variants(decision_schema(bare, 384) or {})]
    for gone in ("accept_offer", "counter_offer", "reject_offer", "leave_coalition"):
        assert gone not in kinds
    assert "wait" in kinds and "send_offer" in kinds
    assert set(kinds) <= set(obs.legal_actions)
    alone = bare.model_copy(update={"active_labs": [obs.seat]})
    kinds = [_kind(v) for v in _variants(decision_schema(alone, 384) or {})]
    assert "send_offer" not in kinds and "form_coalition" not in kinds
    # a message to all is still possible with nobody else to address by name
    message = next(
        v for v in _variants(decision_schema(alone, 384) or {}) if _kind(v) == "send_message"
    )
    assert message["properties"]["to"]["enum"] == ["all"]


def test_allocate_to_job_has_one_variant_per_active_job_with_its_blocks_left() -> None:
    obs = next(
        o
        for o in observations("coalition_market")
        if o.role == "bidder" and sum(j.status == "active" for j in o.jobs or ()) >= 2
    )
    schema = decision_schema(obs, 384) or {}
    jobs = {
        v["properties"]["job_id"]["const"]: v["properties"]["blocks"]["maximum"]
        for v in _variants(schema)
        if _kind(v) == "allocate_to_job"
    }
    assert jobs == {
        j.job_id: j.size - j.progress
        for j in obs.jobs or ()
        if j.status == "active" and j.size > j.progress
    }


def test_designer_must_name_a_mechanism_field_and_money_is_bounded() -> None:
    obs = next(o for o in observations("market_round") if o.role == "designer")
    schema = decision_schema(obs, 512) or {}
    mech = next(v for v in _variants(schema) if _kind(v) == "set_mechanism")
    inner = mech["properties"]["mechanism"]
    assert inner["minProperties"] == 1 and "mechanism" in mech["required"]
    for prop in inner["properties"].values():
        if prop["type"] == "number":
            assert "maximum" in prop and "minimum" in prop


def test_text_shrinks_with_max_tokens_and_required_text_drops_its_type() -> None:
    obs = next(
        o for o in observations("market_round") if o.phase == "negotiation" and o.role == "bidder"
    )

    def text_chars(max_tokens: int) -> int | None:
        schema = decision_schema(obs, max_tokens) or {}
        for v in _variants(schema):
            if _kind(v) == "send_message":
                return int(v["properties"]["text"]["pattern"].rsplit(",", 1)[1].split("}")[0])
        return None

    wide, narrow, tiny = text_chars(2048), text_chars(64), text_chars(24)
    assert wide == TEXT_CHARS
    assert narrow is not None and MIN_TEXT_CHARS <= narrow < TEXT_CHARS
    assert tiny is None  # no room for a message: send_message is not offered


def test_bid_cap_follows_the_round_and_shrinks_to_fit() -> None:
    obs = next(o for o in observations("market_round") if o.phase == "bidding")
    bid = next(v for v in _variants(decision_schema(obs, 2048) or {}) if _kind(v) == "bid")
    assert bid["properties"]["bids"]["maxItems"] == unit_cap(obs)
    # a bid names at least one price: abstaining is wait (an empty bid played nothing)
    assert bid["properties"]["bids"]["minItems"] == 1 and "bids" in bid["required"]
    assert "wait" in obs.legal_actions
    small = next(v for v in _variants(decision_schema(obs, 64) or {}) if _kind(v) == "bid")
    assert 1 <= small["properties"]["bids"]["maxItems"] < unit_cap(obs)
    assert longest_reply_tokens({"anyOf": [small]}) <= 64 - REPLY_MARGIN
    # too few tokens for even one price: no bid is offered (rather than an empty one)
    assert not [v for v in _variants(decision_schema(obs, 40) or {}) if _kind(v) == "bid"]


def test_replies_the_grammar_allows_parse_and_name_real_ids() -> None:
    """Random replies drawn from the grammar parse as actions (but for cross-field rules the
    grammar does not state) and never fail on an unknown id."""
    rng = random.Random(1)

    def draw(prop: dict[str, Any]) -> Any:
        if "const" in prop:
            return prop["const"]
        if "enum" in prop:
            return rng.choice(prop["enum"])
        kind = prop["type"]
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "integer":
            return rng.randint(prop["minimum"], prop["maximum"])
        if kind == "number":
            return round(rng.uniform(prop["minimum"], prop["maximum"]), 2)
        if kind == "array":
            n = rng.randint(prop.get("minItems", 0), prop["maxItems"])
            return [draw(prop["items"]) for _ in range(n)]
        if kind == "object":
            return {k: draw(p) for k, p in prop["properties"].items() if rng.random() < 0.5} or {
                next(iter(prop["properties"])): draw(next(iter(prop["properties"].values())))
            }
        return "hello there"

    unknown = ("does not exist", "not one of your", "is not open", "not in coalition")
    checked = parsed = 0
    for obs in _sample(15):
        schema = decision_schema(obs, 384) or {}
        for variant in _variants(schema):
            reply = {
                k: draw(p)
                for k, p in variant["properties"].items()
                if k in variant["required"] or rng.random() < 0.5
            }
            if "bids" in reply:  # non-increasing: a rule the grammar does not state
                reply["bids"] = sorted(reply["bids"], reverse=True)
            try:
                action = parse_action(reply, designer=obs.role == "designer")
            except ActionParseError as exc:  # a cross-field rule (a swap is a buy offer)
                assert not any(u in str(exc) for u in unknown), (reply, exc)
                continue
            parsed += 1
            reasons = validate_for(action, obs)
            assert not any(u in r for r in reasons for u in unknown), (reply, reasons)
            checked += 1
    assert checked > 500 and parsed > 0.8 * checked


def test_the_seat_sends_the_grammar_only_to_a_local_grammar_backend() -> None:
    obs = next(o for o in observations("market_round") if o.phase == "negotiation")

    class Local:
        constrain = True
        max_new_tokens = 200

        def count_tokens(self, text: str) -> int:
            return estimate_tokens(text) * 2

    class Server:
        pass

    local = seat_schema(obs, Local(), {"max_tokens": 128}, structured=True, reasoning=False)
    assert local == decision_schema(obs, 128, count=Local().count_tokens)
    assert seat_schema(obs, Server(), {}, structured=True, reasoning=False) is (
        legal_action_schema(obs.legal_actions, obs.role == "designer")
    )
    assert seat_schema(obs, Local(), {}, structured=False, reasoning=False) is None
    thinking = seat_schema(obs, Local(), {}, structured=True, reasoning=True) or {}
    for variant in _variants(thinking):
        assert next(iter(variant["properties"])) == "reasoning"
        assert variant["required"][0] == "reasoning"


@pytest.mark.slow
def test_with_smollm2s_tokenizer_the_written_out_longest_reply_fits() -> None:
    """With a real tokenizer's counts (SmolLM2's), the grammar's bound holds for the longest
    reply written out whole, not only piece by piece."""
    require_modules(("llama_cpp",), "pip install llama-cpp-python")
    import llama_cpp  # noqa: PLC0415  (optional heavy dependency)

    llm = llama_cpp.Llama(str(require_gguf()), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(llm.tokenize(text.encode(), add_bos=False, special=False))

    rng = random.Random(2)
    for obs in _sample(20):
        max_tokens = rng.choice([64, 128, 384])
        schema = decision_schema(obs, max_tokens, count=count)
        assert schema is not None
        assert longest_reply_tokens(schema, count) <= max_tokens - REPLY_MARGIN
        for variant in _variants(schema):
            assert count(_maximal_reply(variant)) <= max_tokens, (_kind(variant), max_tokens)


@pytest.mark.slow
@pytest.mark.real_model
def test_xgrammar_compiles_every_decisions_grammar_with_smollm2s_tokenizer() -> None:
    """The hf engine's compiler (xgrammar with the model's tokenizer) takes every grammar: a
    text bound above xgrammar's repetition limit (128) fails there, not in the schema checks."""
    require_modules(HF_MODULES, HF_INSTALL)
    import xgrammar as xgr  # noqa: PLC0415  (optional heavy dependency)

    from agents.llm.backends.hf_backend import HFBackend  # noqa: PLC0415

    backend = HFBackend(path=str(require_gguf()), max_new_tokens=64).load()
    tokenizer = backend._get_loaded().tokenizer
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer), max_threads=2)
    for obs in _sample(4):
        schema = seat_schema(obs, backend, {"max_tokens": 384}, structured=True, reasoning=False)
        assert schema is not None
        compiler.compile_json_schema(json.dumps(bounded(schema)), any_whitespace=False)


class _LocalFake:
    """A backend shaped like llm:hf (``constrain``, ``count_tokens``, no tool calls)."""

    model = "local-fake"

    def __init__(self, finish: str = "stop") -> None:
        self.constrain, self.max_new_tokens, self.finish = True, 256, finish
        self.schemas: list[Any] = []

    def count_tokens(self, text: str) -> int:
        return estimated_counter(text)

    def supports_tools(self) -> bool:
        return False

    def complete(self, messages: Any, schema: Any, params: Any) -> Any:
        from agents.llm.backends.base import Completion  # noqa: PLC0415

        self.schemas.append(schema)
        text = '{"action_type": "wait"}' if self.finish == "stop" else '{"action_type": "wa'
        return Completion(text=text, model=self.model, extra={"finish_reason": self.finish})


def test_a_local_grammar_seat_sends_the_decisions_grammar_and_counts_cutoffs() -> None:
    from agents.llm.agent import LLMAgent  # noqa: PLC0415

    obs = next(o for o in observations("market_round") if o.phase == "negotiation")
    backend = _LocalFake()
    agent = LLMAgent(backend, memory="none", max_tokens=128)  # type: ignore[arg-type]
    agent.act(obs)
    assert backend.schemas[0] == decision_schema(obs, 128, count=backend.count_tokens)
    assert agent.stats["cutoffs"] == 0
    cut = _LocalFake("length")
    agent = LLMAgent(cut, memory="none", retries=1)  # type: ignore[arg-type]
    agent.act(obs)
    assert agent.stats["cutoffs"] == 2 and agent.stats["fallbacks"] == 1


def test_tools_mode_on_a_local_grammar_backend_is_refused_at_start() -> None:
    from agents.llm.agent import LLMAgent  # noqa: PLC0415

    with pytest.raises(ValueError, match="mode=tools is not supported by _LocalFake"):
        LLMAgent(_LocalFake(), mode="tools")  # type: ignore[arg-type]
    assert LLMAgent(_LocalFake(), mode="auto").mode == "auto"  # type: ignore[arg-type]


def test_reserve_and_release_name_only_rounds_with_blocks_to_move() -> None:
    seen = 0
    for obs in _sample(30):
        if obs.role != "bidder" or "reserve_capacity" not in obs.legal_actions:
            continue
        held, kept = list(obs.holdings or []), list(obs.reserved or [])
        free = {
            obs.round + k: h - (kept[k] if k < len(kept) else 0)
            for k, h in enumerate(held)
            if obs.round + k < obs.rounds_total
        }
        for kind, want in (
            ("reserve_capacity", {r: n for r, n in free.items() if n > 0}),
            ("release_capacity", {obs.round + k: n for k, n in enumerate(kept) if n > 0}),
        ):
            got = {
                v["properties"]["round"]["const"]: v["properties"]["blocks"]["maximum"]
                for v in _variants(decision_schema(obs, 384) or {})
                if _kind(v) == kind
            }
            assert got == want, (kind, obs.seat, obs.round)
            seen += len(got)
    assert seen > 0
