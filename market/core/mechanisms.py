"""Mechanisms: what the designer chooses, and how a round's primary auction clears.

The designer's action is a :class:`Mechanism`. Its field names and values are the DAEDALUS
designer's JSON, so a designer trained there fills our seat unchanged; ``judge_pool_share`` is ours.

Clearing (:func:`clear`) is a pure function of a bid matrix: row ``i`` holds lab ``i``'s
non-increasing marginal bids, one per block wanted, padded with ``-1`` (any negative entry means
"no bid for this unit").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

AuctionType = Literal["first_price", "second_price", "vcg", "fair_share", "posted_price"]
CoalitionPolicy = Literal["allow", "restrict", "penalize_suspected", "penalize_confirmed"]
AUCTION_TYPES: tuple[AuctionType, ...] = get_args(AuctionType)
COALITION_POLICIES: tuple[CoalitionPolicy, ...] = get_args(CoalitionPolicy)
#: the auction types DAEDALUS's designer can choose: first_price, second_price and vcg (the first
#: three of AuctionType; fair_share and posted_price are this market's own)
DAEDALUS_AUCTION_TYPES: tuple[AuctionType, ...] = AUCTION_TYPES[:3]


class Mechanism(BaseModel):
    """The market rules in force for a round. Every field changes outcomes (see tests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    auction_type: AuctionType = Field(
        "second_price",
        description="first_price: pay-as-bid; second_price: uniform price = highest rejected bid "
        "(or the reserve); vcg: each winner pays its externality; fair_share: max-min fair split "
        "of capacity by stated demand at the reserve; posted_price: reserve price, rationed by lottery.",
    )
    reserve_price: float = Field(
        0.0, ge=0.0, le=1e9, description="No block sells below it (credits per block)."
    )
    reveal_reserve: bool = Field(True, description="Bidders see the reserve price before bidding.")
    reveal_competing_bids: bool = Field(
        False,
        description="After clearing, bidders see every bid schedule (anonymised unless winner identities are revealed).",
    )
    reveal_winner_identity: bool = Field(
        True, description="After clearing, bidders see who won how many blocks."
    )
    reveal_clearing_price: bool = Field(
        True, description="After clearing, bidders see the clearing price."
    )
    reveal_bid_distribution: bool = Field(
        False, description="After clearing, bidders see summary statistics of all bids."
    )
    shill_penalty: float = Field(
        0.0,
        ge=0.0,
        le=1e9,
        description="Credits charged per block of a detected shill bid (bids beyond a lab's true need that set the price or win idle blocks).",
    )
    withdrawal_penalty: float = Field(
        0.0,
        ge=0.0,
        le=1e9,
        description="Credits charged per block undelivered on a forward contract, and per breach of a coalition commitment.",
    )
    collusion_penalty: float = Field(
        0.0,
        ge=0.0,
        le=1e9,
        description="Credits charged to each member of a detected cartel, per round, when the coalition policy penalises it.",
    )
    coalition_policy: CoalitionPolicy = Field(
        "allow",
        description="allow: declared coalitions may bid jointly, no collusion penalties; restrict: joint bids "
        "are forbidden; penalize_suspected / penalize_confirmed: undeclared cartels are charged "
        "collusion_penalty once their suspicion score reaches the suspected / confirmed threshold.",
    )
    judge_pool_share: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Fraction of the round's capacity granted free by the judge to the strongest pitches instead of auctioned.",
    )


@dataclass(slots=True)
class Clearing:
    """The outcome of one auction.

    ``alloc[i]`` blocks go to bidder ``i`` who pays ``payments[i]`` credits in total.
    ``won[i, k]`` says whether bidder ``i``'s ``k``-th unit bid won (fair_share and posted_price
    mark a bidder's first ``alloc[i]`` units). ``price`` is the uniform price for second_price,
    fair_share and posted_price, and the mean price per block sold for first_price and vcg; it is
    the reserve when nothing sells. ``price_setter`` is the bidder whose rejected bid set a
    second_price/vcg price, or -1 when the reserve (or nothing) set it.
    """

    alloc: NDArray[np.int64]
    payments: np.ndarray  # float64 (numpy's stubs type bincount's weighted sums loosely)
    won: NDArray[np.bool_]
    price: float
    price_setter: int


