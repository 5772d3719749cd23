"""Mechanism comparison (``gpumarket eval --mechanisms``): candidate mechanisms on one scenario,
their designer metrics, and each bidder type's gain from deviating to another built-in strategy
(a paired incentive-compatibility check). Every run is a resumable folder inside ``out_dir``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER, is_bidder_seat
from market.review.report import CSS, Safe, bar_chart, content_security_policy, h
from market.run.evaluation import csv_value, folder_health, md_cell, seed_text, slug
from market.run.folders import RunFolder, check_seats, open_folder
from market.run.health import SeatHealth
from market.run.jobs import ProgressFn, RunConfigError
from market.run.rollout import mean_ci95
from market.run.runner import execute
from scenarios import deep_merge, load_scenario

#: the robust fixed mechanism of the DAEDALUS headline
ROBUST = {
    "auction_type": "second_price",
    "reserve_price": 2.0,
    "reveal_clearing_price": True,
    "reveal_reserve": True,
    "coalition_policy": "penalize_suspected",
    "collusion_penalty": 30.0,
}
#: candidate mechanisms: name -> (designer spec, [mechanism] overrides or None for the scenario's)
CANDIDATES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "robust": ("fixed", ROBUST),
    "first_price": ("fixed", {**ROBUST, "auction_type": "first_price"}),
    "vcg": ("fixed", {**ROBUST, "auction_type": "vcg"}),
    "fair_share": ("fixed", {**ROBUST, "auction_type": "fair_share"}),
    "posted_price": ("fixed", {**ROBUST, "auction_type": "posted_price", "reserve_price": 20.0}),
    "random": ("random", None),
}
#: DAEDALUS parity designers (docs/scenarios.md, "DAEDALUS parity"), not run by default: the card's
#: robust mechanism sent in DAEDALUS units, the uniform-random designer over DAEDALUS's mechanism
#: space, and the rule designer
PARITY_CANDIDATES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "daedalus_robust": ("daedalus_robust", None),
    "daedalus_random": ("random?space=daedalus", None),
    "rule_designer": ("rule_designer", None),
}
#: designers that need the scenario's designer seat
_DESIGNER_ONLY = frozenset({"random", *PARITY_CANDIDATES})
#: built-in bidder strategies a bidder type may deviate to
ALTERNATIVES = (
    "truthful",
    "shader",
    "colluder",
    "dropout",
    "exploiter",
    "greedy_hoarder",
    "no_negotiation",
    "rule_expert",
    "always_accept",
    "random_valid",
)
METRICS = ("composite", "welfare_ratio", "revenue", "fairness", "participation", "stability")


@dataclass
class Deviation:
    """One bidder type's best unilateral deviation under one mechanism (paired over seeds)."""

    mechanism: str
    bidder_type: str
    seat: str
    base: dict[int, float]
    alternatives: dict[str, dict[int, float]]

    def gain(self, alternative: str) -> tuple[float, float]:
        alt = self.alternatives[alternative]
        seeds = sorted(set(alt) & set(self.base))
        return mean_ci95([alt[s] - self.base[s] for s in seeds])

    @property
    def best(self) -> tuple[str | None, float, float]:
        """(alternative, mean gain, 95% CI half-width) of the best alternative."""
        scored = [(a, *self.gain(a)) for a in self.alternatives]
        scored = [t for t in scored if math.isfinite(t[1])]
        return max(scored, key=lambda t: t[1]) if scored else (None, float("nan"), float("nan"))


