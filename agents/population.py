"""The built-in seat population (docs/design.md, section 7).

DAEDALUS bidders: ``shader``, ``colluder``, ``dropout``, ``exploiter``. GPU-arena baselines:
``greedy_hoarder``, ``no_negotiation`` (``random_valid`` and ``always_accept`` live in
:mod:`agents.scripted`). Experts: ``rule_expert`` (bidder) and ``rule_designer`` (designer).

Ground rules shared by every class here:

* an agent acts on its own :class:`~market.environment.observations.Observation` only, and may remember
  what it saw in earlier turns (that memory is cleared by ``reset``);
* its only randomness is ``self.rng``, seeded by ``reset(seed)``;
* a block's *value* this round is its job's value per block times this round's reliability,
  the expected progress value of one more block (as in :func:`agents.scripted.marginal_values`);
* a bid schedule never has more units than the round's capacity (the unit limit when the
  scenario leaves ``capacity.max_units_per_bid`` at 0, as every built-in scenario does) and
  never adds up to more than the budget, so it is always a valid ``bid``.

Spec parameters arrive as strings (``colluder?partners=bidder_1,bidder_2&adapt=false``); each
constructor converts and checks them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agents.base import BaseAgent, as_flag
from agents.scripted import MAX_INVITEES, WAIT, affordable, marginal_values
from market.core.actions import (
    AcceptOffer,
    ActionModel,
    AllocateToJob,
    Bid,
    CommitToCoalition,
    Finish,
    FormCoalition,
    LeaveCoalition,
    MakePitch,
    SendMessage,
    SendOffer,
    SetMechanism,
)
from market.core.mechanisms import first_price_equilibrium_bid
from market.core.seats import lab_index
from market.environment import CoalitionView, JobView, MarketResultView, Observation

PENALISING = frozenset({"penalize_suspected", "penalize_confirmed"})


# ------------------------------------------------------------------------------------------
# Parameters and small market readings shared by the agents
# ------------------------------------------------------------------------------------------


def as_count(value: int | str, name: str, minimum: int = 0) -> int:
    """An integer spec parameter of at least ``minimum``."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {number}")
    return number


def known_reserve(obs: Observation) -> float | None:
    """The effective reserve ``max(reserve_price, energy_floor)`` if revealed, else None."""
    if obs.mechanism.reserve_price is None:
        return None
    return max(obs.mechanism.reserve_price, obs.energy_floor)


def price_floor(obs: Observation) -> float:
    """The lowest price a block can clear at, as far as the seat knows.

    The effective reserve when it is revealed; otherwise the energy floor (always shown) or the
    last revealed effective reserve, whichever is higher.
    """
    reserve = known_reserve(obs)
    if reserve is not None:
        return reserve
    last = obs.last_result.reserve if obs.last_result is not None else None
    return max(obs.energy_floor, last or 0.0)


def unit_limit(obs: Observation) -> int:
    return max(1, obs.capacity)


def last_price(obs: Observation) -> float | None:
    """The previous round's clearing price as far as it was revealed.

    The revealed clearing price; failing that, under ``second_price`` with competing bids
    revealed, the highest rejected eligible unit bid (the price rule itself); else None.
    """
    result = obs.last_result
    if result is None:
        return None
    if result.clearing_price is not None:
        return result.clearing_price
    if result.competing_bids is not None and result.auction_type == "second_price":
        floor = result.reserve if result.reserve is not None else 0.0
        units = sorted(
            (b for row in result.competing_bids for b in row if b >= floor), reverse=True
        )
        if len(units) > result.blocks_sold:
            return max(units[result.blocks_sold], floor)
        return result.reserve
    return None


def credits_down(amount: float) -> float:
    """``amount`` rounded down to the cent, so it never exceeds what it was computed from."""
    return max(0.0, math.floor(amount * 100 + 1e-6) / 100)


def schedule(values: list[float], obs: Observation) -> Bid:
    """A valid bid for non-increasing unit ``values``: unit limit and budget respected."""
    return Bid(bids=affordable(sorted(values, reverse=True), obs.budget or 0.0, unit_limit(obs)))


class StatefulAgent(BaseAgent):
    """A :class:`BaseAgent` whose per-episode memory is built by :meth:`clear`, both when it is
    constructed and on every ``reset``, so nothing carries over from one episode to the next."""

    def __init__(self) -> None:
        super().__init__()
        self.clear()

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.clear()

    def clear(self) -> None:
        """Forget everything remembered from earlier turns."""


# ------------------------------------------------------------------------------------------
# First-price shading
# ------------------------------------------------------------------------------------------


