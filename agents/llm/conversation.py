"""Pieces of one LLM decision's conversation (``LLMAgent._decide``), kept out of the agent:
the exchange record a decision fills and the reading of a reply's tool call."""

from __future__ import annotations

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
