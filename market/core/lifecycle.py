"""Labs entering and leaving the market: a round's budget shocks and exits, the scheduled
entrants (an entrant whose exit shock has come never enters), and a lab's retirement."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from market.core import coalitions as coal
from market.core import execution, ledger, negotiation
from market.core.actions import LeaveCoalition
from market.core.mechanisms import Mechanism
from market.core.round_close import RewardEvent, breach_rewards
from market.core.shocks import Shock
from market.core.summation import ordered_sum
from market.core.world import World


def apply_round_shocks(
    world: World, shocks: list[Shock], r: int, retire: Callable[[int], None]
) -> None:
    """Apply round ``r``'s targeted shocks in schedule order; ``retire(lab)`` handles exits."""
    for shock in shocks:
        if shock.round != r or shock.target is None:
            continue
        lab = world.labs[shock.target]
        if shock.kind == "budget_cut" and lab.active:
            ledger.burn_credits(world, shock.target, lab.budget * min(1.0, shock.magnitude))
        elif shock.kind == "windfall" and lab.active:
            ledger.mint_credits(world, shock.target, shock.magnitude)
        elif shock.kind == "lab_exit" and lab.active:
            retire(shock.target)


def admit_entrants(world: World, shocks: list[Shock], r: int) -> list[str]:
    """Admit the labs scheduled to enter in round ``r`` that have not entered and have not exited
    (an entrant whose exit shock has come never enters); returns their seats."""
    seats = []
    for i, lab in enumerate(world.labs):
        if (
            world.entry_round[i] == r
            and not lab.entered
            and not any(s.kind == "lab_exit" and s.target == i and s.round <= r for s in shocks)
        ):
            lab.entered = lab.active = True
            seats.append(lab.seat)
    return seats


def retire_lab(
    world: World,
    book: negotiation.Book,
    coalitions: coal.CoalitionBook,
    lab_index: int,
    now: int,
    mechanism: Mechanism,
    voluntary: bool,
) -> tuple[list[execution.Breach], list[float]]:
    """Lab ``lab_index`` leaves (finish or exit shock): live jobs settle now, its offers void, the
    forward contracts it sold or bought are delivered or breached now, and it leaves its
    coalitions (pools refund). Returns the breaches and the coalition-exit penalties, in order."""
    lab = world.labs[lab_index]
    lab.active = False
    lab.exit_round = now
    for job in lab.jobs:
        if job.status == "active":
            job.status = "expired"
            job.realized = job.unit_value * job.progress if job.partial_credit else 0.0
    negotiation.void_offers_of(book, lab_index)
    # forward contracts it sold settle now, while its seat can still be charged: it delivers
    # what it holds for the delivery round and is in breach for the rest (as at delivery); so do
    # those it bought, while its seat can still be paid a refund or compensation
    breaches = []
    for contract in book.contracts:
        if lab_index in (contract.seller, contract.buyer) and contract.delivered < 0:
            breach = execution.deliver_contract(world, contract, mechanism.withdrawal_penalty)
            if breach is not None:
                breaches.append(breach)
    penalties = []
    for c in list(coalitions.of(lab_index)):
        _, penalty = coal.handle_leave(
            world,
            coalitions,
            lab_index,
            LeaveCoalition(coalition_id=c.coalition_id),
            now,
            mechanism,
            forced=not voluntary,
        )
        penalties.append(penalty)
    return breaches, penalties


def retirement_rewards(
    world: World,
    lab_index: int,
    breaches: list[execution.Breach],
    penalties: list[float],
    potential: np.ndarray,
) -> list[RewardEvent]:
    """The reward events of lab ``lab_index``'s retirement (:func:`retire_lab`'s breaches and
    coalition-exit penalties), in the order they accrue: each breach's
    (:func:`~market.core.round_close.breach_rewards`), each penalty as ``withdrawal_penalty``,
    then the change of its job value, ``sum(Job.potential())`` in job order, as ``job_value``
    (its live jobs settled at retirement); ``potential`` is updated in place."""
    events = [e for breach in breaches for e in breach_rewards(breach)]
    events += [(lab_index, "withdrawal_penalty", -penalty) for penalty in penalties]
    delta = ordered_sum(j.potential() for j in world.labs[lab_index].jobs) - potential[lab_index]
    potential[lab_index] += delta
    events.append((lab_index, "job_value", delta))
    return events


def start_jobs(world: World, r: int) -> None:
    """Activate round ``r``'s jobs of every active lab (:func:`~market.core.execution.activate_jobs`)."""
    for lab in world.labs:
        if lab.active:
            execution.activate_jobs(lab.jobs, r)