def equilibrium_bid(value: float, n_bidders: int, low: float, high: float, reserve: float) -> float:
    """The symmetric Bayes-Nash bid of a first-price auction with a reserve, clipped to the value.

    ``n_bidders`` risk-neutral bidders with i.i.d. ``Uniform[low, high]`` values. With the
    reserve ``r <= low`` this is :func:`market.core.mechanisms.first_price_equilibrium_bid`,
    ``low + (v - low)(n - 1)/n``. With ``low < r < v`` it is the textbook reserve version
    ``v - ((v - low)^n - (r - low)^n) / (n (v - low)^(n - 1))``, which equals ``r`` at ``v = r``.
    A lone bidder bids the lowest eligible price. A value at or below the reserve cannot win a
    block worth having, so it is bid as is.
    """
    if value <= reserve:
        return value
    if n_bidders <= 1:
        return min(value, max(reserve, low))
    if reserve <= low:
        bid = float(first_price_equilibrium_bid(value, n_bidders, low, high))
    else:
        x = value - low
        bid = value - (x**n_bidders - (reserve - low) ** n_bidders) / (
            n_bidders * x ** (n_bidders - 1)
        )
    return min(value, max(reserve, bid))


class ValueRange:
    """A running estimate of the range ``[low, high]`` of the bidders' block values.

    Samples (each a value, or a bid that lower-bounds a value) come only from the seat's own
    observation:

    * its own jobs: one sample per job, value per block x the reliability when first seen;
    * after each clearing, what the mechanism revealed: every competing unit bid, or the
      ``min`` and ``max`` of the bid distribution; and under ``second_price`` a clearing price
      above the reserve, which is a rejected rival's bid, i.e. a rival's value.

    With ``m >= 2`` samples spanning ``[a, b]`` the estimate widens the span by one average gap,
    ``(b - a)/(m - 1)``, on each side (the unbiased endpoint estimate for uniform draws), and
    never goes below 0. With one sample there is no spread to learn from: ``low`` falls back to
    the known price floor (bidders below the reserve do not bid) and ``high`` is that sample.
    First-price bids are shaded, so they only make the estimate of ``low`` conservative.
    """

    def __init__(self) -> None:
        self.own: dict[str, float] = {}
        self.market: list[float] = []
        self._rounds: set[int] = set()

    def observe(self, obs: Observation) -> None:
        for job in obs.jobs or ():
            if job.status == "active" and job.job_id not in self.own:
                self.own[job.job_id] = job.value / job.size * obs.reliability
        result = obs.last_result
        if result is None or result.round in self._rounds:
            return
        self._rounds.add(result.round)
        if result.competing_bids:
            self.market += [b for row in result.competing_bids for b in row]
        elif result.bid_distribution and result.bid_distribution.get("count"):
            self.market += [result.bid_distribution["min"], result.bid_distribution["max"]]
        price, reserve = result.clearing_price, result.reserve or 0.0
        if (
            result.auction_type == "second_price"
            and price is not None
            and result.blocks_sold
            and price > reserve
        ):
            self.market.append(price)

    def estimate(self, floor: float) -> tuple[float, float]:
        samples = [*self.own.values(), *self.market]
        if len(samples) >= 2:
            lo, hi = min(samples), max(samples)
            gap = (hi - lo) / (len(samples) - 1)
            low, high = max(0.0, lo - gap), hi + gap
        elif samples:
            low, high = floor, samples[0]
        else:
            low, high = floor, floor + 1.0
        return low, max(high, low + 1e-6)


def shade(values: list[float], obs: Observation, value_range: ValueRange) -> list[float]:
    """Bid amounts for unit ``values`` under the mechanism in force.

    * ``first_price``: pay-as-bid, so each unit is shaded to :func:`equilibrium_bid` with
      ``n = len(active_labs)`` bidders (the seat and its active rivals), the estimated value
      range and the known price floor.
    * ``second_price``: the price is set by a rejected bid, never by one's own winning bid;
      with unit demand truthful bidding is dominant. Bid the values.
    * ``vcg``: truthful bidding is dominant for any demand. Bid the values.
    * ``posted_price`` and ``fair_share``: everyone who clears the reserve pays the reserve;
      the amount only decides eligibility, so shading gains nothing and risks losing. Bid the
      values.
    """
    if obs.mechanism.auction_type != "first_price":
        return list(values)
    value_range.observe(obs)
    floor = price_floor(obs)
    low, high = value_range.estimate(floor)
    n = max(1, len(obs.active_labs))
    return [round(equilibrium_bid(v, n, low, high, floor), 6) for v in values]


