"""Opponent archetypes: five population bidders that do what their names say.

Each reads only its own observation. The shared readings:

* *value* of a block: :func:`~market.environment.marginal_values` (the expected value of the next
  block this round to its live jobs; 0 if its jobs need no more);
* *need*: the blocks its live runnable jobs still need beyond the blocks it holds this round;
* *spare*: blocks it holds this round (minus reserved and already sold ones) that its jobs
  cannot use.

An offer's price is per block (``price / blocks``). Each archetype's docstring states its rule.
"""

from __future__ import annotations

from agents.population.common import StatefulAgent, as_count, last_price, price_floor, schedule
from agents.population.trust import TrustLedger
from agents.scripted import truthful_bid
from market.core.actions import (
    AcceptOffer,
    ActionModel,
    Bid,
    CommitToCoalition,
    RejectOffer,
    SendMessage,
    SendOffer,
    Wait,
)
from market.core.seats import lab_index
from market.core.summation import ordered_sum
from market.environment import Observation, marginal_values

WAIT = Wait()


def _value(obs: Observation) -> float:
    values = marginal_values(obs)
    return values[0] if values else 0.0


def _need(obs: Observation) -> int:
    live = [
        j for j in obs.jobs or () if j.status == "active" and j.min_reliability <= obs.reliability
    ]
    return max(0, ordered_sum(j.size - j.progress for j in live) - (obs.holdings or [0])[0])


def _spare(obs: Observation) -> int:
    held = (obs.holdings or [0])[0] - (obs.reserved or [0])[0]
    sold = ordered_sum(
        c.blocks
        for c in obs.contracts or ()
        if c.seller == obs.seat and c.delivery_round == obs.round
    )
    live = [
        j for j in obs.jobs or () if j.status == "active" and j.min_reliability <= obs.reliability
    ]
    return max(0, held - sold - ordered_sum(j.size - j.progress for j in live))


def _per_block(price: float, blocks: int) -> float:
    return price / max(1, blocks)


def _fair_price(obs: Observation) -> float:
    """The last revealed clearing price, else the known price floor, at least one credit."""
    return max(last_price(obs) or 0.0, price_floor(obs), 1.0)


class _Archetype(StatefulAgent):
    """Shared turn structure: answer offers (``judge``), then ``initiate``; bid ``bid``."""

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase == "bidding":
            return self.bid(obs)
        if obs.phase != "negotiation":
            return WAIT
        self.observe(obs)
        for offer in obs.offers_received or ():
            verdict = self.judge(
                obs, offer.sender, offer.side, offer.blocks, offer.price, offer.delivery_round
            )
            if verdict is True:
                return AcceptOffer(offer_id=offer.offer_id)
            if verdict is False:
                return RejectOffer(offer_id=offer.offer_id)
        return self.initiate(obs)

    def observe(self, obs: Observation) -> None:
        """Update memory from the observation (default: nothing)."""

    def judge(
        self, obs: Observation, sender: str, side: str, blocks: int, price: float, delivery: int
    ) -> bool | None:
        """True: accept, False: reject, None: leave the offer open."""
        return None

    def initiate(self, obs: Observation) -> ActionModel:
        return WAIT

    def bid(self, obs: Observation) -> Bid:
        return schedule(marginal_values(obs), obs)

    def can_sell(self, obs: Observation, blocks: int, delivery: int) -> bool:
        return delivery == obs.round and blocks <= _spare(obs)


class CooperativeBidder(_Archetype):
    """Accepts fair offers and joins coalitions.

    Rule: an offer to sell it blocks is accepted when the price per block is at most its value of
    the next block (a trade that does not hurt it); an offer to buy its blocks this round is
    accepted when it has the blocks spare and the price per block is at least the known price
    floor. Anything else is rejected. It commits to every coalition it is invited to, paying 10 %
    of its budget into the pool; offers one spare block at the fair price (the last revealed
    clearing price, else the floor) to the next active lab; bids its values.
    """

    name = "cooperative"

    def judge(
        self, obs: Observation, sender: str, side: str, blocks: int, price: float, delivery: int
    ) -> bool | None:
        per = _per_block(price, blocks)
        if side == "sell":
            return per <= _value(obs) + 1e-9 and price <= (obs.budget or 0.0)
        return self.can_sell(obs, blocks, delivery) and per >= price_floor(obs) - 1e-9

    def initiate(self, obs: Observation) -> ActionModel:
        for c in obs.coalitions or ():
            if obs.seat in c.invited:
                share = int((obs.budget or 0.0) * 10) / 100  # 10 %, rounded down to the cent
                return CommitToCoalition(coalition_id=c.coalition_id, contribution=share)
        others = [s for s in obs.active_labs if s != obs.seat]
        if _spare(obs) and others and not obs.offers_sent:
            to = min(others, key=lambda s: (lab_index(s) <= lab_index(obs.seat), lab_index(s)))
            return SendOffer(to=to, blocks=1, price=round(_fair_price(obs), 2))
        return WAIT


