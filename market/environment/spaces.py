"""The AEC env's spaces: structured observations per seat, and text actions."""

from __future__ import annotations

import copy
import string
from collections.abc import Mapping
from typing import Any, cast

import gymnasium
import numpy as np
from gymnasium.spaces import Discrete, Text

from market.environment.observations import Observation

ACTION_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "
Info = dict[str, object]  # a seat's info dict (``infos[seat]``)
Options = dict[str, object]  # ``reset(options=...)`` (unused by the market)


def seat_space_seed(seed: int, index: int) -> int:
    """The seed of seat ``index``'s action space in an episode reset with ``seed``."""
    return int(np.random.SeedSequence([seed, 7, index]).generate_state(1)[0])


class SeedOnFirstUse(gymnasium.spaces.Space[Any]):
    """A seat's action space whose reset seed is kept pending (:func:`seed_action_spaces`) and
    applied when the space first needs its generator: the same samples as seeding at reset,
    without building a generator per seat per reset (thousands of seats in a large market)."""

    _pending_seed: tuple[int, int] | None = None  # (episode seed, seat index)

    @property
    def np_random(self) -> np.random.Generator:
        pending = self._pending_seed
        if pending is not None:  # the first use since a reset: seed as the reset would have
            self.seed(seat_space_seed(*pending))
        return super().np_random

    def seed(self, seed: int | None = None) -> Any:
        self._pending_seed = None  # an explicit seed (or None: fresh entropy) replaces it
        return super().seed(seed)

    def seed_later(self, seed: int, index: int) -> None:
        """Seed as ``seed(seat_space_seed(seed, index))`` would, when the generator is first used."""
        # gymnasium >= 1.3 types ``_np_random`` as never None; None still means "seed on first use"
        self._np_random = cast("np.random.Generator", None)
        self._pending_seed = (seed, index)


class SeatText(SeedOnFirstUse, Text):
    """A seat's text action space (seeded on first use)."""


class SeatDiscrete(SeedOnFirstUse, Discrete[np.int64]):
    """A seat's discrete action space in the discrete wrappers (seeded on first use)."""


#: the one built text action space whose character tables every seat's copy shares
_TEXT_ACTION_SPACE = SeatText(max_length=200, min_length=0, charset=ACTION_CHARSET)


def text_action_spaces(agents: list[str]) -> dict[str, SeatText]:
    """Each seat's text action space, seeded per seat so that entrants also sample reproducibly.

    A ``Text`` space builds its character tables (a set, a list, an index of every character) on
    construction: two thirds of a live env's memory when each seat built its own. The seats'
    spaces are shallow copies of one space instead, so they share those read-only tables; each
    copy gets its own generator from ``seed``."""
    spaces = {}
    for k, agent in enumerate(agents):
        space = copy.copy(_TEXT_ACTION_SPACE)
        space.seed(k)
        spaces[agent] = space
    return spaces


def seed_action_spaces(
    action_spaces: Mapping[str, gymnasium.spaces.Space[object]], agents: list[str], seed: int | None
) -> None:
    """Seed every seat's action space from the episode seed (entrants sample reproducibly):
    ours (:class:`SeedOnFirstUse`) when they first sample, any other space now."""
    if seed is not None:
        for i, agent in enumerate(agents):
            space = action_spaces[agent]
            if isinstance(space, SeedOnFirstUse):
                space.seed_later(seed, i)
            else:
                space.seed(seat_space_seed(seed, i))


class ObservationSpace(gymnasium.spaces.Space[Observation]):
    """The space of :class:`~market.environment.observations.Observation` objects for one seat.

    Observations are structured (pydantic); RL users get fixed-size vectors and masks from
    :mod:`market.environment.wrappers`.
    """

    def __init__(self, seat: str) -> None:
        super().__init__(shape=None, dtype=None)
        self.seat = seat

    def contains(self, x: object) -> bool:
        return isinstance(x, Observation) and x.seat == self.seat

    def sample(self, mask: object = None, probability: object = None) -> Observation:
        raise NotImplementedError(
            "observations are structured market states and cannot be sampled; "
            "use env.observe(agent) or the vector wrapper in market.environment.wrappers"
        )

    def __eq__(self, other: object) -> bool:
        # every seat observes the same structure; ``contains`` also checks the seat
        return isinstance(other, ObservationSpace)

    def __hash__(self) -> int:
        return hash(ObservationSpace)

    def __repr__(self) -> str:
        return f"ObservationSpace({self.seat!r})"