class ShaderBidder(StatefulAgent):
    """Bids the Bayes-Nash shaded amount of each block's value for the mechanism in force.

    Values are :func:`agents.scripted.marginal_values`. Under ``first_price`` each unit is bid
    at the symmetric equilibrium for ``len(active_labs)`` bidders and the value range estimated
    by :class:`ValueRange`; under ``second_price``, ``vcg``, ``posted_price`` and
    ``fair_share`` it bids its values (see :func:`shade` for why, per type). Never negotiates.
    """

    name = "shader"

    def clear(self) -> None:
        self.values = ValueRange()

    def act(self, obs: Observation) -> ActionModel:
        self.values.observe(obs)
        if obs.phase != "bidding":
            return WAIT
        return schedule(shade(marginal_values(obs), obs, self.values), obs)


# ------------------------------------------------------------------------------------------
# Colluder: a bid-rotation cartel
# ------------------------------------------------------------------------------------------


class ColluderBidder(StatefulAgent):
    """A member of a bid-rotation cartel.

    * **Members.** With ``partners=bidder_1,bidder_2`` the cartel is this seat plus those seats.
      Without it, each colluder posts one public handshake containing ``token`` in its first
      negotiation turn, and the cartel is every seat whose messages carry the token. Members
      that are no longer active drop out of the rotation.
    * **Rotation.** Members are ordered by seat index; in round ``r`` the member at position
      ``r mod k`` of the active members is the designated winner.
    * **Coordination.** In every round each member sends its partners one private message
      naming that round's designated winner.
    * **Suppression.** The designated winner bids just above the reserve (``floor + step``, with
      ``step = value_unit / 100``) for every block worth more than that, not its values. The
      others abstain, so the cartel never bids against itself.
    * **Adapting** (``adapt=true``, the default). Its expected cartel gain per round is the
      surplus of winning its current demand at the reserve once every ``k`` rounds,
      ``sum(max(0, v - floor - step)) / k``. When the mechanism penalises suspected or
      confirmed collusion with a ``collusion_penalty`` above that gain, it stops colluding
      (no messages, truthful bids) until that is no longer so. ``adapt=false`` keeps the
      cartel going whatever the mechanism.

    Without partners (none known, or none active) it bids truthfully.
    """

    name = "colluder"
    TOKEN = "#rotation-club"

    def __init__(
        self, partners: str | None = None, adapt: bool | str = True, token: str = TOKEN
    ) -> None:
        self.fixed_partners = (
            [p.strip() for p in partners.split(",") if p.strip()] if partners else None
        )
        self.adapt = as_flag(adapt, "adapt")
        if not str(token).strip():
            raise ValueError("token must not be blank")
        self.token = str(token).strip()
        super().__init__()  # clear() reads the parameters

    def clear(self) -> None:
        self.partners: set[str] = set(self.fixed_partners or ())
        self.handshake_sent = False
        self.coordinated: set[int] = set()
        self.colluded_rounds: list[int] = []

    def members(self, obs: Observation) -> list[str]:
        """The active cartel members, this seat included, in seat-index order."""
        group = (self.partners | {obs.seat}) & set(obs.active_labs)
        return sorted(group, key=lab_index)

    def designated(self, obs: Observation) -> str:
        group = self.members(obs)
        return group[obs.round % len(group)]

    def step_size(self, obs: Observation) -> float:
        return obs.value_unit / 100.0

    def expected_gain(self, obs: Observation) -> float:
        """Per-round cartel surplus: its current demand won at the reserve every k-th round."""
        cut = price_floor(obs) + self.step_size(obs)
        k = max(1, len(self.members(obs)))
        return sum(max(0.0, v - cut) for v in marginal_values(obs)) / k

    def colluding(self, obs: Observation) -> bool:
        if len(self.members(obs)) < 2:
            return False
        if not self.adapt:
            return True
        mech = obs.mechanism
        deterred = (
            mech.coalition_policy in PENALISING and mech.collusion_penalty > self.expected_gain(obs)
        )
        return not deterred

    def _discover(self, obs: Observation) -> None:
        if self.fixed_partners is not None:
            return
        for message in obs.messages:
            if message.sender != obs.seat and self.token in message.text:
                self.partners.add(message.sender)

    def act(self, obs: Observation) -> ActionModel:
        self._discover(obs)
        if obs.phase == "negotiation":
            if self.fixed_partners is None and not self.handshake_sent:
                self.handshake_sent = True
                return SendMessage(to="all", text=f"{self.token} looking for long-term partners")
            if obs.round not in self.coordinated and self.colluding(obs):
                self.coordinated.add(obs.round)
                others = [m for m in self.members(obs) if m != obs.seat]
                return SendMessage(
                    to=others,
                    text=f"{self.token} round {obs.round}: {self.designated(obs)} takes the "
                    "blocks; everyone else stays out",
                )
            return WAIT
        if obs.phase != "bidding":
            return WAIT
        values = marginal_values(obs)
        if not self.colluding(obs):
            return schedule(values, obs)
        self.colluded_rounds.append(obs.round)
        if self.designated(obs) != obs.seat:
            return Bid(bids=[])
        bid = round(price_floor(obs) + self.step_size(obs), 6)
        return schedule([bid for v in values if v > bid], obs)


