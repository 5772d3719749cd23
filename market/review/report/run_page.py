"""The report of a run folder (``gpumarket run``): aggregate tables and plots, an index of every
episode, and a page for a sample of episodes.

The run's ``report.html`` is built from the run's result rows (``results.jsonl``, one row per
episode and seat, :data:`market.run.runner.ROW_KEYS`), never from the transcripts, so its size
and build time grow with the number of episodes by one index row each and not with what the
episodes hold. It shows the agent-health box, the mean and 95% CI of every seat's return and
reward components, the welfare ratio, conduct per agent, a bar chart of mean returns, a chart of
the welfare ratio per seed, and the episode index: per seed its rounds, steps, welfare ratio,
each seat's return, its flags (decisions that fell back, agent errors, timeouts, invalid
actions) and a link to its page.

An episode's page (``episodes/<seed>.html``) is the single-transcript page of
:func:`market.review.report.page.build_report` (seats, plots, graph, every round and step).
Pages are written for a sample of episodes (:func:`sample_seeds`):

- the first :data:`FIRST` seeds of the run (in seed order);
- the :data:`EXTREMES` episodes with the lowest and the :data:`EXTREMES` with the highest welfare
  ratio (ties broken by the lower seed; episodes with no finite ratio are left out);
- up to :data:`FLAGGED` flagged episodes (any fallback, agent error or timeout), lowest seeds
  first;

and only for episodes whose transcript is in the folder. Any other episode's page is written on
demand by ``gpumarket report RUN_DIR --episode SEED`` (:func:`write_episode_page`), which is the
same function, so a page written on demand equals the sampled one byte for byte; the index row of
an episode without a page says that command instead of linking.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from agents.specs_redact import redact_spec
from market.review.report.episode import episode_from, seat_sort_key
from market.review.report.markup import Safe, clip, fmt, h, html_table, join
from market.review.report.page import (
    CSS,
    build_report,
    content_security_policy,
    health_box,
    units_note,
)
from market.review.report.plots import Series, bar_chart, line_chart
from market.review.report.views import axis_unit
from market.run.conduct_table import CONDUCT_HEADERS, conduct_cells, summarize
from market.run.health import from_rows
from market.run.rollout import mean_ci95
from market.run.worker_pool import TaskFailed, WorkerPool

#: the sample rule's sizes (see the module docstring)
FIRST, EXTREMES, FLAGGED = 5, 3, 5
#: where an episode's page goes, relative to the run folder
PAGES = "episodes"
TITLE = "gpumarket run report"
#: the sample's pages go to a pool of processes only when writing them in this process would
#: take longer than this (seconds, estimated from the first page): starting a pool costs more
#: than a handful of small pages
POOL_AFTER_S = 0.5


@dataclass
class EpisodeRow:
    """One episode as the run report shows it, gathered from its result rows (plain data)."""

    seed: int
    scenario: str = ""
    rounds: int = 0
    steps: int = 0
    welfare: float = math.nan
    seats: dict[str, str] = field(default_factory=dict)  # seat -> agent spec
    returns: dict[str, float] = field(default_factory=dict)
    fallbacks: int = 0
    agent_errors: int = 0
    timeouts: int = 0
    invalid: int = 0

    @property
    def flagged(self) -> bool:
        """Any decision fell back, raised or timed out."""
        return bool(self.fallbacks or self.agent_errors or self.timeouts)


def _num(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return math.nan


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def episode_rows(rows: Sequence[Mapping[str, Any]]) -> list[EpisodeRow]:
    """The episodes of result rows, in seed order (rows of one seed are one episode)."""
    by_seed: dict[int, EpisodeRow] = {}
    for row in rows:
        seed = row.get("seed")
        if not isinstance(seed, int) or isinstance(seed, bool):
            continue
        ep = by_seed.get(seed)
        if ep is None:
            ep = by_seed[seed] = EpisodeRow(
                seed,
                str(row.get("scenario", "")),
                _int(row.get("rounds")),
                _int(row.get("steps")),
                _num(row.get("welfare_ratio")),
            )
        seat = str(row.get("seat", "?"))
        ep.seats[seat] = redact_spec(str(row.get("agent", "")))  # rows of older runs too
        ep.returns[seat] = _num(row.get("return"))
        ep.fallbacks += _int(row.get("fallbacks"))
        ep.agent_errors += _int(row.get("agent_errors"))
        ep.timeouts += _int(row.get("timeouts"))
        ep.invalid += _int(row.get("invalid_actions"))
    return [by_seed[s] for s in sorted(by_seed)]


def sample_seeds(
    episodes: Sequence[EpisodeRow],
    first: int = FIRST,
    extremes: int = EXTREMES,
    flagged: int = FLAGGED,
) -> list[int]:
    """The seeds that get a page when the run report is written (the rule in the module
    docstring), sorted."""
    ordered = sorted(episodes, key=lambda e: e.seed)
    chosen = {e.seed for e in ordered[:first]}
    finite = sorted(
        (e for e in ordered if math.isfinite(e.welfare)), key=lambda e: (e.welfare, e.seed)
    )
    if extremes > 0:
        chosen.update(e.seed for e in finite[:extremes])
        chosen.update(e.seed for e in sorted(finite, key=lambda e: (-e.welfare, e.seed))[:extremes])
    chosen.update(e.seed for e in [e for e in ordered if e.flagged][:flagged])
    return sorted(chosen)


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The result rows of a run folder (``results.jsonl``); a line cut by a crash is skipped."""
    path = run_dir / "results.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} is not a run folder (no results.jsonl); give the folder "
            "`gpumarket run` wrote, e.g. runs/market_round"
        )
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def episode_command(run_dir: Path | str, seed: int | str) -> str:
    """The command that writes ``seed``'s page."""
    return f"gpumarket report {run_dir} --episode {seed}"


