"""The designer's view of a round: demand, welfare ratio, fairness, participation, stability,
revenue and the composite reward, as pure functions of the round's state and numpy arrays.

The welfare optimum is taken over every live runnable job's remaining units, before execution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from market.core.coalitions import CoalitionBook
from market.core.job_table import JobTable
from market.core.rewards import designer_composite, gini, optimal_welfare, stability
from market.core.scenario_schema import RewardSpec
from market.core.settlement import BidEntry, RoundResult
from market.core.world import World


@dataclass(frozen=True, slots=True)
class Demand:
    """Every live runnable job's remaining units: value per unit, units left and owning lab."""

    unit_values: np.ndarray
    remaining: np.ndarray
    owners: np.ndarray


def demand(world: World, active: list[int], reliability: float) -> Demand:
    """The demand of the active labs' live jobs that this round's reliability can run."""
    unit_values: list[float] = []
    remaining: list[int] = []
    owners: list[int] = []
    for i in active:
        for job in world.labs[i].jobs:
            if (
                job.status == "active"
                and job.min_reliability <= reliability
                and job.progress < job.size
            ):
                unit_values.append(job.value / job.size)
                remaining.append(job.size - job.progress)
                owners.append(i)
    return Demand(
        np.array(unit_values), np.array(remaining, dtype=np.int64), np.array(owners, dtype=np.int64)
    )


def table_demand(table: JobTable, reliability: float) -> Demand:
    """:func:`demand` read off the round close's job table (same entries, same order)."""
    live = table.runnable(reliability) & (table.progress < table.size)
    return Demand(
        table.value[live] / table.size[live],
        table.size[live] - table.progress[live],
        table.lab[live],
    )


def satisfaction(active: list[int], allocated: np.ndarray, d: Demand, blocks: int) -> np.ndarray:
    """Each lab's allocated value over the most its jobs could use of this round's blocks."""
    uv, rem, own = d.unit_values, d.remaining, d.owners
    n = len(allocated)
    demand_ = np.bincount(own, weights=rem, minlength=n) if own.size else np.zeros(n)
    best = np.bincount(own, weights=uv * rem, minlength=n) if own.size else np.zeros(n)
    for i in np.flatnonzero(demand_ > blocks):  # rare: one lab could absorb every block
        best[i] = optimal_welfare(uv[own == i], rem[own == i], blocks)
    labs = np.asarray(active, dtype=np.int64)
    labs = labs[best[labs] > 0]  # in ``active`` order
    result: np.ndarray = allocated[labs] / best[labs]
    return result


def bidding_labs(entries: list[BidEntry], coalitions: CoalitionBook) -> set[int]:
    """Labs that bid this round, alone or as members of a bidding coalition."""
    bidders = {e.lab for e in entries if e.bids}
    for e in entries:
        if e.coalition_id is not None and e.bids:
            bidders.update(coalitions.coalitions[e.coalition_id].members)
    return bidders


def designer_parts(
    active: list[int],
    allocated_value: np.ndarray,
    d: Demand,
    blocks_total: int,
    optimum: float,
    bidders: set[int],
    result: RoundResult,
    previous_price: float | None,
    rewards: RewardSpec,
) -> tuple[dict[str, float], float]:
    """The designer's round metrics with their ``composite``, and the allocated welfare."""
    sat = satisfaction(active, allocated_value, d, blocks_total)
    demanders = set(d.owners.tolist())
    allocated = math.fsum(allocated_value.tolist())  # exact: order-free
    parts = {
        "welfare_ratio": 1.0 if optimum <= 0 else min(1.0, allocated / optimum),
        "fairness": 1.0 - gini(np.array(sat)),
        # share of the labs that still need blocks who bid (alone or through a coalition)
        "participation": len(bidders & demanders) / len(demanders) if demanders else 1.0,
        "stability": stability(result.price, previous_price),
        "revenue": result.revenue / max(1.0, result.capacity * rewards.value_unit),
    }
    parts["composite"] = designer_composite(
        parts["welfare_ratio"],
        parts["fairness"],
        parts["participation"],
        parts["stability"],
        dict(rewards.designer_weights),
        parts["revenue"],
        rewards.designer_revenue_weight,
    )
    return parts, allocated
