"""Coalition pledges: blocks members commit to a pool, shared by need and paid for; defaults and
cascades.

A member of an active coalition may pledge ``k`` blocks per round of the term
(``pledge_blocks`` of ``form_coalition`` / ``commit_to_coalition``). At the close of each round
``r`` of the term, after owned blocks fail (:mod:`market.core.delivery`) and before forward
contracts are delivered:

1. Each member gives ``g = min(k, held)`` of its blocks for ``r`` to the pool. A member with
   ``g < k`` **defaults** by ``s = k - g`` blocks (its blocks failed or it never acquired them):
   it loses ``BREACH_REPUTATION_LOSS x s / k`` reputation and pays ``default_compensation`` per
   missing block out of its pool balance (as far as it goes) to the members the shortfall cut
   (step 3), pro rata to their cut.
2. The pool's blocks go to the members by need: each member's need is the remaining blocks of
   its live jobs this round's reliability can run, less the blocks it still holds; need units
   are served highest value per block first (ties: member order, then the job's deadline), and
   blocks no one needs go back to the members that gave them, in member order.
2a. **Payment.** Every block that moves from a member that gave it to a member that draws it is
   paid for at the round's clearing price ``c`` (the auction's price, at least the effective
   reserve): the net givers, in member order, hand their blocks to the net takers, in member
   order, and a taker of ``n`` blocks from a giver pays that giver ``min(n x c, its budget)``
   out of its budget (never below zero). A member's own blocks that come back to it are not
   paid for, and credits only move between members, so the members' budgets sum to the same
   total before and after. A member with spare blocks therefore earns ``c`` for each one a
   member with a need draws, which is what makes pledging worth its risk.

   Example: ``c = 8``; A pledges 2 and gives 2, B pledges 1 and gives 1, C pledges nothing and
   needs 3. The pool (3 blocks) goes to C; C pays A 16 and B 8, 24 in all (if its budget
   holds 24).
3. **Cascade.** Each member's entitlement is what step 2 would have given it had every pledge
   been delivered in full; a member that gets less is cut by the pool (recorded with the
   coalition and the defaulters). The cut fails the jobs that counted on those blocks, and, as
   pool settlement precedes contract delivery, can leave the member short on its own forward
   sales, which then breach (:func:`market.core.execution.deliver_contract`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from market.core.coalitions import Coalition, CoalitionBook
from market.core.execution import runnable
from market.core.ledger import move_blocks, pay_from_escrow, transfer_credits
from market.core.penalties import BREACH_REPUTATION_LOSS
from market.core.scenario_schema import DeliverySpec
from market.core.seats import bidder_seat
from market.core.summation import ordered_sum
from market.core.world import World, lose_reputation


@dataclass(slots=True)
class PoolSettlement:
    """One coalition's pledges in one round: who gave, who defaulted, who was cut."""

    coalition_id: str
    round: int
    pledged: dict[int, int]
    given: dict[int, int]
    received: dict[int, int]
    entitled: dict[int, int]
    compensation: dict[tuple[int, int], float] = field(default_factory=dict)  # (payer, payee)
    price: float = 0.0  # the price per block drawn (the round's clearing price)
    moved: dict[tuple[int, int], int] = field(default_factory=dict)  # (giver, taker): blocks
    payments: dict[tuple[int, int], float] = field(default_factory=dict)  # (taker, giver)

    @property
    def defaults(self) -> dict[int, int]:
        """Blocks each defaulting member failed to give."""
        return {m: k - self.given[m] for m, k in self.pledged.items() if self.given[m] < k}

    @property
    def cut(self) -> dict[int, int]:
        """Blocks each member got less than its entitlement (the cascade)."""
        return {
            m: e - self.received.get(m, 0)
            for m, e in self.entitled.items()
            if self.received.get(m, 0) < e
        }

    def to_log(self) -> dict[str, object]:
        return {
            "coalition_id": self.coalition_id,
            "pledged": {bidder_seat(m): k for m, k in self.pledged.items()},
            "given": {bidder_seat(m): g for m, g in self.given.items()},
            "received": {bidder_seat(m): v for m, v in self.received.items() if v},
            "defaults": {bidder_seat(m): s for m, s in self.defaults.items()},
            "cut": {bidder_seat(m): c for m, c in self.cut.items()},
            "compensation": [
                {"payer": bidder_seat(a), "payee": bidder_seat(b), "credits": v}
                for (a, b), v in self.compensation.items()
            ],
            "price": self.price,
            "payments": [
                {
                    "payer": bidder_seat(a),
                    "payee": bidder_seat(b),
                    "blocks": self.moved[(b, a)],
                    "credits": v,
                }
                for (a, b), v in self.payments.items()
            ],
        }


