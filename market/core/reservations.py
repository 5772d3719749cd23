"""Capacity reservations: a lab sets blocks it owns aside for its own jobs.

The rule (docs/actions.md, ``reserve_capacity``):

- a lab may reserve only blocks it owns for a round that has not passed and that are neither
  promised on an open forward contract nor already reserved: ``reserved <= owned - committed``
  for every (lab, round);
- reserved blocks cannot be sold, offered, used to accept an offer or a counter-offer, until
  released (:func:`~market.core.negotiation` subtracts :meth:`Reservations.blocks` wherever it
  counts the blocks a seller can deliver). An open sell offer whose blocks are reserved after it
  was sent becomes void when accepted, so a reservation also protects a lab from an offer it no
  longer wants honoured;
- a reservation with a ``job_id`` runs that job first when the round executes (before the lab's
  ``allocate_to_job`` plan and earliest-deadline-first);
- reserve and release are atomic: every listed block or none, and the error names the first
  block that cannot be reserved (or released);
- reservations of a round end with the round (blocks are perishable); if a lab ever holds fewer
  blocks than it reserved (capacity lost to a shock), the reservation shrinks to the holding.

Coalition pools hold credits, not blocks, so no block is ever put in a pool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from market.core.actions import ReleaseCapacity, ReserveCapacity
from market.core.ledger import ActionError
from market.core.summation import ordered_sum
from market.core.world import World


@dataclass(slots=True)
class Reservations:
    """Reserved blocks by (lab, round), and the job each reservation runs first (if any)."""

    blocks_by: dict[tuple[int, int], int] = field(default_factory=dict)
    jobs_by: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)

    def blocks(self, lab: int, round_: int) -> int:
        """Blocks ``lab`` has reserved for ``round_`` (0 if none)."""
        return self.blocks_by.get((lab, round_), 0)

    def of(self, lab: int, first: int, rounds: int) -> list[int]:
        """Reserved blocks of ``lab`` for rounds ``first .. rounds-1`` (aligned with its holdings)."""
        if not self.blocks_by:  # no lab has reserved (the common case): every entry is 0
            return [0] * (rounds - first)
        return [self.blocks(lab, r) for r in range(first, rounds)]

    def plans(self, now: int) -> dict[int, dict[str, int]]:
        """Round ``now``'s job reservations by lab (job -> reserved blocks), in reservation order."""
        return {lab: dict(jobs) for (lab, r), jobs in self.jobs_by.items() if r == now and jobs}

    def end_of_round(self, world: World, now: int) -> None:
        """Forget reservations of rounds up to ``now``; shrink any above the lab's holding."""
        for key in [k for k in self.blocks_by if k[1] <= now]:
            del self.blocks_by[key]
            self.jobs_by.pop(key, None)
        for (lab, r), n in list(self.blocks_by.items()):
            held = int(world.holdings[lab, r])
            if n > held:
                self.set_blocks(lab, r, held)

    def set_blocks(self, lab: int, round_: int, n: int) -> None:
        """Set the reserved blocks of (``lab``, ``round_``) to ``n`` (0 drops the reservation)."""
        key = (lab, round_)
        if n > 0:
            self.blocks_by[key] = n
            jobs = self.jobs_by.get(key)
            if jobs:  # never more job-bound blocks than reserved ones; latest bindings shrink first
                over = ordered_sum(jobs.values()) - n
                for job_id in reversed(list(jobs)):
                    if over <= 0:
                        break
                    cut = min(over, jobs[job_id])
                    jobs[job_id] -= cut
                    over -= cut
                    if not jobs[job_id]:
                        del jobs[job_id]
        else:
            self.blocks_by.pop(key, None)
            self.jobs_by.pop(key, None)


def with_reserved_jobs(
    plans: dict[int, dict[str, int]], reservations: Reservations, now: int
) -> dict[int, dict[str, int]]:
    """The round's job plans with each lab's job reservations first (the plan's own entries after;
    a job in both gets the larger number)."""
    reserved = reservations.plans(now)
    if not reserved:
        return plans
    merged = {lab: dict(plan) for lab, plan in plans.items()}
    for lab, jobs in reserved.items():
        plan = merged.get(lab, {})
        first = {j: max(n, plan.get(j, 0)) for j, n in jobs.items()}
        merged[lab] = first | {j: n for j, n in plan.items() if j not in first}
    return merged


def _by_round(
    requested: list[tuple[str, int]], now: int, rounds: int
) -> tuple[Counter[int], dict[int, str]]:
    """Blocks asked for per round, and the label of the last block listed for each round."""
    counts: Counter[int] = Counter()
    label: dict[int, str] = {}
    for name, r in requested:
        if not now <= r < rounds:
            raise ActionError(
                f"block {name}: round {r} is not between the current round {now} and the last "
                f"round {rounds - 1}; reserve blocks of this or a later round"
            )
        counts[r] += 1
        label[r] = name
    return counts, label


def handle_reserve(
    world: World,
    reservations: Reservations,
    committed: Callable[[int, int], int],
    me: int,
    action: ReserveCapacity,
    now: int,
    rounds: int,
) -> dict[str, int]:
    """Reserve every listed block or none; returns the blocks reserved per round, by block id (``{"r3": 2}``).

    ``committed(lab, round)`` is the blocks the lab has promised on open forward contracts.
    """
    counts, label = _by_round(action.requested(now), now, rounds)
    job = None
    if action.job_id is not None:
        job = next((j for j in world.labs[me].jobs if j.job_id == action.job_id), None)
        if job is None or job.status != "active":
            raise ActionError(
                f"job_id {action.job_id!r} is not one of your active jobs; omit it or use an "
                "active job_id from your jobs"
            )
    for r, n in sorted(counts.items()):
        owned = int(world.holdings[me, r])
        free = owned - committed(me, r) - reservations.blocks(me, r)
        if n > free:
            raise ActionError(
                f"block {label[r]}: you own {owned} block(s) for round {r}, of which {max(free, 0)} "
                f"are neither reserved nor promised on a contract, not {n}; reserve at most "
                f"{max(free, 0)} or buy blocks first"
            )
    for r, n in counts.items():
        key = (me, r)
        reservations.blocks_by[key] = reservations.blocks(me, r) + n
        if job is not None:
            jobs = reservations.jobs_by.setdefault(key, {})
            jobs[job.job_id] = jobs.get(job.job_id, 0) + n
    return {f"r{r}": n for r, n in sorted(counts.items())}


def handle_release(
    reservations: Reservations, me: int, action: ReleaseCapacity, now: int, rounds: int
) -> dict[str, int]:
    """Release every listed block or none; returns the blocks released per round, by block id."""
    counts, label = _by_round(action.requested(now), now, rounds)
    for r, n in sorted(counts.items()):
        have = reservations.blocks(me, r)
        if n > have:
            raise ActionError(
                f"block {label[r]}: you have {have} reserved block(s) for round {r}, not {n}; "
                f"release at most {have}"
            )
    for r, n in counts.items():
        reservations.set_blocks(me, r, reservations.blocks(me, r) - n)
    return {f"r{r}": n for r, n in sorted(counts.items())}
