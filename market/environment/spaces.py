"""The AEC env's spaces: structured observations per seat, and text actions."""

from __future__ import annotations

import copy
import string
from collections.abc import Mapping

import gymnasium
import numpy as np
from gymnasium.spaces import Text

from market.environment.observations import Observation

ACTION_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "
Info = dict[str, object]  # a seat's info dict (``infos[seat]``)
Options = dict[str, object]  # ``reset(options=...)`` (unused by the market)


#: the one built text action space whose character tables every seat's copy shares
_TEXT_ACTION_SPACE = Text(max_length=200, min_length=0, charset=ACTION_CHARSET)


def text_action_spaces(agents: list[str]) -> dict[str, Text]:
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
    """Seed every seat's action space from the episode seed (entrants sample reproducibly)."""
    if seed is not None:
        for i, agent in enumerate(agents):
            action_spaces[agent].seed(
                int(np.random.SeedSequence([seed, 7, i]).generate_state(1)[0])
            )


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