@dataclass
class MechanismReport:
    scenario: str
    seeds: list[int]
    mechanisms: list[str]
    metrics: dict[str, dict[str, dict[int, float]]]  # mechanism -> metric -> seed -> value
    deviations: dict[str, list[Deviation]]  # mechanism -> one per bidder type
    notes: list[str] = field(default_factory=list)
    failed: dict[str, dict[int, str]] = field(default_factory=dict)
    health: list[SeatHealth] = field(default_factory=list)  # per run folder and seat

    def metric(self, mechanism: str, name: str) -> tuple[float, float]:
        values = self.metrics[mechanism][name]
        return mean_ci95([values[s] for s in sorted(values)])

    def paired(self, a: str, b: str, name: str = "composite") -> tuple[float, float]:
        """Mean and CI of ``a - b`` per seed (the same worlds under both mechanisms)."""
        x, y = self.metrics[a][name], self.metrics[b][name]
        return mean_ci95([x[s] - y[s] for s in sorted(set(x) & set(y))])

    def max_regret(self, mechanism: str) -> tuple[str | None, str | None, float, float]:
        """(type, alternative, gain, ci) of the most profitable deviation under ``mechanism``."""
        best: tuple[str | None, str | None, float, float] = (None, None, float("nan"), float("nan"))
        for dev in self.deviations.get(mechanism, []):
            alt, gain, half = dev.best
            if alt is not None and not (gain <= best[2]):
                best = (dev.bidder_type, alt, gain, half)
        return best

    def table(self) -> list[dict[str, Any]]:
        out = []
        for m in self.mechanisms:
            row: dict[str, Any] = {"mechanism": m, "n": len(self.metrics[m]["composite"])}
            for name in METRICS:
                row[name], row[f"{name}_ci95"] = self.metric(m, name)
            kind, alt, gain, half = self.max_regret(m)
            row.update(
                {
                    "max_regret": gain,
                    "max_regret_ci95": half,
                    "regret_type": kind,
                    "regret_alternative": alt,
                }
            )
            out.append(row)
        return out

    def deviation_rows(self) -> list[dict[str, Any]]:
        out = []
        for m in self.mechanisms:
            for dev in self.deviations.get(m, []):
                for alt in dev.alternatives:
                    gain, half = dev.gain(alt)
                    out.append(
                        {
                            "mechanism": m,
                            "bidder_type": dev.bidder_type,
                            "seat": dev.seat,
                            "alternative": alt,
                            "gain": gain,
                            "ci95": half,
                            "best": alt == dev.best[0],
                        }
                    )
        return out

    def csv(self) -> str:
        return _to_csv(self.table())

    def deviations_csv(self) -> str:
        return _to_csv(self.deviation_rows())

    def markdown(self) -> str:
        types = sorted({d.bidder_type for devs in self.deviations.values() for d in devs})
        head = ["mechanism", *METRICS, *(f"gain: {t}" for t in types)]
        lines = [
            f"Mechanisms on `{self.scenario}` over {len(self.seeds)} seed(s) "
            f"({seed_text(self.seeds)}): per-round means of the designer parts (revenue in "
            "credits per episode), mean ± 95% CI over episodes. `gain: T` is bidder type T's "
            "gain from deviating to its best alternative built-in strategy (one seat swapped, "
            "same seeds, paired difference of that seat's return; > 0 means the mechanism is not "
            "incentive compatible for T among the built-ins).",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
        ]
        for m in self.mechanisms:
            cells = [m]
            for name in METRICS:
                mean, half = self.metric(m, name)
                cells.append(
                    f"{mean:.1f} ± {half:.1f}" if name == "revenue" else f"{mean:.3f} ± {half:.3f}"
                )
            devs = {d.bidder_type: d for d in self.deviations.get(m, [])}
            for t in types:
                dev = devs.get(t)
                if dev is None or dev.best[0] is None:
                    cells.append("")
                    continue
                alt, gain, half = dev.best
                cells.append(f"{gain:+.3f} ± {half:.3f} ({alt})")
            lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
        lines += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        charts = []
        for i, name in enumerate(METRICS):
            bars = [(m, *self.metric(m, name)) for m in self.mechanisms]
            charts.append(
                bar_chart(
                    name, bars, plot_id=f"m{i}", y_label="credits" if name == "revenue" else ""
                )
            )
        regret = [(m, *self.max_regret(m)[2:]) for m in self.mechanisms]
        charts.append(
            bar_chart(
                "max gain from deviating (any bidder type)",
                regret,
                plot_id="regret",
                y_label="return",
            )
        )
        for j, m in enumerate(self.mechanisms):
            bars = [
                (d.bidder_type, d.best[1], d.best[2])
                for d in self.deviations.get(m, [])
                if d.best[0] is not None
            ]
            if bars:
                charts.append(
                    bar_chart(
                        f"{m}: best deviation's gain per bidder type",
                        bars,
                        plot_id=f"d{j}",
                        y_label="return",
                    )
                )
        table = [h("tr", [h("th", k) for k in ("mechanism", *METRICS, "max regret")])]
        for row in self.table():
            cells = [h("td", row["mechanism"])]
            cells += [
                h(
                    "td",
                    f"{row[k]:.{1 if k == 'revenue' else 3}f} ± "
                    f"{row[k + '_ci95']:.{1 if k == 'revenue' else 3}f}",
                    class_="num",
                )
                for k in METRICS
            ]
            cells.append(
                h(
                    "td",
                    ""
                    if row["regret_type"] is None
                    else f"{row['max_regret']:+.3f} ± {row['max_regret_ci95']:.3f} "
                    f"({row['regret_type']}→{row['regret_alternative']})",
                    class_="num",
                )
            )
            table.append(h("tr", cells))
        title = f"gpumarket mechanisms: {self.scenario}"
        head = h(
            "head",
            h("meta", charset="utf-8"),
            h("meta", http_equiv="Content-Security-Policy", content=content_security_policy()),
            h("title", title),
            Safe(f"<style>{CSS}</style>"),
        )
        body = h(
            "body",
            h(
                "header",
                h("h1", title),
                h("p", f"{len(self.seeds)} seed(s), {seed_text(self.seeds)}", class_="muted"),
            ),
            h(
                "main",
                h("div", h("table", table), class_="tw"),
                h("div", charts, class_="plots"),
                h("ul", [h("li", n) for n in self.notes]),
            ),
        )
        return "<!DOCTYPE html>\n" + h("html", head, body, lang="en") + "\n"