def transcript_of(run_dir: Path, seed: int) -> Path:
    return run_dir / "transcripts" / f"{seed}.jsonl"


def files_in(folder: Path) -> set[str]:
    """The names of the files in ``folder`` (none if it is missing): one directory listing,
    where asking ``is_file()`` of every episode's path costs a system call each."""
    try:
        with os.scandir(folder) as entries:
            return {entry.name for entry in entries if entry.is_file()}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def episode_page(run_dir: Path, seed: int) -> str:
    """The page of one episode of a run: the single-transcript report of its transcript, its
    source named relative to the run folder (so the page does not depend on how the folder was
    named on the command line)."""
    path = transcript_of(run_dir, seed)
    if not path.is_file():
        raise FileNotFoundError(
            f"no transcript for seed {seed} in {run_dir / 'transcripts'}; pick a seed the run "
            "recorded (the run must not have used --no-transcripts)"
        )
    ep = episode_from(path)
    ep.source = f"transcripts/{seed}.jsonl"
    return build_report([ep])


def write_episode_page(run_dir: str | Path, seed: int, out: str | Path | None = None) -> Path:
    """Write ``seed``'s page (default ``RUN_DIR/episodes/<seed>.html``) and return its path."""
    run_dir = Path(run_dir)
    target = Path(out) if out is not None else run_dir / PAGES / f"{seed}.html"
    text = episode_page(run_dir, seed)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def value_units(run_dir: Path) -> dict[str, float | None]:
    """Scenario name -> credits per reward unit (``rewards.value_unit``) from the run folder's
    manifest (``run.json``); empty when the folder has none or it is unreadable."""
    try:
        manifest = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(manifest, dict):
        return {}
    scenario = manifest.get("scenario")
    rewards = scenario.get("rewards") if isinstance(scenario, dict) else None
    unit = rewards.get("value_unit") if isinstance(rewards, dict) else None
    name = manifest.get("scenario_name")
    if not isinstance(name, str) or not (_num(unit) > 0):
        return {}
    return {name: float(cast(float, unit))}


def _aggregate(
    rows: Sequence[Mapping[str, Any]],
    episodes: Sequence[EpisodeRow],
    units: Mapping[str, float | None],
) -> Safe:
    by_seat: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_seat[str(row.get("seat", "?"))].append(row)
    seats = sorted(by_seat, key=seat_sort_key)
    names = sorted({str(n) for r in rows for n in (r.get("components") or {})})
    table, bars = [], []
    for seat in seats:
        seat_rows = by_seat[seat]
        agents = sorted({redact_spec(str(r.get("agent", ""))) for r in seat_rows} - {""})
        ret_m, ret_c = mean_ci95([_num(r.get("return")) for r in seat_rows])
        bars.append((seat, ret_m, ret_c))
        columns: list[list[float]] = [[] for _ in names]  # one pass over the rows for all
        for r in seat_rows:
            components = r.get("components") or {}
            for n, column in zip(names, columns, strict=True):
                value = components.get(n, 0.0)
                column.append(value if type(value) is float else _num(value))
        cells = []
        for column in columns:
            m, c = mean_ci95(column)
            cells.append(f"{fmt(m, 3)} \u00b1 {fmt(c, 3)}")
        table.append(
            [
                seat,
                clip(", ".join(agents), 120),
                str(len(seat_rows)),
                f"{fmt(ret_m, 3)} \u00b1 {fmt(ret_c, 3)}",
                *cells,
            ]
        )
    finite = [e for e in episodes if math.isfinite(e.welfare)]
    welfare_m, welfare_c = mean_ci95([e.welfare for e in finite])
    return h(
        "section",
        h("h2", "Aggregate per seat (mean \u00b1 95% CI over episodes)"),
        units_note(units),
        html_table(
            ["seat", "agent", "episodes", "return", *names],
            table,
            "aggregate",
            numeric=tuple(range(2, 4 + len(names))),
        ),
        h("p", f"welfare ratio: {fmt(welfare_m, 3)} \u00b1 {fmt(welfare_c, 3)}"),
        _conduct_by_agent(rows),
        h(
            "div",
            bar_chart(
                "Mean return per seat (95% CI)",
                bars,
                plot_id="aggregate-returns",
                y_label=f"return ({axis_unit(units)})",
            ),
            line_chart(
                "Welfare ratio per episode (allocated / optimal)",
                [Series("welfare ratio", [(float(e.seed), e.welfare) for e in finite], 4)],
                plot_id="welfare-by-seed",
                x_label="seed",
                y_label="ratio",
                y_range=(0.0, 1.0),
            ),
            class_="plots",
        ),
        id="aggregate",
    )


