"""The built-in seat population (docs/design.md, section 7).

DAEDALUS bidders: ``shader``, ``colluder``, ``dropout``, ``exploiter``. GPU-arena baselines:
``greedy_hoarder``, ``no_negotiation`` (``random_valid`` and ``always_accept`` live in
:mod:`agents.scripted`). Experts: ``rule_expert`` (bidder) and ``rule_designer`` (designer). Delivery risk:
``short_seller`` (sells forward blocks it does not own). Conduct: ``liar`` (misstates its needs) and
``promise_breaker`` (breaks its promises).

Ground rules shared by every class here:

* an agent acts on its own :class:`~market.environment.observations.Observation` only, and may remember
  what it saw in earlier turns (that memory is cleared by ``reset``);
* its only randomness is ``self.rng``, seeded by ``reset(seed)``;
* a block's *value* this round is its job's value per block times this round's reliability,
  the expected progress value of one more block (as in :func:`market.environment.marginal_values`);
* a bid schedule never has more units than the round's capacity (the unit limit when the
  scenario leaves ``capacity.max_units_per_bid`` at 0, as every built-in scenario does) and
  never adds up to more than the budget, so it is always a valid ``bid``.

The package's modules: :mod:`~agents.population.common` (shared bidding helpers),
``baselines`` (the simple strategic bidders), ``planning`` (the rule expert's valuation),
``expert`` (``rule_expert``), ``dishonest`` (``liar``, ``promise_breaker``), ``delivery_risk`` (failure arithmetic and ``short_seller``) and
``designers`` (``rule_designer``); every public name is re-exported here.

Spec parameters arrive as strings (``colluder?partners=bidder_1,bidder_2&adapt=false``); each
constructor converts and checks them.
"""

from __future__ import annotations

from agents.base import BaseAgent
from agents.population.archetypes import (
    ARCHETYPES,
    CooperativeBidder,
    DeadlinePanickedBidder,
    DeceptiveBidder,
    ReciprocalBidder,
    RetaliatoryBidder,
    SelfishBidder,
)
from agents.population.baselines import (
    ColluderBidder,
    DropoutBidder,
    ExploiterBidder,
    GreedyHoarder,
    NoNegotiationBidder,
    ShaderBidder,
)
from agents.population.common import (
    PENALISING,
    StatefulAgent,
    ValueRange,
    as_count,
    credits_down,
    equilibrium_bid,
    known_reserve,
    last_price,
    price_floor,
    schedule,
    shade,
    unit_limit,
)
from agents.population.delivery_risk import (
    ShortSeller,
    blocks_to_hold,
    cover_values,
    deliverable,
    expected_shortfall,
    failure_rate_at,
    survive_at_least,
)
from agents.population.designers import (
    DAEDALUS_ROBUST,
    DaedalusRobustDesigner,
    RuleDesigner,
)
from agents.population.dishonest import LiarBidder, PromiseBreaker, live_jobs
from agents.population.expert import (
    RuleExpert,
)
from agents.population.planning import (
    PATIENT_MARGIN,
    JobPlan,
    MarketMemory,
    Plan,
    auctioned_blocks,
    expected_price,
    later_price,
    plan_jobs,
    reduce_demand,
    slack,
)

POPULATION: tuple[type[BaseAgent], ...] = (
    ShaderBidder,
    ColluderBidder,
    DropoutBidder,
    ExploiterBidder,
    GreedyHoarder,
    NoNegotiationBidder,
    RuleExpert,
    RuleDesigner,
    *ARCHETYPES,
    ShortSeller,
    LiarBidder,
    PromiseBreaker,
)

__all__ = [
    "ARCHETYPES",
    "CooperativeBidder",
    "DeadlinePanickedBidder",
    "DeceptiveBidder",
    "ReciprocalBidder",
    "RetaliatoryBidder",
    "SelfishBidder",
    "ColluderBidder",
    "DropoutBidder",
    "ExploiterBidder",
    "GreedyHoarder",
    "JobPlan",
    "LiarBidder",
    "PromiseBreaker",
    "live_jobs",
    "MarketMemory",
    "NoNegotiationBidder",
    "PATIENT_MARGIN",
    "PENALISING",
    "POPULATION",
    "Plan",
    "RuleDesigner",
    "DaedalusRobustDesigner",
    "DAEDALUS_ROBUST",
    "RuleExpert",
    "ShaderBidder",
    "ShortSeller",
    "StatefulAgent",
    "ValueRange",
    "as_count",
    "auctioned_blocks",
    "blocks_to_hold",
    "cover_values",
    "credits_down",
    "deliverable",
    "equilibrium_bid",
    "expected_price",
    "expected_shortfall",
    "failure_rate_at",
    "known_reserve",
    "last_price",
    "later_price",
    "plan_jobs",
    "price_floor",
    "reduce_demand",
    "schedule",
    "shade",
    "slack",
    "survive_at_least",
    "unit_limit",
]
