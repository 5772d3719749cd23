"""The reply reader of an LLM seat's decision (``LLMAgent._decide``): one completion turned into
an action or an error, as a :class:`Reading`.

A reply is a tool call (``mode=tools``) or JSON text (reasoning blocks split off), validated
against the observation (:func:`validate_value`, or the seat's own ``_validate_value``). The
reader records the exchange as transcripts show it (the raw reply, every raw reply, the tool
call, the finish reason, the reasoning, the error or the action); the counting is the agent's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agents.llm.backends.base import Completion, ToolCall
from agents.llm.decision_grammar import in_credits
from agents.llm.parsing import extract_json
from agents.llm.reasoning import reasoning_tokens, split_think
from agents.llm.tools import assistant_tool_message, call_to_action
from market.core.action_checks import choices, validate_for
from market.core.actions import ActionModel, ActionParseError, parse_action
from market.environment import Observation

Validate = Callable[[Any, Observation], ActionModel]


class SemanticError(ActionParseError):
    """A well-formed action the env would refuse (``validate_for``), and the valid choices."""


def validate_value(value: Any, obs: Observation, semantic: bool = True) -> ActionModel:
    """A parsed reply as this seat's action: valid, its type legal now, addressed to this seat
    and (``semantic``) one the env would accept. Raises :class:`ActionParseError` (the repair
    message), :class:`SemanticError` for an action the env would refuse."""
    if isinstance(value, dict) and "action_type" not in value and "reasoning" in value:
        value = {k: v for k, v in value.items() if k != "reasoning"}  # the flat mechanism form
    action = in_credits(parse_action(value, designer=obs.role == "designer"))
    if action.action_type not in obs.legal_actions:
        raise ActionParseError(
            f"{action.action_type} is not allowed in the {obs.phase} phase; legal now: {', '.join(obs.legal_actions)}"
        )
    if action.agent is not None and action.agent != obs.seat:
        raise ActionParseError(f"'agent' is {action.agent!r} but you are {obs.seat}; drop 'agent'")
    if semantic and (reasons := validate_for(action, obs)):  # the env's checks: repair loop
        raise SemanticError(
            f"the market would refuse this {action.action_type}: {reasons[0]}. "
            f"Valid now: {choices(obs, action.action_type)}"
        )
    return action


@dataclass(frozen=True)
class Reading:
    """What one completion gave: an ``action``, or an ``error`` (the repair message's text;
    ``semantic`` when the action was well formed but the env would refuse it)."""

    raw: str  # the completion's text, echoed back in a repair
    reply: dict[str, Any]  # the assistant turn the seat's memory keeps (no reasoning blocks)
    call: ToolCall | None  # the reply's tool call (its id named by the repair's tool message)
    repeated: bool  # the same text as an earlier reply of this decision
    action: ActionModel | None = None
    error: str | None = None
    semantic: bool = False
    reasoning_tokens: int = 0
    degraded: bool = False  # this completion made the decision degraded (counted once)


def read_reply(
    outcome: Completion,
    obs: Observation,
    exchange: dict[str, Any],
    *,
    tools: bool,
    decision: int,
    validate: Validate = validate_value,
    count: Callable[[str], int],
) -> Reading:
    """Read one completion of a decision and record it in ``exchange``: a tool call when
    ``tools`` (its missing id made from the round and ``decision``), else the JSON of the text;
    ``count`` counts reasoning tokens the server did not report."""
    exchange["raw"] = outcome.text
    degraded = note_completion(exchange, outcome.extra)
    repeated = outcome.text in exchange["raw_replies"]
    exchange["raw_replies"].append(outcome.text)
    text, think = split_think(outcome.text)
    calls = list(getattr(outcome, "tool_calls", None) or []) if tools else []
    call = first_tool_call(calls, obs, decision, exchange)
    reply = assistant_tool_message(call) if call else {"role": "assistant", "content": text}
    field = None
    action: ActionModel | None = None
    error: str | None = None
    semantic = False
    try:
        value = call_to_action(call) if call else extract_json(text)
        if isinstance(value, dict) and isinstance(value.get("reasoning"), str):
            field = value["reasoning"]
        action = validate(value, obs)
    except ActionParseError as exc:
        error, semantic = str(exc), isinstance(exc, SemanticError)
        exchange["error"] = error
        exchange["errors"].append(error)
    finally:  # a failed reply's reasoning is recorded too
        exchange["reasoning"], tokens = reasoning_tokens(
            outcome, [outcome.reasoning, think, field], count
        )
    if action is not None:
        exchange.update(action=action.model_dump(exclude_none=True), error=None)
    return Reading(outcome.text, reply, call, repeated, action, error, semantic, tokens, degraded)


def first_tool_call(
    calls: list[ToolCall], obs: Observation, decision: int, exchange: dict[str, Any]
) -> ToolCall | None:
    """The reply's first tool call (None without one), with a deterministic id when the server
    gave none, recorded in ``exchange["tool_calls"]``."""
    if not calls:
        return None
    call = calls[0]
    if not call.id:  # a deterministic id for the conversation
        call = ToolCall(f"call_{obs.round}_{decision}", call.name, call.arguments)
    exchange.setdefault("tool_calls", []).append(
        {"id": call.id, "name": call.name, "arguments": call.arguments}
    )
    return call


def note_completion(exchange: dict[str, Any], extra: Mapping[str, Any]) -> bool:
    """Record a completion's ``finish_reason`` in ``exchange`` (the last one, and one per attempt
    in ``finish_reasons``) and add its new degraded notes to ``exchange["degraded"]``. True when
    the decision became degraded by this completion (it had no degraded feature before), so the
    agent counts each degraded decision once (``stats["degraded_features"]``)."""
    exchange["finish_reason"] = extra.get("finish_reason")
    exchange.setdefault("finish_reasons", []).append(exchange["finish_reason"])
    degraded = exchange.setdefault("degraded", [])
    notes = extra.get("degraded") or ()
    new = [str(n) for n in ([notes] if isinstance(notes, str) else notes) if n]
    new = [n for n in dict.fromkeys(new) if n not in degraded]
    became = bool(new) and not degraded
    degraded.extend(new)
    return became
