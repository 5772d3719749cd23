"""The negotiation report (``gpumarket eval --negotiation``): what talk, honesty, contracts and
hedging are worth in each scenario, on paired seeds. docs/negotiation.md defines every figure.

Per scenario, each *cell* is one line-up played over the same seeds, recorded in its own run
folder ``OUT/<scenario>/<cell>`` (resumable, as ``gpumarket eval``'s):

* seat cells: an agent in seat ``bidder_0``, the other seats the scenario's own: ``rule_expert``
  (and every ``--agents`` spec) and its talk-off twin (``talk_off:SPEC``, :mod:`agents.talk_off`),
  ``rule_expert?hedge=false``, each dishonest agent of :data:`HONEST_TWINS` and its honest twin;
* ``@own``: the scenario's own seats; ``@spot_only``: every bidder seat the talk-off twin of the
  scenario's own agent for it (nobody negotiates).

Figures are paired: a difference is taken seed by seed (the same worlds and the same opponents'
draws) and reported as its mean and the half-width of its 95% CI (Student t,
:func:`market.run.rollout.mean_ci95`, as in ``eval --expert-matrix``).

Besides the run folder's rows and round logs, each episode leaves one line in the folder's
``negotiation.jsonl`` (written with the episode, keyed by the folder's configuration hash): what
only the play itself shows (offers sent, accepted and refused, trades and their prices, forward
contracts, coalitions formed and joined, pitches, the seat's reputation at the end) and the
episode's first-best welfare (:func:`first_best`). Episodes run in a local process pool.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.registry import REGISTRY
from agents.talk_off import PREFIX as TALK_OFF
from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER
from market.review.report.markup import h
from market.run.evaluation import csv_value, md_cell, seed_text, slug
from market.run.expert_matrix import matrix_scenarios
from market.run.folders import RunFolder, open_folder, read_jsonl
from market.run.jobs import ProgressFn, RunConfigError, default_workers, json_line
from market.run.negotiation_figures import (
    KEYS,
    Figure,
    paired,
    scenario_figures,
)
from market.run.negotiation_measures import (
    CORE_SCENARIOS,
    DEFAULT_SEEDS,
    EXPENSIVE,
    EXPERT,
    HEDGE_OFF,
    HONEST_TWINS,
    OWN,
    SEAT,
    SIDECAR,
    SPOT_ONLY,
    CellData,
    Tally,
    episode_first_best,
    first_best,
    play_counted,
    round_counts,
    welfare,
)
from market.run.rollout import default_seats
from market.run.runner import progress_bar
from market.run.worker_pool import TaskFailed, WorkerPool
from scenarios import load_scenario


def _seat_specs(sc: Scenario) -> dict[str, str]:
    return {s: spec for s, spec in default_seats(sc).items() if s != DESIGNER}


def cell_plan(
    sc: Scenario, agents: Sequence[str], expert: str = EXPERT
) -> dict[str, dict[str, str]]:
    """Cell name -> the seats it sets (the rest: the scenario's own)."""
    specs: list[str] = []
    for agent in dict.fromkeys([expert, *agents]):
        specs += [agent, TALK_OFF + agent]
    if expert == EXPERT:
        specs.append(HEDGE_OFF)
    for liar, honest in HONEST_TWINS:
        if liar in REGISTRY and honest in REGISTRY:
            specs += [liar, honest]
    cells = {spec: {SEAT: spec} for spec in dict.fromkeys(specs)}
    cells[OWN] = {}
    cells[SPOT_ONLY] = {s: TALK_OFF + spec for s, spec in _seat_specs(sc).items()}
    return cells


def _folder_name(cell: str) -> str:
    return cell if cell in (OWN, SPOT_ONLY) else slug(cell)


def _read_lines(folder: RunFolder) -> dict[int, dict[str, Any]]:
    lines = {}
    for line in read_jsonl(folder.out / SIDECAR):
        if (
            line is not None
            and line.get("config") == folder.config
            and line.get("seed") in folder.done
        ):
            lines[int(line["seed"])] = line
    return lines


# ----------------------------------------------------------------------------- figures


# ----------------------------------------------------------------------------- the report


@dataclass
class NegotiationReport:
    scenarios: list[str]
    seeds: list[int]
    talkers: list[str]
    figures: list[Figure]
    failed: dict[str, dict[int, str]] = field(default_factory=dict)

    def get(
        self, scenario: str, section: str, metric: str, subject: str | None = None
    ) -> Figure | None:
        for f in self.figures:
            if (f.scenario, f.section, f.metric) == (scenario, section, metric) and (
                subject is None or f.subject == subject
            ):
                return f
        return None

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(KEYS)
        for f in self.figures:
            row = {k: getattr(f, k) for k in KEYS}
            writer.writerow([csv_value(row[k]) for k in KEYS])
        return buf.getvalue()

    def headline(self) -> tuple[list[str], list[list[str]]]:
        """The summary table: one row per scenario (docs/negotiation.md, "The table")."""
        liars = [liar for liar, _ in HONEST_TWINS if any(f.subject == liar for f in self.figures)]
        head = [
            "scenario",
            *(f"talk: {a}" for a in self.talkers),
            *(f"lying: {liar}" for liar in liars),
            "forward %",
            "breach %",
            "defaults/ep",
            "cascades/ep",
            "hedging gain",
            "negotiable",
            "captured",
        ]
        rows = []
        for sc in self.scenarios:
            line = [sc]
            for a in self.talkers:
                f = self.get(sc, "value_of_talk", "return", a)
                line.append(_marked(f))
            for liar in liars:
                f = self.get(sc, "cost_of_lying", "share", liar)
                line.append(_marked(f, percent=True, beyond=0.10))
            for metric in ("episodes_with_forward", "episodes_with_breach"):
                f = self.get(sc, "rates", metric)
                line.append(f"{100 * f.mean:.0f}%" if f and math.isfinite(f.mean) else "n/a")
            for metric in ("defaults", "cascades"):
                f = self.get(sc, "rates", metric)
                line.append(f"{f.mean:.3f}" if f and math.isfinite(f.mean) else "n/a")
            line.append(_marked(self.get(sc, "hedging_gain", "return")))
            f = self.get(sc, "welfare", "negotiable")
            line.append(f.text(2) if f else "n/a")
            f = self.get(sc, "welfare", "share_captured")
            line.append(f"{100 * f.mean:.0f}%" if f and math.isfinite(f.mean) else "n/a")
            rows.append(line)
        return head, rows

    def markdown(self, plot: str | None = None) -> str:
        head, rows = self.headline()
        lines = [
            f"# Negotiation report\n\nSeat `{SEAT}`, {len(self.seeds)} paired seed(s) "
            f"({seed_text(self.seeds)}); every figure is a paired mean ± 95% CI (docs/negotiation.md). "
            "`>` marks a CI above 0 (for lying: entirely beyond a 10% loss).",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
        ]
        lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
        if plot:
            lines += ["", f"![value of talk, cost of lying and hedging gain per scenario]({plot})"]
        lines += [
            "",
            "## Where the dishonest agents' loss comes from",
            "",
            "Dishonest agent minus its honest twin, per episode (paired mean ± 95% CI); prices "
            "are credits per block over all episodes (dishonest minus honest).",
        ]
        for sc in self.scenarios:
            figs = [
                f for f in self.figures if f.scenario == sc and f.section == "lying_decomposition"
            ]
            if not figs:
                continue
            liars = list(dict.fromkeys(f.subject for f in figs))
            metrics = list(dict.fromkeys(f.metric for f in figs))
            lines += [
                "",
                f"### {sc}",
                "",
                "| metric | "
                + " | ".join(
                    f"{liar} − {next(f.versus for f in figs if f.subject == liar)}"
                    for liar in liars
                )
                + " |",
                "|---|" + "---:|" * len(liars),
            ]
            for m in metrics:
                cells = []
                for liar in liars:
                    f = next(f for f in figs if f.subject == liar and f.metric == m)
                    cells.append(
                        f.text()
                        if math.isfinite(f.ci95)
                        else (f"{f.mean:+.2f}" if math.isfinite(f.mean) else "n/a")
                    )
                lines.append(f"| {m} | " + " | ".join(md_cell(c) for c in cells) + " |")
        if self.failed:
            lines += ["", "## Episodes that failed", ""]
            lines += [
                f"- {k}: {len(v)} seed(s), e.g. {next(iter(v.values()))}"
                for k, v in self.failed.items()
            ]
        return "\n".join(lines) + "\n"

    def svg(self) -> str:
        """Value of talk, cost of lying (share) and hedging gain per scenario, with 95% CIs."""
        bars = []
        for f in self.figures:
            if (f.section, f.metric) in (
                ("value_of_talk", "return"),
                ("hedging_gain", "return"),
                ("cost_of_lying", "share"),
            ):
                label = {
                    "value_of_talk": f"talk {f.subject}",
                    "hedging_gain": "hedging gain",
                    "cost_of_lying": f"lying {f.subject} (share)",
                }[f.section]
                bars.append((f"{f.scenario}: {label}", f.mean, f.ci95))
        return bar_svg("Paired differences, mean and 95% CI", bars)


def _marked(f: Figure | None, percent: bool = False, beyond: float = 0.0) -> str:
    if f is None:
        return "n/a"
    return f.text(percent=percent) + (">" if math.isfinite(f.low) and f.low > beyond else "")


def bar_svg(title: str, bars: Sequence[tuple[str, float, float]]) -> str:
    """A standalone SVG of horizontal bars (label, mean, CI half-width) with whiskers."""
    finite = [
        v
        for _, m, c in bars
        for v in (m - (c if math.isfinite(c) else 0), m + (c if math.isfinite(c) else 0))
        if math.isfinite(v)
    ]
    lo, hi = min([0.0, *finite]), max([0.0, *finite])
    hi = hi if hi > lo else lo + 1
    left, width, row = 300, 720, 18
    plot_w = width - left - 20
    height = 40 + row * max(1, len(bars)) + 24

    def x(v: float) -> float:
        return round(left + (v - lo) / (hi - lo) * plot_w, 2)

    parts = [h("text", title, x=10, y=18, font_size=14, font_family="sans-serif")]
    for i, (label, mean, ci) in enumerate(bars):
        y = 32 + i * row
        parts.append(
            h(
                "text",
                label,
                x=left - 6,
                y=y + 12,
                font_size=11,
                font_family="sans-serif",
                text_anchor="end",
            )
        )
        if not math.isfinite(mean):
            continue
        a, b = sorted((x(0.0), x(mean)))
        color = "#4e79a7" if mean >= 0 else "#e15759"
        parts.append(
            h("rect", x=a, y=y + 3, width=round(max(0.5, b - a), 2), height=row - 6, fill=color)
        )
        if math.isfinite(ci) and ci > 0:
            parts.append(
                h(
                    "line",
                    x1=x(mean - ci),
                    x2=x(mean + ci),
                    y1=y + row / 2,
                    y2=y + row / 2,
                    stroke="#222",
                    stroke_width=1.2,
                )
            )
    zero = x(0.0)
    parts.append(h("line", x1=zero, x2=zero, y1=28, y2=height - 22, stroke="#888"))
    for v in (lo, hi):
        parts.append(
            h(
                "text",
                f"{v:.2f}",
                x=x(v),
                y=height - 8,
                font_size=10,
                font_family="sans-serif",
                text_anchor="middle",
            )
        )
    return (
        str(
            h(
                "svg",
                parts,
                xmlns="http://www.w3.org/2000/svg",
                viewBox=f"0 0 {width} {height}",
                width=width,
                height=height,
            )
        )
        + "\n"
    )


def default_scenarios(seat: str = SEAT) -> list[str]:
    """:data:`CORE_SCENARIOS` plus every scenario of the expert matrix with a negotiation turn,
    but :data:`EXPENSIVE`."""
    names = list(CORE_SCENARIOS)
    for name in matrix_scenarios(seat):
        if (
            name not in names
            and name not in EXPENSIVE
            and load_scenario(name).negotiation_turns > 0
        ):
            names.append(name)
    return names


def negotiation_report(
    out_dir: str | Path,
    seeds: Iterable[int] = DEFAULT_SEEDS,
    *,
    scenarios: Sequence[str | Path] | None = None,
    agents: Sequence[str] = (),
    workers: int | None = None,
    progress: bool | ProgressFn = True,
    fresh: bool = False,
) -> NegotiationReport:
    """Play every cell of every scenario over ``seeds`` (resuming what ``out_dir`` holds) and
    write ``negotiation.csv``, ``negotiation.md`` and ``negotiation.svg`` there.

    ``agents``: specs whose value of talk is measured besides ``rule_expert``. Raises
    :class:`RunConfigError` for an unknown scenario or agent, or no seeds."""
    seed_list = list(dict.fromkeys(int(s) for s in seeds))
    if len(seed_list) < 2:
        raise RunConfigError("give at least two seeds (e.g. --seeds 0:60) for paired CIs")
    out = Path(out_dir)
    talkers = list(dict.fromkeys([EXPERT, *agents]))
    plan: dict[str, dict[str, RunFolder]] = {}
    for spec in default_scenarios() if scenarios is None else scenarios:
        try:
            sc = load_scenario(spec)
        except ValueError as exc:
            raise RunConfigError(str(exc)) from None
        if sc.name in plan:
            raise RunConfigError(f"scenario {sc.name!r} is listed twice")
        if SEAT not in default_seats(sc):
            raise RunConfigError(f"scenario {sc.name!r} has no seat {SEAT}")
        plan[sc.name] = {
            cell: open_folder(
                sc, seed_list, seats, out / sc.name / _folder_name(cell), False, fresh, 1
            )
            for cell, seats in cell_plan(sc, agents).items()
        }
    folders = [(sc, cell, f) for sc, cells in plan.items() for cell, f in cells.items()]
    lines = [_read_lines(f) for _, _, f in folders]
    jobs = [
        (i, seed)
        for i, (_, _, f) in enumerate(folders)
        for seed in f.seeds
        if seed not in f.done or seed not in lines[i]
    ]
    failed: dict[str, dict[int, str]] = {}
    _play_all(folders, lines, jobs, failed, workers, progress)
    figures: list[Figure] = []
    for name, cells in plan.items():
        data = {}
        for cell, f in cells.items():
            d = CellData(cell)
            index = next(i for i, (s, c, _) in enumerate(folders) if (s, c) == (name, cell))
            for seed in f.seeds:
                if seed in f.done and seed in lines[index]:
                    d.rows[seed] = {r["seat"]: r for r in f.done[seed]}
                    d.rounds[seed] = f.rounds.get(seed, [])
                    d.lines[seed] = lines[index][seed]
            data[cell] = d
        figures += scenario_figures(name, data, talkers)
    report = NegotiationReport(list(plan), seed_list, talkers, figures, failed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "negotiation.csv").write_text(report.csv(), encoding="utf-8")
    (out / "negotiation.svg").write_text(report.svg(), encoding="utf-8")
    (out / "negotiation.md").write_text(report.markdown("negotiation.svg"), encoding="utf-8")
    return report


_FOLDER_JOBS: tuple[tuple[Any, ...], ...] = ()


def _start(folder_jobs: tuple[tuple[Any, ...], ...]) -> None:
    global _FOLDER_JOBS
    _FOLDER_JOBS = folder_jobs


def _play_task(task: tuple[int, int]) -> tuple[int, Any]:
    index, seed = task
    scenario, _, seats, transcript, digest_every, config = _FOLDER_JOBS[index]
    return index, play_counted((scenario, seed, seats, transcript, digest_every, config))


def _play_all(
    folders: list[tuple[str, str, RunFolder]],
    lines: list[dict[int, dict[str, Any]]],
    jobs: list[tuple[int, int]],
    failed: dict[str, dict[int, str]],
    workers: int | None,
    progress: bool | ProgressFn,
) -> None:
    """Play ``jobs`` (folder index, seed) in a process pool, recording each episode in its run
    folder (rows, round log) and its negotiation line in the folder's sidecar."""
    total = len(jobs)
    workers = default_workers() if workers is None else max(1, int(workers))
    callback = progress if callable(progress) else None
    folder_jobs = tuple(f.job(0) for _, _, f in folders)
    pool = (
        WorkerPool(_play_task, min(workers, total), initializer=_start, initargs=(folder_jobs,))
        if workers > 1 and total > 1
        else None
    )
    if pool is None:
        _start(folder_jobs)
    bar = progress_bar(progress is True and total > 0, "negotiation")
    sidecars = [open(f.out / SIDECAR, "a", encoding="utf-8") for _, _, f in folders]  # noqa: SIM115
    for _, _, f in folders:
        f.open()
    done = 0
    try:
        with bar:
            task = bar.add_task("negotiation", total=total)
            results = (
                (
                    (jobs[pos][0], (jobs[pos][1], None, [], None, f"episode not finished: {res}"))
                    if isinstance(res, TaskFailed)
                    else res
                    for pos, res in pool.imap_unordered(jobs)
                )
                if pool is not None
                else map(_play_task, jobs)
            )
            for index, (seed, rows, rounds, line, error) in results:
                scenario, cell, folder = folders[index]
                if error is not None or rows is None or line is None:
                    failed.setdefault(f"{scenario}/{cell}", {})[seed] = error or "no result"
                else:
                    if seed not in folder.done:
                        folder.record(seed, rows, rounds)
                    elif _returns_of(folder.done[seed]) != _returns_of(rows):
                        failed.setdefault(f"{scenario}/{cell}", {})[seed] = (
                            "replayed episode differs from the run folder's"
                        )
                        continue
                    sidecars[index].write(json_line(line))
                    sidecars[index].flush()
                    lines[index][seed] = line
                done += 1
                bar.update(task, completed=done)
                if callback is not None:
                    callback(done, total)
            if pool is not None:
                pool.close()
    finally:
        if pool is not None:
            pool.terminate()
        for fh in sidecars:
            fh.close()
        for _, _, f in folders:
            f.close()


def _returns_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    return {r["seat"]: r["return"] for r in rows}


__all__ = [
    "CORE_SCENARIOS",
    "DEFAULT_SEEDS",
    "HONEST_TWINS",
    "NegotiationReport",
    "SEAT",
    "Tally",
    "default_scenarios",
    "episode_first_best",
    "first_best",
    "negotiation_report",
    "paired",
    "round_counts",
    "welfare",
]
