"""Coalitions: labs pool credits, the leader bids for the group, won blocks are split.

Lifecycle: ``form_coalition`` (proposer commits and pays its contribution into the escrow pool)
-> invitees ``commit_to_coalition`` -> active once two members have committed -> dissolves at the
end of its term (or when fewer than two members remain), returning each member's pool balance.
A proposal nobody joins by the end of its round lapses and is refunded. Leaving an active
coalition before its term ends is a breach: the mechanism's withdrawal penalty and a reputation
loss. Credits in the pool stay the members' money: payments for won blocks are charged pro rata to
pool balances, and what is left comes back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from market.core.actions import CoalitionSplit, CommitToCoalition, FormCoalition, LeaveCoalition
from market.core.ledger import (
    ActionError,
    escrow_credits,
    pay_operator,
    pay_operator_from_escrow,
    release_escrow,
)
from market.core.mechanisms import Mechanism
from market.core.negotiation import seat_index
from market.core.penalties import COALITION_EXIT_REPUTATION_LOSS
from market.core.summation import ordered_sum
from market.core.world import World, lose_reputation

MAX_OPEN_COALITIONS = 4


@dataclass(slots=True)
class Coalition:
    coalition_id: str
    leader: int
    invited: set[int]
    purpose: str
    split: CoalitionSplit
    created_round: int
    term_end: int
    members: list[int] = field(default_factory=list)
    balances: dict[int, float] = field(default_factory=dict)  # pool escrow per member
    contributed: dict[int, float] = field(default_factory=dict)
    status: Literal["proposed", "active", "dissolved"] = "proposed"
    pledges: dict[int, int] = field(default_factory=dict)  # blocks per term round (pledges.py)

    @property
    def pool(self) -> float:
        return float(ordered_sum(self.balances.values()))


@dataclass(slots=True)
class CoalitionBook:
    coalitions: dict[str, Coalition] = field(default_factory=dict)
    next_id: int = 0

    def escrow(self) -> float:
        return float(
            ordered_sum(c.pool for c in self.coalitions.values() if c.status != "dissolved")
        )

    def of(self, lab: int) -> list[Coalition]:
        return [
            c
            for c in self.coalitions.values()
            if c.status != "dissolved" and (lab in c.members or lab in c.invited)
        ]


def _escrow(world: World, coalition: Coalition, lab: int, amount: float) -> None:
    if world.labs[lab].budget + 1e-9 < amount:
        raise ActionError(
            f"you have {world.labs[lab].budget:.2f} credits, not {amount:.2f}; contribute less"
        )
    escrow_credits(world, coalition.balances, lab, amount)
    coalition.contributed[lab] = coalition.contributed.get(lab, 0.0) + amount


def handle_form(
    world: World, book: CoalitionBook, me: int, action: FormCoalition, now: int, rounds: int
) -> Coalition:
    invited = set()
    for seat in action.members:
        other = seat_index(seat, len(world.labs), "members")
        if other == me:
            raise ActionError("members lists yourself; list only the labs you invite")
        if not world.labs[other].active:
            raise ActionError(f"{seat} is not in the market now; invite active labs only")
        invited.add(other)
    if ordered_sum(1 for c in book.of(me) if c.leader == me) >= MAX_OPEN_COALITIONS:
        raise ActionError(
            f"you already lead {MAX_OPEN_COALITIONS} coalitions; leave one before proposing another"
        )
    if world.labs[me].budget + 1e-9 < action.contribution:
        raise ActionError(
            f"you have {world.labs[me].budget:.2f} credits, not {action.contribution:.2f}; contribute less"
        )
    coalition = Coalition(
        coalition_id=f"c{book.next_id}",
        leader=me,
        invited=invited,
        purpose=action.purpose,
        split=action.split,
        created_round=now,
        term_end=min(rounds - 1, now + action.term_rounds - 1),
    )
    book.next_id += 1
    coalition.members.append(me)
    _escrow(world, coalition, me, action.contribution)
    if action.pledge_blocks:
        coalition.pledges[me] = action.pledge_blocks
    book.coalitions[coalition.coalition_id] = coalition
    return coalition


def handle_commit(
    world: World, book: CoalitionBook, me: int, action: CommitToCoalition
) -> Coalition:
    coalition = book.coalitions.get(action.coalition_id)
    if coalition is None or coalition.status == "dissolved":
        raise ActionError(
            f"coalition {action.coalition_id!r} is not open; use a coalition_id from your invitations"
        )
    if me in coalition.members:
        raise ActionError(f"you are already a member of {coalition.coalition_id}")
    if me not in coalition.invited:
        raise ActionError(f"you are not invited to {coalition.coalition_id}")
    _escrow(world, coalition, me, action.contribution)
    if action.pledge_blocks:
        coalition.pledges[me] = action.pledge_blocks
    coalition.invited.discard(me)
    coalition.members.append(me)
    if len(coalition.members) >= 2:
        coalition.status = "active"
    return coalition


def _refund(world: World, coalition: Coalition, lab: int) -> None:
    release_escrow(world, coalition.balances, lab)


def dissolve(world: World, coalition: Coalition) -> None:
    for lab in list(coalition.balances):
        _refund(world, coalition, lab)
    coalition.status = "dissolved"


def handle_leave(
    world: World,
    book: CoalitionBook,
    me: int,
    action: LeaveCoalition,
    now: int,
    mechanism: Mechanism,
    forced: bool = False,
) -> tuple[Coalition, float]:
    """Leave; returns the coalition and the withdrawal penalty charged (breach)."""
    coalition = book.coalitions.get(action.coalition_id)
    if (
        coalition is None
        or coalition.status == "dissolved"
        or (me not in coalition.members and me not in coalition.invited)
    ):
        raise ActionError(f"you are not in coalition {action.coalition_id!r}")
    if me in coalition.invited:
        coalition.invited.discard(me)  # declining an invitation
        return coalition, 0.0
    penalty = 0.0
    if coalition.status == "active" and now <= coalition.term_end and not forced:
        penalty = pay_operator(world, me, mechanism.withdrawal_penalty)
        lose_reputation(world, me, COALITION_EXIT_REPUTATION_LOSS)
    _refund(world, coalition, me)
    coalition.pledges.pop(me, None)
    coalition.members.remove(me)
    if coalition.leader == me and coalition.members:
        coalition.leader = coalition.members[0]
    if len(coalition.members) < 2 and (coalition.status == "active" or not coalition.members):
        dissolve(world, coalition)
    return coalition, penalty


def split_blocks(coalition: Coalition, blocks: int) -> dict[int, int]:
    """Split won blocks by the coalition's rule with largest remainders (ties: member order)."""
    members = coalition.members
    if coalition.split == "equal" or coalition.pool <= 0:
        weights = np.ones(len(members))
    else:
        weights = np.array([coalition.contributed.get(m, 0.0) for m in members])
        if not (weights > 0).any():
            weights = np.ones(len(members))
    exact = blocks * weights / math.fsum(weights.tolist())
    base = np.floor(exact).astype(np.int64)
    left = blocks - int(base.sum())
    order = sorted(range(len(members)), key=lambda k: (-(exact[k] - base[k]), k))
    for k in order[:left]:
        base[k] += 1
    return {m: int(b) for m, b in zip(members, base, strict=True)}


def charge_pool(world: World, coalition: Coalition, amount: float) -> dict[int, float]:
    """Pay ``amount`` to the operator from the pool, pro rata to members' balances."""
    pool = coalition.pool
    if amount <= 0 or pool <= 0:
        return {}
    return pay_operator_from_escrow(world, coalition.balances, coalition.members, amount, pool)


def end_of_round(world: World, book: CoalitionBook, now: int) -> None:
    """Lapse unjoined proposals and dissolve coalitions whose term ended."""
    for coalition in book.coalitions.values():
        if (
            coalition.status == "proposed"
            and coalition.created_round <= now
            or coalition.status == "active"
            and coalition.term_end <= now
        ):
            dissolve(world, coalition)
