"""Clearing a round: judge pool grants, the primary auction, coalition splits and penalties.

Order (docs/design.md, section 4, step 5):
1. The effective reserve is the mechanism's reserve or the energy floor, whichever is higher.
2. ``floor(capacity x judge_pool_share)`` blocks go to the judge pool; grants are free. Blocks the
   judge does not grant return to the auction. A pitch with a false claim loses the lab
   ``FALSE_CLAIM_REPUTATION_LOSS`` reputation (see ``market.core.penalties``).
3. The auction clears the rest over lab and coalition bid schedules.
4. Labs pay; coalition payments come out of the pool; coalition blocks are split.
5. Shill bids (unit bids beyond a lab's true need that set the price or win blocks it cannot use)
   pay ``shill_penalty`` per block; detected cartels pay ``collusion_penalty`` per member when the
   coalition policy penalises them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter

import numpy as np

from market.core.coalitions import CoalitionBook, charge_pool, split_blocks
from market.core.collusion import InteractionGraph, detect_cartels, flagged_labs
from market.core.delivery import BlockFailure
from market.core.execution import Breach
from market.core.judge import (
    Judge,
    JudgeHistory,
    Verdict,
)
from market.core.judge import (
    allocate_judge_pool as allocate_judge_pool,  # re-exported: `replay --rejudge` patches it here
)
from market.core.ledger import issue_blocks, pay_for_block_rows, pay_operator
from market.core.mechanisms import Mechanism, clear
from market.core.negotiation import Book
from market.core.penalties import FALSE_CLAIM_REPUTATION_LOSS
from market.core.pledges import PoolSettlement
from market.core.summation import ordered_sum
from market.core.world import World, lose_reputation


@dataclass(slots=True)
class BidEntry:
    """One row of the auction: a lab bidding for itself, or a coalition's leader for the group."""

    lab: int  # the lab that submitted it (coalition leader for coalition bids)
    bids: list[float]
    coalition_id: str | None = None


@dataclass(slots=True)
class RoundResult:
    round: int
    mechanism: Mechanism
    reserve: float  # effective reserve
    capacity: int
    auctioned: int
    price: float
    sold: int
    revenue: float
    bids: list[BidEntry]
    won: dict[int, int] = field(
        default_factory=dict
    )  # blocks won at auction, per lab (after coalition splits)
    paid: dict[int, float] = field(
        default_factory=dict
    )  # auction payments per lab (coalition share included)
    verdicts: list[Verdict] = field(default_factory=list)
    shill: dict[int, float] = field(default_factory=dict)
    collusion: dict[int, float] = field(default_factory=dict)
    suspected: list[tuple[list[int], float]] = field(default_factory=list)
    # delivery risk, filled in at the round's close (market.core.round_close)
    failures: list[BlockFailure] = field(default_factory=list)
    breaches: list[Breach] = field(default_factory=list)
    pools: list[PoolSettlement] = field(default_factory=list)  # coalition pledges settled


def _affordable(bids: list[float], pool: float) -> list[float]:
    """The longest prefix of a schedule whose total the pool can pay."""
    total, out = 0.0, []
    for b in bids:
        total += b
        if total > pool + 1e-9:
            break
        out.append(b)
    return out


def true_needs(
    world: World,
    labs: list[int],
    now: int,
    runnable_units: np.ndarray | Sequence[int] | None = None,
) -> np.ndarray:
    """Per lab (an int array over every lab; 0 for labs not in ``labs``): the true need of each
    lab in ``labs``, the blocks of progress its live jobs that round ``now``'s reliability can
    run still need, minus the blocks it already holds for ``now`` (never below 0).

    ``runnable_units`` (per lab, the first term for every active lab, as the round close's job
    table gives it) saves the walk over the jobs."""
    held = world.holdings[:, now]
    needs = np.zeros(len(world.labs), dtype=np.int64)
    if not labs:
        return needs
    rows = np.asarray(labs, dtype=np.int64)
    if runnable_units is not None and all(world.labs[lab].active for lab in labs):
        units = np.asarray(runnable_units, dtype=np.int64)[rows]
    else:
        rel = float(world.reliability[now])
        units = np.array(
            [
                ordered_sum(
                    j.size - j.progress
                    for j in world.labs[lab].jobs
                    if j.status == "active" and j.min_reliability <= rel  # runnable(j, rel)
                )
                for lab in labs
            ],
            dtype=np.int64,
        )
    needs[rows] = np.maximum(0, units - held[rows])
    return needs


