"""Textbook auction theory, checked by simulation against the clearing engine.

Expected values are derived by hand in the comments (uniform values on [0, 1]):
* E[k-th highest of n i.i.d. U(0,1)] = (n + 1 - k) / (n + 1).
* Second price, n bidders, reserve r: E[revenue] = n * int_r^1 (2v - 1) v^(n-1) dv (Myerson).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from market.core.mechanisms import clear, first_price_equilibrium_bid, myerson_optimal_reserve

N_AUCTIONS = 20_000


def utility(
    value: np.ndarray,
    my_bid: np.ndarray,
    rivals: np.ndarray,
    capacity: int,
    auction_type: str,
    reserve: float,
    priority: np.ndarray,
) -> float:
    """Bidder 0's quasi-linear utility: value of the blocks it wins minus its payment."""
    m = max(my_bid.size, rivals.shape[1])
    bids = np.full((1 + rivals.shape[0], m), -1.0)
    bids[0, : my_bid.size] = my_bid
    bids[1:, : rivals.shape[1]] = rivals
    c = clear(bids, capacity, auction_type, reserve, priority, np.random.default_rng(0))
    return float(value[: c.alloc[0]].sum() - c.payments[0])


# ------------------------------------------------------------------ incentive compatibility


@pytest.mark.parametrize("auction_type", ["second_price", "vcg"])
def test_truthful_bidding_is_dominant_with_unit_demand(auction_type: str) -> None:
    rng = np.random.default_rng(42)
    grid = np.round(np.linspace(0.0, 12.0, 49), 6)
    for _ in range(60):
        n_rivals = int(rng.integers(1, 5))
        rivals = np.round(rng.uniform(0.0, 10.0, size=(n_rivals, 1)) * 2) / 2  # ties happen
        value = np.array([float(np.round(rng.uniform(0.0, 10.0) * 2) / 2)])
        capacity = int(rng.integers(1, 4))
        reserve = float(rng.choice([0.0, 2.0, 5.0]))
        priority = rng.integers(0, 2, size=n_rivals + 1)
        truthful = utility(value, value, rivals, capacity, auction_type, reserve, priority)
        deviations = np.concatenate([grid, rivals[:, 0], value + 1e-3, value - 1e-3, [-1.0]])
        for b in deviations:
            u = utility(value, np.array([b]), rivals, capacity, auction_type, reserve, priority)
            assert u <= truthful + 1e-9, (auction_type, value, b, rivals.ravel(), capacity)


def test_truthful_bidding_is_dominant_in_multi_unit_vcg() -> None:
    # Bidder 0 wants two blocks with non-increasing values; it may report any non-increasing
    # pair (or drop units). No report beats the truth under VCG.
    rng = np.random.default_rng(3)
    levels = np.arange(0.0, 11.0, 1.0)
    reports = [np.array(p) for p in itertools.product(levels, repeat=2) if p[0] >= p[1]]
    reports += [np.array([x, -1.0]) for x in levels] + [np.array([-1.0, -1.0])]
    for _ in range(25):
        value = -np.sort(-rng.integers(0, 11, size=2).astype(float))
        rivals = -np.sort(-rng.integers(0, 11, size=(int(rng.integers(1, 4)), 2)), axis=1)
        capacity = int(rng.integers(1, 5))
        reserve = float(rng.choice([0.0, 3.0]))
        priority = rng.integers(0, 2, size=rivals.shape[0] + 1)
        args = (rivals.astype(float), capacity, "vcg", reserve, priority)
        truthful = utility(value, value, *args)
        for report in reports:
            assert utility(value, report, *args) <= truthful + 1e-9, (value, report, rivals)


def test_demand_reduction_pays_under_uniform_price_but_not_vcg() -> None:
    # A values two blocks at [10, 8]; B values one at 7; K = 2, reserve 0.
    # Uniform price, truthful: A wins 2 at p = 7 (B's rejected bid) -> 18 - 14 = 4.
    #   A bids only [10]: A and B both win, nothing rejected -> p = 0 -> A gets 10 > 4.
    # VCG, truthful: A wins 2 and pays B's lost 7 -> 18 - 7 = 11; bidding [10] -> 10 - 0 = 10.
    value = np.array([10.0, 8.0])
    rivals = np.array([[7.0]])
    priority = np.array([0, 1])
    reduced = np.array([10.0])
    assert utility(value, value, rivals, 2, "second_price", 0.0, priority) == 4.0
    assert utility(value, reduced, rivals, 2, "second_price", 0.0, priority) == 10.0
    assert utility(value, value, rivals, 2, "vcg", 0.0, priority) == 11.0
    assert utility(value, reduced, rivals, 2, "vcg", 0.0, priority) == 10.0


def test_first_price_is_not_truthful() -> None:
    # Value 10 against a rival bid of 6: truthful earns 0, shading to 7 earns 3.
    rivals, priority = np.array([[6.0]]), np.array([0, 1])
    value = np.array([10.0])
    assert utility(value, value, rivals, 1, "first_price", 0.0, priority) == 0.0
    assert utility(value, np.array([7.0]), rivals, 1, "first_price", 0.0, priority) == 3.0


