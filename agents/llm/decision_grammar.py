"""A grammar for one decision, read off the seat's observation: the JSON schema a constrained
decoder (the hf backend's xgrammar, or an OpenAI-compatible server's structured output) decodes
under, so a small model can only write an action the seat could mean.

:func:`decision_schema` narrows :func:`agents.llm.prompts.legal_action_schema` to this decision:

- only the legal action types, each one a variant of a flat ``anyOf`` (no ``$ref``);
- every id field an ``enum`` of the ids the observation holds: the labs the seat may address,
  the offers it may accept, counter or reject, the coalitions it may join, lead a bid of or leave,
  its active jobs (one ``allocate_to_job`` variant per job, its blocks at most the job's blocks
  left), the rounds it holds free or reserved blocks in (one ``reserve_capacity`` or
  ``release_capacity`` variant per round, its blocks at most that round's). An action type whose required id has no
  value is left out; an optional id field without a value is left out of its variant;
- every number bounded on both sides (xgrammar then writes at most :data:`FRACTION_DIGITS`
  decimals and no exponent), a bid at most the round's unit cap of prices;
- free text (``message``, ``purpose``, ``text``, ``reasoning``) printable ASCII without quote or
  backslash (at most one token a character in a byte-level tokenizer) and at most as long as
  leaves the longest reply the grammar allows within ``max_tokens`` (:func:`longest_reply_tokens`);
  a variant whose required text cannot get :data:`MIN_TEXT_CHARS` is left out;
- the designer's ``set_mechanism`` must name at least one field (``minProperties``).

Not every reply the grammar allows is one the env accepts (a sum of bids above the budget, a sale
of blocks the seat does not own): those stay :func:`market.core.action_checks.validate_for`'s and
the repair loop's. The grammar only rules out what cannot be meant: unknown ids, illegal types,
oversize replies.
"""

from __future__ import annotations

import copy
import json
import math
import weakref
from collections.abc import Callable
from functools import lru_cache
from typing import Any, TypeVar

from agents.llm.prompts import estimate_tokens, legal_action_schema
from agents.llm.reasoning import with_reasoning_first
from market.core.action_checks import unit_cap
from market.core.actions import ActionModel
from market.core.seats import is_bidder_seat
from market.core.summation import ordered_sum
from market.environment import Observation

#: decimals xgrammar 0.2.8 lets a number bounded on both sides have
FRACTION_DIGITS = 6
#: the longest free text a field gets, whatever the token budget: xgrammar 0.2.8 compiles a
#: repetition of at most 128 (``{1,200}`` fails in its grammar compiler with a tokenizer:
#: ``per_rule_fsm_hashes ... has_value()``), and a 135M model's note rarely needs more
TEXT_CHARS = 128
#: the shortest useful free text; a required text field that cannot get this drops its action
MIN_TEXT_CHARS = 8
#: tokens kept free of the reply budget (token merges at the pieces' boundaries, the end token)
REPLY_MARGIN = 8
#: what :func:`estimate_tokens` may fall below a real tokenizer's count
ESTIMATE_MARGIN = 1.1
#: the largest money amount a designer may set (credits; DAEDALUS units are far below it)
MONEY_MAX = 1000.0
#: printable ASCII without ``"`` and ``\\``: one token a character in any byte-level tokenizer
TEXT_CLASS = r"[ !#-\[\]-~]"
#: the designer's mechanism fields that are money
_MONEY = ("reserve_price", "shill_penalty", "withdrawal_penalty", "collusion_penalty")
_TEXT_FIELDS = frozenset({"message", "purpose", "text", "reasoning"})
_ROUND_FIELDS = frozenset({"delivery_round", "give_round", "round", "claimed_deadline"})

#: optional fields whose lack of any value leaves their action nothing to do
_ESSENTIAL = {"reserve_capacity": ("blocks",), "release_capacity": ("blocks",), "bid": ("bids",)}

