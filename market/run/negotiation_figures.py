"""The negotiation report's figures (:mod:`market.review.negotiation_report`): each a paired
difference over seeds (:func:`paired`), read from the cells' rows, round logs and tallies, per
scenario (:func:`scenario_figures`). docs/negotiation.md defines every figure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents.talk_off import PREFIX as TALK_OFF
from market.run.negotiation_measures import (
    EXPERT,
    HEDGE_OFF,
    HONEST_TWINS,
    OWN,
    SPOT_ONLY,
    CellData,
    round_counts,
    welfare,
)
from market.run.rollout import mean_ci95


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, float, int]:
    """Mean and 95% CI half-width of ``a - b`` over the seeds both have, and how many."""
    seeds = sorted(set(a) & set(b))
    values = [a[s] - b[s] for s in seeds if math.isfinite(a[s]) and math.isfinite(b[s])]
    mean, half = mean_ci95(values)
    return mean, half, len(values)


def _mean(values: Iterable[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return math.fsum(finite) / len(finite) if finite else math.nan


def per_block(credits: Mapping[int, float], blocks: Mapping[int, float]) -> float:
    """Credits per block over all episodes (NaN without a block)."""
    total = math.fsum(blocks.values())
    return math.fsum(credits.values()) / total if total > 0 else math.nan


@dataclass
class Figure:
    """One line of negotiation.csv."""

    scenario: str
    section: str
    metric: str
    subject: str
    versus: str
    n: int
    mean: float
    ci95: float
    subject_mean: float = math.nan
    versus_mean: float = math.nan

    @property
    def low(self) -> float:
        return self.mean - self.ci95

    @property
    def high(self) -> float:
        return self.mean + self.ci95

    def text(self, digits: int = 3, percent: bool = False) -> str:
        if not math.isfinite(self.mean):
            return "n/a"
        if percent:
            return f"{100 * self.mean:+.1f}% ± {100 * self.ci95:.1f}"
        return f"{self.mean:+.{digits}f} ± {self.ci95:.{digits}f}"


KEYS = (
    "scenario",
    "section",
    "metric",
    "subject",
    "versus",
    "n",
    "mean",
    "ci95",
    "low",
    "high",
    "subject_mean",
    "versus_mean",
)


def _series(cell: CellData, get: Any) -> dict[int, float]:
    out = {}
    for s in cell.seeds:
        try:
            out[s] = float(get(s))
        except (KeyError, TypeError, ValueError):
            out[s] = math.nan
    return out


def _returns(cell: CellData) -> dict[int, float]:
    return _series(cell, lambda s: cell.seat(s)["return"])


def _diff(scenario: str, section: str, metric: str, a: CellData, b: CellData, get: Any) -> Figure:
    sa, sb = _series(a, get(a)), _series(b, get(b))
    mean, half, n = paired(sa, sb)
    return Figure(
        scenario,
        section,
        metric,
        a.name,
        b.name,
        n,
        mean,
        half,
        _mean(sa.values()),
        _mean(sb.values()),
    )


def _component(name: str) -> Any:
    return lambda c: lambda s: c.seat(s)["components"].get(name, 0.0)


def _count(name: str) -> Any:
    return lambda c: lambda s: c.lines[s]["seat"][name]


def _rounds(name: str) -> Any:
    return lambda c: lambda s: round_counts(c.rounds[s])[name]


def _conduct(name: str) -> Any:
    return lambda c: lambda s: (c.seat(s).get("conduct") or {}).get(name, 0)


#: the decomposition of a dishonest agent's loss: (metric, how a cell's seed gives it)
DECOMPOSITION: tuple[tuple[str, Any], ...] = (
    ("return", lambda c: lambda s: c.seat(s)["return"]),
    ("job_value", _component("job_value")),
    ("auction_payments", _component("auction_payments")),
    ("trade_balance", _component("trade_balance")),
    ("talk_cost", _component("talk_cost")),
    (
        "penalties",
        lambda c: (
            lambda s: math.fsum(
                v
                for k, v in c.seat(s)["components"].items()
                if k not in ("job_value", "auction_payments", "trade_balance", "talk_cost")
            )
        ),
    ),
    ("offers_sent", _count("offers_sent")),
    ("offers_accepted", _count("offers_accepted")),
    ("offers_rejected", _count("offers_rejected")),
    ("trades", _count("trades")),
    ("blocks_bought", _count("blocks_bought")),
    ("blocks_sold", _count("blocks_sold")),
    ("coalitions_formed", _count("coalitions_formed")),
    ("joins_received", _count("joins_received")),
    ("joins_made", _count("joins_made")),
    ("judge_granted", _rounds("granted")),
    ("auction_blocks", _rounds("won")),
    ("reputation", _count("reputation")),
    ("claims_false", _conduct("claims_false")),
    ("promises_broken", _conduct("promises_broken")),
)


def scenario_figures(
    scenario: str, cells: Mapping[str, CellData], talkers: Sequence[str]
) -> list[Figure]:
    """Every figure of one scenario (docs/negotiation.md defines each)."""
    out: list[Figure] = []
    ret = lambda c: lambda s: c.seat(s)["return"]  # noqa: E731
    for agent in talkers:
        out.append(
            _diff(scenario, "value_of_talk", "return", cells[agent], cells[TALK_OFF + agent], ret)
        )
    for liar, honest in HONEST_TWINS:
        if liar not in cells or honest not in cells:
            continue
        h, d = cells[honest], cells[liar]
        loss = _diff(scenario, "cost_of_lying", "return", h, d, ret)
        # the loss as a share of the honest twin's mean return (that mean taken as fixed)
        base = abs(loss.subject_mean)
        share = Figure(
            scenario,
            "cost_of_lying",
            "share",
            liar,
            honest,
            loss.n,
            loss.mean / base if base > 0 else math.nan,
            loss.ci95 / base if base > 0 else math.nan,
            loss.versus_mean,
            loss.subject_mean,
        )
        out.append(share)
        for metric, get in DECOMPOSITION:
            f = _diff(scenario, "lying_decomposition", metric, d, h, get)
            out.append(f)
        for metric, credits, blocks in (
            ("price_bought", "credits_bought", "blocks_bought"),
            ("price_sold", "credits_sold", "blocks_sold"),
        ):
            a = per_block(_series(d, _count(credits)(d)), _series(d, _count(blocks)(d)))
            b = per_block(_series(h, _count(credits)(h)), _series(h, _count(blocks)(h)))
            out.append(
                Figure(
                    scenario,
                    "lying_decomposition",
                    metric,
                    liar,
                    honest,
                    len(d.seeds),
                    a - b,
                    math.nan,
                    a,
                    b,
                )
            )
        for metric, credits, blocks in (("price_auction", "paid", "won"),):
            a = per_block(_series(d, _rounds(credits)(d)), _series(d, _rounds(blocks)(d)))
            b = per_block(_series(h, _rounds(credits)(h)), _series(h, _rounds(blocks)(h)))
            out.append(
                Figure(
                    scenario,
                    "lying_decomposition",
                    metric,
                    liar,
                    honest,
                    len(d.seeds),
                    a - b,
                    math.nan,
                    a,
                    b,
                )
            )
    if EXPERT in cells and HEDGE_OFF in cells:
        out.append(_diff(scenario, "hedging_gain", "return", cells[EXPERT], cells[HEDGE_OFF], ret))
    own, spot = cells[OWN], cells[SPOT_ONLY]
    for metric, get in (
        ("forward_contracts", lambda s: own.lines[s]["episode"]["forward_contracts"]),
        (
            "episodes_with_forward",
            lambda s: float(own.lines[s]["episode"]["forward_contracts"] > 0),
        ),
        ("trades", lambda s: own.lines[s]["episode"]["trades"]),
        ("coalition_joins", lambda s: own.lines[s]["episode"]["joins"]),
        ("breaches", lambda s: round_counts(own.rounds[s])["breaches"]),
        ("episodes_with_breach", lambda s: float(round_counts(own.rounds[s])["breaches"] > 0)),
        ("defaults", lambda s: round_counts(own.rounds[s])["defaults"]),
        ("episodes_with_default", lambda s: float(round_counts(own.rounds[s])["defaults"] > 0)),
        ("cascades", lambda s: round_counts(own.rounds[s])["cascades"]),
    ):
        values = _series(own, get)
        mean, half = mean_ci95([v for v in values.values() if math.isfinite(v)])
        out.append(Figure(scenario, "rates", metric, OWN, "", len(values), mean, half, mean))
    fb = _series(own, lambda s: own.lines[s]["first_best"])
    actual = _series(own, lambda s: welfare(own.rows[s]))
    spot_w = _series(spot, lambda s: welfare(spot.rows[s]))
    for metric, subject_w, versus_w, subject, versus in (
        ("negotiable", fb, spot_w, "first_best", SPOT_ONLY),
        ("captured", actual, spot_w, OWN, SPOT_ONLY),
        ("left", fb, actual, "first_best", OWN),
    ):
        mean, half, n = paired(subject_w, versus_w)
        out.append(
            Figure(
                scenario,
                "welfare",
                metric,
                subject,
                versus,
                n,
                mean,
                half,
                _mean(subject_w.values()),
                _mean(versus_w.values()),
            )
        )
    negotiable, captured = out[-3], out[-2]
    captured_share = captured.mean / negotiable.mean if negotiable.mean > 0 else math.nan
    out.append(
        Figure(
            scenario,
            "welfare",
            "share_captured",
            OWN,
            "first_best",
            captured.n,
            captured_share,
            math.nan,
        )
    )
    return out