# --------------------------------------------------------------------------------------------
# Clearing engine
# --------------------------------------------------------------------------------------------
#
# Conventions shared by every mechanism below:
#
# * A unit bid ``bids[i, k]`` is *eligible* when it is non-negative and at least the reserve.
#   Because rows are non-increasing, a bidder's eligible units are a prefix of its row and its
#   *stated demand* ``d_i`` is the length of that prefix.
# * The *rank order* of eligible unit bids is: higher bid first, then lower ``priority``, then
#   lower unit index ``k``, then lower bidder index ``i`` (the last key only makes the order total).
#   The auctions (first_price, second_price, vcg) sell the ``K`` best-ranked eligible units; the
#   remaining eligible units are *rejected*.

_MONOTONE_RTOL = 1e-9  # rows may rise by this relative amount (float noise in marginal values)


@dataclass(frozen=True, slots=True)
class _Book:
    """A validated bid matrix with its eligibility mask and stated demands."""

    bids: NDArray[np.float64]  # (n, m)
    capacity: int
    reserve: float
    priority: NDArray[np.int64]  # (n,)
    eligible: NDArray[np.bool_]  # (n, m)
    demand: NDArray[np.int64]  # (n,), eligible units per bidder

    @property
    def n(self) -> int:
        return int(self.bids.shape[0])


def _validate(bids: np.ndarray, capacity: int, reserve: float, priority: np.ndarray) -> _Book:
    """Check the inputs of :func:`clear` and precompute eligibility, raising clear ValueErrors."""
    b = np.asarray(bids, dtype=np.float64)
    if b.ndim != 2:
        raise ValueError(f"bids must be a 2-D (n_bidders, n_units) array, got shape {b.shape}")
    n = b.shape[0]
    if not (b < np.inf).all():  # False exactly for NaN and +inf (one pass over the matrix)
        raise ValueError("bids must not contain NaN or +inf (use a negative entry for 'no bid')")
    # Rows must be non-increasing once every negative entry is read as the same "no bid".
    clean = np.where(b < 0, -1.0, b)
    before = clean[:, :-1]
    rise = clean[:, 1:] - before
    tolerance = np.maximum(before, 1.0)  # = max(1, |before|), as before >= -1
    tolerance *= _MONOTONE_RTOL
    bad = rise > tolerance
    if bad.any():
        i, k = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(
            f"bid rows must be non-increasing with padding (negatives) at the end: bidder {i} "
            f"bids {b[i, k]!r} for unit {k} but {b[i, k + 1]!r} for unit {k + 1}"
        )

    if isinstance(capacity, bool | np.bool_):
        raise ValueError(f"capacity must be a non-negative integer, got {capacity!r}")
    try:
        cap = int(capacity) if float(capacity).is_integer() else None
    except (TypeError, ValueError, OverflowError):
        cap = None
    if cap is None or cap < 0:
        raise ValueError(f"capacity must be a non-negative integer, got {capacity!r}")

    try:
        res = float(reserve)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reserve must be a finite number >= 0, got {reserve!r}") from exc
    if not np.isfinite(res) or res < 0:
        raise ValueError(f"reserve must be a finite number >= 0, got {reserve!r}")

    pr = np.asarray(priority)
    if pr.shape != (n,):
        raise ValueError(f"priority must have shape ({n},) (one per bid row), got {pr.shape}")
    integral = pr.dtype.kind in "iu" or (
        pr.dtype.kind in "fb" and bool(np.all(np.isfinite(pr) & (np.mod(pr, 1) == 0)))
    )
    if not integral:
        raise ValueError(f"priority must hold integers, got {pr.dtype} values")
    pr = pr.astype(np.int64)

    eligible = (b >= res) & (b >= 0.0)
    return _Book(b, cap, res, pr, eligible, eligible.sum(axis=1).astype(np.int64))


