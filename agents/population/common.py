"""Shared bidding helpers of the built-in population: spec-parameter parsing, market readings
(reserve, price floor, unit limit, last price), the bid schedule, the stateful agent base and
Bayes-Nash shading (equilibrium bid, value-range estimate)."""

from __future__ import annotations

import math

from agents.base import BaseAgent
from market.core.actions import Bid
from market.core.mechanisms import first_price_equilibrium_bid
from market.environment import Observation, affordable

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
    """A valid bid for non-increasing unit ``values``: unit limit and budget respected (built
    with :meth:`Bid.trusted`: :func:`affordable` makes a valid schedule of plain numbers)."""
    return Bid.trusted(affordable(sorted(values, reverse=True), obs.budget or 0.0, unit_limit(obs)))


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
