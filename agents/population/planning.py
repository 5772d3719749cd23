"""The rule expert's valuation: its market memory, slack detection, the job plan (which jobs to
admit and what each block is worth) and demand reduction under the uniform-price auction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from agents.population.common import price_floor
from market.core.summation import ordered_sum
from market.environment import JobView, MarketResultView, Observation

# ------------------------------------------------------------------------------------------
# The rule expert's valuation
# ------------------------------------------------------------------------------------------


class MarketMemory:
    """What a lab remembers across turns: base reliability and capacity, its win history, and
    how much of the last cleared round's supply its rivals left over."""

    def __init__(self) -> None:
        self.reliability = 0.0
        self.capacities: dict[int, int] = {}
        self.auctioned: dict[int, int] = {}
        self.bid_units: dict[int, int] = {}
        self.won: dict[int, int] = {}
        self.seen_results: set[int] = set()
        self.left_over: float | None = None  # share of the last round's blocks rivals left
        # the highest won / capacity of the rounds it bid for more than it won (see share)
        self.won_share: float | None = None
        self.last_plan: tuple[tuple[object, ...], Plan] | None = None  # (its inputs, the plan)
        self.plans_reused = 0  # turns served by the last plan (nothing it reads had changed)

    def plan(self, obs: Observation) -> Plan:
        """:func:`plan_jobs` for this turn, reusing the last turn's plan when every input it
        reads (:func:`plan_inputs`) is unchanged: the same inputs give the same plan, so a seat
        with several turns in a round plans once. Callers read a plan and never change it."""
        base_cap, share, floor = self.base_capacity(obs), self.share(obs), price_floor(obs)
        key = plan_inputs(obs, self.reliability, base_cap, share, floor)
        if self.last_plan is not None and self.last_plan[0] == key:
            self.plans_reused += 1
            return self.last_plan[1]
        plan = _plan(obs, self.reliability, base_cap, share, floor)
        self.last_plan = (key, plan)
        return plan

    def observe(self, obs: Observation) -> None:
        self.reliability = max(self.reliability, obs.reliability)
        if not any(
            s.kind == "capacity_outage" and s.round <= obs.round < s.round + s.duration
            for s in obs.shocks
        ):
            self.capacities[obs.round] = obs.capacity
        self.auctioned[obs.round] = auctioned_blocks(obs)
        result = obs.last_result
        if result is not None and result.round not in self.seen_results:
            self.seen_results.add(result.round)
            self.won[result.round] = result.my_won
            # that round's bid and capacity are final once its result is out: fold it in now
            units, cap = self.bid_units.get(result.round), self.capacities.get(result.round)
            if units is not None and cap and units > result.my_won:
                seen = min(1.0, result.my_won / cap)
                self.won_share = seen if self.won_share is None else max(self.won_share, seen)
            auctioned = self.auctioned.get(result.round, 0)
            if auctioned:
                rivals = result.blocks_sold - result.my_won
                spare = max(0, auctioned - rivals) if slack(result, auctioned) else 0
                self.left_over = spare / auctioned

    def base_capacity(self, obs: Observation) -> float:
        seen = list(self.capacities.values())
        return ordered_sum(seen) / len(seen) if seen else float(obs.capacity)

    def share(self, obs: Observation) -> float:
        """Plausible share of a round's auctioned blocks it can win: an equal share; more if it
        has won more than that when it bid for more than it got; and at least the share its
        rivals left over in the last round, if that round cleared at the reserve (their demand
        was met, so what they did not take would have gone to a bid at the floor)."""
        share = min(1.0, 1.0 / max(1, len(obs.active_labs)))
        if self.won_share is not None:  # folded in by observe as each result comes out
            share = max(share, self.won_share)
        return max(share, self.left_over or 0.0)


def auctioned_blocks(obs: Observation) -> int:
    """This round's blocks that go to auction (capacity less the judge's pool)."""
    return math.floor(obs.capacity * (1 - obs.mechanism.judge_pool_share) + 1e-9)


def slack(result: MarketResultView, auctioned: int) -> bool:
    """Whether a cleared round had supply to spare: blocks went unsold, or the price (revealed,
    or what the seat itself paid per block) was the reserve."""
    if result.blocks_sold < auctioned:
        return True
    price = result.clearing_price
    if price is None and result.my_won:
        price = result.my_paid / result.my_won
    return price is not None and result.reserve is not None and price <= result.reserve + 1e-9


@dataclass
class JobPlan:
    job: JobView
    unit: float  # value per block of size
    pursue: bool
    held: dict[int, int] = field(default_factory=dict)  # round -> own blocks planned for it
    buy: dict[int, int] = field(default_factory=dict)  # round -> blocks it plans to win
    short: bool = False  # completable with the blocks on offer, but not with its budget


