"""A live seat's action in a step, outside the AEC class: parse, check, apply, or refuse.

:func:`take_action` is what ``raw_env.step`` does with the acting seat's action: parse it, check
it against the seat's observation, tell the conduct log, apply it, and report what it did in the
step's info; an invalid action changes nothing (docs/design.md, section 5.5) and is refused with
the error in the info. It returns the info, whether the market may have changed and the one
reward the acting seat is charged for the action; the env credits it. The appliers:
:func:`apply_designer_action` (the designer's mechanism update, pure) and
:func:`apply_lab_action` (each lab action's handler in :mod:`market.core` and its result).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from market.core import actions, negotiation, reservations
from market.core import coalitions as coal
from market.core.action_checks import check_action
from market.core.actions import ActionModel, ActionParseError, parse_action
from market.core.arena import ignored_conditions
from market.core.arena_payloads import BlockContext
from market.core.bidding import RoundOrders
from market.core.claims import with_claims
from market.core.collusion import InteractionGraph
from market.core.ledger import ActionError
from market.core.mechanisms import Mechanism
from market.core.phases import TALK_ACTIONS
from market.core.rewards import RewardComponent
from market.core.round_close import RewardEvent
from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER, bidder_seat
from market.core.settlement import RoundResult
from market.core.world import World
from market.environment.conduct_log import ConductLog
from market.environment.observations import Observation

CreditLabs = Callable[[Iterable[RewardEvent]], None]  # credits (lab, component, credits) events
Retire = Callable[[int, bool], None]  # retire(lab, voluntary)
Apply = Callable[[str, ActionModel], dict[str, object]]  # apply(seat, action) -> the result


class ActionState(Protocol):
    """The market state an action reads and changes (``raw_env`` provides it)."""

    @property
    def world(self) -> World: ...
    @property
    def book(self) -> negotiation.Book: ...
    @property
    def coalitions(self) -> coal.CoalitionBook: ...
    @property
    def graph(self) -> InteractionGraph: ...
    @property
    def conduct(self) -> ConductLog: ...
    @property
    def orders(self) -> RoundOrders: ...
    @property
    def mechanism(self) -> Mechanism: ...
    @property
    def results(self) -> list[RoundResult]: ...
    @property
    def round(self) -> int: ...
    @property
    def phase(self) -> str: ...
    @property
    def scenario(self) -> Scenario: ...
    def observe(self, agent: str) -> Observation: ...


@dataclass(slots=True)
class ActionOutcome:
    """What a step's action did: the step's info (``round``, ``phase``, then ``action`` and
    ``result``, or ``error``), whether the market may have changed (an applied action other than
    ``wait``) and the reward component and value the acting seat is charged (talk, or refusal)."""

    info: dict[str, object]
    changed: bool
    charge: tuple[RewardComponent, float] | None


def take_action(m: ActionState, agent: str, action: object, apply: Apply) -> ActionOutcome:
    """Parse, check and apply ``agent``'s ``action`` (``apply`` applies a valid one), telling the
    conduct log before and after; refuse it, changing nothing, if it is invalid."""
    info: dict[str, object] = {"round": m.round, "phase": m.phase}
    m.conduct.begin_step()
    try:
        blocks = BlockContext.reader(m.world, agent, m.round)  # GPU-arena block ids
        act = parse_action(action, designer=agent == DESIGNER, blocks=blocks)
        info["action"] = act.action_type
        check_action(act, m.observe(agent), m.scenario.capacity.max_units_per_bid)
        m.conduct.before_action(m.world, agent, act, m.round)
        result = info["result"] = apply(agent, act)
        m.conduct.after_action(agent, act, result, m.round, m.results)
    except (ActionParseError, ActionError) as exc:
        info["error"] = str(exc)
        return ActionOutcome(
            info, False, ("invalid_action", -m.scenario.rewards.invalid_action_penalty)
        )
    talk = act.action_type in TALK_ACTIONS
    charge: tuple[RewardComponent, float] | None = (
        ("talk_cost", -m.scenario.rewards.talk_cost) if talk else None
    )
    return ActionOutcome(info, act.action_type != "wait", charge)


def apply_designer_action(
    mechanism: Mechanism, act: ActionModel, scenario: Scenario
) -> tuple[Mechanism, dict[str, object]]:
    """The mechanism after the designer's action and the action's result: a ``SetMechanism``
    updates it (amounts in DAEDALUS units converted to credits: 1 = the highest private value per
    block, :class:`~market.core.mechanism_update.MechanismUpdate`); anything else leaves it."""
    if not isinstance(act, actions.SetMechanism):
        return mechanism, {}
    scale = scenario.jobs.value_per_block[1]
    update, converted = act.mechanism.in_credits(scale, scenario.mechanism_units)
    mechanism = update.apply_to(mechanism)
    if not converted:
        return mechanism, {"mechanism": mechanism.model_dump()}
    return mechanism, {
        "mechanism": mechanism.model_dump(),
        "units": "daedalus",
        "value_scale": scale,
        "converted": converted,
    }


def apply_lab_action(
    m: ActionState, me: int, act: ActionModel, credit: CreditLabs, retire: Retire
) -> dict[str, object]:
    """Apply lab ``me``'s valid action with its handler; ``credit`` takes the rewards it earns
    as it goes (a trade's price, a coalition exit's penalty), ``retire`` a ``Finish``. Returns
    the action's result for the step's info."""
    world, now, rounds = m.world, m.round, m.scenario.rounds
    match act:
        case actions.SendOffer():
            offer = negotiation.handle_send_offer(world, m.book, me, act, now, rounds)
            return {"offer_id": offer.offer_id, **ignored_conditions(act.conditions)}
        case actions.CounterOffer():
            offer = negotiation.handle_counter(world, m.book, me, act, now, rounds)
            ignored = ignored_conditions(act.conditions)
            return {"offer_id": offer.offer_id, "countered": act.offer_id, **ignored}
        case actions.AcceptOffer():
            offer, contract = negotiation.handle_accept(world, m.book, me, act, now)
            if offer.status == "accepted":
                credit([(offer.seller, "trade_balance", offer.price)])
                credit([(offer.buyer, "trade_balance", -offer.price)])
                m.graph.record_trade(offer.seller, offer.buyer, now)
                m.conduct.accepted(offer, contract, now)
            return {
                "offer_id": offer.offer_id,
                "status": offer.status,
                "contract_id": contract.contract_id if contract else None,
            }
        case actions.RejectOffer():
            offer = negotiation.handle_reject(m.book, me, act)
            return {"offer_id": offer.offer_id, "status": offer.status}
        case actions.FormCoalition():
            c = coal.handle_form(world, m.coalitions, me, act, now, rounds)
            return {"coalition_id": c.coalition_id}
        case actions.CommitToCoalition():
            c = coal.handle_commit(world, m.coalitions, me, act)
            if c.status == "active":
                m.graph.record_coalition(c.members, c.coalition_id, now)
            return {"coalition_id": c.coalition_id, "status": c.status}
        case actions.LeaveCoalition():
            c, penalty = coal.handle_leave(world, m.coalitions, me, act, now, m.mechanism)
            credit([(me, "withdrawal_penalty", -penalty)])
            return {"coalition_id": c.coalition_id, "breach_penalty": penalty}
        case actions.SendMessage():
            msg = negotiation.handle_message(world, m.book, me, act, now)
            for other in msg.recipients or ():
                m.graph.record_private_message(me, other, now)
            return {
                "delivered_to": "all"
                if msg.recipients is None
                else [bidder_seat(i) for i in msg.recipients]
            }
        case actions.MakePitch():
            m.book.pitches[me] = with_claims(
                negotiation.handle_pitch(world, m.book, me, act, now), act
            )
            return {"pitched": act.blocks_requested}
        case actions.CounterPitch():
            negotiation.handle_counter_pitch(world, m.book, me, act)
            return {"countered": act.target}
        case actions.ReserveCapacity():
            got = reservations.handle_reserve(
                world, m.book.reserved, m.book.committed, me, act, now, rounds
            )
            return {"reserved": got, "job_id": act.job_id}
        case actions.ReleaseCapacity():
            got = reservations.handle_release(m.book.reserved, me, act, now, rounds)
            return {"released": got}
        case actions.AllocateToJob():
            m.orders.allocate(world, me, act)
            return {"job_id": act.job_id, "blocks": act.blocks}
        case actions.Bid():
            cap = m.scenario.capacity.max_units_per_bid or max(1, int(world.capacity[now]))
            return dict(m.orders.place_bid(world, m.coalitions, m.mechanism, me, act, cap))
        case actions.Finish():
            retire(me, True)
            return {"finished": True}
    return {}
