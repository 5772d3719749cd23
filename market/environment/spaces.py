"""The AEC env's spaces: structured observations per seat, and text actions."""

from __future__ import annotations

import string

import gymnasium

from market.environment.observations import Observation

ACTION_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "
Info = dict[str, object]  # a seat's info dict (``infos[seat]``)
Options = dict[str, object]  # ``reset(options=...)`` (unused by the market)


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