@dataclass
class Plan:
    jobs: list[JobPlan]
    bid_values: list[float]  # this round's blocks to buy, value each, highest first
    spare: dict[int, int]  # round -> own blocks no pursued job needs
    wanted: dict[int, list[float]]  # round -> values of blocks it plans to acquire then
    price: float  # expected price per block
    urgent: int = 0  # blocks that deadline jobs due this round still need beyond own blocks

    def job(self, job_id: str) -> JobPlan | None:
        return next((p for p in self.jobs if p.job.job_id == job_id), None)


def expected_price(obs: Observation, floor: float) -> float:
    """The price per block it plans its budget with: the median revealed clearing price so far
    (the floor before any is revealed), never below the floor."""
    revealed = sorted(p for p in obs.price_history if p is not None)
    return max(floor, revealed[len(revealed) // 2]) if revealed else floor


def _simulate(
    plans: list[JobPlan],
    rounds: range,
    held: dict[int, int],
    plausible: dict[int, int],
    usable: dict[str, set[int]],
    budget: float,
    price: float,
) -> tuple[bool, bool]:
    """Schedule ``plans`` round by round; fill their ``held``/``buy``; (complete?, affordable?).

    In each round, jobs without partial credit go first, earliest deadline first (the order that
    completes a set of deadline jobs whenever any order does), on own blocks first and then on
    plausible wins; jobs with partial credit share what is left, highest value per block first,
    buying only what the remaining budget pays for at the expected price.
    """
    hard: list[JobPlan] = []
    soft: list[JobPlan] = []
    for p in plans:
        p.held, p.buy = {}, {}
        (soft if p.job.partial_credit else hard).append(p)
    if len(hard) > 1:
        hard.sort(key=_deadline_first)
    if len(soft) > 1:
        soft.sort(key=_value_first)
    # one row per job in scheduling order (deadline jobs first): [plan, blocks still needed,
    # rounds it can use, price it pays per block, without partial credit?]
    rows: list[list[Any]] = [
        [
            p,
            p.job.size - p.job.progress,
            usable[p.job.job_id],
            price if price < p.unit else p.unit,
            h,
        ]
        for group, h in ((hard, True), (soft, False))
        for p in group
    ]
    last = max((max(row[2]) for row in rows if row[2]), default=rounds.start - 1)
    spent = 0.0
    need: int
    ok: set[int]
    cost: float
    is_hard: bool
    for t in rounds:
        if t > last:  # no job can use a later round
            break
        own, win = held[t], plausible[t]
        for row in rows:
            p, need, ok, cost, is_hard = row
            if need <= 0 or t not in ok:
                continue
            got = own if own < need else need
            if got:
                p.held[t], own, need = got, own - got, need - got
            if is_hard:
                can_pay = need
            else:
                left = budget - spent
                can_pay = int((left if left > 0.0 else 0.0) // (cost if cost > 1e-9 else 1e-9))
            got = min(win, need, can_pay)
            if got:
                p.buy[t], win, need = got, win - got, need - got
                spent += got * cost
            row[1] = need
    complete = all(row[1] <= 0 for row in rows if row[4])
    return complete, spent <= budget + 1e-9


def _deadline_first(p: JobPlan) -> tuple[int, float, str]:
    return (p.job.deadline, -p.unit, p.job.job_id)


def _value_first(p: JobPlan) -> tuple[float, int, str]:
    return (-p.unit, p.job.deadline, p.job.job_id)


def plan_inputs(
    obs: Observation, reliability: float, base_cap: float, share: float, floor: float
) -> tuple[object, ...]:
    """Everything :func:`plan_jobs` reads, as plain data: two turns with equal inputs get
    equal plans. The memory enters through its highest reliability seen, base capacity and
    plausible share; the observation through the fields the plan reads (jobs it can still
    run, holdings, contracts, shocks, prices, budget, number of active labs)."""
    now, seat = obs.round, obs.seat
    return (
        now,
        obs.rounds_total,
        tuple(obs.holdings or ()),
        tuple((c.delivery_round, c.blocks, c.buyer == seat) for c in obs.contracts or ()),
        obs.reliability,
        reliability,
        base_cap,
        obs.capacity,
        tuple((s.kind, s.round, s.duration, s.magnitude) for s in obs.shocks),
        obs.mechanism.judge_pool_share,
        share,
        floor,
        tuple(obs.price_history),
        obs.budget,
        len(obs.active_labs),
        tuple(
            (j.job_id, j.size, j.progress, j.deadline, j.value, j.partial_credit, j.min_reliability)
            for j in obs.jobs or ()
            if j.status == "active" and j.deadline >= now
        ),
    )


def plan_jobs(obs: Observation, memory: MarketMemory) -> Plan:
    """Which jobs are worth blocks, what to bid this round, which held blocks are spare.

    1. Per round ``t`` from now to the end it counts its *own* blocks (holdings, plus blocks
       bought and minus blocks sold on forward contracts), the auctioned capacity (this round's,
       less the judge pool; later rounds: the mean capacity seen outside outages, reduced by
       known outages), the reliability (this round's; later: the highest seen, less known
       reliability drops), and the blocks it can *plausibly win*: ``ceil(capacity x share)``
       (:meth:`MarketMemory.share`).
    2. A job can use the rounds up to its deadline whose reliability it accepts and in which a
       block is worth more than the floor (a block worth less is never bought).
    3. Jobs are admitted by value per block, highest first. A job with partial credit is always
       admitted: each block pays. A job without partial credit is worth something only if it
       completes by its deadline, so it is admitted only if every admitted deadline job still
       completes when they are scheduled together (:func:`_simulate`: earliest deadline first,
       own blocks before plausible wins) and the wins fit the budget at the expected price
       (:func:`expected_price`). If only the budget stops it, it is ``short``.
    4. This round's marginal values: for each admitted job it can run now, its remaining
       blocks minus its own blocks of later rounds scheduled for it, at value per block x this
       round's reliability; this round's own blocks cover the most valuable of these units, so
       the extra blocks it bids for are worth the rest.
    5. ``urgent``: the blocks its deadline jobs must get this round, because by some deadline
       their remaining blocks exceed what later rounds can give (own blocks plus an equal share,
       ``floor(auctioned / active labs)``, of each later round's auction).
    6. Own blocks left unused when the admitted jobs are served from own blocks alone (in case
       it wins nothing) are *spare*; in later rounds it keeps one block per admitted deadline
       job still running then, as insurance against failures.
    """
    return _plan(
        obs, memory.reliability, memory.base_capacity(obs), memory.share(obs), price_floor(obs)
    )


def _plan(
    obs: Observation, seen_reliability: float, base_cap: float, share: float, floor: float
) -> Plan:
    """:func:`plan_jobs` from the memory's readings (highest reliability seen, base capacity,
    plausible share) and the price floor."""
    now, total = obs.round, obs.rounds_total
    rounds = range(now, total)
    holdings = obs.holdings or []
    ahead = len(holdings)
    held = {t: holdings[t - now] if t - now < ahead else 0 for t in rounds}
    seat = obs.seat
    for c in obs.contracts or ():
        if c.delivery_round in held:
            held[c.delivery_round] += c.blocks if c.buyer == seat else -c.blocks
    for t, h in held.items():
        if h < 0:
            held[t] = 0
    jobs = [j for j in obs.jobs or () if j.status == "active" and j.deadline >= now]
    if not jobs and now in held:  # nothing to plan for: no bids, every own block is spare
        return Plan([], [], dict(held), {t: [] for t in rounds}, expected_price(obs, floor))
    if len(jobs) > 1:
        jobs.sort(key=_best_value_first)
    base_rel = max(seen_reliability, obs.reliability)
    reliability = {t: base_rel for t in rounds}
    capacity = {t: base_cap for t in rounds}
    reliability[now], capacity[now] = obs.reliability, float(obs.capacity)
    for shock in obs.shocks:
        for t in range(max(shock.round, now + 1), min(total, shock.round + shock.duration)):
            if shock.kind == "reliability_drop":
                reliability[t] = max(0.0, reliability[t] - shock.magnitude)
            elif shock.kind == "capacity_outage":
                capacity[t] = capacity[t] * (1 - min(1.0, shock.magnitude))
    pool_share = obs.mechanism.judge_pool_share
    plausible = {
        t: math.ceil(math.floor(capacity[t] * (1 - pool_share) + 1e-9) * share) for t in rounds
    }
    price = expected_price(obs, floor)
    budget = obs.budget or 0.0
    usable: dict[str, set[int]] = {}
    plans: list[JobPlan] = []
    for j in jobs:
        unit, low = j.value / j.size, j.min_reliability
        usable[j.job_id] = {
            t
            for t in range(now, j.deadline + 1)
            if low <= reliability[t] and unit * reliability[t] > floor
        }
        plans.append(JobPlan(j, unit, pursue=False))
    admitted: list[JobPlan] = []
    scheduled = True  # the admitted jobs' held/buy are those of scheduling them alone
    for plan in plans:
        if not usable[plan.job.job_id]:
            continue
        trial = [*admitted, plan]
        complete, within_budget = _simulate(trial, rounds, held, plausible, usable, budget, price)
        scheduled = complete and within_budget
        if scheduled:
            admitted.append(plan)
        else:
            plan.short = complete and not within_budget
    for plan in plans:
        plan.pursue = any(plan is p for p in admitted)
        if not plan.pursue:
            plan.held, plan.buy = {}, {}
    if not scheduled:  # a rejected trial last rescheduled the admitted jobs: schedule them alone
        _simulate(admitted, rounds, held, plausible, usable, budget, price)
    with_wins = [(plan.held, plan.buy) for plan in admitted]
    bid_values: list[float] = []
    wanted: dict[int, list[float]] = {t: [] for t in rounds}
    held_now = 0
    for plan in admitted:
        job = plan.job
        for t, n in plan.buy.items():
            wanted[t] += [plan.unit * reliability[t]] * n
        if now in usable[job.job_id]:
            later = ordered_sum(n for t, n in plan.held.items() if t > now)
            held_now += plan.held.get(now, 0)
            bid_values += [plan.unit * obs.reliability] * max(0, job.size - job.progress - later)
    # this round's own blocks cover the most valuable units; extra blocks are worth the rest
    bid_values.sort(reverse=True)
    bid_values = bid_values[held_now:]
    wanted[now] = list(bid_values)
    # blocks the deadline jobs need this round: by each deadline d, what later rounds up to d
    # cannot supply (own blocks plus an equal share of the auctioned blocks) must come now
    hard = [p for p in admitted if not p.job.partial_credit]
    n_labs = max(1, len(obs.active_labs))
    must = later = 0  # later: what rounds now+1 .. upto supply (whole blocks: exact sums)
    upto = now
    for d in sorted({p.job.deadline for p in hard}):
        demand = ordered_sum(p.job.size - p.job.progress for p in hard if p.job.deadline <= d)
        for t in range(upto + 1, d + 1):
            later += held[t] + math.floor(capacity[t] * (1 - pool_share) + 1e-9) // n_labs
        upto = max(upto, d)
        must = max(must, demand - later)
    urgent = max(0, must - held[now])
    # spare: own blocks left when the admitted jobs are served from own blocks alone (it may
    # win nothing), less one block per deadline job still running then, against failures
    spare = dict(held)
    if admitted:
        _simulate(admitted, rounds, held, dict.fromkeys(rounds, 0), usable, budget, price)
        for plan in admitted:
            for t, n in plan.held.items():
                spare[t] -= n
    for t in rounds:
        if t > now and hard:
            running = ordered_sum(1 for p in hard if p.job.deadline >= t)
            spare[t] = max(0, spare[t] - running)
    for plan, (own, buy) in zip(admitted, with_wins, strict=True):  # the schedule with wins again
        plan.held, plan.buy = own, buy
    return Plan(plans, bid_values, spare, wanted, price, urgent)


def _best_value_first(j: JobView) -> tuple[float, int, str]:
    return (-j.value / j.size, j.deadline, j.job_id)


#: how far above the price floor it bids for the blocks it can wait for, in value units: enough
#: to rank before bids at the floor or a step or two above it, while a rejected bid of its own
#: raises the price it pays by no more than that
PATIENT_MARGIN = 0.03


def reduce_demand(bids: list[float], obs: Observation, plan: Plan) -> list[float]:
    """Demand reduction for the uniform-price (``second_price``) auction.

    Under ``second_price`` every block sells at the highest *rejected* bid, so a bid on a unit
    it does not win sets the price it pays for every unit it does win: a rejected bid at value
    hands the whole surplus of its other units to the seller. It therefore bids its value only
    on the blocks its deadline jobs cannot do without this round (``plan.urgent``: what later
    rounds cannot supply) and is patient with the rest. A block it can still buy in a later
    round is worth to it no more than what it expects to pay then, so a patient unit is bid at
    :func:`later_price` (never above its value): in a slack market that is just above the floor
    (:data:`PATIENT_MARGIN` value units), where such units win whenever the other labs leave
    supply over and, if rejected, raise the price by at most that margin; in a market where
    blocks have kept selling above the floor it is the going price, so patience does not hand
    every block to the rivals. Other mechanisms are returned unchanged.
    """
    if obs.mechanism.auction_type != "second_price" or not bids:
        return bids
    patient = later_price(obs)
    return [b if k < plan.urgent else min(b, patient) for k, b in enumerate(bids)]


def later_price(obs: Observation) -> float:
    """What a block bought in a later round is expected to cost: the lower quartile of the
    clearing prices revealed so far (the ``k = floor((m - 1) / 4)``-th lowest of ``m``), at
    least the price floor plus :data:`PATIENT_MARGIN` value units; before any price is revealed,
    that floor plus margin. The lower quartile, not the median: a patient buyer waits for the
    cheaper rounds, and a single expensive round says little about the next."""
    patient = price_floor(obs) + PATIENT_MARGIN * obs.value_unit
    revealed = sorted(p for p in obs.price_history if p is not None)
    if not revealed:
        return patient
    return max(patient, revealed[(len(revealed) - 1) // 4])