def _conduct_by_agent(rows: Sequence[Mapping[str, Any]]) -> Safe:
    """Per agent spec: its seat-episodes' conduct (:mod:`market.run.conduct_table`; a row
    without a ``conduct`` mapping was recorded before the conduct judge: not judged)."""
    scores: dict[str, list[Mapping[str, Any] | None]] = defaultdict(list)
    for row in rows:
        conduct = row.get("conduct")
        agent = redact_spec(str(row.get("agent") or row.get("seat") or "?"))
        scores[agent].append(conduct if isinstance(conduct, Mapping) else None)
    table = [
        [clip(agent, 120), str(len(scores[agent])), *conduct_cells(summarize(scores[agent]))]
        for agent in sorted(scores)
    ]
    return join(
        [
            h("h3", "Conduct per agent (seat-episodes with a final conduct score)"),
            html_table(
                ["agent", "seat-episodes", *CONDUCT_HEADERS],
                table,
                "conduct-agents",
                numeric=(1, 2, 3, 4),
            ),
        ]
    )


def _flags(ep: EpisodeRow) -> str:
    parts = [
        f"{n} {label}"
        for n, label in (
            (ep.fallbacks, "fell back"),
            (ep.agent_errors, "errors"),
            (ep.timeouts, "timeouts"),
            (ep.invalid, "invalid"),
        )
        if n
    ]
    return ", ".join(parts) or "-"


def _index(
    episodes: Sequence[EpisodeRow],
    pages: Mapping[int, str],
    run_label: str,
    recorded: set[int],
    units: Mapping[str, float | None],
) -> Safe:
    seats = sorted({s for e in episodes for s in e.seats}, key=seat_sort_key)
    rows = []
    for e in episodes:
        if e.seed in pages:
            page: Any = h("a", f"episode {e.seed}", href=pages[e.seed])
        elif e.seed in recorded:
            page = h("code", episode_command(run_label, e.seed))
        else:
            page = h("span", "no transcript", class_="muted")
        rows.append(
            [
                str(e.seed),
                page,
                str(e.rounds),
                str(e.steps),
                fmt(e.welfare, 3),
                *(fmt(e.returns.get(s), 2) for s in seats),
                _flags(e),
            ]
        )
    return h(
        "section",
        h("h2", f"Episodes ({len(episodes)})"),
        h(
            "p",
            f"{len(pages)} episode page(s) written (the first seeds, the lowest and highest "
            "welfare ratios, flagged episodes); write any other with ",
            h("code", episode_command(run_label, "SEED")),
            ".",
            class_="muted",
        ),
        units_note(units) if episodes else None,
        html_table(
            ["seed", "page", "rounds", "steps", "welfare ratio", *seats, "flags"],
            rows,
            "index",
            numeric=(0, *range(2, 5 + len(seats))),
        ),
        id="index",
    )


