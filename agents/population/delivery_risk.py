"""Delivery risk for bidders: how many blocks a lab can promise forward when owned blocks fail,
how many it must hold to deliver what it owes, and the ``short_seller`` that prices none of it.

Owned blocks fail independently at a round's close with probability ``p`` (docs/world.md,
Delivery risk), so of ``h`` blocks held, ``X ~ Binomial(h, 1 - p)`` survive to be delivered. A
lab that must deliver ``c`` blocks delivers them all with probability ``P(X >= c)``, and is short
by ``E[max(0, c - X)]`` blocks on average.

The expected-cost arithmetic the rule expert hedges with:

* **Selling forward.** Each block short at delivery costs the seller ``loss`` = the refund of its
  price per block plus the withdrawal penalty (plus the compensation, on a short sale). Promising
  one more block, the ``(c + 1)``-th, raises the expected shortfall by
  ``E[max(0, c + 1 - X)] - E[max(0, c - X)] = P(X <= c)``, the probability that block is the one
  missing. The sale pays ``ask`` at once, so it is worth making iff
  ``ask > loss x P(X <= c)`` (:func:`forward_sale_blocks`). A confidence rule ("deliver all
  with probability 0.95") ignores the price: it refuses sales that pay at 3 % failure and its
  breaches never happen, though they are priced.
* **Covering a forward sale.** In the delivery round, each block held beyond ``h`` is worth
  ``loss x (E[max(0, c - X_h)] - E[max(0, c - X_{h+1})]) = loss x (1 - p) x P(X_h < c)``
  (:func:`cover_values`).
* **Covering a job.** A job without partial credit due this round that needs ``n`` more blocks
  completes only if ``n`` of the blocks held for it survive the close (and then run): the
  ``k``-th block beyond ``n`` is worth ``V x (P(X_{n+k} >= n) - P(X_{n+k-1} >= n))`` with ``V``
  the job's value times the chance its ``n`` blocks all run (:func:`completion_cover_values`).
  A job with partial credit loses only the value per block of each missing block, which
  :func:`cover_values` prices with ``loss`` = that value.
"""

from __future__ import annotations

import functools
import math

from agents.population.common import StatefulAgent, last_price, price_floor, schedule
from agents.scripted import WAIT
from market.core.actions import ActionModel, Bid, CommitToCoalition, SendOffer
from market.environment import Observation, marginal_values

MAX_HOLD = 1000  # blocks_to_hold searches no further


@functools.lru_cache(maxsize=4096)
def survive_at_least(held: int, need: int, p: float) -> float:
    """``P(Binomial(held, 1 - p) >= need)``: all ``need`` blocks survive out of ``held``."""
    if need <= 0:
        return 1.0
    if need > held:
        return 0.0
    q = 1.0 - p
    return math.fsum(math.comb(held, k) * q**k * p ** (held - k) for k in range(need, held + 1))


@functools.lru_cache(maxsize=4096)
def deliverable(held: int, committed: int, p: float, confidence: float) -> int:
    """The most extra blocks ``n`` (at most ``held - committed``) a lab holding ``held`` blocks,
    ``committed`` of them already promised, can promise so that it delivers all
    ``committed + n`` with probability at least ``confidence``."""
    n = max(0, held - committed)
    while n > 0 and survive_at_least(held, committed + n, p) < confidence:
        n -= 1
    return n


@functools.lru_cache(maxsize=4096)
def expected_shortfall(held: int, owed: int, p: float) -> float:
    """``E[max(0, owed - Binomial(held, 1 - p))]``: the blocks it expects to be short by."""
    if owed <= 0:
        return 0.0
    q = 1.0 - p
    return math.fsum(
        math.comb(held, k) * q**k * p ** (held - k) * (owed - k) for k in range(min(held, owed) + 1)
    )


def cover_values(held: int, owed: int, p: float, loss: float, most: int) -> list[float]:
    """The value of each extra block held beyond ``held`` (at most ``most``), when every block
    short of ``owed`` costs ``loss``: the drop in expected shortfall cost it buys. The values
    fall with each block (a block is pivotal less often), so they form a valid bid schedule;
    values under 0.01 credits are left out."""
    values = []
    before = expected_shortfall(held, owed, p)
    for k in range(1, most + 1):
        after = expected_shortfall(held + k, owed, p)
        value = round(loss * (before - after), 2)
        if value < 0.01:
            break
        values.append(value)
        before = after
    return values


@functools.lru_cache(maxsize=4096)
def forward_sale_blocks(held: int, owed: int, p: float, ask: float, loss: float, most: int) -> int:
    """The most extra blocks ``n <= most`` worth promising for a round in which the lab holds
    ``held`` blocks and already owes ``owed``, at ``ask`` credits per block, when each block
    short at delivery costs ``loss``: the ``k``-th is worth selling iff
    ``ask > loss x P(Binomial(held, 1 - p) <= owed + k - 1)`` (the module doc). That
    probability grows with ``k``, so the blocks worth selling are the first ``n``."""
    n = 0
    while n < most and ask > loss * (1.0 - survive_at_least(held, owed + n + 1, p)) + 1e-9:
        n += 1
    return n


