"""The rule expert's fast path (the plan reused across turns with unchanged inputs, a leaner
schedule, rivals ranked only when a block is for sale) takes exactly the actions of a reference
expert that plans afresh at every turn and ranks rivals eagerly, and every plan it makes equals
the one the reference planner below (the planner as it was before the fast path) makes."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agents.population import NoNegotiationBidder, RuleExpert, plan_jobs
from agents.population.common import credits_down, price_floor, schedule
from agents.population.expert import _unsold
from agents.population.planning import JobPlan, MarketMemory, Plan, expected_price
from agents.registry import make_agent
from agents.scripted import MAX_INVITEES, WAIT
from market.core.actions import ActionModel, FormCoalition, SendOffer
from market.core.seats import is_bidder_seat
from market.environment import Observation
from market.environment.aec import raw_env

# ------------------------------------------------------------------------------------------
# The reference planner: the job plan as computed before the fast path, kept here verbatim
# ------------------------------------------------------------------------------------------


def reference_simulate(
    plans: list[JobPlan],
    rounds: range,
    held: dict[int, int],
    plausible: dict[int, int],
    usable: dict[str, set[int]],
    budget: float,
    price: float,
) -> tuple[bool, bool]:
    """The schedule as computed before the fast path."""
    need = {p.job.job_id: p.job.size - p.job.progress for p in plans}
    for p in plans:
        p.held, p.buy = {}, {}
    spent = 0.0
    hard = sorted(
        (p for p in plans if not p.job.partial_credit),
        key=lambda p: (p.job.deadline, -p.unit, p.job.job_id),
    )
    soft = sorted(
        (p for p in plans if p.job.partial_credit),
        key=lambda p: (-p.unit, p.job.deadline, p.job.job_id),
    )
    for t in rounds:
        own, win = held[t], plausible[t]
        for group in (hard, soft):
            for p in group:
                key = p.job.job_id
                if need[key] <= 0 or t not in usable[key]:
                    continue
                got = min(own, need[key])
                if got:
                    p.held[t], own, need[key] = got, own - got, need[key] - got
                cost = min(price, p.unit)
                can_pay = (
                    need[key] if group is hard else int(max(0.0, budget - spent) // max(cost, 1e-9))
                )
                got = min(win, need[key], can_pay)
                if got:
                    p.buy[t], win, need[key] = got, win - got, need[key] - got
                    spent += got * cost
    complete = all(need[p.job.job_id] <= 0 for p in hard)
    return complete, spent <= budget + 1e-9


def reference_plan_jobs(obs: Observation, memory: MarketMemory) -> Plan:
    """The plan as computed before the fast path (a fresh schedule for every use)."""
    now, total = obs.round, obs.rounds_total
    rounds = range(now, total)
    holdings = obs.holdings or []
    held = {t: holdings[t - now] if t - now < len(holdings) else 0 for t in rounds}
    for c in obs.contracts or ():
        if c.delivery_round in held:
            held[c.delivery_round] += c.blocks if c.buyer == obs.seat else -c.blocks
    held = {t: max(0, h) for t, h in held.items()}
    base_rel = max(memory.reliability, obs.reliability)
    reliability = {t: obs.reliability if t == now else base_rel for t in rounds}
    base_cap = memory.base_capacity(obs)
    capacity = {t: float(obs.capacity) if t == now else base_cap for t in rounds}
    for shock in obs.shocks:
        for t in range(max(shock.round, now + 1), min(total, shock.round + shock.duration)):
            if shock.kind == "reliability_drop":
                reliability[t] = max(0.0, reliability[t] - shock.magnitude)
            elif shock.kind == "capacity_outage":
                capacity[t] = capacity[t] * (1 - min(1.0, shock.magnitude))
    pool_share = obs.mechanism.judge_pool_share
    share = memory.share(obs)
    plausible = {
        t: math.ceil(math.floor(capacity[t] * (1 - pool_share) + 1e-9) * share) for t in rounds
    }
    floor = price_floor(obs)
    price = expected_price(obs, floor)
    budget = obs.budget or 0.0
    jobs = sorted(
        (j for j in obs.jobs or () if j.status == "active" and j.deadline >= now),
        key=lambda j: (-j.value / j.size, j.deadline, j.job_id),
    )
    usable = {
        j.job_id: {
            t
            for t in range(now, j.deadline + 1)
            if j.min_reliability <= reliability[t] and j.value / j.size * reliability[t] > floor
        }
        for j in jobs
    }
    plans = [JobPlan(j, j.value / j.size, pursue=False) for j in jobs]
    admitted: list[JobPlan] = []
    for plan in plans:
        if not usable[plan.job.job_id]:
            continue
        trial = [*admitted, plan]
        complete, within_budget = reference_simulate(
            trial, rounds, held, plausible, usable, budget, price
        )
        if complete and within_budget:
            admitted.append(plan)
        else:
            plan.short = complete and not within_budget
    for plan in plans:
        plan.pursue = plan in admitted
        if not plan.pursue:
            plan.held, plan.buy = {}, {}
    reference_simulate(admitted, rounds, held, plausible, usable, budget, price)
    bid_values: list[float] = []
    wanted: dict[int, list[float]] = {t: [] for t in rounds}
    held_now = 0
    for plan in admitted:
        job = plan.job
        for t, n in plan.buy.items():
            wanted[t] += [plan.unit * reliability[t]] * n
        if now in usable[job.job_id]:
            later = sum(n for t, n in plan.held.items() if t > now)
            held_now += plan.held.get(now, 0)
            bid_values += [plan.unit * obs.reliability] * max(0, job.size - job.progress - later)
    # this round's own blocks cover the most valuable units; extra blocks are worth the rest
    bid_values = sorted(bid_values, reverse=True)[held_now:]
    wanted[now] = list(bid_values)
    # blocks the deadline jobs need this round: by each deadline d, what later rounds up to d
    # cannot supply (own blocks plus an equal share of the auctioned blocks) must come now
    hard = [p for p in admitted if not p.job.partial_credit]
    n_labs = max(1, len(obs.active_labs))
    must = 0
    for d in sorted({p.job.deadline for p in hard}):
        demand = sum(p.job.size - p.job.progress for p in hard if p.job.deadline <= d)
        later = sum(
            held[t] + math.floor(capacity[t] * (1 - pool_share) + 1e-9) // n_labs
            for t in range(now + 1, d + 1)
        )
        must = max(must, demand - later)
    urgent = max(0, must - held[now])
    # spare: own blocks left when the admitted jobs are served from own blocks alone (it may
    # win nothing), less one block per deadline job still running then, against failures
    reference_simulate(admitted, rounds, held, dict.fromkeys(rounds, 0), usable, budget, price)
    spare = dict(held)
    for plan in admitted:
        for t, n in plan.held.items():
            spare[t] -= n
    for t in rounds:
        if t > now:
            running = sum(1 for p in hard if p.job.deadline >= t)
            spare[t] = max(0, spare[t] - running)
    reference_simulate(admitted, rounds, held, plausible, usable, budget, price)
    return Plan(plans, bid_values, spare, wanted, price, urgent)


class FreshMemory(MarketMemory):
    """Plans afresh at every turn: the reference for the reused plan."""

    def plan(self, obs: Observation) -> Plan:
        return reference_plan_jobs(obs, self)


class ReferenceExpert(RuleExpert):
    """The rule expert as it was: a fresh plan every turn; rivals ranked before anything else."""

    def clear(self) -> None:
        super().clear()
        self.memory = FreshMemory()

    def _sell(self, obs: Observation, plan: Plan) -> ActionModel | None:
        others = [s for s in obs.active_labs if s != obs.seat and self.ledger.trusted(s)]
        if not others or len(obs.offers_sent or ()) >= 8:
            return None
        winners = (obs.last_result.winners or {}) if obs.last_result is not None else {}
        others.sort(key=lambda s: (-self.ledger.kept(s), -winners.get(s, 0), s))
        ask = self._market_price(obs, plan)
        for t in sorted(plan.spare):
            blocks = plan.spare[t]
            if self.hedge and t > obs.round:  # the forward rule itself is not what is compared
                blocks = self._forward_blocks(obs, t, blocks, ask)
            # only blocks it owns: one bought on a contract is not its to sell before delivery
            blocks = min(blocks, _unsold(obs, t, self.pledged))
            if blocks <= 0:
                continue
            for other in others:
                key = (obs.round, other, t)
                if key in self.offered:
                    continue
                self.offered.add(key)
                return SendOffer(
                    to=other,
                    side="sell",
                    blocks=blocks,
                    price=round(ask * blocks * (1.0 + self.ledger.margin(other)), 2),
                    delivery_round=t,
                    message=f"{blocks} spare block(s) for round {t}",
                )
        return None

    def _propose(self, obs: Observation, plan: Plan) -> ActionModel | None:
        short = next(
            (p for p in plan.jobs if p.short and p.job.min_reliability <= obs.reliability), None
        )
        others = [s for s in obs.active_labs if s != obs.seat and self.ledger.trusted(s)]
        leading = any(c.leader == obs.seat for c in obs.coalitions or ())
        if (
            short is None
            or not others
            or leading
            or obs.round in self.club_job
            or obs.mechanism.coalition_policy == "restrict"
        ):
            return None
        price = round(min(plan.price, short.unit * obs.reliability), 2)
        idle = credits_down((obs.budget or 0.0) - sum(self._own_bid(obs, plan).bids))
        if price <= 0 or idle < price:
            return None
        self.club_job[obs.round] = short.job.job_id
        return FormCoalition(
            members=others[:MAX_INVITEES],
            purpose=f"{self.PURPOSE}: blocks at {price:.2f} each",
            contribution=idle,
            split="proportional",
            term_rounds=1,
        )


class ReferenceNoNegotiation(NoNegotiationBidder):
    def clear(self) -> None:
        self.memory = FreshMemory()

    def act(self, obs: Observation) -> ActionModel:
        self.memory.observe(obs)
        if obs.phase != "bidding":
            return WAIT
        return schedule(reference_plan_jobs(obs, self.memory).bid_values, obs)


def play(scenario: str, seed: int, make: Any) -> tuple[list[str], dict[str, Any]]:
    """Every action of one episode (seat: action JSON), and the agents."""
    env = raw_env(scenario)
    env.reset(seed=seed)
    agents = {}
    for i, seat in enumerate(env.possible_agents):
        agents[seat] = make(i) if is_bidder_seat(seat) else make_agent("fixed")
        agents[seat].reset(seed=seed)
    out = []
    for seat in env.agent_iter():
        obs, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        action = agents[seat].act(obs)
        out.append(f"{seat}: {action.model_dump_json()}")
        env.step(action)
    return out, agents


CASES = [
    ("market_round", 0),
    ("market_round", 3),
    ("coalition_market", 2),
    ("shock_storm", 0),
    ("single_trade", 4),
]


@pytest.mark.parametrize(("scenario", "seed"), CASES)
def test_fast_expert_takes_the_reference_actions(scenario: str, seed: int) -> None:
    fast, agents = play(scenario, seed, lambda i: make_agent("rule_expert"))
    slow, _ = play(scenario, seed, lambda i: ReferenceExpert())
    assert len(fast) >= 10 and any('"action_type":"bid"' in a for a in fast)
    assert fast == slow
    reused = sum(a.memory.plans_reused for a in agents.values() if isinstance(a, RuleExpert))
    assert reused > 0  # the fast path was taken, not only the fresh plans


def test_mixed_line_up_with_the_no_negotiation_bidder() -> None:
    def fast(i: int) -> Any:
        return make_agent("rule_expert" if i % 2 else "no_negotiation")

    def slow(i: int) -> Any:
        return ReferenceExpert() if i % 2 else ReferenceNoNegotiation()

    a, _ = play("mechanism_stage_4", 1, fast)
    b, _ = play("mechanism_stage_4", 1, slow)
    assert len(a) >= 30
    assert a == b


def test_a_changed_input_is_planned_afresh() -> None:
    env = raw_env("market_round")
    env.reset(seed=0)
    obs = None
    for seat in env.agent_iter():
        obs, *_ = env.last()
        if is_bidder_seat(seat) and obs.phase == "bidding" and obs.jobs:
            break
        env.step(make_agent("fixed" if not is_bidder_seat(seat) else "rule_expert").act(obs))
    assert obs is not None
    memory = MarketMemory()
    memory.observe(obs)
    first = memory.plan(obs)
    assert memory.plan(obs) is first and memory.plans_reused == 1
    poorer = obs.model_copy(update={"budget": 0.0})
    fresh = memory.plan(poorer)
    assert fresh is not first and memory.plans_reused == 1
    assert fresh.bid_values == plan_jobs(poorer, memory).bid_values
    assert price_floor(poorer) == price_floor(obs)


def plan_fields(plan: Plan) -> tuple[object, ...]:
    return (
        [(p.job.job_id, p.unit, p.pursue, p.held, p.buy, p.short) for p in plan.jobs],
        plan.bid_values,
        plan.spare,
        plan.wanted,
        plan.price,
        plan.urgent,
    )


class CheckedMemory(MarketMemory):
    """Plans through the fast path and compares every plan with the reference planner's."""

    checked = 0

    def plan(self, obs: Observation) -> Plan:
        fast = super().plan(obs)
        assert plan_fields(fast) == plan_fields(reference_plan_jobs(obs, self))
        CheckedMemory.checked += 1
        return fast


class CheckedExpert(RuleExpert):
    def clear(self) -> None:
        super().clear()
        self.memory = CheckedMemory()


@pytest.mark.parametrize(
    ("name", "seed"), [("market_round_hard", 1), ("shock_storm", 2), ("daedalus_stage_2", 0)]
)
def test_every_plan_equals_the_reference_plan(name: str, seed: int) -> None:
    CheckedMemory.checked = 0
    actions, _ = play(name, seed, lambda i: CheckedExpert())
    assert actions and CheckedMemory.checked >= 10