def test_multi_unit_vcg_hand_computed() -> None:
    # A [10, 8], B [9, 3], C [7], K = 3, reserve 0.
    # Welfare-maximising allocation: A 10 + 8, B 9 (total 27); rejected C 7, B 3.
    # p_A = W_others(without A) - W_others(with A) = (9 + 7 + 3) - 9 = 10.
    # p_B = (10 + 8 + 7) - (10 + 8) = 7.   p_C = 0 (C wins nothing).
    bids = np.array([[10.0, 8.0], [9.0, 3.0], [7.0, -1.0]])
    c = clear(bids, 3, "vcg", 0.0, np.arange(3), np.random.default_rng(0))
    np.testing.assert_array_equal(c.alloc, [2, 1, 0])
    np.testing.assert_allclose(c.payments, [10.0, 7.0, 0.0])
    # The uniform price (7 per block) charges A 14: the two rules really differ.
    s = clear(bids, 3, "second_price", 0.0, np.arange(3), np.random.default_rng(0))
    np.testing.assert_allclose(s.payments, [14.0, 7.0, 0.0])


# ------------------------------------------------------------------ revenue


def simulate_revenue(values: np.ndarray, auction_type: str, reserve: float = 0.0) -> np.ndarray:
    """Revenue of one single-unit auction per row of (already chosen) bids."""
    n = values.shape[1]
    priority = np.arange(n)
    rng = np.random.default_rng(0)
    return np.array(
        [
            clear(row[:, None], 1, auction_type, reserve, priority, rng).payments.sum()
            for row in values
        ]
    )


def assert_close(sample: np.ndarray, expected: float, n_se: float = 4.0) -> None:
    se = sample.std(ddof=1) / np.sqrt(sample.size)
    assert abs(sample.mean() - expected) < n_se * se, (sample.mean(), expected, se)


def test_equilibrium_bid_and_myerson_reserve_formulas() -> None:
    assert first_price_equilibrium_bid(0.8, 4, 0.0, 1.0) == pytest.approx(0.6)  # 0.8 * 3/4
    assert first_price_equilibrium_bid(0.5, 2, 0.0, 1.0) == pytest.approx(0.25)
    assert first_price_equilibrium_bid(7.0, 3, 4.0, 10.0) == pytest.approx(6.0)  # 4 + 3 * 2/3
    assert first_price_equilibrium_bid(3.0, 1, 3.0, 9.0) == pytest.approx(3.0)  # alone: bid low
    np.testing.assert_allclose(first_price_equilibrium_bid(np.array([0.0, 1.0]), 5, 0, 1), [0, 0.8])
    assert myerson_optimal_reserve(0.0, 1.0) == 0.5
    assert myerson_optimal_reserve(0.0, 1.0, seller_value=0.2) == pytest.approx(0.6)
    assert myerson_optimal_reserve(2.0, 4.0) == 2.0  # (4 + 0) / 2 = 2 = low
    assert myerson_optimal_reserve(0.0, 10.0) == 5.0
    assert myerson_optimal_reserve(6.0, 10.0) == 6.0  # 5 clipped up to low
    assert myerson_optimal_reserve(0.0, 1.0, seller_value=3.0) == 1.0  # clipped to high
    with pytest.raises(ValueError):
        myerson_optimal_reserve(1.0, 1.0)
    with pytest.raises(ValueError):
        first_price_equilibrium_bid(0.5, 0, 0.0, 1.0)


def test_revenue_equivalence_first_vs_second_price() -> None:
    # n = 4, values i.i.d. U(0,1). Second price, truthful: E[2nd highest value] = 3/5.
    # First price, b(v) = 3v/4: E[3/4 * highest value] = 3/4 * 4/5 = 3/5. Same expected revenue.
    n = 4
    values = np.random.default_rng(2025).random((N_AUCTIONS, n))
    first = simulate_revenue(first_price_equilibrium_bid(values, n, 0.0, 1.0), "first_price")
    second = simulate_revenue(values, "second_price")
    assert_close(first, 0.6)
    assert_close(second, 0.6)
    assert_close(first - second, 0.0)  # paired on the same value draws
    # Same mean, but first price revenue is less dispersed (it is a conditional expectation).
    assert first.var() < second.var()


def test_reserve_price_raises_then_lowers_second_price_revenue() -> None:
    # n = 2, values U(0,1), second price with reserve r:
    # R(r) = 2 int_r^1 (2v - 1) v dv = 1/3 + r^2 - 4 r^3 / 3.
    #   R(0) = 1/3,  R(0.5) = 1/3 + 1/4 - 1/6 = 5/12,  R(0.95) = 1/3 + 0.9025 - 1.1431667
    #   = 0.0926667; neighbours of the optimum: R(0.3) = 0.3873333, R(0.7) = 0.3663333.
    expected = {0.0: 1 / 3, 0.3: 0.3873333333, 0.5: 5 / 12, 0.7: 0.3663333333, 0.95: 0.0926666667}
    values = np.random.default_rng(99).random((N_AUCTIONS, 2))
    revenue = {r: simulate_revenue(values, "second_price", r) for r in expected}
    for r, theory in expected.items():
        assert_close(revenue[r], theory)
    best = myerson_optimal_reserve(0.0, 1.0)
    assert best == 0.5
    # Paired differences: the optimal reserve beats no reserve, and its neighbours and the
    # absurd reserve do worse (each gap beyond 4 standard errors of the paired difference).
    for r in (0.0, 0.3, 0.7, 0.95):
        gain = revenue[best] - revenue[r]
        assert gain.mean() > 4 * gain.std(ddof=1) / np.sqrt(gain.size), r
    assert_close(revenue[0.5] - revenue[0.0], 5 / 12 - 1 / 3)
