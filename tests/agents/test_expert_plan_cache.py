"""The rule expert's fast path (the plan reused across turns with unchanged inputs, rivals ranked
only when a block is for sale) takes exactly the actions of a reference expert that plans afresh
at every turn and ranks rivals eagerly, as it did before the fast path."""

from __future__ import annotations

from typing import Any

import pytest

from agents.population import NoNegotiationBidder, RuleExpert, plan_jobs
from agents.population.common import credits_down, price_floor, schedule
from agents.population.delivery_risk import deliverable, failure_rate_at, owed
from agents.population.planning import MarketMemory, Plan
from agents.registry import make_agent
from agents.scripted import MAX_INVITEES, WAIT
from market.core.actions import ActionModel, FormCoalition, SendOffer
from market.core.seats import is_bidder_seat
from market.environment import Observation
from market.environment.aec import raw_env


class FreshMemory(MarketMemory):
    """Plans afresh at every turn: the reference for the reused plan."""

    def plan(self, obs: Observation) -> Plan:
        return plan_jobs(obs, self)


class ReferenceExpert(RuleExpert):
    """The rule expert as it was: a fresh plan every turn; rivals ranked before anything else."""

    def clear(self) -> None:
        super().clear()
        self.memory = FreshMemory()

    def _sell(self, obs: Observation, plan: Plan) -> ActionModel | None:
        others = [s for s in obs.active_labs if s != obs.seat]
        if not others or len(obs.offers_sent or ()) >= 8:
            return None
        winners = (obs.last_result.winners or {}) if obs.last_result is not None else {}
        others.sort(key=lambda s: (-winners.get(s, 0), s))
        ask = self._market_price(obs, plan)
        for t in sorted(plan.spare):
            blocks = plan.spare[t]
            if self.hedge and t > obs.round:
                holdings = obs.holdings or []
                held = holdings[t - obs.round] if t - obs.round < len(holdings) else 0
                blocks = min(
                    blocks,
                    deliverable(held, owed(obs, t)[0], failure_rate_at(obs, t), self.confidence),
                )
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
                    price=round(ask * blocks, 2),
                    delivery_round=t,
                    message=f"{blocks} spare block(s) for round {t}",
                )
        return None

    def _propose(self, obs: Observation, plan: Plan) -> ActionModel | None:
        short = next(
            (p for p in plan.jobs if p.short and p.job.min_reliability <= obs.reliability), None
        )
        others = [s for s in obs.active_labs if s != obs.seat]
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
        return schedule(plan_jobs(obs, self.memory).bid_values, obs)


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
    ("mechanism_stage_4", 1),
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
