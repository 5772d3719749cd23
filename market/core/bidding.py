"""The bids and job plans of the round in progress, and their validation.

A lab bids for itself (within its budget) or, as a coalition's leader, for the coalition (within
the pool); ``allocate_to_job`` plans which of its live jobs its blocks run. Invalid orders raise
:class:`~market.core.ledger.ActionError` with what was wrong and how to fix it; nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from market.core.actions import AllocateToJob, Bid
from market.core.coalitions import CoalitionBook
from market.core.ledger import ActionError
from market.core.mechanisms import Mechanism
from market.core.seats import bidder_seat
from market.core.settlement import BidEntry
from market.core.summation import ordered_sum
from market.core.world import World


@dataclass(slots=True)
class RoundOrders:
    """This round's orders: own bids by lab, coalition bids by coalition id, plans by lab."""

    bids: dict[int, BidEntry] = field(default_factory=dict)
    coalition_bids: dict[str, BidEntry] = field(default_factory=dict)
    plans: dict[int, dict[str, int]] = field(default_factory=dict)

    def entries(self, world: World, coalitions: CoalitionBook) -> list[BidEntry]:
        """The auction's rows: active labs' own bids by lab, then active coalitions' by id."""
        entries = [self.bids[i] for i in sorted(self.bids) if world.labs[i].active]
        entries += [
            e
            for cid, e in sorted(self.coalition_bids.items())
            if coalitions.coalitions[cid].status == "active"
        ]
        return entries

    def allocate(self, world: World, me: int, act: AllocateToJob) -> None:
        """Record lab ``me``'s plan to run ``act.blocks`` blocks on job ``act.job_id``."""
        check_allocation(world, me, act)
        self.plans.setdefault(me, {})[act.job_id] = act.blocks

    def place_bid(
        self,
        world: World,
        coalitions: CoalitionBook,
        mechanism: Mechanism,
        me: int,
        act: Bid,
        cap: int,
    ) -> dict[str, int | str]:
        """Validate and record lab ``me``'s bid schedule (at most ``cap`` unit bids)."""
        if len(act.bids) > cap:
            raise ActionError(
                f"{len(act.bids)} unit bids exceed the limit of {cap} this round; bid for at most {cap} blocks"
            )
        total = float(ordered_sum(act.bids))
        if act.coalition_id is None:
            budget = world.labs[me].budget
            if total > budget + 1e-9:
                raise ActionError(
                    f"your bids add up to {total:.2f} credits but you have {budget:.2f}; bid less so you can pay for every block you might win"
                )
            self.bids[me] = BidEntry(me, list(act.bids))
            return {"units": len(act.bids)}
        c = coalitions.coalitions.get(act.coalition_id)
        if c is None or c.status != "active" or me not in c.members:
            raise ActionError(f"{act.coalition_id!r} is not an active coalition you belong to")
        if c.leader != me:
            raise ActionError(f"only the leader {bidder_seat(c.leader)} bids for {c.coalition_id}")
        if mechanism.coalition_policy == "restrict":
            raise ActionError(
                "the coalition policy is 'restrict': joint bids are forbidden; bid for yourself"
            )
        if total > c.pool + 1e-9:
            raise ActionError(
                f"the bids add up to {total:.2f} but the pool of {c.coalition_id} holds {c.pool:.2f}"
            )
        self.coalition_bids[c.coalition_id] = BidEntry(me, list(act.bids), c.coalition_id)
        return {"units": len(act.bids), "coalition_id": c.coalition_id}


def check_allocation(world: World, me: int, act: AllocateToJob) -> None:
    """Raise unless ``act`` plans at most the remaining blocks of one of lab ``me``'s live jobs."""
    job = next(
        (j for j in world.labs[me].jobs if j.job_id == act.job_id and j.status != "pending"), None
    )
    if job is None:
        raise ActionError(
            f"job_id {act.job_id!r} is not one of your jobs; use a job_id from your jobs"
        )
    if job.status != "active":
        raise ActionError(f"job {act.job_id} is {job.status}; allocate blocks to an active job")
    if act.blocks > job.remaining:
        raise ActionError(
            f"job {act.job_id} needs only {job.remaining} more block(s); allocate at most that"
        )
