"""The talk-off twin of any agent: ``talk_off:SPEC`` plays ``SPEC`` with negotiation switched off.

Rule: in a ``negotiation`` turn the twin plays ``wait`` and does not consult its inner agent, so
it sends no message, offer or counter-offer, accepts and rejects nothing, forms, joins and
leaves no coalition and makes no pitch (nor any other negotiation-phase action); and because
the inner agent never sees those turns, its memory holds no talk it did not make (an agent
that counts on its own sales, say, bids as if it had made none). Every other turn (bidding,
design, the end of the episode) goes to the inner agent unchanged, with the same observation
and the same seeded generator, so the twin differs from its agent only in not negotiating.
It is how the negotiation report (:mod:`market.review.negotiation_report`) measures the value of
talk: an agent's return minus its twin's, on the same seeds.

The spec is ``talk_off:`` followed by any agent spec, parameters included
(``talk_off:rule_expert?hedge=false``); a server's allow-list treats it as its inner spec
(:mod:`agents.spec_policy`).
"""

from __future__ import annotations

from typing import Any

from agents.base import BaseAgent
from market.core.actions import ActionModel, Wait
from market.environment import Observation

PREFIX = "talk_off:"


def inner_spec(spec: str) -> str | None:
    """The spec a ``talk_off:`` spec wraps, or None when ``spec`` is not one."""
    text = spec.strip() if isinstance(spec, str) else ""
    return text[len(PREFIX) :].strip() if text.startswith(PREFIX) else None


class TalkOffAgent(BaseAgent):
    """The talk-off twin of an agent: it waits in every negotiation turn and otherwise plays its
    agent (see the module docstring)."""

    def __init__(self, inner: Any, spec: str) -> None:
        super().__init__()
        self.inner = inner
        self.name = f"{PREFIX}{spec}"  # type: ignore[misc]  # per instance: the spec it wraps
        self.roles = frozenset(getattr(inner, "roles", ()))  # type: ignore[misc]

    # the runner sets these on the seat's agent and reads its stats: they belong to the inner one
    @property
    def stats(self) -> dict[str, float]:
        inner_stats = getattr(self.inner, "stats", None)
        return inner_stats if isinstance(inner_stats, dict) else {}

    @stats.setter
    def stats(self, value: dict[str, float]) -> None:
        pass  # BaseAgent.__init__ sets an empty dict; the inner agent keeps its own

    def __setattr__(self, key: str, value: Any) -> None:
        if key in ("limiter", "budget") and "inner" in self.__dict__:
            setattr(self.inner, key, value)
        super().__setattr__(key, value)

    def __getattr__(self, key: str) -> Any:
        # an LLM seat's last exchange is recorded from the seat's agent: the inner one's
        if key == "last_exchange" and "inner" in self.__dict__:
            return getattr(self.inner, key)
        raise AttributeError(key)

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.inner.reset(seed)

    def act(self, observation: Observation) -> ActionModel | str | dict[str, Any]:
        if observation.phase == "negotiation":
            return Wait()
        action: ActionModel | str | dict[str, Any] = self.inner.act(observation)
        return action

    async def aact(self, observation: Observation) -> ActionModel | str | dict[str, Any]:
        if observation.phase == "negotiation":
            return Wait()
        inner_aact = getattr(self.inner, "aact", None)
        if inner_aact is None:
            action: ActionModel | str | dict[str, Any] = self.inner.act(observation)
            return action
        result: ActionModel | str | dict[str, Any] = await inner_aact(observation)
        return result


__all__ = ["PREFIX", "TalkOffAgent", "inner_spec"]