# ------------------------------------------------------------------------------------------
# Dropout
# ------------------------------------------------------------------------------------------


class DropoutBidder(StatefulAgent):
    """Bids truthfully; leaves the market (``finish``) after ``patience`` losing rounds in a row.

    A round counts as lost when it bid for at least one block (it had demand) and won nothing
    at auction (``last_result.my_won == 0``). A round in which it had no demand neither counts
    nor breaks the streak; a round in which it won something resets it. It finishes at its
    first turn after the streak reaches ``patience`` (default 2).
    """

    name = "dropout"

    def __init__(self, patience: int | str = 2) -> None:
        self.patience = as_count(patience, "patience", minimum=1)
        super().__init__()

    def clear(self) -> None:
        self.losing = 0
        self.bid_rounds: dict[int, bool] = {}

    def act(self, obs: Observation) -> ActionModel:
        result = obs.last_result
        if result is not None and self.bid_rounds.pop(result.round, False):
            self.losing = 0 if result.my_won > 0 else self.losing + 1
        if self.losing >= self.patience and "finish" in obs.legal_actions:
            return Finish()
        if obs.phase != "bidding":
            return WAIT
        bid = schedule(marginal_values(obs), obs)
        self.bid_rounds[obs.round] = bool(bid.bids)
        return bid


# ------------------------------------------------------------------------------------------
# Exploiter
# ------------------------------------------------------------------------------------------


class ExploiterBidder(StatefulAgent):
    """Probes the mechanism for the cheapest price that still wins, and reneges when it pays.

    Bidding (values are :func:`agents.scripted.marginal_values`):

    * ``second_price`` with a last clearing price it can see (revealed, or rebuilt from revealed
      competing bids) above the floor: bids ``last price + step`` for units worth more than
      that, and exactly the floor for units worth more than the floor only;
    * otherwise, with the reserve revealed: bids exactly the effective reserve
      (``max(reserve_price, energy_floor)``) for every unit worth more;
    * with the reserve hidden: probes upward. It starts one step above the energy floor and,
      after a round in which it bid and won nothing, raises the probe by one step (never above
      a unit's value); after a win it keeps the level. ``step = value_unit / 100``, and the
      upward probe step is ``max(step, 10% of its top value)``.

    Reneging: it joins coalition invitations, contributing the floor price of its demand, and
    in a later round leaves an active coalition before its term ends whenever the
    ``withdrawal_penalty`` is below the pool balance it gets back by leaving. It ``finish``es
    once all its jobs are settled (none active, at least one done), unless that would breach
    a coalition.
    """

    name = "exploiter"

    def clear(self) -> None:
        self.probe: float | None = None
        self.bid_rounds: dict[int, bool] = {}
        self.joined: dict[str, int] = {}

    def _update_probe(self, obs: Observation) -> None:
        result = obs.last_result
        if result is None or result.round not in self.bid_rounds:
            return
        if self.bid_rounds.pop(result.round) and result.my_won == 0 and self.probe is not None:
            top = max(marginal_values(obs), default=0.0)
            self.probe += max(obs.value_unit / 100.0, 0.1 * top)

    def target_bids(self, obs: Observation) -> list[float]:
        values = marginal_values(obs)
        step = obs.value_unit / 100.0
        reserve = known_reserve(obs)
        if reserve is None:
            if self.probe is None:
                self.probe = obs.energy_floor + step
            level = max(self.probe, obs.energy_floor)
            return [min(v, level) for v in values if v > obs.energy_floor]
        price = last_price(obs) if obs.mechanism.auction_type == "second_price" else None
        if price is not None and price > reserve:
            above = price + step
            return [above if v > above else reserve for v in values if v > reserve]
        return [reserve for v in values if v > reserve]

    def act(self, obs: Observation) -> ActionModel:
        self._update_probe(obs)
        mine = [c for c in obs.coalitions or () if obs.seat in c.members and c.status == "active"]
        jobs = obs.jobs or []
        settled = (
            bool(jobs)
            and all(j.status != "active" for j in jobs)
            and any(j.status == "done" for j in jobs)
        )
        if obs.phase == "negotiation":
            for c in mine:
                if (
                    c.term_end >= obs.round > self.joined.get(c.coalition_id, obs.round)
                    and (c.my_balance or 0.0) > obs.mechanism.withdrawal_penalty
                ):
                    return LeaveCoalition(coalition_id=c.coalition_id)
            for c in obs.coalitions or ():
                if obs.seat in c.invited:
                    demand = len(marginal_values(obs)) * price_floor(obs)
                    self.joined[c.coalition_id] = obs.round
                    return CommitToCoalition(
                        coalition_id=c.coalition_id,
                        contribution=credits_down(min(demand, (obs.budget or 0.0) / 4)),
                    )
        if settled and not mine and "finish" in obs.legal_actions:
            return Finish()
        if obs.phase != "bidding":
            return WAIT
        bid = schedule(self.target_bids(obs), obs)
        self.bid_rounds[obs.round] = bool(bid.bids)
        return bid


