"""What an LLM seat is sent: the system and user messages of a decision, the repair message after
an unusable reply, and the JSON schema of the action types legal now (sent to the backend for
structured output; the prompt shows its compact form, :func:`action_formats`).

:func:`prompt_messages` is the single source of the prompt. It renders the seat's Jinja2 templates
(:mod:`agents.llm.prompt_templates`) with the rules taught from the observation
(:mod:`agents.llm.rules`) and the observation cut to fit a small context
(:mod:`agents.llm.compact`)."""

from __future__ import annotations

import json
import string
from functools import lru_cache
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter

from agents.llm.compact import compact_observation, trim_repeats
from agents.llm.prompt_templates import PromptTemplates, default_templates
from agents.llm.rules import bid_example, seat_rules
from market.core.actions import ACTION_CLASSES, Bid, MechanismUpdate, Wait
from market.environment import UNTRUSTED_RULE, Observation, raw_env

Messages = list[dict[str, str]]

# ---------------------------------------------------------------------------------------------
# schema of the legal actions


def _compact(node: Any, in_properties: bool = False) -> Any:
    """Drop titles, null/object defaults and discriminator metadata; oneOf -> anyOf.

    Shorter prompts, and a schema every OpenAI-compatible server's constrained decoder accepts.
    """
    if isinstance(node, list):
        return [_compact(v) for v in node]
    if not isinstance(node, dict):
        return node
    if in_properties:  # keys are field names here, not schema keywords
        return {k: _compact(v) for k, v in node.items()}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "discriminator") or (
            key == "default" and (value is None or isinstance(value, dict))
        ):
            continue
        out["anyOf" if key == "oneOf" else key] = _compact(
            value, in_properties=key in ("properties", "$defs")
        )
    return out


def _simplify_field(prop: dict[str, Any]) -> dict[str, Any]:
    """``X | None`` -> ``X`` (optional fields are simply left out), no huge maxima, no const default."""
    options = prop.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        rest = {k: v for k, v in prop.items() if k != "anyOf"}
        prop = {**next(o for o in options if o != {"type": "null"}), **rest}
        if prop.get("default", 0) is None:
            del prop["default"]
    if isinstance(prop.get("maximum"), int | float) and prop["maximum"] >= 1e6:
        prop = {k: v for k, v in prop.items() if k != "maximum"}
    # huge length bounds add nothing for a model, and llama.cpp's grammar compiler crashes the
    # server on them (maxItems 100000 on Bid.bids segfaults llama-cpp-python 0.3.36)
    for bound in ("maxItems", "maxLength"):
        if isinstance(prop.get(bound), int) and prop[bound] > 1000:
            prop = {k: v for k, v in prop.items() if k != bound}
    if "const" in prop and prop.get("default") == prop["const"]:
        prop = {k: v for k, v in prop.items() if k != "default"}
    if isinstance(prop.get("items"), dict):
        prop = {**prop, "items": _simplify_field(prop["items"])}
    return prop


def _simplify_variant(sub: dict[str, Any]) -> None:
    """In place: one action's schema as an LLM needs it (no ``agent``, a plain ``reasoning``)."""
    props = sub.get("properties", {})
    props.pop("agent", None)
    # GPU-arena compatibility forms a model does not need: unenforced terms and block id lists
    # (``blocks`` says the same); left out to keep prompts and grammars small
    props.pop("conditions", None)
    props.pop("block_ids", None)
    if "required" in sub:
        sub["required"] = [r for r in sub["required"] if r not in ("conditions", "block_ids")]
    if "reasoning" in props:
        props["reasoning"] = {"type": "string"}
    for name, prop in props.items():
        props[name] = _simplify_field(prop)
    if isinstance(sub.get("description"), str):
        sub["description"] = sub["description"].replace("``", "`")
    if "action_type" in props:
        sub["required"] = [
            "action_type",
            *[r for r in sub.get("required", []) if r != "action_type"],
        ]


@lru_cache(maxsize=64)
def _legal_schema(kinds: tuple[str, ...], designer: bool) -> tuple[dict[str, Any], str]:
    classes = tuple(ACTION_CLASSES[k] for k in kinds if k in ACTION_CLASSES)
    if not classes:
        raise ValueError(f"no known action types among {kinds}")
    # a runtime union of the legal classes: Union[...] here, not X | Y (classes is a tuple)
    tagged = Annotated[Union[classes], Field(discriminator="action_type")]  # type: ignore[valid-type]  # noqa: UP007
    union: Any = classes[0] if len(classes) == 1 else tagged
    if designer:
        union = Union[union, MechanismUpdate]  # noqa: UP007  (the flat DAEDALUS mechanism form)
    schema = _compact(TypeAdapter(union).json_schema())
    for sub in schema.get("$defs", {}).values():
        _simplify_variant(sub)
    _simplify_variant(schema)
    if "anyOf" in schema:  # flatten the designer's anyOf[anyOf[actions], flat form]
        schema["anyOf"] = [
            o
            for item in schema["anyOf"]
            for o in (item["anyOf"] if set(item) == {"anyOf"} else [item])
        ]
    return schema, json.dumps(schema, separators=(",", ":"))


