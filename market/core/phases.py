"""The turn order of a round: its phases, the actions legal in each, and the seat schedule.

A round (docs/design.md, section 4) is the design pass (``designer_0``, when the scenario gives
the designer a seat), ``negotiation_turns`` negotiation passes over the active labs and one
bidding pass; ``done`` ends the episode.
"""

from __future__ import annotations

from market.core.actions import ActionModel
from market.core.ledger import ActionError
from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER

TALK_ACTIONS = frozenset(
    {"send_offer", "counter_offer", "form_coalition", "send_message", "make_pitch", "counter_pitch"}
)
LEGAL: dict[str, tuple[str, ...]] = {
    "design": ("set_mechanism", "wait"),
    "negotiation": (
        "send_offer",
        "counter_offer",
        "accept_offer",
        "reject_offer",
        "form_coalition",
        "commit_to_coalition",
        "leave_coalition",
        "send_message",
        "make_pitch",
        "counter_pitch",
        "allocate_to_job",
        "reserve_capacity",
        "release_capacity",
        "wait",
        "finish",
    ),
    "bidding": ("bid", "allocate_to_job", "wait", "finish"),
    "done": (),
}


def round_schedule(
    designs: bool, negotiation_turns: int, active: list[str]
) -> list[tuple[str, str]]:
    """The round's turns as (seat, phase) pairs: design (if ``designs``), negotiation, bidding."""
    schedule: list[tuple[str, str]] = []
    if designs:
        schedule.append((DESIGNER, "design"))
    for _ in range(negotiation_turns):
        schedule += [(a, "negotiation") for a in active]
    schedule += [(a, "bidding") for a in active]
    return schedule


def check_turn(act: ActionModel, agent: str, phase: str) -> None:
    """Raise :class:`ActionError` unless ``act`` is ``agent``'s to take in ``phase``."""
    if act.agent is not None and act.agent != agent:
        raise ActionError(
            f"this action is addressed to {act.agent!r} but it is {agent}'s turn; drop 'agent' or set it to {agent!r}"
        )
    legal = LEGAL[phase]
    if act.action_type not in legal:
        raise ActionError(
            f"{act.action_type} is not allowed in the {phase} phase; legal now: {', '.join(legal)}"
        )


def round_turns(sc: Scenario, r: int, active: list[str]) -> list[tuple[str, str]]:
    """Round ``r``'s turns (:func:`round_schedule`) for the ``active`` seats: the designer's on
    a design round (every ``rounds_per_design`` rounds, or only the first if the mechanism is
    set once per episode), then ``negotiation_turns`` negotiation passes and a bidding pass."""
    every = sc.rounds_per_design if sc.mechanism_every == "round" else sc.rounds
    designs = sc.designer_seat and r % every == 0
    return round_schedule(designs, sc.negotiation_turns, active)