Counter = Callable[[str], int]
_A = TypeVar("_A", bound=ActionModel)


class _Drop(Exception):
    """The action type has no value for a required field: it leaves the grammar."""


def estimated_counter(text: str) -> int:
    """Tokens of ``text`` without a tokenizer: :func:`estimate_tokens` with its margin."""
    return math.ceil(ESTIMATE_MARGIN * estimate_tokens(text))


class _Facts:
    """What the observation offers a decision: ids, bounds."""

    def __init__(self, obs: Observation, max_units_per_bid: int = 0) -> None:
        me = obs.seat
        self.now, self.last = int(obs.round), int(obs.rounds_total) - 1
        self.cash = max(0.0, float(obs.budget or 0.0))
        self.others = [s for s in obs.active_labs if s != me and is_bidder_seat(s)]
        self.received = [o.offer_id for o in obs.offers_received or ()]
        self.sent = [o.offer_id for o in obs.offers_sent or ()]
        coalitions = list(obs.coalitions or ())
        seen = {c.coalition_id for c in coalitions}
        every = coalitions + [c for c in obs.public_coalitions if c.coalition_id not in seen]
        self.invited = [c.coalition_id for c in every if me in c.invited and me not in c.members]
        self.mine = [c.coalition_id for c in coalitions]
        self.led = [
            c.coalition_id
            for c in coalitions
            if c.leader == me and c.status == "active" and me in c.members
        ]
        self.pitched = [p.lab for p in obs.pitches or () if p.lab in self.others]
        self.jobs = [
            (j.job_id, j.size - j.progress)
            for j in obs.jobs or ()
            if j.status == "active" and j.size - j.progress > 0
        ]
        holdings = list(obs.holdings or [])
        reserved = list(obs.reserved or [])
        free = {
            self.now + k: h - (reserved[k] if k < len(reserved) else 0)
            for k, h in enumerate(holdings)
            if self.now + k <= self.last
        }
        self.free = {r: int(n) for r, n in free.items() if n > 0}
        self.reserved = {self.now + k: int(n) for k, n in enumerate(reserved) if n > 0}
        job_blocks = ordered_sum(j.size for j in obs.jobs or ())
        self.blocks = max(1, int(obs.capacity), ordered_sum(holdings), job_blocks)
        job_value = ordered_sum(j.value for j in obs.jobs or ())
        self.price = float(math.ceil(max(1.0, self.cash, job_value)))
        self.cap = unit_cap(obs, max_units_per_bid)
        self.pool = max(
            [self.cash, *[c.pool or 0.0 for c in coalitions if c.coalition_id in self.led]]
        )


def _enum(values: list[str]) -> dict[str, Any]:
    if not values:
        raise _Drop
    return {"type": "string", "enum": list(dict.fromkeys(values))}