def legal_action_schema(
    legal: list[str] | tuple[str, ...], designer: bool = False
) -> dict[str, Any]:
    """The JSON schema of a discriminated union of only the ``legal`` action types.

    For the designer it also admits the flat DAEDALUS mechanism object (``{"auction_type": ...}``).
    The result is cached and shared: do not mutate it.
    """
    kinds = tuple(k for k in ACTION_CLASSES if k in set(legal))
    return _legal_schema(kinds, designer)[0]


# ---------------------------------------------------------------------------------------------
# compact action formats (the prompt's view of the schema)


def _type_text(prop: dict[str, Any]) -> str:
    if "const" in prop:
        return json.dumps(prop["const"])
    if "enum" in prop:
        return "|".join(json.dumps(v) for v in prop["enum"])
    if "anyOf" in prop:
        return "|".join(_type_text(p) for p in prop["anyOf"])
    if "$ref" in prop:
        return "{...}"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"[{_type_text(prop.get('items', {}))},...]"
    text: str = {"integer": "int", "number": "num", "string": "str", "boolean": "bool"}.get(
        kind, kind
    )
    low, high = prop.get("minimum"), prop.get("maximum")
    if high is not None and high >= 1000:  # a sanity bound, not a rule worth tokens
        high = None
    if low == 0 and high is None:  # counts and prices are never negative: not worth tokens
        low = None
    if low is not None and high is not None:
        text += f" {low:g}..{high:g}"
    elif low is not None:
        text += f">={low:g}"
    return text


#: action types whose docstring the prompt keeps even in a phase with many legal actions (an
#: offer's price is the total for all its blocks, not a price per block)
ALWAYS_DESCRIBED = frozenset({"send_offer"})
#: in a phase with more legal action types than this, only :data:`ALWAYS_DESCRIBED` keep theirs
MAX_DESCRIBED = 4


def _format_line(sub: dict[str, Any], describe: bool = True, optional: bool = True) -> str:
    props = sub.get("properties", {})
    required = set(sub.get("required", []))
    kind = props.get("action_type", {}).get("const")
    parts = []
    for name, prop in props.items():
        if name in ("reasoning", "action_type"):
            continue
        if name not in required and not optional:
            parts.append("...")  # optional fields left out (said once, in the prompt's note)
            continue
        mark = "" if name in required else "?"
        parts.append(f'"{name}"{mark}:{_type_text(prop)}')
    parts = [p for i, p in enumerate(parts) if p != "..." or "..." not in parts[:i]]
    line = ("" if kind is None else f"{kind}: ") + "{" + ",".join(parts) + "}"
    doc = str(sub.get("description", "")).split("\n\n")[0].replace("\n", " ").strip()
    return f"{line}  {doc}" if doc and describe else line


#: how much of each legal action the prompt shows, fullest first (:func:`action_formats`)
DETAIL_LEVELS = 3


@lru_cache(maxsize=64)
def _action_formats(kinds: tuple[str, ...], designer: bool, detail: int = 0) -> tuple[str, ...]:
    schema = _legal_schema(kinds, designer)[0]
    defs = schema.get("$defs", {})
    variants = [
        defs[o["$ref"].rsplit("/", 1)[-1]] if "$ref" in o else o
        for o in schema.get("anyOf", [schema])
    ]
    few = len(kinds) <= MAX_DESCRIBED and detail == 0
    lines = []
    for sub in variants:
        kind = sub.get("properties", {}).get("action_type", {}).get("const")
        if kind is None:  # the designer's flat mechanism form
            continue
        lines.append(_format_line(sub, few or kind in ALWAYS_DESCRIBED, detail < 2))
    if designer and "set_mechanism" in kinds and "MechanismUpdate" in defs:
        fields = _format_line(defs["MechanismUpdate"], describe=False)
        lines.append(f'"mechanism" of set_mechanism: {fields} (name only the fields to change)')
    return tuple(lines)


