"""Crediting reward events to seats: the env's step rewards, the seats a step credited and each
seat's reward components (``infos[seat]["reward_components"]``), outside the AEC class.

A lab's reward events are in credits (:data:`~market.core.round_close.RewardEvent`); a seat's
reward is in the scenario's ``value_unit`` (docs/design.md, section 6). A zero, or a seat without
a reward slot (one that left), is skipped. Events are credited one by one, in the given order, so
a seat's components keep the order they first accrued in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from market.core.rewards import RewardComponent
from market.core.round_close import RewardEvent
from market.core.world import Lab

SeatEvent = tuple[str, RewardComponent, float]  # (seat, reward component, value)


def credit(
    rewards: dict[str, float],
    rewarded: set[str],
    pending: dict[str, dict[str, float]],
    events: Iterable[SeatEvent],
) -> None:
    """Add each event's value to the seat's ``rewards`` and its ``pending`` components and the
    seat to ``rewarded``; a zero, or a seat without a slot in ``rewards``, is skipped."""
    for agent, component, value in events:  # thousands in a round close at scale
        if value == 0.0 or agent not in rewards:
            continue
        rewards[agent] += value
        rewarded.add(agent)
        components = pending[agent]
        components[component] = components.get(component, 0.0) + value


def seat_events(
    labs: Sequence[Lab], unit: float, events: Iterable[RewardEvent]
) -> Iterator[SeatEvent]:
    """The labs' reward events (in credits) as their seats' (in units of ``unit`` credits),
    lazily."""
    return ((labs[lab].seat, c, float(credits) / unit) for lab, c, credits in events)