def _to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    if rows:
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(list(rows[0]))
        for row in rows:
            writer.writerow([csv_value(v) for v in row.values()])
    return buf.getvalue()


def _with_mechanism(sc: Scenario, overrides: dict[str, Any] | None) -> Scenario:
    if overrides is None:
        return sc
    table = sc.model_dump(mode="python")
    table["mechanism"] = deep_merge(table["mechanism"], overrides)
    return load_scenario(Scenario.model_validate(table))


def _episode_metrics(folder: RunFolder) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {name: {} for name in METRICS}
    for seed in folder.seeds:
        rows = folder.done.get(seed)
        if not rows:
            continue
        row = rows[0]
        for name in METRICS:
            out[name][seed] = row["revenue"] if name == "revenue" else row["designer"][name]
    return out


def evaluate_mechanisms(
    scenario: str | Path | Scenario,
    seeds: Iterable[int],
    out_dir: str | Path,
    workers: int | None = None,
    *,
    candidates: Sequence[str] | None = None,
    alternatives: Sequence[str] | None = None,
    deviations: bool = True,
    backend: str = "local",
    address: str | None = None,
    progress: bool | ProgressFn = True,
    fresh: bool = False,
    agent_timeout: float | None = None,
) -> MechanismReport:
    """Compare mechanisms (:data:`CANDIDATES`) on ``scenario``; for each, every bidder type's
    gain from deviating to its best alternative strategy (:data:`ALTERNATIVES`).

    The bidder types are the distinct agent specs of the scenario's bidder seats; a type deviates
    in its first seat. Writes ``mechanisms.csv``, ``mechanisms.md``, ``deviations.csv`` and
    ``mechanisms.html`` (plots) to ``out_dir``; every run is a resumable folder inside it.
    ``agent_timeout`` as in :func:`run_scenario`.
    """
    seeds = list(seeds)
    sc = load_scenario(scenario)
    table = {**CANDIDATES, **PARITY_CANDIDATES}
    names = list(candidates or CANDIDATES)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise RunConfigError(
            f"unknown mechanism(s) {', '.join(unknown)}; choose from {', '.join(table)}"
        )
    alts = list(alternatives or ALTERNATIVES)
    notes = []
    dropped = [n for n in names if n in _DESIGNER_ONLY] if not sc.designer_seat else []
    for n in dropped:
        names.remove(n)
        notes.append(f"{sc.name} has no designer seat: the {n} designer was left out")
    if not names:
        raise RunConfigError("no mechanism left to compare")
    base_seats = check_seats(sc, None)
    types: dict[str, str] = {}
    for seat, spec in base_seats.items():
        if seat != DESIGNER and is_bidder_seat(seat) and spec not in types:
            types[spec] = seat
    out = Path(out_dir)
    base: dict[str, RunFolder] = {}
    devs: dict[tuple[str, str, str], RunFolder] = {}
    for m in names:
        designer, overrides = table[m]
        msc = _with_mechanism(sc, overrides)
        seats = {DESIGNER: designer} if sc.designer_seat else {}
        base[m] = open_folder(msc, seeds, seats, out / m / "base", False, fresh, 1, agent_timeout)
        if not deviations:
            continue
        for kind, seat in types.items():
            for alt in alts:
                if alt != kind:
                    devs[(m, kind, alt)] = open_folder(
                        msc,
                        seeds,
                        {**seats, seat: alt},
                        out / m / f"{slug(kind)}@{seat}-{slug(alt)}",
                        False,
                        fresh,
                        1,
                        agent_timeout,
                    )
    execute(
        [*base.values(), *devs.values()],
        workers=workers,
        backend=backend,
        address=address,
        progress=progress,
        label="mechanisms",
    )

    def seat_returns(folder: RunFolder, seat: str) -> dict[int, float]:
        return {
            s: next(r["return"] for r in folder.done[s] if r["seat"] == seat)
            for s in folder.seeds
            if s in folder.done
        }

    report = MechanismReport(
        sc.name, seeds, names, {m: _episode_metrics(f) for m, f in base.items()}, {}, notes
    )
    for m in names:
        report.deviations[m] = (
            [
                Deviation(
                    m,
                    kind,
                    seat,
                    seat_returns(base[m], seat),
                    {
                        alt: seat_returns(devs[(m, kind, alt)], seat)
                        for alt in alts
                        if (m, kind, alt) in devs
                    },
                )
                for kind, seat in types.items()
            ]
            if deviations
            else []
        )
    report.failed = {str(f.out): f.failed for f in [*base.values(), *devs.values()] if f.failed}
    report.health = folder_health([*base.values(), *devs.values()], out)
    report.notes.append(
        "revenue: auction revenue in credits per episode; the other metrics are per-round means of "
        "the designer parts (round_log[r]['designer']); composite is the designer's reward"
    )
    if deviations:
        report.notes.append(
            "the best of several alternatives is picked on the same seeds it is measured on, so "
            "its gain is biased upwards (a conservative incentive-compatibility check)"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "mechanisms.csv").write_text(report.csv(), encoding="utf-8")
    (out / "deviations.csv").write_text(report.deviations_csv(), encoding="utf-8")
    (out / "mechanisms.md").write_text(report.markdown(), encoding="utf-8")
    (out / "mechanisms.html").write_text(report.html(), encoding="utf-8")
    return report


__all__ = [
    "ALTERNATIVES",
    "CANDIDATES",
    "METRICS",
    "PARITY_CANDIDATES",
    "ROBUST",
    "Deviation",
    "MechanismReport",
    "evaluate_mechanisms",
]