# ------------------------------------------------------------------------------------------
# GPU-arena baselines
# ------------------------------------------------------------------------------------------


class GreedyHoarder(BaseAgent):
    """Buys as many blocks as its budget allows at high prices, whatever it needs; never sells.

    Bidding: a flat schedule at ``1.5 x`` the highest reference price it knows (its highest
    value per block over live jobs, the last revealed clearing price, the floor, at least one
    credit), for as many units as the unit limit and its budget allow; if the budget cannot pay
    one unit at that price it spreads the whole budget over the unit limit. Negotiation: accepts
    every offer to *sell* it blocks that it can pay for; ignores requests to buy from it.
    """

    name = "greedy_hoarder"
    MARKUP = 1.5

    def act(self, obs: Observation) -> ActionModel:
        budget = obs.budget or 0.0
        if obs.phase == "negotiation":
            for offer in obs.offers_received or ():
                if offer.side == "sell" and offer.price <= budget:
                    return AcceptOffer(offer_id=offer.offer_id)
            return WAIT
        if obs.phase != "bidding":
            return WAIT
        values = [j.value / j.size for j in obs.jobs or () if j.status == "active"]
        reference = max([*values, last_price(obs) or 0.0, price_floor(obs), 1.0])
        price = round(self.MARKUP * reference, 2)
        cap = unit_limit(obs)
        units = min(cap, int(budget // price)) if price > 0 else cap
        if units == 0:
            price, units = math.floor(budget / cap * 100) / 100, cap
        return Bid(bids=affordable([price] * units, budget, cap) if price > 0 else [])


class NoNegotiationBidder(StatefulAgent):
    """Never negotiates (waits through every negotiation turn); bids its marginal values.

    The values are the rule expert's (:func:`plan_jobs`): only blocks for jobs it can still
    complete, or that pay per block, each at its value per block times the reliability. They are
    bid unshaded, whatever the mechanism.
    """

    name = "no_negotiation"

    def clear(self) -> None:
        self.memory = MarketMemory()

    def act(self, obs: Observation) -> ActionModel:
        self.memory.observe(obs)
        if obs.phase != "bidding":
            return WAIT
        return schedule(plan_jobs(obs, self.memory).bid_values, obs)


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
            auctioned = self.auctioned.get(result.round, 0)
            if auctioned:
                rivals = result.blocks_sold - result.my_won
                spare = max(0, auctioned - rivals) if slack(result, auctioned) else 0
                self.left_over = spare / auctioned

    def base_capacity(self, obs: Observation) -> float:
        seen = list(self.capacities.values())
        return sum(seen) / len(seen) if seen else float(obs.capacity)

    def share(self, obs: Observation) -> float:
        """Plausible share of a round's auctioned blocks it can win: an equal share; more if it
        has won more than that when it bid for more than it got; and at least the share its
        rivals left over in the last round, if that round cleared at the reserve (their demand
        was met, so what they did not take would have gone to a bid at the floor)."""
        share = min(1.0, 1.0 / max(1, len(obs.active_labs)))
        for r, units in self.bid_units.items():
            won = self.won.get(r)
            cap = self.capacities.get(r)
            if won is not None and cap and units > won:
                share = max(share, min(1.0, won / cap))
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
        complete, within_budget = _simulate(trial, rounds, held, plausible, usable, budget, price)
        if complete and within_budget:
            admitted.append(plan)
        else:
            plan.short = complete and not within_budget
    for plan in plans:
        plan.pursue = plan in admitted
        if not plan.pursue:
            plan.held, plan.buy = {}, {}
    _simulate(admitted, rounds, held, plausible, usable, budget, price)
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
    _simulate(admitted, rounds, held, dict.fromkeys(rounds, 0), usable, budget, price)
    spare = dict(held)
    for plan in admitted:
        for t, n in plan.held.items():
            spare[t] -= n
    for t in rounds:
        if t > now:
            running = sum(1 for p in hard if p.job.deadline >= t)
            spare[t] = max(0, spare[t] - running)
    _simulate(admitted, rounds, held, plausible, usable, budget, price)
    return Plan(plans, bid_values, spare, wanted, price, urgent)


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
    rounds cannot supply) and is patient with the rest: it bids them just above the floor
    (:data:`PATIENT_MARGIN` value units above it, never above their value). Those units win
    whenever the other labs leave supply over, at about the reserve, and if rejected they raise
    the price by at most that margin; blocks it misses now it can still buy in a later, slacker
    round. Other mechanisms are returned unchanged.
    """
    if obs.mechanism.auction_type != "second_price" or not bids:
        return bids
    patient = price_floor(obs) + PATIENT_MARGIN * obs.value_unit
    return [b if k < plan.urgent else min(b, patient) for k, b in enumerate(bids)]


# ------------------------------------------------------------------------------------------
# Rule expert
# ------------------------------------------------------------------------------------------


class RuleExpert(StatefulAgent):
    """Negotiates, forms useful coalitions and bids from job values; adapts to shocks.

    Valuation (:func:`plan_jobs`, recomputed at every turn from the observation and memory):
    a block's value is its job's value per block x the reliability; a job without partial credit
    counts only if it can still complete by its deadline from its own blocks and the blocks it
    can plausibly win within its budget; jobs are served highest value per block first. Shocks
    enter through the observation: the current reliability re-values every block and rules out
    jobs that cannot run; known outages and reliability drops lower the supply of later rounds;
    an energy spike raises the floor, and blocks worth less than the floor are not bid for.

    Each negotiation turn takes the first rule that applies:

    1. accept an offer to *sell* it blocks whose price is at most the value of those blocks to
       it (the values of the blocks it would otherwise try to win in that round), or an offer
       to *buy* blocks it holds spare, at a price of at least the floor per block;
    2. commit to a coalition invitation that helps it: it still needs blocks this round, the
       coalition's term ends this round, and the purpose states a price per block at most its
       value for them; it contributes that price for each block it needs (at most half its
       budget);
    3. keep a job it cannot complete off this round's blocks (``allocate_to_job`` with 0) when
       earliest-deadline-first execution would otherwise give that job blocks before a job it
       pursues;
    4. pitch to the judge, when the mechanism has a judge pool, for as many blocks as the pool
       holds and it still needs this round (once per round);
    5. offer spare held blocks for sale at the market price (the last revealed price, else its
       own median value per block, at least the floor) to each other active lab in turn, first
       those that won blocks last round (they need blocks); one offer per lab, round and delivery
       round, and none while 8 of its offers are open;
    6. propose a one-round buying club (a coalition with proportional split) to the other active
       labs when a deadline job it could complete with the blocks on offer is beyond its budget
       (once per round). It contributes the part of its budget its own bid leaves idle, so an
       unanswered proposal costs it nothing but the talk fee, and states the price per block it
       will bid for the members' blocks: the expected price, at most its own value;
    7. otherwise wait.

    Bidding: as the leader of an active club it bids from the pool: its own bid (including the
    short job's blocks), plus one block at the stated price for every such price the other
    members paid in; if the pool cannot carry its own bid, it bids alone. Otherwise it bids its
    own values, shaded under ``first_price`` exactly as the ``shader`` does (:func:`shade`) and
    with demand reduction under ``second_price`` (:func:`reduce_demand`). If it has nothing to
    bid and a rule-3 fix is pending, it makes that fix instead (bidding nothing and planning
    blocks both leave it out of the auction).

    It honours commitments: it never leaves a coalition early, never sells blocks a pursued job
    needs and never sells forward more than it owns.
    """

    name = "rule_expert"
    PURPOSE = "buying club"

    def clear(self) -> None:
        self.memory = MarketMemory()
        self.values = ValueRange()
        self.offered: set[tuple[int, str, int]] = set()
        self.pitched: set[int] = set()
        self.kept_off: set[tuple[int, str]] = set()
        self.club_job: dict[int, str] = {}

    # --- helpers --------------------------------------------------------------------------
    def _market_price(self, obs: Observation, plan: Plan) -> float:
        price = last_price(obs)
        if price is None or price <= price_floor(obs):
            own = sorted(j.value / j.size * obs.reliability for j in obs.jobs or ())
            price = own[len(own) // 2] if own else price_floor(obs)
        return round(max(price, price_floor(obs)), 2)

    def _accept(self, obs: Observation, plan: Plan) -> ActionModel | None:
        budget = obs.budget or 0.0
        for offer in obs.offers_received or ():
            t = offer.delivery_round
            if t < obs.round or offer.expires_round < obs.round:
                continue
            if offer.side == "sell":  # it would buy
                values = plan.wanted.get(t, [])[: offer.blocks]
                if len(values) == offer.blocks and offer.price <= min(sum(values), budget):
                    return AcceptOffer(offer_id=offer.offer_id)
            elif offer.blocks <= plan.spare.get(t, 0) and offer.price >= offer.blocks * price_floor(
                obs
            ):
                return AcceptOffer(offer_id=offer.offer_id)
        return None

    def _commit(self, obs: Observation, plan: Plan) -> ActionModel | None:
        if not plan.bid_values:
            return None
        for c in obs.coalitions or ():
            if obs.seat not in c.invited or c.term_end != obs.round or c.split != "proportional":
                continue
            price = _club_price(c)
            if price is None:
                continue
            blocks = [v for v in plan.bid_values if v >= price]
            contribution = min(len(blocks) * price, (obs.budget or 0.0) / 2)
            if blocks and contribution >= price:
                return CommitToCoalition(
                    coalition_id=c.coalition_id, contribution=credits_down(contribution)
                )
        return None

    def _keep_off(self, obs: Observation, plan: Plan) -> ActionModel | None:
        runnable = [p for p in plan.jobs if p.job.min_reliability <= obs.reliability]
        pursued = [p.job for p in runnable if p.pursue]
        if not pursued or not ((obs.holdings or [0])[0] or plan.bid_values):
            return None
        last = max((j.deadline, j.job_id) for j in pursued)
        for p in runnable:
            key = (obs.round, p.job.job_id)
            if not p.pursue and (p.job.deadline, p.job.job_id) < last and key not in self.kept_off:
                self.kept_off.add(key)
                return AllocateToJob(job_id=p.job.job_id, blocks=0)
        return None

    def _pitch(self, obs: Observation, plan: Plan) -> ActionModel | None:
        pool = math.floor(obs.capacity * obs.mechanism.judge_pool_share + 1e-9)
        if pool < 1 or obs.round in self.pitched or not plan.bid_values:
            return None
        urgent = min(
            (p.job for p in plan.jobs if p.pursue and p.job.min_reliability <= obs.reliability),
            key=lambda j: (j.deadline, -j.value),
            default=None,
        )
        if urgent is None:
            return None
        self.pitched.add(obs.round)
        want = min(pool, len(plan.bid_values))
        return MakePitch(
            text=f"{urgent.job_id} needs {urgent.size - urgent.progress} more block(s) "
            f"by round {urgent.deadline}",
            blocks_requested=want,
            job_id=urgent.job_id,
        )

    def _sell(self, obs: Observation, plan: Plan) -> ActionModel | None:
        others = [s for s in obs.active_labs if s != obs.seat]
        if not others or len(obs.offers_sent or ()) >= 8:
            return None
        winners = (obs.last_result.winners or {}) if obs.last_result is not None else {}
        others.sort(key=lambda s: (-winners.get(s, 0), s))
        ask = self._market_price(obs, plan)
        for t in sorted(plan.spare):
            blocks = plan.spare[t]
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

    def _own_bid(self, obs: Observation, plan: Plan) -> Bid:
        return schedule(reduce_demand(shade(plan.bid_values, obs, self.values), obs, plan), obs)

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

    def _coalition_bid(self, obs: Observation, plan: Plan) -> Bid | None:
        led = next(
            (
                c
                for c in obs.coalitions or ()
                if c.leader == obs.seat
                and c.status == "active"
                and c.term_end >= obs.round
                and c.pool
            ),
            None,
        )
        if led is None or obs.mechanism.coalition_policy == "restrict":
            return None
        price = _club_price(led) or 0.0
        mine = list(plan.bid_values)
        job = plan.job(self.club_job.get(obs.round, ""))
        if job is not None:
            mine += [job.unit * obs.reliability] * (job.job.size - job.job.progress)
        funded = max(0.0, (led.pool or 0.0) - (led.my_balance or 0.0))
        club = [price] * (int(funded // price) if price > 0 else 0)
        own = reduce_demand(shade(mine, obs, self.values), obs, plan)
        if sum(own) > (led.pool or 0.0) - len(club) * price + 1e-9:
            return None  # the pool cannot carry its own bids: bid alone this round
        values = sorted([*own, *club], reverse=True)
        return Bid(
            bids=affordable(values, led.pool or 0.0, unit_limit(obs)), coalition_id=led.coalition_id
        )

    # --- the turn -------------------------------------------------------------------------
    def act(self, obs: Observation) -> ActionModel:
        self.memory.observe(obs)
        self.values.observe(obs)
        if obs.phase not in ("negotiation", "bidding"):
            return WAIT
        plan = plan_jobs(obs, self.memory)
        if obs.phase == "negotiation":
            for rule in (
                self._accept,
                self._commit,
                self._keep_off,
                self._pitch,
                self._sell,
                self._propose,
            ):
                action = rule(obs, plan)
                if action is not None:
                    return action
            return WAIT
        bid = self._coalition_bid(obs, plan)
        if bid is None:
            bid = self._own_bid(obs, plan)
        if not bid.bids:
            fix = self._keep_off(obs, plan)
            if fix is not None:
                return fix
        self.memory.bid_units[obs.round] = len(bid.bids)
        return bid


def _club_price(coalition: CoalitionView) -> float | None:
    """The per-block price a rule expert's buying-club proposal states in its purpose."""
    text = coalition.purpose
    if not text.startswith(RuleExpert.PURPOSE):
        return None
    try:
        return float(text.split(" at ", 1)[1].split()[0])
    except (IndexError, ValueError):
        return None


# ------------------------------------------------------------------------------------------
# Rule designer
# ------------------------------------------------------------------------------------------


class RuleDesigner(StatefulAgent):
    """Adapts the mechanism to the market signals in its ``designer_stats``.

    ``designer_stats`` has one entry per cleared round of every health signal, the suspected
    cartels of the last round and the active labs (``last_result`` shows the same last clearing
    in more detail; these rules do not need it). Rule table, read at each design turn from the
    last entry of each series (``p`` is the mean clearing price so far); every rule that fires
    contributes its fields:

    =================================  ====================================================
    signal                             change
    =================================  ====================================================
    suspected collusion                ``coalition_policy = penalize_suspected``,
    (``suspected_cartels >= 1``)       ``collusion_penalty = max(current, 25, 2 p)``
    dropouts: fewer active labs than   ``reserve_price`` halved (0 below 1 credit); and if
    before, or participation ``< 0.8`` fairness ``< 0.7`` also
    or falling                         ``auction_type = fair_share``
    price volatility                   ``reveal_clearing_price = true``,
    (stability ``< 0.7``)              ``auction_type = second_price``
    welfare shortfall                  ``auction_type = second_price``,
    (welfare_ratio ``< 0.8``)          ``reserve_price = min(current, 0.1 p)``
    =================================  ====================================================

    When both ``fair_share`` (dropouts) and ``second_price`` (volatility, welfare) fire, the
    dropout rule wins: a fair split is what brings labs back. With no signal, or before the
    first clearing, it waits (the mechanism in force stays).
    """

    name = "rule_designer"
    roles = frozenset({"designer"})

    def clear(self) -> None:
        self.active_seen: int | None = None
        self.last_decision: dict[str, object] = {}

    def decide(self, obs: Observation) -> dict[str, object]:
        stats = obs.designer_stats
        mech = obs.mechanism
        update: dict[str, object] = {}
        if stats is None or not stats.welfare_ratio:
            return update
        prices = [p for p in stats.prices if p is not None]
        mean_price = sum(prices) / len(prices) if prices else 0.0
        reserve = mech.reserve_price or 0.0
        if stats.suspected_cartels >= 1:
            update["coalition_policy"] = "penalize_suspected"
            update["collusion_penalty"] = round(
                max(mech.collusion_penalty, 25.0, 2 * mean_price), 2
            )
        part = stats.participation
        dropped = self.active_seen is not None and stats.active_labs < self.active_seen
        falling = len(part) >= 2 and part[-1] < part[-2]
        auction: str | None = None
        if dropped or part[-1] < 0.8 or falling:
            lowered = reserve / 2
            update["reserve_price"] = round(lowered, 2) if lowered >= 1.0 else 0.0
            if stats.fairness[-1] < 0.7:
                auction = "fair_share"
        if stats.stability[-1] < 0.7:
            update["reveal_clearing_price"] = True
            auction = auction or "second_price"
        if stats.welfare_ratio[-1] < 0.8:
            auction = auction or "second_price"
            low = round(min(float(update.get("reserve_price", reserve)), 0.1 * mean_price), 2)
            update["reserve_price"] = low
        if auction is not None:
            update["auction_type"] = auction
        return update

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase != "design":
            return WAIT
        update = self.decide(obs)
        if obs.designer_stats is not None:
            self.active_seen = obs.designer_stats.active_labs
        self.last_decision = update
        if not update:
            return WAIT
        return SetMechanism.model_validate({"mechanism": update})


POPULATION: tuple[type[BaseAgent], ...] = (
    ShaderBidder,
    ColluderBidder,
    DropoutBidder,
    ExploiterBidder,
    GreedyHoarder,
    NoNegotiationBidder,
    RuleExpert,
    RuleDesigner,
)