class SelfishBidder(_Archetype):
    """Never accepts an offer worse than its value; never joins a coalition.

    Rule (``margin`` m, default 0.2): it buys only at a price per block at most ``(1 - m)`` x its
    value of the next block, and sells only spare blocks at a price per block at least
    ``(1 + m)`` x the fair price (the last revealed clearing price, else the floor); every
    other offer, and every coalition invitation, is ignored. It bids its values shaded by ``m``.
    """

    name = "selfish"

    def __init__(self, margin: float | str = 0.2) -> None:
        self.margin = float(margin)
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {margin!r}")
        super().__init__()

    def judge(
        self, obs: Observation, sender: str, side: str, blocks: int, price: float, delivery: int
    ) -> bool | None:
        per = _per_block(price, blocks)
        if side == "sell":
            ok = per <= (1 - self.margin) * _value(obs) and price <= (obs.budget or 0.0)
        else:
            ok = self.can_sell(obs, blocks, delivery) and per >= (1 + self.margin) * _fair_price(
                obs
            )
        return True if ok else None

    def bid(self, obs: Observation) -> Bid:
        return schedule([v * (1 - self.margin) for v in marginal_values(obs)], obs)


class DeadlinePanickedBidder(_Archetype):
    """Overpays more and more as its earliest deadline nears.

    Rule (``panic`` p, default 1.0): with ``d`` rounds left before its earliest live deadline
    (0 in the deadline round), it is willing to pay ``f = 1 + p / (1 + d)`` times its value of
    a block: ``2 x`` value in the deadline round, ``1.5 x`` one round before, ``1.33 x`` two
    before. It bids ``f`` x its values, accepts any offer to sell it blocks at a price per block
    up to ``f`` x value, and sends the first active lab an offer to buy one block at that price.
    """

    name = "deadline_panicked"

    def __init__(self, panic: float | str = 1.0) -> None:
        self.panic = float(panic)
        if self.panic < 0:
            raise ValueError(f"panic must be at least 0, got {panic!r}")
        super().__init__()

    def factor(self, obs: Observation) -> float:
        live = [j.deadline for j in obs.jobs or () if j.status == "active"]
        if not live:
            return 1.0
        return 1.0 + self.panic / (1 + max(0, min(live) - obs.round))

    def judge(
        self, obs: Observation, sender: str, side: str, blocks: int, price: float, delivery: int
    ) -> bool | None:
        if side != "sell":
            return None
        per = _per_block(price, blocks)
        return per <= self.factor(obs) * _value(obs) + 1e-9 and price <= (obs.budget or 0.0)

    def initiate(self, obs: Observation) -> ActionModel:
        others = [s for s in obs.active_labs if s != obs.seat]
        price = round(self.factor(obs) * _value(obs), 2)
        if _need(obs) and others and not obs.offers_sent and 0 < price <= (obs.budget or 0.0):
            return SendOffer(to=min(others, key=lab_index), side="buy", blocks=1, price=price)
        return WAIT

    def bid(self, obs: Observation) -> Bid:
        f = self.factor(obs)
        return schedule([v * f for v in marginal_values(obs)], obs)