def _ranked_units(book: _Book) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eligible unit bids in rank order: ``(bidder, unit index, bid)``, best first."""
    n, m = book.bids.shape
    by_priority = np.argsort(book.priority, kind="stable")
    ranked_priority = book.priority[by_priority]
    if not (ranked_priority[1:] == ranked_priority[:-1]).any():
        # distinct priorities: listing the units row by row in priority order puts them in tie
        # order, so one stable sort by value ranks them (about 3x faster than the general case)
        at, cols = np.nonzero(book.eligible[by_priority])
        rows = by_priority[at]
        values = book.bids[rows, cols]
        order = np.argsort(-values, kind="stable")
        return rows[order], cols[order], values[order]
    rows, cols = np.nonzero(book.eligible)
    values = book.bids[rows, cols]
    _, level = np.unique(book.priority, return_inverse=True)  # dense priority ranks 0..n-1
    if n * n * max(m, 1) < 2**62:
        # the three tie-break keys (priority, unit, bidder) packed into one unique integer
        tie = (level[rows].astype(np.int64) * m + cols) * n + rows
        order = _by_value_then_tie(values, tie)
    else:
        order = np.lexsort((rows, cols, book.priority[rows], -values))
    return rows[order], cols[order], values[order]


def _by_value_then_tie(values: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """Indices ordering ``values`` from high to low, equal values by ``tie`` (unique) ascending.

    One plain (unstable) sort by value, then only the runs of equal values are re-sorted by
    ``tie``: bids rarely tie exactly, so this costs about a third of a two-key stable sort at
    10^5 unit bids, and at worst (every bid equal) one more sort of the tied ones.
    """
    order = np.argsort(-values)
    ranked = values[order]
    same = ranked[1:] == ranked[:-1]  # position k+1 continues the run of position k
    if same.any():
        tied = np.zeros(ranked.size, dtype=bool)
        tied[1:] |= same
        tied[:-1] |= same
        where = np.flatnonzero(tied)
        run = np.cumsum(np.concatenate(([True], ~same)))[where]  # run number of each position
        members = order[where]
        order[where] = members[np.lexsort((tie[members], run))]
    return order


def _prefix_won(book: _Book, alloc: np.ndarray) -> np.ndarray:
    """Mark each bidder's first ``alloc[i]`` eligible units as won."""
    return book.eligible & (np.cumsum(book.eligible, axis=1) <= alloc[:, None])


def _nothing_sold(book: _Book) -> Clearing:
    return Clearing(
        alloc=np.zeros(book.n, dtype=np.int64),
        payments=np.zeros(book.n, dtype=np.float64),
        won=np.zeros(book.bids.shape, dtype=bool),
        price=book.reserve,
        price_setter=-1,
    )


