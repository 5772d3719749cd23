"""Rewards: dense, decomposed, paid only for realised economic outcomes.

Labs (reward units = credits / ``value_unit``): ``job_value`` (change of the job potential: value
x progress/size while live, the realised value once settled), ``auction_payments``,
``trade_balance``, ``shill_penalty``, ``withdrawal_penalty``, ``collusion_penalty``,
``breach_compensation`` (paid out of a short seller's collateral to the buyer it failed; credits
actually moved) and two shaping terms, ``invalid_action`` and ``talk_cost``. Talk earns nothing by
itself: offers, proposals, messages and pitches only cost ``talk_cost``; what they lead to pays.

Designer: the DAEDALUS composite ``welfare_ratio x fairness x participation x stability`` (each
raised to its scenario weight) plus an optional revenue term.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from scenarios.schema import DESIGNER_WEIGHTS, DesignerWeight

LAB_COMPONENTS: tuple[str, ...] = (
    "job_value",
    "auction_payments",
    "trade_balance",
    "shill_penalty",
    "withdrawal_penalty",
    "collusion_penalty",
    "breach_compensation",
    "invalid_action",
    "talk_cost",
)
DESIGNER_COMPONENTS: tuple[str, ...] = (*DESIGNER_WEIGHTS, "revenue", "composite")


def optimal_welfare(unit_values: np.ndarray, remaining: np.ndarray, blocks: int) -> float:
    """The most value ``blocks`` blocks can create this round (expected value before failures).

    Each live, runnable job offers ``remaining`` units of progress worth ``unit_value`` each; with
    identical blocks the knapsack is solved exactly by taking the best units first.
    """
    if blocks <= 0 or unit_values.size == 0:
        return 0.0
    units = np.repeat(unit_values, remaining)
    if units.size > blocks:
        # partition's output order depends on the CPU's SIMD path: sum exactly (order-free)
        units = np.partition(units, units.size - blocks)[units.size - blocks :]
    return math.fsum(units.tolist())


def gini(x: np.ndarray) -> float:
    """Gini coefficient of non-negative values (0 = equal); 0 for fewer than 2 or all zero."""
    x = np.asarray(x, dtype=np.float64)
    if x.size < 2 or not (x > 0).any():
        return 0.0
    s = np.sort(x)  # sorted values do not depend on the input order; cumsum is sequential
    n = s.size
    cum = np.cumsum(s)
    return float((n + 1 - 2 * (math.fsum(cum.tolist()) / cum[-1])) / n)


def bid_distribution(bids: list[float]) -> dict[str, float]:
    """Count, mean, population std, min, max and median of a non-empty list of unit bids.

    Sums are exact (``math.fsum``), so the figures do not depend on the order of the bids.
    """
    s = sorted(bids)
    n = len(s)
    mean = math.fsum(s) / n
    std = math.sqrt(math.fsum((b - mean) * (b - mean) for b in s) / n)
    mid = n // 2
    median = s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2
    return {
        "count": float(n),
        "mean": mean,
        "std": std,
        "min": s[0],
        "max": s[-1],
        "median": median,
    }


def stability(price: float, previous: float | None) -> float:
    """1 - |p_r - p_{r-1}| / max(p_r, p_{r-1}); 1 in the first round or when both are zero."""
    if previous is None:
        return 1.0
    scale = max(price, previous)
    return 1.0 if scale <= 0 else 1.0 - abs(price - previous) / scale


def designer_composite(
    welfare_ratio: float,
    fairness: float,
    participation: float,
    stability_: float,
    weights: Mapping[DesignerWeight, float],
    revenue_norm: float = 0.0,
    revenue_weight: float = 0.0,
) -> float:
    parts: dict[DesignerWeight, float] = {
        "welfare_ratio": welfare_ratio,
        "fairness": fairness,
        "participation": participation,
        "stability": stability_,
    }
    composite = 1.0
    for name, value in parts.items():
        composite *= max(0.0, value) ** weights.get(name, 1.0)
    return composite + revenue_weight * revenue_norm