def action_formats(
    legal: list[str] | tuple[str, ...], designer: bool = False, detail: int = 0
) -> list[str]:
    """One compact line per legal action type: its other fields, e.g.
    ``accept_offer: {"offer_id":str}`` (``?`` marks an optional field), with the
    first paragraph of its docstring when at most :data:`MAX_DESCRIBED` types are legal (else only
    for :data:`ALWAYS_DESCRIBED`): the prompt's short form of :func:`legal_action_schema`.

    ``detail`` shortens it for a small context: 1 describes only :data:`ALWAYS_DESCRIBED`
    whatever the number of types, 2 also shows only the required fields (``...`` where optional
    ones are left out)."""
    kinds = tuple(k for k in ACTION_CLASSES if k in set(legal))
    return list(_action_formats(kinds, designer, min(max(int(detail), 0), DETAIL_LEVELS - 1)))


# ---------------------------------------------------------------------------------------------
# prompts

_GOALS = {
    "bidder": "an AI lab that needs GPU blocks for its jobs",
    "designer": (
        "the market operator: you set the auction mechanism, rewarded for an efficient, fair, "
        "well-attended, stable market and for revenue"
    ),
}

#: chat-template tokens around a decision's two messages (SmolLM2's template adds about 10 a
#: message), kept free of the prompt budget
CHAT_OVERHEAD = 32
#: how far :func:`estimate_tokens` may fall below a real tokenizer's count (measured on every
#: built-in scenario's prompts with SmolLM2's tokenizer, tests/agents/test_llm_prompts.py)
ESTIMATE_MARGIN = 1.1


def prompt_budget(context: int | None, max_tokens: int | None) -> int | None:
    """The first-turn prompt's budget in :func:`estimate_tokens` tokens for a model of
    ``context`` tokens that may write ``max_tokens``: what is left of the context after the reply
    and the chat template, divided by :data:`ESTIMATE_MARGIN`. None (no limit) without a context."""
    if context is None:
        return None
    left = int(context) - int(max_tokens or 0) - CHAT_OVERHEAD
    return max(0, int(left / ESTIMATE_MARGIN))


#: the default size of the first-turn prompt in estimated tokens (:func:`estimate_tokens`), for
#: callers that know no context: a 384-token reply in a 2,048-token context
#: (tests/agents/test_llm_prompts.py measures every built-in scenario with SmolLM2's tokenizer)
PROMPT_TOKEN_BUDGET: int = prompt_budget(2_048, 384) or 0

#: the prompt's forms, fullest first: the list limit of :func:`compact_observation` and how far
#: the fixed text is shortened (0: whole; 1: the observation's lines the rest of the prompt repeats
#: go and only :data:`ALWAYS_DESCRIBED` actions are described; 2: the action formats show only
#: required fields). The fixed text is shortened before the lists are cut far, and no form cuts
#: :data:`agents.llm.compact.PROTECTED`.
FORMS: tuple[tuple[int | None, int], ...] = (
    (None, 0),
    (None, 1),
    (12, 1),
    (8, 1),
    (5, 1),
    (5, 2),
    (3, 2),
    (2, 2),
    (1, 2),
    (0, 2),
)