def build_run_report(
    rows: Sequence[Mapping[str, Any]],
    pages: Mapping[int, str] | None = None,
    run_label: str = "RUN_DIR",
    recorded: set[int] | None = None,
    *,
    episodes: Sequence[EpisodeRow] | None = None,
    units: Mapping[str, float | None] | None = None,
) -> str:
    """The run report as a string: ``pages`` maps a seed to its page's link (relative to the
    report); ``recorded`` holds the seeds with a transcript (their rows name the command that
    writes their page); ``run_label`` is the run folder as the command should name it.
    ``episodes``: :func:`episode_rows` of ``rows``, when the caller already has them.
    ``units``: scenario name -> credits per reward unit (:func:`value_units`); a scenario not
    in it is said to have its unit unrecorded."""
    pages = dict(pages or {})
    episodes = episode_rows(rows) if episodes is None else episodes
    scenarios = sorted({e.scenario for e in episodes})
    known = dict(units or {})
    units = {name: known.get(name) for name in scenarios}
    subtitle = f"{', '.join(scenarios) or 'no scenario'}: {len(episodes)} episode(s)"
    nav = h("nav", [h("a", "aggregate", href="#aggregate"), h("a", "episodes", href="#index")])
    body = h(
        "body",
        h("header", h("h1", TITLE), h("p", subtitle, class_="muted"), nav),
        h(
            "main",
            health_box(from_rows(rows)),
            _aggregate(rows, episodes, units) if rows else h("p", "no episodes", class_="muted"),
            _index(episodes, pages, run_label, set(recorded or ()), units),
        ),
    )
    head = h(
        "head",
        h("meta", charset="utf-8"),
        h("meta", http_equiv="Content-Security-Policy", content=content_security_policy()),
        h("meta", name="referrer", content="no-referrer"),
        h("meta", name="viewport", content="width=device-width, initial-scale=1"),
        h("title", TITLE),
        Safe(f"<style>{CSS}</style>"),
    )
    return "<!DOCTYPE html>\n" + h("html", head, body, lang="en") + "\n"


@dataclass
class RunReport:
    """What :func:`write_run_report` wrote: the report and the episode pages."""

    path: Path
    pages: list[Path]


def write_run_report(
    run_dir: str | Path,
    rows: Sequence[Mapping[str, Any]] | None = None,
    out: str | Path | None = None,
    sample: bool = True,
    workers: int = 1,
) -> RunReport:
    """Write ``RUN_DIR/report.html`` (or ``out``) from the run's rows (read from
    ``results.jsonl`` when not given) and, with ``sample``, the sampled episodes' pages (each
    reads and replays one transcript), with up to ``workers`` processes (:func:`write_pages`)."""
    run_dir = Path(run_dir)
    rows = list(rows) if rows is not None else read_rows(run_dir)
    target = Path(out) if out is not None else run_dir / "report.html"
    episodes = episode_rows(rows)
    transcripts = files_in(run_dir / "transcripts")
    recorded = {e.seed for e in episodes if f"{e.seed}.jsonl" in transcripts}
    written = []
    if sample:
        written = write_pages(
            run_dir, sample_seeds([e for e in episodes if e.seed in recorded]), workers
        )
    # every page in the folder gets its link: the sample, and pages written on demand before
    folder = Path(os.path.relpath(run_dir / PAGES, target.parent)).as_posix()
    prefix = "" if folder == "." else folder + "/"
    on_disk = files_in(run_dir / PAGES)
    pages = {seed: f"{prefix}{seed}.html" for seed in sorted(recorded) if f"{seed}.html" in on_disk}
    target.parent.mkdir(parents=True, exist_ok=True)
    text = build_run_report(
        rows, pages, str(run_dir), recorded, episodes=episodes, units=value_units(run_dir)
    )
    target.write_text(text, encoding="utf-8")
    return RunReport(target, written)


def write_pages(
    run_dir: Path,
    seeds: Sequence[int],
    workers: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Path]:
    """Write each seed's page (:func:`write_episode_page`): the first in this process, timed
    by ``clock``; the rest in a pool of up to ``workers`` processes if writing them here would
    take longer than :data:`POOL_AFTER_S`, else here. Never a pool while this process runs
    other threads: a forked child of a process with other threads (an LLM backend's) can
    deadlock."""
    if not seeds:
        return []
    start = clock()
    written = [write_episode_page(run_dir, seeds[0])]
    rest = [(run_dir, seed) for seed in seeds[1:]]
    estimate = (clock() - start) * len(rest)
    if workers > 1 and len(rest) > 1 and estimate > POOL_AFTER_S and threading.active_count() == 1:
        with WorkerPool(_write_page, min(workers, len(rest))) as pool:
            by_position = dict(pool.imap_unordered(rest))
            pool.close()
        # a page whose worker failed is written here: the page, or the error it raises
        return written + [
            write_episode_page(*rest[p]) if isinstance(page, TaskFailed) else page
            for p, page in sorted(by_position.items())
        ]
    return written + [write_episode_page(*job) for job in rest]


def _write_page(job: tuple[Path, int]) -> Path:
    """A pool worker's task: one page (:func:`write_episode_page`)."""
    return write_episode_page(*job)


__all__ = [
    "EXTREMES",
    "FIRST",
    "FLAGGED",
    "PAGES",
    "POOL_AFTER_S",
    "EpisodeRow",
    "RunReport",
    "build_run_report",
    "episode_command",
    "episode_page",
    "episode_rows",
    "files_in",
    "read_rows",
    "sample_seeds",
    "transcript_of",
    "value_units",
    "write_episode_page",
    "write_pages",
    "write_run_report",
]