def clear_round(
    world: World,
    book: Book,
    coalitions: CoalitionBook,
    graph: InteractionGraph,
    entries: list[BidEntry],
    mechanism: Mechanism,
    now: int,
    priority: np.ndarray,
    lottery_rng: np.random.Generator,
    judge: Judge | None = None,
    judge_history: JudgeHistory | None = None,
    runnable_units: np.ndarray | Sequence[int] | None = None,
) -> RoundResult:
    # one canonical row order (labs by index, then coalitions by id), so that payments, budgets
    # and revenue come out bit-identical whatever order the caller listed the bids in
    entries = sorted(
        (e for e in entries if e.coalition_id is None), key=attrgetter("lab")
    ) + sorted(
        (e for e in entries if e.coalition_id is not None), key=attrgetter("coalition_id", "lab")
    )
    reserve = max(mechanism.reserve_price, float(world.energy_floor[now]))
    capacity = int(world.capacity[now])
    pool = int(np.floor(capacity * mechanism.judge_pool_share + 1e-9))
    verdicts: list[Verdict] = []
    granted = 0
    if pool > 0 and book.pitches:
        verdicts = allocate_judge_pool(
            book.pitches, world.labs, pool, now, float(world.reliability[now]), judge, judge_history
        )
        for v in verdicts:
            issue_blocks(world, v.lab, now, v.granted)
            granted += v.granted
            if v.false_claims:  # a false claim to the committee costs reputation
                lose_reputation(world, v.lab, FALSE_CLAIM_REPUTATION_LOSS)
    # each lab's true need before the auction; only the shill rule reads it
    needs = (
        true_needs(world, [e.lab for e in entries if e.coalition_id is None], now, runnable_units)
        if mechanism.shill_penalty > 0
        else None
    )
    # a member may have left after the leader bid: a coalition bids only what its pool can pay
    entries = [
        e
        if e.coalition_id is None
        else BidEntry(
            e.lab, _affordable(e.bids, coalitions.coalitions[e.coalition_id].pool), e.coalition_id
        )
        for e in entries
    ]
    auctioned = capacity - granted
    # one row per entry, padded with -1 (built from plain lists: no numpy call per row)
    schedules = [e.bids for e in entries]
    rows = np.array([e.lab for e in entries], dtype=np.int64)
    lengths = np.fromiter(map(len, schedules), dtype=np.int64, count=len(schedules))
    width = max(int(lengths.max()), 1) if len(schedules) else 1
    matrix = np.full((len(entries), width), -1.0)
    matrix[np.arange(width) < lengths[:, None]] = np.fromiter(
        chain.from_iterable(schedules), dtype=float, count=int(lengths.sum())
    )
    row_priority = np.asarray(priority)[rows].astype(np.int64)
    result = RoundResult(
        now, mechanism, reserve, capacity, auctioned, reserve, 0, 0.0, entries, verdicts=verdicts
    )
    if entries:
        outcome = clear(
            matrix, auctioned, mechanism.auction_type, reserve, row_priority, lottery_rng
        )
        result.price = float(outcome.price)
        alloc = np.asarray(outcome.alloc).astype(np.int64).tolist()
        payments = np.asarray(outcome.payments).astype(np.float64).tolist()
        result.sold = ordered_sum(alloc)
        revenue = 0.0
        for payment in payments:  # in row order, as the auction's rows are
            revenue += payment
        result.revenue = revenue
        # the labs' own rows come first (one per lab), then the coalitions' rows
        own = next((k for k, e in enumerate(entries) if e.coalition_id is not None), len(entries))
        payers = [e.lab for e in entries[:own]]
        pay_for_block_rows(world, payers, now, alloc[:own], payments[:own])
        result.won = dict(zip(payers, alloc[:own], strict=True))
        result.paid = {
            lab: 0.0 + payment for lab, payment in zip(payers, payments[:own], strict=True)
        }
        for row in range(own, len(entries)):
            entry, blocks, payment = entries[row], alloc[row], payments[row]
            coalition = coalitions.coalitions[str(entry.coalition_id)]
            for member, share in charge_pool(world, coalition, payment).items():
                result.paid[member] = result.paid.get(member, 0.0) + share
            for member, got in split_blocks(coalition, blocks).items():
                issue_blocks(world, member, now, got)
                result.won[member] = result.won.get(member, 0) + got
        if needs is not None:  # the shill rule, over the labs' own rows (the first ``own``)
            won_own = np.array(alloc[:own], dtype=np.int64)
            flagged_own = np.maximum(0, won_own - needs[rows[:own]])
            setter = outcome.price_setter
            if setter is not None and 0 <= setter < own:
                need, got = int(needs[payers[setter]]), alloc[setter]
                flagged_own[setter] += int(got >= need and len(entries[setter].bids) > got)
            for row in np.flatnonzero(flagged_own).tolist():  # in row order
                result.shill[payers[row]] = pay_operator(
                    world, payers[row], mechanism.shill_penalty * int(flagged_own[row])
                )
    # collusion: the graph sees every lab's bidding, including through coalition rows
    n = len(world.labs)
    bid_units = np.zeros(n, dtype=np.int64)
    np.add.at(bid_units, rows, lengths)
    bid_max = np.zeros(n)
    np.maximum.at(bid_max, rows[lengths > 0], matrix[lengths > 0, 0])
    won_units = np.zeros(n, dtype=np.int64)
    won_units[list(result.won)] = list(result.won.values())
    active = [lab.active for lab in world.labs]
    graph.record_round_bids(
        now, bid_units.tolist(), won_units.tolist(), (bid_max + 0.0).tolist(), reserve, active
    )
    suspicions = detect_cartels(graph, now)
    result.suspected = [(sorted(s.members), s.score) for s in suspicions]
    if mechanism.collusion_penalty > 0 and mechanism.coalition_policy.startswith("penalize"):
        for flagged in sorted(flagged_labs(suspicions, mechanism.coalition_policy)):
            if world.labs[flagged].active:
                result.collusion[flagged] = pay_operator(
                    world, flagged, mechanism.collusion_penalty
                )
    return result
