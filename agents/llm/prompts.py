"""What an LLM seat is sent: the system and user messages of a decision, the repair message after
an unusable reply, and the JSON schema of the action types legal now (sent to the model, and to the
backend for structured output). :func:`prompt_messages` is the single source of the prompt."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter

from market.core.actions import ACTION_CLASSES, MechanismUpdate
from market.environment import Observation

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
    tagged = Annotated[Union[classes], Field(discriminator="action_type")]  # noqa: UP007
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
# prompts

_GOALS = {
    "bidder": (
        "You are an AI lab that needs GPU blocks for its jobs. Your reward is the value of the jobs "
        "you complete by their deadlines minus the credits you pay; invalid actions and talk cost a "
        "little."
    ),
    "designer": (
        "You are the market operator and choose the auction mechanism. Your reward combines "
        "allocative efficiency (welfare), fairness, participation, price stability and revenue."
    ),
}
_PHASE_HINTS = {
    "design": (
        'To change the mechanism send {"action_type": "set_mechanism", "mechanism": {...only the '
        'fields to change...}} (the flat form {"auction_type": "vcg", "reserve_price": 8} is accepted '
        'too); {"action_type": "wait"} keeps the mechanism in force.'
    ),
    "bidding": (
        "A bid lists one marginal bid per block wanted, highest first (non-increasing), within your "
        'budget, e.g. {"action_type": "bid", "bids": [30, 25]}; {"action_type": "bid", "bids": []} '
        "abstains."
    ),
    "negotiation": (
        "Use only seat, offer, job and coalition ids that appear in the observation; "
        '{"action_type": "wait"} passes.'
    ),
}


def system_message(obs: Observation) -> str:
    return "\n".join(
        [
            f"You play seat {obs.seat} ({obs.role}) in a multi-round GPU capacity market. {_GOALS[obs.role]}",
            'Rules: reply with ONE JSON object, a single action with an "action_type" field, and nothing '
            'else: no prose, no code fences. You may add a short "reasoning" string to the object.',
            f"Legal action types now ({obs.phase} phase): {', '.join(obs.legal_actions)}.",
            _PHASE_HINTS.get(obs.phase, ""),
        ]
    ).strip()


def user_message(obs: Observation) -> str:
    schema_text = _legal_schema(
        tuple(k for k in ACTION_CLASSES if k in set(obs.legal_actions)), obs.role == "designer"
    )[1]
    return f"{obs.to_prompt()}\n\nYour reply must be one JSON object matching this JSON schema:\n{schema_text}"


def prompt_messages(obs: Observation) -> Messages:
    """The chat messages of one decision's first request: the system and the user message.

    The single source of the LLM prompt: ``LLMAgent`` sends it and ``market.train.training_data``
    renders scripted seats' decisions with it."""
    return [
        {"role": "system", "content": system_message(obs)},
        {"role": "user", "content": user_message(obs)},
    ]


def repair_message(error: str, obs: Observation) -> str:
    return (
        f"That reply could not be used: {error}\n"
        f"Reply again with ONE JSON object (legal action types now: {', '.join(obs.legal_actions)}) "
        "and nothing else."
    )
