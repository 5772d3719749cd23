"""The end of a round, after the last bid: clearing, owned-block failures, contract deliveries,
execution, job settlement and the designer's metrics, with the labs' rewards in the order they accrue.

One generator per round: the tie-break priority is drawn first (a fixed number of draws), then
execution failures, so neither depends on what agents did. Only ``posted_price`` draws a lottery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from market.core import coalitions as coal
from market.core import execution, negotiation
from market.core.bidding import RoundOrders
from market.core.coalitions import CoalitionBook
from market.core.collusion import InteractionGraph
from market.core.delivery import fail_owned_blocks
from market.core.designer_metrics import bidding_labs, demand, designer_parts, table_demand
from market.core.job_table import JobTable
from market.core.judge import Judge, JudgeHistory
from market.core.mechanisms import Mechanism
from market.core.negotiation import Book
from market.core.pledges import settle_pledges
from market.core.production import run_round_blocks, run_table_blocks
from market.core.reservations import with_reserved_jobs
from market.core.rewards import LabComponent, optimal_welfare
from market.core.rng import RngStreams
from market.core.scenario_schema import Scenario
from market.core.settlement import RoundResult, clear_round
from market.core.summation import ordered_sum
from market.core.world import World

RewardEvent = tuple[int, LabComponent, float]  # (lab, reward component, credits)
#: a round close over at least this many jobs runs on the numpy job table
#: (:mod:`market.core.job_table`); a smaller one runs lab by lab on the job objects, where
#: numpy's fixed cost per call outweighs the loops it saves (measured on the round-closing step:
#: lab by lab 38% faster at 13 jobs, even at ~430, 14-16% slower from ~860). Both give the
#: same results bit for bit (tests/core/test_job_table.py).
TABLE_MIN_JOBS = 400
_NO_LOTTERY = np.random.Generator(np.random.PCG64(0))  # never drawn from (see close_round)


@dataclass(slots=True)
class RoundClose:
    """What closing a round gives the env: the clearing, the labs' rewards, the designer's
    metrics (with ``composite``), the optimal and the allocated welfare."""

    result: RoundResult
    rewards: list[RewardEvent]
    parts: dict[str, float]
    optimum: float
    allocated: float


def breach_rewards(breach: execution.Breach) -> list[RewardEvent]:
    """The seller's penalty, refund and compensation and the buyer's refund and compensation
    for a breached contract."""
    seller, buyer = breach.contract.seller, breach.contract.buyer
    return [
        (seller, "withdrawal_penalty", -breach.penalty),
        (seller, "trade_balance", -breach.refund),
        (buyer, "trade_balance", breach.refund),
        (seller, "breach_compensation", -breach.compensation),
        (buyer, "breach_compensation", breach.compensation),
    ]


def settle_lab_by_lab(
    world: World, active: list[int], now: int, potential: np.ndarray
) -> list[RewardEvent]:
    """Settle each active lab's jobs (:func:`market.core.execution.settle_jobs`) and credit the
    change of its job value, ``sum(Job.potential())`` in job order, as ``job_value`` (a change
    of zero is no reward); ``potential`` is updated in place."""
    rewards: list[RewardEvent] = []
    for i in active:
        jobs = world.labs[i].jobs
        execution.settle_jobs(jobs, now)
        value = ordered_sum(j.potential() for j in jobs)
        change = float(value - potential[i])
        if change:
            rewards.append((i, "job_value", change))
        potential[i] = value
    return rewards


class RoundState(Protocol):
    """The state a round closes over (``raw_env`` provides it)."""

    @property
    def world(self) -> World: ...
    @property
    def book(self) -> Book: ...
    @property
    def coalitions(self) -> CoalitionBook: ...
    @property
    def graph(self) -> InteractionGraph: ...
    @property
    def judge(self) -> Judge: ...
    @property
    def judge_history(self) -> JudgeHistory: ...
    @property
    def streams(self) -> RngStreams: ...
    @property
    def orders(self) -> RoundOrders: ...
    @property
    def mechanism(self) -> Mechanism: ...
    @property
    def round(self) -> int: ...
    @property
    def prices(self) -> list[float]: ...
    @property
    def scenario(self) -> Scenario: ...


def close_round(m: RoundState, potential: np.ndarray) -> RoundClose:
    """Clear the round, deliver contracts, run the blocks and settle jobs; ``potential`` (each
    lab's settled job value so far) is updated in place."""
    world, orders, mechanism, now = m.world, m.orders, m.mechanism, m.round
    active = [i for i, lab in enumerate(world.labs) if lab.active]
    reliability = float(world.reliability[now])
    blocks_total = (
        int(world.capacity[now]) + int(world.holdings[active, now].sum()) if active else 0
    )
    entries = orders.entries(world, m.coalitions)
    table = (  # the jobs do not change until the blocks run
        JobTable.read(world, active)
        if ordered_sum(len(world.labs[i].jobs) for i in active) >= TABLE_MIN_JOBS
        else None
    )
    round_rng = m.streams.stream("clearing", now)
    priority = round_rng.permutation(len(world.labs))
    lottery = (
        m.streams.stream("clearing", now, 1)
        if mechanism.auction_type == "posted_price"
        else _NO_LOTTERY
    )
    result = clear_round(
        world,
        m.book,
        m.coalitions,
        m.graph,
        entries,
        mechanism,
        now,
        priority,
        lottery,
        m.judge,
        m.judge_history,
        table.needs(reliability) if table and mechanism.shill_penalty > 0 else None,
    )
    rewards: list[RewardEvent] = []
    charges: tuple[tuple[LabComponent, dict[int, float]], ...] = (
        ("auction_payments", result.paid),
        ("shill_penalty", result.shill),
        ("collusion_penalty", result.collusion),
    )
    # a zero amount is no reward: left out (most bidders pay nothing)
    for component, amounts in charges:
        rewards += [(lab, component, -amount) for lab, amount in amounts.items() if amount]
    # owned blocks fail after the auction and before deliveries (market.core.delivery)
    result.failures = fail_owned_blocks(
        world, m.streams, m.scenario.delivery, m.scenario.capacity.reliability, now
    )
    # coalition pledges settle next (a default can cut members short; blocks drawn from the pool
    # are paid at the clearing price), then contracts deliver
    result.pools = settle_pledges(world, m.coalitions, now, m.scenario.delivery, result.price)
    for pool in result.pools:
        for (payer, payee), credits in pool.payments.items():
            rewards += [(payer, "trade_balance", -credits), (payee, "trade_balance", credits)]
        for (payer, payee), credits in pool.compensation.items():
            rewards += [
                (payer, "breach_compensation", -credits),
                (payee, "breach_compensation", credits),
            ]
    result.breaches = execution.settle_contracts(world, m.book, now, mechanism.withdrawal_penalty)
    for breach in result.breaches:
        rewards += breach_rewards(breach)
    # optimal welfare over every live runnable job's remaining units, before execution
    wanted = table_demand(table, reliability) if table else demand(world, active, reliability)
    optimum = optimal_welfare(wanted.unit_values, wanted.remaining, blocks_total)
    plans = with_reserved_jobs(orders.plans, m.book.reserved, now)  # job reservations run first
    # retired labs settled their potential when they left; jobs settle, then each active lab's
    # Job.potential() summed in job order is credited as its change
    if table:
        allocated_value = run_table_blocks(world, table, active, now, plans, reliability, round_rng)
        table.settle(now)
        table.write_back()
        value = table.potential()
        change = (value - potential).tolist()
        rewards += [(i, "job_value", change[i]) for i in active if change[i]]
        potential[active] = value[active]
    else:
        allocated_value = run_round_blocks(world, active, now, plans, reliability, round_rng)
        rewards += settle_lab_by_lab(world, active, now, potential)
    bidders = bidding_labs(entries, m.coalitions)
    parts, allocated = designer_parts(
        active,
        allocated_value,
        wanted,
        blocks_total,
        optimum,
        bidders,
        result,
        m.prices[-1] if m.prices else None,
        m.scenario.rewards,
    )
    return RoundClose(result, rewards, parts, optimum, allocated)


def housekeep(world: World, coalitions: CoalitionBook, book: Book, now: int) -> None:
    """The housekeeping after round ``now`` closes, before the next round: the coalitions' end
    of round, offers expire, reservations lapse, the book is pruned and the pitches cleared."""
    coal.end_of_round(world, coalitions, now)
    negotiation.expire_offers(book, now)
    book.reserved.end_of_round(world, now)
    book.prune()
    book.pitches = {}


def episode_over(world: World, now: int, rounds: int) -> bool:
    """Whether the episode ends with round ``now``: the last round, or no lab active and none
    still to enter."""
    return bool(
        now + 1 >= rounds
        or not any(lab.active for lab in world.labs)
        and not (world.entry_round > now).any()
    )