class DeceptiveBidder(_Archetype):
    """Misstates its needs in public messages; otherwise trades and bids like ``cooperative``.

    Rule: once per round, its first negotiation turn, it tells everyone the opposite of the truth
    about its need: when its jobs still need blocks it says it needs none (to damp the price);
    when they need none it claims it needs ``spare + 3`` blocks urgently (to lift the price of
    its spare blocks). The number it states never equals its true need.
    """

    name = "deceptive"

    def clear(self) -> None:
        self.told: set[int] = set()
        self.honest = CooperativeBidder()

    def claim(self, obs: Observation) -> int:
        """The need it states: never its true need."""
        return 0 if _need(obs) else _spare(obs) + 3

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase == "negotiation" and obs.round not in self.told:
            self.told.add(obs.round)
            claim = self.claim(obs)
            text = (
                "We have all the compute we need: 0 more blocks wanted."
                if claim == 0
                else f"Urgent: our jobs need {claim} more blocks this round."
            )
            return SendMessage(to="all", text=text)
        return self.honest.act(obs)


class RetaliatoryBidder(_Archetype):
    """Cooperative, except toward labs that wronged it, which it punishes, then forgives.

    Rule: a lab *wrongs* it when (a) it turns down an offer it sent them: the offer leaves
    ``offers_sent`` before its last round with no trade (no budget change of its price, no new
    contract; it only ever offers blocks it can deliver, so the offer was not void); or (b) it breaches a forward
    contract with it: the seller's public reputation falls in the round the contract was due;
    or (c) its :class:`~agents.population.trust.TrustLedger` sees a wrong by the lab: its public
    reputation falls (the market's audit of false claims and broken promises, a breach, a
    coalition left early) or it leaves a coalition of ours early. Each wrong (re)starts a punishment of ``forgive_after`` rounds (default 2): until round
    ``wronged + forgive_after`` it rejects every offer from that lab and sends it none. Offers
    from every other lab are judged as ``cooperative`` judges them: fair ones are accepted.
    """

    name = "retaliatory"

    def __init__(self, forgive_after: int | str = 2) -> None:
        self.forgive_after = as_count(forgive_after, "forgive_after", 1)
        super().__init__()

    def clear(self) -> None:
        self.until: dict[str, int] = {}  # seat -> first round it is forgiven
        self.sent: list[tuple[str, str, float, int]] = []  # its offers: (to, side, price, round)
        self.seen_budget: float | None = None
        self.contracts: set[tuple[str, str, int, float, int]] = set()
        self.due: dict[int, set[str]] = {}  # round -> sellers of its contracts due then
        self.reputations: dict[str, float] = {}
        self.fair = CooperativeBidder()
        self.ledger = TrustLedger()
        self.wrongs_read = 0  # the ledger's wrongs it has acted on

    def punished(self, seat: str, now: int) -> bool:
        return self.until.get(seat, -1) > now

    def wronged(self, seat: str, now: int) -> None:
        self.until[seat] = now + self.forgive_after

    def observe(self, obs: Observation) -> None:
        now, budget = obs.round, obs.budget or 0.0
        contracts = {
            (c.seller, c.buyer, c.blocks, c.price, c.delivery_round) for c in obs.contracts or ()
        }
        new = contracts - self.contracts
        still_open = {(o.recipient, o.side, o.price) for o in obs.offers_sent or ()}
        for sent in list(self.sent):
            to, side, price, expiry = sent
            if (to, side, price) in still_open:
                continue
            self.sent.remove(sent)
            paid = self.seen_budget is None or abs(abs(budget - self.seen_budget) - price) < 1e-6
            traded = paid or any(c[0 if side == "buy" else 1] == to for c in new)
            if not traded and expiry >= now:
                self.wronged(to, now)
        for seller in self.due.pop(now - 1, set()):
            if obs.reputations.get(seller, 0.0) < self.reputations.get(seller, 0.0) - 1e-9:
                self.wronged(seller, now)  # its reputation fell when our contract was due
        for seller, buyer, _, _, delivery in new:
            if buyer == obs.seat:
                self.due.setdefault(delivery, set()).add(seller)
        self.contracts |= contracts
        self.reputations = dict(obs.reputations)
        self.seen_budget = budget
        self.ledger.observe(obs)
        for _, lab, _ in self.ledger.wrongs[self.wrongs_read :]:
            self.wronged(lab, now)
        self.wrongs_read = len(self.ledger.wrongs)

    def judge(
        self, obs: Observation, sender: str, side: str, blocks: int, price: float, delivery: int
    ) -> bool | None:
        if self.punished(sender, obs.round):
            return False
        return self.fair.judge(obs, sender, side, blocks, price, delivery)

    def initiate(self, obs: Observation) -> ActionModel:
        others = [s for s in obs.active_labs if s != obs.seat and not self.punished(s, obs.round)]
        if _spare(obs) and others and not obs.offers_sent:
            to = min(others, key=lambda s: (lab_index(s) <= lab_index(obs.seat), lab_index(s)))
            return SendOffer(to=to, blocks=1, price=round(_fair_price(obs), 2))
        return WAIT

    def act(self, obs: Observation) -> ActionModel:
        action = super().act(obs)
        if obs.phase == "negotiation":
            self.seen_budget = obs.budget or 0.0  # what it acted on (its own accept moves credits)
            if isinstance(action, AcceptOffer):  # its own trade: offers closing now get the doubt
                self.seen_budget = None
            if isinstance(
                action, SendOffer
            ):  # one open offer at a time: (to, side, price) names it
                self.sent.append((action.to, action.side, action.price, obs.round))
        return action