def _int(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": int(low), "maximum": max(int(low), int(high))}


def _num(high: float) -> dict[str, Any]:
    return {"type": "number", "minimum": 0.0, "maximum": float(max(0.0, high))}


def _field(kind: str, name: str, prop: dict[str, Any], f: _Facts) -> dict[str, Any]:
    """One field of one action type, narrowed (raises :class:`_Drop` when it has no value)."""
    if name == "action_type":
        return {"type": "string", "const": kind}
    if name in _TEXT_FIELDS:
        return {"type": "string"}  # bounded later, by the reply budget
    if name == "to" and kind == "send_message":
        return _enum(["all", *f.others])
    if name in ("to", "target") or name == "members":
        labs = f.pitched if kind == "counter_pitch" else f.others
        if name == "members":
            return {
                "type": "array",
                "items": _enum(labs),
                "minItems": 1,
                "maxItems": len(labs),
            }
        return _enum(labs)
    if name == "offer_id":
        return _enum(f.received + f.sent if kind == "reject_offer" else f.received)
    if name == "coalition_id":
        ids = {"commit_to_coalition": f.invited, "leave_coalition": f.mine, "bid": f.led}
        return _enum(ids.get(kind, []))
    if name == "job_id":
        return _enum([j for j, _ in f.jobs])
    if kind in ("reserve_capacity", "release_capacity") and name in ("round", "blocks"):
        # blocks of a round the seat holds free (reserve) or reserved (release): none, no action
        rounds = f.free if kind == "reserve_capacity" else f.reserved
        if not rounds:
            raise _Drop
        if name == "blocks":
            return _int(1, max(rounds.values()))
        return _int(min(rounds), max(rounds))
    if name == "bids":  # at least one price: a seat that abstains says wait (an empty bid
        # is the reply small models fall back on, and it plays nothing)
        if f.cap < 1:
            raise _Drop
        return {"type": "array", "items": _num(f.pool), "minItems": 1, "maxItems": f.cap}
    if name == "side":
        return {"type": "string", "enum": ["sell", "buy"]}
    if name == "split":
        return {"type": "string", "enum": ["proportional", "equal"]}
    if name == "short":
        return {"type": "boolean"}
    if name in _ROUND_FIELDS:
        return _int(f.now, f.last)
    if name in ("expires_in", "term_rounds"):
        return _int(1, max(1, f.last - f.now + 1))
    if prop.get("type") == "integer":
        return _int(int(prop.get("minimum", 0)), f.blocks)
    if name == "contribution":
        return _num(f.cash)
    if prop.get("type") == "number":
        return _num(f.price)
    raise _Drop  # a field this module does not know: never guess its values


def _mechanism(schema: dict[str, Any]) -> dict[str, Any]:
    """The designer's mechanism object: every field bounded, at least one field named."""
    fields = schema["$defs"]["MechanismUpdate"]["properties"]
    props: dict[str, Any] = {}
    for name, prop in fields.items():
        if name == "units":
            continue  # the seat's prompt is in credits: the agent sends units="credits"
        if "enum" in prop:
            props[name] = {"type": "string", "enum": list(prop["enum"])}
        elif prop.get("type") == "boolean":
            props[name] = {"type": "boolean"}
        elif name in _MONEY:
            props[name] = _num(MONEY_MAX)
        elif prop.get("type") == "number":
            props[name] = _num(float(prop.get("maximum", MONEY_MAX)))
    return {
        "type": "object",
        "properties": props,
        "additionalProperties": False,
        "minProperties": 1,
    }


def _variants(obs: Observation, f: _Facts, reasoning: bool) -> list[dict[str, Any]]:
    designer = obs.role == "designer"
    schema = legal_action_schema(obs.legal_actions, designer)
    defs = schema.get("$defs", {})
    subs = [
        defs[o["$ref"].rsplit("/", 1)[-1]] if "$ref" in o else o
        for o in schema.get("anyOf", [schema])
    ]
    out = []
    for sub in subs:
        props = sub.get("properties", {})
        kind = props.get("action_type", {}).get("const")
        if kind is None or kind not in obs.legal_actions:
            continue  # the designer's flat mechanism form: set_mechanism says the same
        required = [r for r in sub.get("required", []) if r != "reasoning"]
        narrowed: dict[str, Any] = {}
        try:
            if reasoning:
                narrowed["reasoning"] = {"type": "string"}
            for name, prop in props.items():
                if name == "reasoning":
                    continue
                if name == "mechanism":
                    narrowed[name] = _mechanism(schema)
                    continue
                try:
                    narrowed[name] = _field(kind, name, prop, f)
                except _Drop:
                    if name in required or name in _ESSENTIAL.get(kind, ()):
                        raise
        except _Drop:
            continue
        if kind == "set_mechanism":
            required = [*required, "mechanism"]
        if kind == "bid":
            required = [*required, "bids"]
        variant: dict[str, Any] = {
            "type": "object",
            "properties": narrowed,
            "required": (["reasoning"] if reasoning else []) + required,
            "additionalProperties": False,
        }
        if kind == "allocate_to_job":  # one variant per job: blocks at most the job's blocks left
            for job, left in f.jobs:
                one = copy.deepcopy(variant)
                one["properties"]["job_id"] = {"type": "string", "const": job}
                one["properties"]["blocks"] = _int(0, left)
                out.append(one)
            continue
        if kind in ("reserve_capacity", "release_capacity"):  # one variant per round that has
            # blocks to reserve (free) or release (reserved): blocks at most that round's
            rounds = f.free if kind == "reserve_capacity" else f.reserved
            for r, n in sorted(rounds.items()):
                one = copy.deepcopy(variant)
                one["properties"]["blocks"] = _int(1, n)
                one["properties"]["round"] = {"type": "integer", "const": r}
                one["required"] = [*one["required"], "round"]
                out.append(one)
            continue
        out.append(variant)
    return out


# ---------------------------------------------------------------------------------------------
# the longest reply


def _longest_value(prop: dict[str, Any], count: Counter) -> tuple[int, list[str]]:
    """Tokens of the longest value ``prop`` allows, and the free-text fields inside it left
    empty (their text is counted by the caller)."""
    if "const" in prop:
        return count(json.dumps(prop["const"])), []
    if "enum" in prop:
        return max(count(json.dumps(v)) for v in prop["enum"]), []
    kind = prop.get("type")
    if kind == "boolean":
        return max(count("true"), count("false")), []
    if kind in ("integer", "number"):
        low, high = prop.get("minimum"), prop.get("maximum")
        if low is None or high is None:
            raise ValueError(f"an unbounded number in the grammar: {prop}")
        digits = max(len(str(int(abs(x)))) for x in (low, high))
        text = ("-" if low < 0 else "") + "9" * digits
        if kind == "number":
            text += "." + "9" * FRACTION_DIGITS
        return count(text), []
    if kind == "array":
        item, texts = _longest_value(prop["items"], count)
        n = int(prop["maxItems"])
        return count("[]") + n * (item + count(", ")), texts * n
    if kind == "object":
        return _longest_object(prop, count)
    if kind == "string":
        if "maxLength" in prop or "pattern" in prop:
            return count('""') + int(prop.get("maxLength", 0)), []
        return count('""'), ["text"]
    raise ValueError(f"an unbounded value in the grammar: {prop}")


def _longest_object(schema: dict[str, Any], count: Counter) -> tuple[int, list[str]]:
    total = count("{}")
    texts: list[str] = []
    for name, prop in schema.get("properties", {}).items():
        value, inner = _longest_value(prop, count)
        total += count(json.dumps(name) + ": ") + value + count(", ")
        texts += inner
    return total, texts


def longest_reply_tokens(schema: dict[str, Any], count: Counter = estimated_counter) -> int:
    """Tokens of the longest reply ``schema`` (a :func:`decision_schema`) allows, by ``count``
    (a tokenizer's, or :func:`estimated_counter`): every field present at its longest, each
    free-text character one token, xgrammar's separators (``", "``, ``": "``), piece by piece.
    Raises ``ValueError`` when the schema leaves a length unbounded."""
    variants = schema.get("anyOf", [schema])
    longest = 0
    for variant in variants:
        total, texts = _longest_object(variant, count)
        if texts:
            raise ValueError("a free-text field without a bound")
        longest = max(longest, total)
    return longest


def _text_pattern(chars: int) -> str:
    return f"^{TEXT_CLASS}{{1,{int(chars)}}}$"


def _bound_text(variant: dict[str, Any], max_tokens: int, count: Counter) -> dict[str, Any] | None:
    """``variant`` with its free text bounded to fit ``max_tokens``; None when a required text
    cannot get :data:`MIN_TEXT_CHARS`. Optional texts that cannot are left out."""
    props = variant["properties"]
    bids = props.get("bids")
    if bids is not None:  # fewer unit bids rather than no bid at all
        item, _ = _longest_value(bids["items"], count)
        per = item + count(", ")
        over = max(0, _longest_object(variant, count)[0] - (max_tokens - REPLY_MARGIN))
        fewer = max(int(bids.get("minItems", 0)), int(bids["maxItems"]) - math.ceil(over / per))
        props = {**props, "bids": {**bids, "maxItems": fewer}}
        variant = {**variant, "properties": props}
    while True:
        texts = [n for n, p in props.items() if n in _TEXT_FIELDS and p.get("type") == "string"]
        fixed, _ = _longest_object(
            {"properties": {n: p for n, p in props.items() if n not in texts}}, count
        )
        # each text field: its name, quotes and separator, then its characters
        fixed += ordered_sum(count(json.dumps(n) + ": ") + count('""') + count(", ") for n in texts)
        room = max_tokens - REPLY_MARGIN - fixed
        share = min(TEXT_CHARS, room // len(texts)) if texts else 0
        if not texts or share >= MIN_TEXT_CHARS:
            break
        optional = [n for n in texts if n not in variant["required"]]
        if len(optional) < len(texts) and not optional:
            return None
        if not optional:
            return None
        props = {k: v for k, v in props.items() if k != optional[-1]}
        variant = {**variant, "properties": props}
    if room < 0:
        return None
    bounded = {
        n: ({"type": "string", "pattern": _text_pattern(share)} if n in texts else p)
        for n, p in props.items()
    }
    return {**variant, "properties": bounded}


def decision_schema(
    obs: Observation,
    max_tokens: int | None,
    *,
    count: Counter | None = None,
    reasoning: bool = False,
    max_units_per_bid: int = 0,
) -> dict[str, Any] | None:
    """The grammar of one decision (module docstring) as a JSON schema: ``{"anyOf": [...]}`` of
    the legal action types' variants (one variant: the variant itself). ``max_tokens``: the
    reply's token limit (None: :data:`TEXT_CHARS` a text field); ``count``: the model's token
    counter (None: :func:`estimated_counter`); ``reasoning``: a ``reasoning`` string first in
    every variant. None when no legal action type is left (never for a seat whose turn it is:
    ``wait`` needs no id)."""
    if not obs.legal_actions:
        return None
    counter = count or estimated_counter
    facts = _Facts(obs, max_units_per_bid)
    limit = int(max_tokens) if max_tokens is not None else 10**9
    variants = []
    for variant in _variants(obs, facts, reasoning):
        fitted = _bound_text(variant, limit, counter)
        if fitted is not None and _longest_object(fitted, counter)[0] <= limit - REPLY_MARGIN:
            variants.append(fitted)
    if not variants:
        return None
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def in_credits(action: _A) -> _A:
    """A designer's ``set_mechanism`` that names no ``units``, in credits: an LLM seat's prompt
    states every amount in credits, so the number the model wrote is the number the market uses
    (the daedalus family otherwise reads a mechanism without ``units`` in DAEDALUS units). Other
    actions, and a mechanism that names its units, are returned as they are."""
    mechanism = getattr(action, "mechanism", None)
    if getattr(action, "action_type", None) != "set_mechanism" or mechanism is None:
        return action
    if mechanism.units is not None:
        return action
    return action.model_copy(
        update={"mechanism": mechanism.model_copy(update={"units": "credits"})}
    )


def _inner(backend: Any) -> Any:
    """The backend a cache (:class:`~agents.llm.cache.CachedBackend`) wraps; else itself."""
    inner = getattr(backend, "backend", None)
    return inner if inner is not None and hasattr(backend, "cache") else backend


def backend_grammar(backend: Any) -> str | None:
    """The grammar ``backend`` decodes under: ``"local"`` for its own (the hf backend with
    ``constrain`` on), a server's schema dialect
    (:meth:`~agents.llm.backends.openai_backend.OpenAIBackend.schema_dialect`), or None. A
    cache answers for the backend it wraps (:meth:`~agents.llm.cache.CachedBackend.grammar`,
    recorded for a replay without it)."""
    if hasattr(backend, "cache") and callable(getattr(backend, "grammar", None)):
        return backend.grammar()  # type: ignore[no-any-return]
    if getattr(backend, "constrain", None) is True and callable(
        getattr(backend, "count_tokens", None)
    ):
        return "local"
    dialect = getattr(backend, "schema_dialect", None)
    return dialect() if callable(dialect) else None


def local_grammar(backend: Any) -> bool:
    """Whether ``backend`` (or the backend a cache wraps) decodes under the request's schema
    itself (the hf backend with ``constrain`` on): it then gets :func:`decision_schema`."""
    return backend_grammar(backend) == "local"


def server_dialect(backend: Any) -> str | None:
    """The schema dialect of an OpenAI-compatible server backend (or of the one a cache wraps);
    None for other backends and for servers that honour no decision grammar."""
    grammar = backend_grammar(backend)
    return None if grammar == "local" else grammar


def seat_schema(
    obs: Observation, backend: Any, params: dict[str, Any], *, structured: bool, reasoning: bool
) -> dict[str, Any] | None:
    """The schema an LLM seat sends with a decision (``LLMAgent._schema``): None without
    ``structured``; for a backend with a local grammar (:func:`local_grammar`) or a server with a
    schema dialect (:func:`server_dialect`; the backend rewrites it in that dialect) the
    decision's grammar, bounded by the call's ``max_tokens`` (else the backend's
    ``max_new_tokens``) and counted with the model's tokenizer (a server's where its preset has
    one, else :func:`estimated_counter`); otherwise the legal actions' schema
    (:func:`agents.llm.prompts.legal_action_schema`), with a ``reasoning`` field first when asked.
    A cached backend gets what the backend it wraps gets (the schema is part of the cache key)."""
    if not structured:
        return None
    inner = _inner(backend)
    if backend_grammar(backend) is not None:
        limit = params.get("max_tokens", getattr(inner, "max_new_tokens", None))
        return decision_schema(obs, limit, count=_memo(backend), reasoning=reasoning)
    schema = legal_action_schema(obs.legal_actions, obs.role == "designer")
    return with_reasoning_first(schema) if reasoning else schema


_COUNTERS: weakref.WeakKeyDictionary[Any, Counter] = weakref.WeakKeyDictionary()


def _memo(backend: Any) -> Counter:
    """The backend's ``count_tokens``, memoised (a grammar counts the same pieces again); a
    piece it cannot count (no tokenizer endpoint, a failed call) is counted by
    :func:`estimated_counter`."""
    counter = _COUNTERS.get(backend)
    if counter is None:
        count = backend.count_tokens

        def counted(text: str) -> int:
            try:
                return int(count(text))
            except Exception:  # NotImplementedError, a server without the endpoint
                return estimated_counter(text)

        counter = lru_cache(maxsize=4096)(counted)
        _COUNTERS[backend] = counter
    return counter


def seat_mode(mode: str, backend: Any) -> str:
    """A seat's decision mode (``tools.tool_mode``'s value) checked against its backend:
    ``tools`` on a backend that decodes locally and has no tool calls (the hf backend) is refused
    when the seat is built. Such a backend would drop the tools and, with no schema sent in tools
    mode, decode every reply unconstrained; JSON mode decodes under the decision's grammar."""
    inner = _inner(backend)
    local = hasattr(inner, "constrain") and callable(getattr(inner, "count_tokens", None))
    if mode == "tools" and local and not backend.supports_tools():
        raise ValueError(
            f"mode=tools is not supported by {type(inner).__name__}: it has no tool-call "
            "decoding, so tools mode would decode unconstrained; use mode=json (the default: "
            "every reply is decoded under the decision's grammar) or mode=auto"
        )
    return mode
