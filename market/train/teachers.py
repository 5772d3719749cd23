"""Teachers a small model can copy from its prompt (docs/training.md).

``rule_expert``'s bids come from its plan and memory, numbers the prompt does not show, so a
135M model distilled from it learns the reply format but not the decisions. The
:class:`CopyableBidder` bids a function of one line of the LLM seat's prompt, the suggested bid
(:func:`agents.llm.rules.bid_example`: the seat's marginal values cut to its budget, rounded to
cents): the first (highest) unit at its value and every further unit at ``cap`` credits at most.
Under a uniform second-price auction this is demand reduction: the high first unit wins a block,
the low bids on the rest keep the price it pays down. It never negotiates (``wait``).

Spec: ``py:market.train.teachers:CopyableBidder`` (parameter ``cap``, default 8). ``cap`` may
also be a ``|``-separated list (``cap=0|4|8|16|32``): each bidding decision then draws one of them
uniformly from the agent's seeded stream, a population of copyable strategies in one teacher. A
model distilled from it keeps that spread in its sampling, which is what GRPO needs to find which
cap pays (docs/training.md, Measured (3)).

:class:`CopyableExpert` negotiates as ``rule_expert`` and bids the copyable bid: the teacher for
scenarios where talk pays (coalition_market; docs/training.md, Measured (5)).
"""

from __future__ import annotations

from agents.base import BaseAgent
from agents.llm.rules import MAX_VALUES
from agents.population.expert import RuleExpert
from agents.scripted import WAIT
from market.core.actions import ActionModel, Bid
from market.environment import Observation, affordable, marginal_values


def copyable_bids(obs: Observation, cap: float) -> list[float]:
    """The suggested bid of the seat's prompt with every unit after the first capped at ``cap``."""
    values = affordable(marginal_values(obs)[:MAX_VALUES], obs.budget or 0.0, MAX_VALUES)
    shown = [round(v, 2) for v in values]
    return shown[:1] + [min(v, cap) for v in shown[1:]]


class CopyableBidder(BaseAgent):
    """Bids the prompt's suggested first unit and ``cap`` for the rest; waits otherwise."""

    name = "copyable_bidder"

    def __init__(self, cap: float | str = 8.0) -> None:
        super().__init__()
        parts = str(cap).split("|") if isinstance(cap, str) else [cap]
        try:
            self.caps = tuple(float(c) for c in parts)
        except (TypeError, ValueError):
            raise ValueError(
                f"cap must be a number or numbers joined by '|', got {cap!r}"
            ) from None
        if any(not c >= 0 for c in self.caps):
            raise ValueError(f"cap must be at least 0, got {cap!r}")
        self.cap = self.caps[0]

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase != "bidding":
            return WAIT
        cap = self.caps[0] if len(self.caps) == 1 else self.caps[self.rng.integers(len(self.caps))]
        bids = copyable_bids(obs, cap)
        return Bid.trusted(affordable(bids, obs.budget or 0.0, max(1, obs.capacity)))


class CopyableExpert(BaseAgent):
    """``rule_expert``'s negotiation with :class:`CopyableBidder`'s bids: every turn goes to an
    inner :class:`~agents.population.expert.RuleExpert` (so its memory and trust stay whole);
    a bid it returns is replaced by the copyable bid, any other action is played as it is."""

    name = "copyable_expert"

    def __init__(self, cap: float | str = 8.0) -> None:
        super().__init__()
        self.bidder = CopyableBidder(cap)
        self.expert = RuleExpert()

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.bidder.reset(seed)
        self.expert.reset(seed)

    def act(self, obs: Observation) -> ActionModel:
        action = self.expert.act(obs)
        if isinstance(action, Bid):
            return self.bidder.act(obs)
        return action