class ReciprocalBidder(_Archetype):
    """Bids its true values; trades and joins coalitions, but only with labs it trusts.

    Rule: it keeps a :class:`~agents.population.trust.TrustLedger` of every other lab (from its
    own observations) and deals only with trusted labs (trust at least the ledger's threshold),
    at the price margin of their record (:func:`~agents.population.trust.record_margin`, 0 for
    a good record). An offer from a lab it does not trust is rejected. From a trusted lab, an
    offer to sell it blocks is accepted when the price per block is at most its value of the
    next block less the margin (``value x (1 - margin)``) and within its budget; an offer to buy
    its blocks this round when it has them spare and the price per block is at least the floor
    plus the margin (``floor x (1 + margin)``); anything else is rejected. It commits to a
    coalition invitation when its jobs still need blocks and every member and the leader are
    trusted, paying 10 % of its budget into the pool. Otherwise, with a spare block and no offer
    out, it offers one block at the fair price (the last revealed clearing price, else the
    floor) plus the margin to a trusted lab: first those that kept their word to it (most kept
    first), then the next lab after itself. It bids its values (``truthful``).
    """

    name = "reciprocal"

    def clear(self) -> None:
        self.ledger = TrustLedger()

    def observe(self, obs: Observation) -> None:
        self.ledger.observe(obs)

    def judge(
        self, obs: Observation, sender: str, side: str, blocks: int, price: float, delivery: int
    ) -> bool | None:
        if not self.ledger.trusted(sender):
            return False
        per, margin = _per_block(price, blocks), self.ledger.margin(sender)
        if side == "sell":
            return per <= _value(obs) * (1.0 - margin) + 1e-9 and price <= (obs.budget or 0.0)
        return (
            self.can_sell(obs, blocks, delivery) and per >= price_floor(obs) * (1.0 + margin) - 1e-9
        )

    def initiate(self, obs: Observation) -> ActionModel:
        for c in obs.coalitions or ():
            if (
                obs.seat in c.invited
                and _need(obs) > 0
                and all(self.ledger.trusted(m) for m in (c.leader, *c.members) if m != obs.seat)
            ):
                share = int((obs.budget or 0.0) * 10) / 100  # 10 %, rounded down to the cent
                return CommitToCoalition(coalition_id=c.coalition_id, contribution=share)
        others = [s for s in obs.active_labs if s != obs.seat and self.ledger.trusted(s)]
        if _spare(obs) and others and not obs.offers_sent:
            to = min(
                others,
                key=lambda s: (
                    -self.ledger.kept(s),
                    lab_index(s) <= lab_index(obs.seat),
                    lab_index(s),
                ),
            )
            price = round(_fair_price(obs) * (1.0 + self.ledger.margin(to)), 2)
            return SendOffer(to=to, blocks=1, price=price)
        return WAIT

    def bid(self, obs: Observation) -> Bid:
        return truthful_bid(obs)


ARCHETYPES: tuple[type[_Archetype], ...] = (
    CooperativeBidder,
    SelfishBidder,
    DeadlinePanickedBidder,
    DeceptiveBidder,
    RetaliatoryBidder,
)