_NO_DIGITS = str.maketrans("", "", string.digits)
_NO_LETTERS = str.maketrans("", "", string.ascii_letters)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate of a text's tokens, calibrated on SmolLM2's tokenizer over the
    prompts of every built-in scenario and rounded up: a digit is a token of its own, an ASCII
    letter about a third of one, any other character about 0.4 of one (a byte-pair tokenizer's
    words are 3-4 letters; punctuation in JSON often merges with a quote)."""
    digits = len(text) - len(text.translate(_NO_DIGITS))
    letters = len(text) - len(text.translate(_NO_LETTERS))
    return int(1.2 * digits + 0.32 * letters + 0.4 * (len(text) - digits - letters)) + 1


def _context(
    obs: Observation, templates: PromptTemplates, limit: int | None, error: str = ""
) -> dict[str, Any]:
    return {**_base_context(obs, templates, error), **_shown(obs, templates, limit)}


def _base_context(
    obs: Observation, templates: PromptTemplates, error: str = "", detail: int = 0
) -> dict[str, Any]:
    """The template variables that do not depend on how far the observation is cut."""
    return {
        "obs": obs,
        "seat": obs.seat,
        "role": obs.role,
        "phase": obs.phase,
        "round": obs.round,
        "rounds_total": obs.rounds_total,
        "legal_actions": list(obs.legal_actions),
        "persona": templates.persona,
        "goal": _GOALS[obs.role],
        "rules": seat_rules(obs),
        "trust_rule": UNTRUSTED_RULE,
        "example": bid_example(obs),
        "action_formats": action_formats(obs.legal_actions, obs.role == "designer", detail),
        "error": error,
    }


def _shown(
    obs: Observation, templates: PromptTemplates, limit: int | None, trim: int = 0
) -> dict[str, str]:
    shown, notes = compact_observation(obs, limit)
    text = shown.to_prompt()
    if trim:
        text, more = trim_repeats(
            text,
            shown,
            formats_shown="action_formats" in templates.variables["user.j2"],
            rules_shown="rules" in templates.variables["system.j2"],
            level=trim,
        )
        notes = [*more, *notes]
    if trim >= 2 and any("..." in line for line in action_formats(obs.legal_actions, False, 2)):
        notes.append("the optional fields of the action formats (...)")
    return {"observation": text, "omitted": "; ".join(notes)}


def prompt_messages(
    obs: Observation,
    templates: PromptTemplates | None = None,
    *,
    max_tokens: int | None = PROMPT_TOKEN_BUDGET,
) -> Messages:
    """The chat messages of one decision's first request: the system and the user message.

    The single source of the LLM prompt: ``LLMAgent`` sends it (with the budget its context and
    ``max_tokens`` leave, :func:`prompt_budget`) and ``market.train.training_data`` renders
    scripted seats' decisions with it. ``templates``: the seat's templates and persona (the
    built-ins when None). The prompt takes the fullest of :data:`FORMS` whose system + user text
    is at most ``max_tokens`` tokens by :func:`estimate_tokens` (the shortest when none fits):
    first the text the prompt repeats goes, then the observation's long lists are cut
    (:mod:`agents.llm.compact`, never its protected items). ``max_tokens=None`` never cuts."""
    templates = templates or default_templates()
    system_varies = bool({"observation", "omitted"} & templates.variables["system.j2"])
    system: dict[str, str] = {}
    user: dict[str, str] = {}
    bases: dict[int, dict[str, Any]] = {}
    for limit, trim in FORMS if max_tokens is not None else ((None, 0),):
        detail = min(trim, DETAIL_LEVELS - 1)
        if detail not in bases:
            bases[detail] = _base_context(obs, templates, detail=detail)
        context = {**bases[detail], **_shown(obs, templates, limit, trim)}
        if system_varies or not system:
            system = {"role": "system", "content": templates.render("system.j2", context)}
        user = {"role": "user", "content": templates.render("user.j2", context)}
        if max_tokens is None:
            break
        if estimate_tokens(system["content"]) + estimate_tokens(user["content"]) <= max_tokens:
            break
    return [system, user]


def system_message(obs: Observation, templates: PromptTemplates | None = None) -> str:
    return prompt_messages(obs, templates)[0]["content"]


def user_message(obs: Observation, templates: PromptTemplates | None = None) -> str:
    return prompt_messages(obs, templates)[1]["content"]


def repair_message(error: str, obs: Observation, templates: PromptTemplates | None = None) -> str:
    """The message after an unusable reply: what was wrong, and the legal action types now."""
    templates = templates or default_templates()
    context = {**_context(obs, templates, 0), "error": error}
    return templates.render("repair.j2", context)


def load_templates(prompt: str | None = None, persona: str | None = None) -> PromptTemplates:
    """A seat's templates and persona (``prompt=``/``persona=`` of its spec), checked now: loaded
    (syntax, file names, variable names) and, when custom, rendered on sample observations, so
    every template error is a one-line :class:`PromptTemplateError` naming the file and line
    when the seat is built."""
    if prompt is None and persona is None:
        return default_templates()
    templates = PromptTemplates(prompt, persona)
    if prompt is not None:
        for obs in sample_observations():
            prompt_messages(obs, templates)
            repair_message("sample error", obs, templates)
    return templates


@lru_cache(maxsize=1)
def sample_observations() -> tuple[Observation, ...]:
    """A designer (design) and a bidder (negotiation, bidding) observation from the first round
    of ``market_round`` (seed 0, every seat waiting or abstaining), to check templates on."""
    env = raw_env("market_round")
    env.reset(seed=0)
    found: dict[tuple[str, str], Observation] = {}
    for _ in env.agent_iter(max_iter=200):
        obs, _, term, trunc, _ = env.last()
        if obs.legal_actions:
            found.setdefault((obs.role, obs.phase), obs)
        if len(found) >= 3 or term or trunc:
            break
        env.step(Bid(bids=[]) if obs.phase == "bidding" else Wait())
    return tuple(found.values())
