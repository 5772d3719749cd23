"""The simple strategic bidders of the population: ``shader``, ``colluder``, ``dropout``,
``exploiter`` (DAEDALUS) and the GPU-arena baselines ``greedy_hoarder`` and ``no_negotiation``."""

from __future__ import annotations

import math

from agents.base import BaseAgent, as_flag
from agents.population.common import (
    PENALISING,
    StatefulAgent,
    ValueRange,
    as_count,
    credits_down,
    known_reserve,
    last_price,
    price_floor,
    schedule,
    shade,
    unit_limit,
)
from agents.population.planning import MarketMemory
from agents.scripted import WAIT
from market.core.actions import (
    AcceptOffer,
    ActionModel,
    Bid,
    CommitToCoalition,
    Finish,
    LeaveCoalition,
    SendMessage,
)
from market.core.seats import lab_index
from market.core.summation import ordered_sum
from market.environment import Observation, affordable, marginal_values


class ShaderBidder(StatefulAgent):
    """Bids the Bayes-Nash shaded amount of each block's value for the mechanism in force.

    Values are :func:`market.environment.marginal_values`. Under ``first_price`` each unit is bid
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
        return ordered_sum(max(0.0, v - cut) for v in marginal_values(obs)) / k

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

    Bidding (values are :func:`market.environment.marginal_values`):

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
        return schedule(self.memory.plan(obs).bid_values, obs)
