"""Agent specs: ``name`` or ``name?key=value&...``, resolved to an agent instance.

This is the minimal registry; plug-ins (entry points, ``py:module:Class``) and LLM specs extend it.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl

from agents.base import BaseAgent
from agents.scripted import (
    AlwaysAcceptBidder,
    CoalitionSpammer,
    FixedDesigner,
    OfferSpammer,
    PitchSpammer,
    RandomDesigner,
    RandomValidBidder,
    TruthfulBidder,
)

REGISTRY: dict[str, Callable[..., BaseAgent]] = {
    cls.name: cls
    for cls in (TruthfulBidder, RandomValidBidder, AlwaysAcceptBidder, FixedDesigner, RandomDesigner,
                OfferSpammer, CoalitionSpammer, PitchSpammer)
}


class AgentSpecError(ValueError):
    """An agent spec could not be resolved; the message lists what is available."""


def make_agent(spec: str, role: str | None = None) -> BaseAgent:
    name, _, query = spec.partition("?")
    factory = REGISTRY.get(name.strip())
    if factory is None:
        raise AgentSpecError(f"unknown agent {name!r}; registered agents: {', '.join(sorted(REGISTRY))}")
    params = dict(parse_qsl(query, strict_parsing=False)) if query else {}
    try:
        agent = factory(**params)
    except TypeError as exc:
        raise AgentSpecError(f"agent {name!r} does not take parameters {sorted(params)}: {exc}") from None
    if role is not None and role not in agent.roles:
        raise AgentSpecError(f"agent {name!r} cannot fill a {role} seat (it fills: {', '.join(sorted(agent.roles))})")
    return agent


def registered(role: str | None = None) -> list[str]:
    return sorted(n for n, f in REGISTRY.items() if role is None or role in getattr(f, "roles", frozenset()))
