"""Execution: blocks held in a round run jobs; each used block fails with 1 - reliability.

Order: forward contracts due this round are delivered (a short seller is in breach), then each
active lab's blocks go to its jobs: first as its ``allocate_to_job`` plan says, then earliest
deadline first. A block adds one unit of progress unless it fails; progress never exceeds size;
unused blocks are wasted (capacity is perishable). Jobs then complete or expire.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from market.core.ledger import move_blocks, pay_operator, release_collateral, transfer_credits
from market.core.negotiation import Book, Contract
from market.core.penalties import BREACH_REPUTATION_LOSS
from market.core.summation import ordered_sum
from market.core.world import Job, World, lose_reputation


@dataclass(slots=True)
class Breach:
    """A forward contract delivered short by ``shortfall`` blocks: the buyer's ``refund`` and
    ``compensation`` (the latter out of collateral only) and the seller's ``penalty``."""

    contract: Contract
    shortfall: int
    refund: float
    penalty: float
    compensation: float = 0.0


def deliver_contract(world: World, contract: Contract, withdrawal_penalty: float) -> Breach | None:
    """Deliver one forward contract from the seller's holdings for its delivery round.

    A seller short by s of b blocks refunds price x s/b (out of the contract's collateral first,
    then its budget as far as it allows), pays the buyer the contract's compensation (rate x
    price x s/b, out of what is left of the collateral only), pays the withdrawal penalty per
    missing block to the operator and loses reputation. The rest of the collateral comes back.
    """
    seller, buyer, when = contract.seller, contract.buyer, contract.delivery_round
    owned = int(world.holdings[seller, when])
    delivered = min(contract.blocks, owned)
    move_blocks(world, seller, buyer, when, delivered)
    contract.delivered = delivered
    shortfall = contract.blocks - delivered
    held = contract.collateral
    if not shortfall:
        if held > 0:
            release_collateral(world, seller, held)
        return None
    lab = world.labs[seller]
    due = contract.price * shortfall / contract.blocks
    from_collateral = min(due, held)
    if from_collateral > 0:
        release_collateral(world, buyer, from_collateral)
    refund = from_collateral + min(due - from_collateral, max(0.0, lab.budget))
    if refund > from_collateral:
        transfer_credits(world, seller, buyer, refund - from_collateral)
    compensation = min(contract.compensation_rate * due, held - from_collateral)
    if compensation > 0:
        release_collateral(world, buyer, compensation)
    if held - from_collateral - compensation > 0:
        release_collateral(world, seller, held - from_collateral - compensation)
    penalty = pay_operator(world, seller, withdrawal_penalty * shortfall)
    lose_reputation(world, seller, BREACH_REPUTATION_LOSS * shortfall / contract.blocks)
    return Breach(contract, shortfall, refund, penalty, max(0.0, compensation))


def settle_contracts(world: World, book: Book, now: int, withdrawal_penalty: float) -> list[Breach]:
    """Deliver the forward contracts due in round ``now``; returns the breaches."""
    due = [c for c in book.contracts if c.delivery_round == now and c.delivered < 0]
    return [b for c in due if (b := deliver_contract(world, c, withdrawal_penalty)) is not None]


def runnable(job: Job, reliability: float) -> bool:
    return job.status == "active" and job.min_reliability <= reliability


def _edf_key(job: Job) -> tuple[int, int, str]:
    return (job.deadline, job.arrival, job.job_id)


def assign_blocks(
    jobs: list[Job], blocks: int, plan: dict[str, int], reliability: float
) -> list[tuple[Job, int]]:
    """Blocks per job: the plan first (in its order), then earliest deadline first; never more
    than a job's remaining size."""
    if not plan:  # the common case: earliest deadline first, same order as below
        out: list[tuple[Job, int]] = []
        left = blocks
        live = [j for j in jobs if j.status == "active" and j.min_reliability <= reliability]
        if len(live) > 1:
            live.sort(key=_edf_key)  # stable, as sorted() is
        for job in live:
            if left <= 0:
                break
            give = min(job.size - job.progress, left)
            if give > 0:
                out.append((job, give))
                left -= give
        return out
    assigned: dict[str, int] = {}
    by_id = {j.job_id: j for j in jobs if runnable(j, reliability)}
    left = blocks
    for job_id, want in plan.items():
        planned = by_id.get(job_id)
        if planned is None or left <= 0:
            continue
        give = min(want, planned.remaining, left)
        assigned[job_id] = give
        left -= give
    for job in sorted(by_id.values(), key=_edf_key):
        if left <= 0:
            break
        if plan.get(job.job_id) == 0:
            continue  # allocate_to_job with 0 blocks keeps the job off this round
        give = min(job.remaining - assigned.get(job.job_id, 0), left)
        if give > 0:
            assigned[job.job_id] = assigned.get(job.job_id, 0) + give
            left -= give
    return [(by_id[k], v) for k, v in assigned.items() if v > 0]


def run_blocks(assignment: list[tuple[Job, int]], successes: np.ndarray | Sequence[bool]) -> int:
    """Run assigned blocks; ``successes[k]`` says whether the lab's k-th block this round works.

    Returns the blocks that succeeded. Progress never exceeds a job's size.
    """
    k = 0
    total = 0
    # plain bools: a slice's sum is an exact int, without a numpy call per job
    flags = successes.tolist() if isinstance(successes, np.ndarray) else successes
    for job, n in assignment:
        gained = ordered_sum(flags[k : k + n])
        job.progress = min(job.size, job.progress + gained)
        total += gained
        k += n
    return total


def failure_draws(
    rng: np.random.Generator, n_labs: int, max_blocks: int, reliability: float
) -> np.ndarray:
    """Success flags, shape (labs, max_blocks): entry (i, k) is lab i's k-th block this round.

    Drawn column by column, so entry (i, k) is draw number k * n_labs + i whatever the other labs
    use: a lab's failures do not depend on anyone else's actions (common random numbers).
    """
    return (rng.random((max_blocks, n_labs)) < reliability).T


def settle_jobs(jobs: list[Job], now: int) -> float:
    """Complete finished jobs and expire those whose deadline is ``now``; returns value realised."""
    realized = 0.0
    for job in jobs:
        if job.status != "active":
            continue
        if job.progress >= job.size:
            job.status, job.realized = "done", job.value
            realized += job.value
        elif job.deadline <= now:
            job.status = "expired"
            job.realized = job.unit_value * job.progress if job.partial_credit else 0.0
            realized += job.realized
    return realized


def activate_jobs(jobs: list[Job], now: int) -> None:
    for job in jobs:
        if job.status == "pending" and job.arrival <= now:
            job.status = "active"