def _auction_allocation(
    book: _Book,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Top-``K`` allocation shared by the three auctions.

    Returns ``(alloc, won, win_rows, win_values, rej_rows, rej_values)`` where the ``rej_*`` arrays
    list the rejected eligible unit bids in rank order.
    """
    rows, cols, values = _ranked_units(book)
    sold = min(book.capacity, values.size)
    alloc = np.bincount(rows[:sold], minlength=book.n).astype(np.int64)
    won = np.zeros(book.bids.shape, dtype=bool)
    won[rows[:sold], cols[:sold]] = True
    return alloc, won, rows[:sold], values[:sold], rows[sold:], values[sold:]


def _clear_first_price(book: _Book) -> Clearing:
    """Discriminatory (pay-as-bid) auction.

    The ``K`` highest eligible unit bids win and every winning unit pays its own bid, so bidder
    ``i`` pays ``sum_k won[i, k] * b[i, k]``. Bidding one's value earns zero surplus, so rational
    bidders shade their bids (see :func:`first_price_equilibrium_bid`). The reported price is the
    average price per block sold.
    """
    alloc, won, win_rows, win_values, _, _ = _auction_allocation(book)
    sold = int(alloc.sum())
    if sold == 0:
        return _nothing_sold(book)
    payments = np.bincount(win_rows, weights=win_values, minlength=book.n)
    return Clearing(alloc, payments, won, math.fsum(payments.tolist()) / sold, -1)


def _clear_second_price(book: _Book) -> Clearing:
    """Uniform-price auction at the highest rejected bid (the multi-unit Vickrey price rule).

    The ``K`` highest eligible unit bids win and every block sells at the same price
    ``p = max(reserve, b_(K+1))``, where ``b_(K+1)`` is the highest rejected eligible bid (the
    ``(K+1)``-th highest eligible bid). With unit demand this is the Vickrey auction and bidding
    one's value is a dominant strategy; with multi-unit demand a bidder's own rejected bid can set
    its price, which rewards demand reduction. ``price_setter`` is the owner of ``b_(K+1)`` when it
    exceeds the reserve, else -1.
    """
    alloc, won, _, _, rej_rows, rej_values = _auction_allocation(book)
    sold = int(alloc.sum())
    if sold == 0:
        return _nothing_sold(book)
    price, setter = book.reserve, -1
    if rej_values.size and rej_values[0] > book.reserve:
        price, setter = float(rej_values[0]), int(rej_rows[0])
    return Clearing(alloc, alloc * price, won, price, setter)


def _vcg_payments(
    winners: np.ndarray,
    units: np.ndarray,
    rej_rows: np.ndarray,
    rej_values: np.ndarray,
    capacity: int,
    reserve: float,
) -> np.ndarray:
    """For each winner ``i`` taking ``units[i]`` blocks, the sum of the ``units[i]`` highest
    values in ``{rejected eligible bids of others} U {reserve} * capacity``.

    Vectorised: ``R`` is the rank-ordered list of rejected bids. For winner ``i`` with own rejected
    bids at positions ``P_0 < P_1 < ...`` of ``R``, exactly ``P_j - j`` bids of others precede
    ``P_j``; so with ``c = #{j : P_j - j < k}`` the prefix ``R[:k + c]`` holds ``k`` bids of others
    and ``c`` of ``i``'s own. One searchsorted over all bidders' ``P_j - j`` (offset per bidder so
    the keys stay sorted) finds every ``c`` at once.
    """
    n_rej = rej_values.size
    prefix = np.concatenate(([0.0], np.cumsum(rej_values)))
    # Bidders are grouped in the order of their best rejected bid in R, not by row number: R's
    # order does not depend on how the rows were listed, so neither do the cumulative sums below
    # (bit for bit; a row order would make each group's float sums depend on the groups before).
    n_rows = int(max(rej_rows.max(initial=-1), winners.max(initial=-1))) + 1
    first = np.full(n_rows, n_rej, dtype=np.int64)
    np.minimum.at(first, rej_rows, np.arange(n_rej))
    group = np.empty(n_rows, dtype=np.int64)  # each row's rank by its first position in R
    group[np.argsort(first, kind="stable")] = np.arange(n_rows)
    by_owner = np.argsort(group[rej_rows], kind="stable")  # positions in R, grouped, ascending
    owner_sorted = group[rej_rows][by_owner]
    own_prefix = np.concatenate(([0.0], np.cumsum(rej_values[by_owner])))
    group_start = np.searchsorted(owner_sorted, owner_sorted, side="left")
    others_before = by_owner - (np.arange(n_rej) - group_start)  # P_j - j
    stride = n_rej + capacity + 2  # > any (P_j - j) and any k, keeps the keys of bidders apart
    keys = owner_sorted.astype(np.int64) * stride + others_before

    winners = group[winners]
    start = np.searchsorted(owner_sorted, winners, side="left")
    end = np.searchsorted(owner_sorted, winners, side="right")
    n_own = end - start
    c = np.searchsorted(keys, winners.astype(np.int64) * stride + units, side="left") - start
    enough = units <= n_rej - n_own  # others' rejected bids cover all k blocks
    t = np.minimum(units + c, n_rej)
    from_others = prefix[t] - (own_prefix[start + c] - own_prefix[start])
    all_others = prefix[n_rej] - (own_prefix[end] - own_prefix[start])
    short = units - (n_rej - n_own)
    externality: np.ndarray = np.where(
        enough, from_others, all_others + np.maximum(short, 0) * reserve
    )
    return externality


def _clear_vcg(book: _Book) -> Clearing:
    """Vickrey-Clarke-Groves auction; the operator values each unsold block at the reserve.

    The allocation maximises reported welfare ``sum of winning bids + reserve * unsold blocks``,
    i.e. sells the ``K`` highest eligible unit bids. Winner ``i`` pays its externality
    ``W_{-i}(without i) - W_{-i}(with i)``: the others' (operator included) best welfare if ``i``
    were absent, minus their welfare in the chosen allocation. With non-increasing marginal bids,
    removing ``i`` frees its ``k_i`` blocks to the next-best claims, so ``i`` pays the sum of the
    ``k_i`` highest values among the others' rejected eligible bids and ``K`` copies of the
    reserve. Truthful bidding is a dominant strategy; with unit demand this is the second-price
    auction. The reported price is the average price per block sold and ``price_setter`` the
    owner of the highest rejected eligible bid above the reserve, else -1.
    """
    alloc, won, win_rows, win_values, rej_rows, rej_values = _auction_allocation(book)
    sold = int(alloc.sum())
    if sold == 0:
        return _nothing_sold(book)
    winners = np.flatnonzero(alloc)
    units = alloc[winners]
    pay = _vcg_payments(winners, units, rej_rows, rej_values, book.capacity, book.reserve)
    # Exact bounds (others' bids never beat i's winning bids, and are >= reserve); clipping only
    # removes float noise from the cumulative sums.
    stated = np.bincount(win_rows, weights=win_values, minlength=book.n)[winners]
    payments = np.zeros(book.n, dtype=np.float64)
    payments[winners] = np.clip(pay, units * book.reserve, stated)
    setter = int(rej_rows[0]) if rej_values.size and rej_values[0] > book.reserve else -1
    return Clearing(alloc, payments, won, math.fsum(payments.tolist()) / sold, setter)


def _water_fill(demand: np.ndarray, capacity: int, priority: np.ndarray) -> np.ndarray:
    """Max-min fair integer split of ``capacity`` blocks among demands ``d_i``.

    Find the largest integer level ``L`` with ``sum_i min(d_i, L) <= K`` and give everyone
    ``min(d_i, L)``; the ``r < #{i : d_i > L}`` blocks left over go one each to the still
    unsatisfied bidders in priority order (lower ``priority`` first, then lower index).
    """
    total = int(demand.sum())
    if total <= capacity:
        return demand.copy()
    sorted_d = np.sort(demand)
    cum = np.concatenate(([0], np.cumsum(sorted_d)))
    levels = np.arange(int(sorted_d[-1]) + 1)
    below = np.searchsorted(sorted_d, levels, side="left")  # bidders with d_i < level
    filled = cum[below] + levels * (demand.size - below)  # sum_i min(d_i, level), non-decreasing
    level = int(np.searchsorted(filled, capacity, side="right")) - 1
    alloc: np.ndarray = np.minimum(demand, level)
    leftover = capacity - int(filled[level])
    unsatisfied = np.flatnonzero(demand > level)
    first = unsatisfied[np.lexsort((unsatisfied, priority[unsatisfied]))][:leftover]
    alloc[first] += 1
    return alloc


def _clear_fair_share(book: _Book) -> Clearing:
    """Fair division at a fixed price: max-min fair split of capacity by stated demand.

    Stated demand ``d_i`` is the number of bidder ``i``'s eligible unit bids (bids at or above the
    reserve). Capacity is water-filled: every bidder gets ``min(d_i, L)`` for the largest integer
    level ``L`` that fits, and leftover blocks go one each to unsatisfied bidders in priority order
    (:func:`_water_fill`). Every block is paid at the reserve, which is also the price. Bid levels
    above the reserve do not matter, only how many units clear it.
    """
    alloc = _water_fill(book.demand, book.capacity, book.priority)
    won = _prefix_won(book, alloc)
    return Clearing(alloc, alloc * book.reserve, won, book.reserve, -1)


def _clear_posted_price(book: _Book, rng: np.random.Generator) -> Clearing:
    """Posted price at the reserve, rationed by a uniform lottery over demanded units.

    Bidder ``i`` demands ``d_i`` blocks at the posted price (its eligible unit bids). If total
    demand ``D = sum_i d_i`` fits, everyone is served in full. Otherwise each demanded unit, listed
    bidder by bidder (bidder 0's units first), draws a key from ``U[0, 1)`` - exactly ``D`` draws
    from ``rng``, so a seeded generator reproduces the outcome - and the ``K`` smallest keys win:
    every demanded unit is served with probability ``K / D``. Each block costs the reserve.
    """
    total = int(book.demand.sum())
    if total <= book.capacity:
        alloc = book.demand.copy()
    else:
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"posted_price needs a numpy Generator as lottery_rng, got {rng!r}")
        keys = rng.random(total)
        alloc = np.zeros(book.n, dtype=np.int64)
        if book.capacity > 0:
            owners = np.repeat(np.arange(book.n), book.demand)
            winning = np.argpartition(keys, book.capacity - 1)[: book.capacity]
            alloc = np.bincount(owners[winning], minlength=book.n).astype(np.int64)
    won = _prefix_won(book, alloc)
    return Clearing(alloc, alloc * book.reserve, won, book.reserve, -1)


def clear(
    bids: np.ndarray,
    capacity: int,
    auction_type: AuctionType,
    reserve: float,
    priority: np.ndarray,
    lottery_rng: np.random.Generator,
) -> Clearing:
    """Clear one round's primary auction. See the module docstring for the bid matrix layout.

    ``priority[i]`` breaks ties between equal bids (lower wins first); ``lottery_rng`` is used only
    by ``posted_price`` rationing.

    A unit bid is eligible when it is ``>= reserve`` and ``>= 0``. first_price, second_price and
    vcg sell the ``capacity`` best eligible unit bids (ties: lower priority, then lower unit
    index, then lower bidder index); fair_share and posted_price sell at the reserve to stated
    demand (number of eligible units). Raises ``ValueError`` for an unknown ``auction_type``, a
    malformed bid matrix (not 2-D, NaN/+inf, increasing rows), ``priority`` not of shape ``(n,)``,
    a negative or non-integer ``capacity`` or a negative/non-finite ``reserve``.
    """
    if auction_type not in AUCTION_TYPES:
        raise ValueError(
            f"unknown auction_type {auction_type!r}; valid values: {', '.join(AUCTION_TYPES)}"
        )
    book = _validate(bids, capacity, reserve, priority)
    if auction_type == "first_price":
        return _clear_first_price(book)
    if auction_type == "second_price":
        return _clear_second_price(book)
    if auction_type == "vcg":
        return _clear_vcg(book)
    if auction_type == "fair_share":
        return _clear_fair_share(book)
    return _clear_posted_price(book, lottery_rng)


# --------------------------------------------------------------------------------------------
# Auction theory helpers
# --------------------------------------------------------------------------------------------


def first_price_equilibrium_bid(
    value: float | np.ndarray, n_bidders: int, low: float, high: float
) -> float | np.ndarray:
    """Symmetric Bayes-Nash equilibrium bid in a one-unit first-price auction.

    With ``n`` risk-neutral bidders whose values are i.i.d. ``Uniform[low, high]``, the
    equilibrium bid is the expected highest rival value given that it is below one's own,
    ``b(v) = E[max of n-1 rival values | < v] = low + (v - low) * (n - 1) / n``.
    Works elementwise on arrays; values outside ``[low, high]`` get the same linear formula.
    """
    if int(n_bidders) != n_bidders or n_bidders < 1:
        raise ValueError(f"n_bidders must be a positive integer, got {n_bidders!r}")
    if not low < high:
        raise ValueError(f"need low < high, got low={low!r}, high={high!r}")
    shaded = low + (np.asarray(value, dtype=np.float64) - low) * (n_bidders - 1) / n_bidders
    return float(shaded) if np.ndim(shaded) == 0 else shaded


def myerson_optimal_reserve(low: float, high: float, seller_value: float = 0.0) -> float:
    """Revenue-maximising (Myerson) reserve for i.i.d. ``Uniform[low, high]`` values.

    The optimal reserve sets the virtual value ``phi(r) = r - (1 - F(r)) / f(r) = r - (high - r)``
    equal to the seller's own value ``s``: ``r* = (high + s) / 2``, clipped to ``[low, high]``.
    It does not depend on the number of bidders.
    """
    if not low < high:
        raise ValueError(f"need low < high, got low={low!r}, high={high!r}")
    return float(np.clip((high + seller_value) / 2.0, low, high))


# --------------------------------------------------------------------------------------------
# Benchmark
# --------------------------------------------------------------------------------------------


def bench_clearing(
    n_bidders: int = 1000,
    capacity: int = 10000,
    units_per_bidder: int = 20,
    repeats: int = 20,
    seed: int = 0,
) -> dict[str, float]:
    """Median wall time of :func:`clear` in milliseconds, per auction type, on a random market.

    Each bidder wants between half and all of ``units_per_bidder`` blocks, with sorted
    ``Uniform[0, 100)`` marginal bids (padded with -1); the reserve is 10 and priorities are a
    random permutation, so demand exceeds capacity and posted_price has to ration.
    """
    rng = np.random.default_rng(seed)
    m = max(int(units_per_bidder), 1)
    values = -np.sort(-rng.uniform(0.0, 100.0, size=(n_bidders, m)), axis=1)
    wanted = rng.integers((m + 1) // 2, m + 1, size=n_bidders)
    bids = np.where(np.arange(m)[None, :] < wanted[:, None], values, -1.0)
    priority = rng.permutation(n_bidders)
    lottery = np.random.default_rng(seed + 1)
    timings: dict[str, float] = {}
    for auction_type in AUCTION_TYPES:
        samples = []
        for _ in range(max(int(repeats), 1)):
            start = time.perf_counter()
            clear(bids, capacity, auction_type, 10.0, priority, lottery)
            samples.append((time.perf_counter() - start) * 1e3)
        timings[auction_type] = float(np.median(samples))
    return timings
