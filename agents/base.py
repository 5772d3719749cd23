"""The Agent protocol: anything that maps a seat's observation to an action.

An agent receives only its own seat's :class:`~market.environment.observations.Observation` and its own seed
(derived per seat; it reveals nothing about the episode seed). ``aact`` lets LLM agents run
concurrently; scripted agents inherit the default that calls ``act``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from market.core.actions import ActionModel
from market.environment import Observation


@runtime_checkable
class Agent(Protocol):
    name: str
    roles: frozenset[str]

    def reset(self, seed: int | None = None) -> None: ...

    def act(self, observation: Observation) -> ActionModel | str | dict[str, Any]: ...

    async def aact(self, observation: Observation) -> ActionModel | str | dict[str, Any]: ...


class BaseAgent:
    """Convenience base: a name, the roles it fills, a seeded Generator, and async via ``act``.

    ``stats`` collects per-seat accounting (LLM tokens, latency, retries, fallbacks); the runner
    copies it into results. ``limiter``, when the runner sets it, bounds model requests in flight
    across all concurrent episodes; ``budget``, when set, is charged with the model tokens the
    agent uses (see :class:`agents.llm.backends.pool.Budget`).
    """

    name: ClassVar[str] = "base"
    roles: ClassVar[frozenset[str]] = frozenset({"bidder"})
    limiter: Any = None
    budget: Any = None

    def __init__(self) -> None:
        self._rng: np.random.Generator | None = None
        self._rng_seed: int | None = 0
        self.stats: dict[str, float] = {}

    def reset(self, seed: int | None = None) -> None:
        self._rng, self._rng_seed = None, seed

    @property
    def rng(self) -> np.random.Generator:
        """The agent's generator, ``np.random.default_rng(seed)`` of the last :meth:`reset` (0
        before any). Made on first use: most scripted agents never draw, and a market of
        thousands of seats would otherwise build thousands of generators per episode. Nothing
        draws before it exists, so its draws are those of one made at reset."""
        if self._rng is None:
            self._rng = np.random.default_rng(self._rng_seed)
        return self._rng

    @rng.setter
    def rng(self, generator: np.random.Generator) -> None:
        self._rng = generator

    def act(self, observation: Observation) -> ActionModel | str | dict[str, Any]:
        raise NotImplementedError

    async def aact(self, observation: Observation) -> ActionModel | str | dict[str, Any]:
        return self.act(observation)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def as_flag(value: bool | str, name: str) -> bool:
    """A boolean spec parameter: true/false, yes/no, on/off or 1/0 (any case)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def unknown_parameter_message(name: str, where: str, groups: Mapping[str, Sequence[str]]) -> str:
    """``unknown parameter 'retrys'[ for WHERE]; did you mean 'retries'? GROUP parameters: ...``
    with the nearest valid name (difflib) and every valid one, by group."""
    valid = [n for names in groups.values() for n in names]
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}? " if close else "; "
    listed = "; ".join(
        f"{group} parameters: {', '.join(names) or '(none)'}" for group, names in groups.items()
    )
    return f"unknown parameter {name!r}{f' for {where}' if where else ''}{hint}{listed}"