def _need_units(
    world: World, members: list[int], now: int, given: dict[int, int]
) -> list[tuple[float, int, int, int]]:
    """(-value per block, member order, deadline, member) for every block of need, each member
    holding its blocks less what it ``given`` to the pool."""
    rel = float(world.reliability[now])
    units = []
    for order, m in enumerate(members):
        left = int(world.holdings[m, now]) - given.get(m, 0)
        jobs = sorted(
            (j for j in world.labs[m].jobs if runnable(j, rel) and j.remaining > 0),
            key=lambda j: (j.deadline, j.arrival, j.job_id),
        )
        for job in jobs:  # held blocks run the earliest deadlines first (execution's order)
            n = job.remaining
            take = min(left, n)
            left -= take
            units += [(-job.unit_value, order, job.deadline, m)] * (n - take)
    units.sort()
    return units


def _allocate(units: list[tuple[float, int, int, int]], blocks: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for *_, m in units[:blocks]:
        out[m] = out.get(m, 0) + 1
    return out


def settle_pool(
    world: World, coalition: Coalition, now: int, spec: DeliverySpec, price: float = 0.0
) -> PoolSettlement | None:
    """Settle one coalition's pledges for round ``now``, blocks drawn paid at ``price`` each
    (see the module doc)."""
    members = [m for m in coalition.members if world.labs[m].active]
    pledged = {m: coalition.pledges[m] for m in members if coalition.pledges.get(m, 0) > 0}
    if not pledged:
        return None
    given = {m: min(k, int(world.holdings[m, now])) for m, k in pledged.items()}
    units = _need_units(world, members, now, given)
    pool = ordered_sum(given.values())
    received = _allocate(units, pool)
    entitled = _allocate(units, ordered_sum(pledged.values()))
    leftover = pool - ordered_sum(received.values())
    for m in members:  # unneeded blocks go back to their givers, in member order
        back = min(leftover, given.get(m, 0))
        if back:
            received[m] = received.get(m, 0) + back
            leftover -= back
    settlement = PoolSettlement(
        coalition.coalition_id, now, pledged, given, received, entitled, price=price
    )
    settlement.moved = _move(world, members, given, received, now)
    _pay(world, settlement)
    _compensate(world, coalition, settlement, spec)
    for m, s in settlement.defaults.items():
        lose_reputation(world, m, BREACH_REPUTATION_LOSS * s / pledged[m])
    return settlement


def _move(
    world: World, members: list[int], given: dict[int, int], received: dict[int, int], now: int
) -> dict[tuple[int, int], int]:
    """Net block moves: members that gave more than they got hand blocks to those that got more
    (givers and takers in member order); returns the blocks moved per (giver, taker)."""
    moved: dict[tuple[int, int], int] = {}
    net = {m: received.get(m, 0) - given.get(m, 0) for m in members}
    takers = [m for m in members if net[m] > 0]
    for giver in (m for m in members if net[m] < 0):
        owe = -net[giver]
        for taker in takers:
            if owe <= 0:
                break
            n = min(owe, net[taker])
            if n > 0:
                move_blocks(world, giver, taker, now, n)
                moved[(giver, taker)] = n
                net[taker] -= n
                owe -= n
    return moved


def _pay(world: World, settlement: PoolSettlement) -> None:
    """Each taker pays each giver ``price`` per block moved between them, out of its budget and
    never below zero (step 2a of the module doc)."""
    if settlement.price <= 0:
        return
    for (giver, taker), n in settlement.moved.items():
        amount = min(settlement.price * n, max(0.0, world.labs[taker].budget))
        if amount > 0:
            transfer_credits(world, taker, giver, amount)
            settlement.payments[(taker, giver)] = amount


def _compensate(
    world: World, coalition: Coalition, settlement: PoolSettlement, spec: DeliverySpec
) -> None:
    """Each defaulter pays ``default_compensation`` per missing block out of its pool balance
    (as far as it goes) to the members cut, pro rata to their cut."""
    cut = settlement.cut
    total_cut = ordered_sum(cut.values())
    if not total_cut or spec.default_compensation <= 0:
        return
    for payer, short in settlement.defaults.items():
        due = min(spec.default_compensation * short, max(0.0, coalition.balances.get(payer, 0.0)))
        for payee, c in cut.items():
            if payee == payer or due <= 0:
                continue
            amount = due * c / total_cut
            pay_from_escrow(world, coalition.balances, payer, payee, amount)
            key = (payer, payee)
            settlement.compensation[key] = settlement.compensation.get(key, 0.0) + amount


def settle_pledges(
    world: World, book: CoalitionBook, now: int, spec: DeliverySpec, price: float = 0.0
) -> list[PoolSettlement]:
    """Settle the pledges of every active coalition whose term covers round ``now``; blocks
    drawn are paid at ``price`` each (the round's clearing price)."""
    out = []
    for coalition in book.coalitions.values():
        if coalition.status == "active" and coalition.created_round <= now <= coalition.term_end:
            settled = settle_pool(world, coalition, now, spec, price)
            if settled is not None:
                out.append(settled)
    return out