def completion_cover_values(need: int, p: float, value: float, most: int) -> list[float]:
    """The value of each block held beyond ``need`` (at most ``most``) for a job worth ``value``
    that completes only if ``need`` of its blocks survive: the rise in the chance of that,
    ``P(Binomial(need + k, 1 - p) >= need) - P(Binomial(need + k - 1, 1 - p) >= need)``, times
    ``value``. Highest first, values under 0.01 credits left out."""
    values = []
    before = survive_at_least(need, need, p)
    for k in range(1, most + 1):
        after = survive_at_least(need + k, need, p)
        values.append(round(value * (after - before), 2))
        before = after
    return sorted((v for v in values if v >= 0.01), reverse=True)


def blocks_to_hold(owed: int, p: float, confidence: float) -> int:
    """The fewest blocks to hold so that ``owed`` of them survive with probability at least
    ``confidence`` (``owed`` itself when ``p`` is 0; capped at :data:`MAX_HOLD`)."""
    if owed <= 0:
        return 0
    if p >= 1.0:
        return MAX_HOLD
    h = owed
    while h < MAX_HOLD and survive_at_least(h, owed, p) < confidence:
        h += 1
    return h


def failure_rate_at(obs: Observation, t: int) -> float:
    """The probability an owned block for round ``t`` fails, as far as the seat knows: this
    round's rate for ``t = now``; later, the base rate plus the exposures to the outages and
    reliability drops it knows of for ``t``."""
    d = obs.delivery
    if d is None:
        return 0.0
    if t == obs.round:
        return d.failure_rate
    outage = drop = 0.0
    for s in obs.shocks:
        if s.round <= t < s.round + s.duration:
            if s.kind == "capacity_outage":
                outage = 1.0 - (1.0 - outage) * (1.0 - min(1.0, s.magnitude))
            elif s.kind == "reliability_drop":
                drop += s.magnitude
    p = d.base_failure_rate + d.outage_exposure * outage + d.reliability_exposure * drop
    return min(1.0, max(0.0, p))


def owed(obs: Observation, t: int) -> tuple[int, float]:
    """Blocks the seat has sold forward for round ``t`` and their total price."""
    blocks, price = 0, 0.0
    for c in obs.contracts or ():
        if c.seller == obs.seat and c.delivery_round == t:
            blocks += c.blocks
            price += c.price
    return blocks, price


class ShortSeller(StatefulAgent):
    """Sells forward blocks it does not own, to every other lab, for the next two rounds.

    Each negotiation turn it sends one ``short`` sell offer of :attr:`BLOCKS` blocks for round
    ``now + 1`` or ``now + 2`` at the last revealed clearing price per block (the price floor
    before any), to a lab it has not offered that delivery round this round, while its budget
    plus the price covers the collateral. In the bidding phase it bids its jobs' values
    (``truthful``) and, for the blocks it owes this round beyond those it holds, the price per
    block it sold them at: a naive cover that ignores that owned blocks can fail and that the
    auction may clear above its price. It never sells what it owns and never hedges.

    It also commits to every coalition it is invited to, contributing a tenth of its budget (at
    most :attr:`CONTRIBUTION`) and pledging :attr:`BLOCKS` blocks per round of the term that it
    does not own (market.core.pledges): it defaults unless it happens to hold them.
    """

    name = "short_seller"
    BLOCKS = 2
    CONTRIBUTION = 20.0

    def clear(self) -> None:
        self.offered: set[tuple[int, str, int]] = set()

    def _offer(self, obs: Observation) -> ActionModel | None:
        d = obs.delivery
        if d is None or not d.short_sales or "send_offer" not in obs.legal_actions:
            return None
        if len(obs.offers_sent or ()) >= 8:
            return None
        last = last_price(obs)
        ask = max(price_floor(obs), last if last is not None else 0.0, 1.0)
        price = round(ask * self.BLOCKS, 2)
        collateral = d.collateral_fraction * price + d.collateral_per_block * self.BLOCKS
        if (obs.budget or 0.0) + price < collateral + 1e-6:
            return None
        others = [s for s in obs.active_labs if s != obs.seat]
        for t in range(obs.round + 1, min(obs.round + 3, obs.rounds_total)):
            for other in others:
                key = (obs.round, other, t)
                if key in self.offered:
                    continue
                self.offered.add(key)
                return SendOffer(
                    to=other,
                    side="sell",
                    blocks=self.BLOCKS,
                    price=price,
                    delivery_round=t,
                    short=True,
                    message=f"{self.BLOCKS} block(s) for round {t}",
                )
        return None

    def _join(self, obs: Observation) -> ActionModel | None:
        """Commit to the first coalition invitation, pledging blocks it does not own."""
        if "commit_to_coalition" not in obs.legal_actions:
            return None
        for c in obs.coalitions or ():
            if obs.seat in c.invited and c.status != "dissolved":
                contribution = round(min((obs.budget or 0.0) * 0.1, self.CONTRIBUTION), 2)
                return CommitToCoalition(
                    coalition_id=c.coalition_id,
                    contribution=contribution,
                    pledge_blocks=self.BLOCKS,
                )
        return None

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase == "negotiation":
            return self._join(obs) or self._offer(obs) or WAIT
        if obs.phase != "bidding":
            return WAIT
        blocks, price = owed(obs, obs.round)
        held = (obs.holdings or [0])[0]
        cover = [price / blocks] * max(0, blocks - held) if blocks else []
        values = marginal_values(obs) + cover
        return schedule(values, obs) if values else Bid(bids=[])
