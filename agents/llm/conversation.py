"""Pieces of one LLM decision's conversation (``LLMAgent._decide``), kept out of the agent:
the exchange record a decision fills (with each completion's ``finish_reason``, ``"length"``
when cut off by the token limit, and the backend's degraded features), and the reading of a
reply's tool call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents.llm.backends.base import ToolCall
from market.environment import Observation


def new_exchange(obs: Observation, model: str, degraded: tuple[str, ...] = ()) -> dict[str, Any]:
    """The empty record of one decision (``LLMAgent.last_exchange``)."""
    return {
        "seat": obs.seat,
        "round": obs.round,
        "phase": obs.phase,
        "model": model,
        "messages": [],
        "raw": None,
        "raw_replies": [],
        "action": None,
        "error": None,
        "errors": [],
        "attempts": 0,
        "fallback": False,
        "reasoning": None,
        "degraded": list(degraded),
    }


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
