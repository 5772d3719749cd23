"""Rewards: dense, decomposed, paid only for realised economic outcomes.

Labs (reward units = credits / ``value_unit``): ``job_value`` (change of the job potential: value
x progress/size while live, the realised value once settled), ``auction_payments``,
``trade_balance``, ``shill_penalty``, ``withdrawal_penalty``, ``collusion_penalty``,
``breach_compensation`` (paid out of a short seller's collateral to the buyer it failed; credits
actually moved), two shaping terms, ``invalid_action`` and ``talk_cost``, and, only with
``rewards.conduct`` on, the conduct penalties ``false_claim``, ``broken_promise`` and
``manipulation``. Talk earns nothing by
itself: offers, proposals, messages and pitches only cost ``talk_cost``; what they lead to pays.

Designer: the DAEDALUS composite ``welfare_ratio x fairness x participation x stability`` (each
raised to its scenario weight) plus an optional revenue term.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, get_args

import numpy as np

from market.core.scenario_schema import DESIGNER_WEIGHTS, DesignerWeight

#: a lab's reward components (docs/rewards.md has a row for each); the last three are the
#: conduct penalties, paid only with ``rewards.conduct`` on
LabComponent = Literal[
    "job_value",
    "auction_payments",
    "trade_balance",
    "shill_penalty",
    "withdrawal_penalty",
    "collusion_penalty",
    "breach_compensation",
    "invalid_action",
    "talk_cost",
    "false_claim",
    "broken_promise",
    "manipulation",
]
#: every component a seat's ``reward_components`` can hold: a lab's, or the designer's
#: ``composite`` (a designer's invalid action is ``invalid_action`` too)
RewardComponent = LabComponent | Literal["composite"]
LAB_COMPONENTS: tuple[LabComponent, ...] = get_args(LabComponent)
REWARD_COMPONENTS: tuple[RewardComponent, ...] = (*LAB_COMPONENTS, "composite")
DESIGNER_COMPONENTS: tuple[str, ...] = (*DESIGNER_WEIGHTS, "revenue", "composite")


def optimal_welfare(unit_values: np.ndarray, remaining: np.ndarray, blocks: int) -> float:
    """The most value ``blocks`` blocks can create this round (expected value before failures).

    Each live, runnable job offers ``remaining`` units of progress worth ``unit_value`` each; with
    identical blocks the knapsack is solved exactly by taking the best units first. The sum is
    exact (correctly rounded), so it depends on neither the jobs' order nor the CPU.
    """
    if blocks <= 0 or unit_values.size == 0:
        return 0.0
    remaining = np.asarray(remaining, dtype=np.int64)
    order = np.argsort(-unit_values, kind="stable")
    rem = remaining[order]
    before = np.cumsum(rem) - rem  # units of better jobs
    take = np.minimum(rem, np.maximum(0, blocks - before))
    terms = exact_products(unit_values[order], take)
    if terms is None:  # out of the split's range: add the units one by one
        return math.fsum(np.repeat(unit_values[order], take).tolist())
    return math.fsum(terms)


_SPLITTER = float(2**27 + 1)  # Veltkamp's constant for float64


def exact_products(values: np.ndarray, counts: np.ndarray) -> list[float] | None:
    """Floats whose exact sum is ``sum(values[k] * counts[k])``, with no rounding anywhere (None
    when a count is 2**26 or more, or a value too large or too small to split exactly).

    Each value is split (Veltkamp) into a high and a low part of at most 26 significant bits
    each; times a count below 2**26 each part's product fits in 53 bits, so it is exact. Adding
    the parts with ``math.fsum`` gives the correctly rounded sum of ``counts[k]`` copies of every
    ``values[k]``, the same float as ``math.fsum`` over the copies themselves.
    """
    if counts.size and int(counts.max()) >= 2**26:
        return None
    magnitude = np.abs(values)
    if not (magnitude < 2.0**995).all() or ((magnitude < 2.0**-960) & (magnitude > 0)).any():
        return None  # too large to scale, or so small that a part could lose bits
    scaled = _SPLITTER * values
    high = scaled - (scaled - values)
    low = values - high
    return [*(high * counts).tolist(), *(low * counts).tolist()]


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
