"""Bench reports read back and compared (``gpumarket bench --compare``), and printed as tables."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from market.bench.config import DEFAULT_THRESHOLD, SCHEMA, BenchFileError
from market.record.console import terminal_console


def load_report(path: Path) -> dict[str, Any]:
    """Read and check a bench JSON file; :class:`BenchFileError` (one line) when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise BenchFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BenchFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), list):
        raise BenchFileError(f"{path}: not a gpumarket bench file (no 'metrics' list)")
    if data.get("schema") != SCHEMA:
        raise BenchFileError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    seen: set[str] = set()
    for i, m in enumerate(data["metrics"]):
        problem = _metric_problem(m)
        if problem:
            raise BenchFileError(f"{path}: metric #{i}: {problem}")
        if m["name"] in seen:
            raise BenchFileError(f"{path}: metric {m['name']!r} appears twice")
        seen.add(m["name"])
    return data


def _metric_problem(m: Any) -> str | None:
    if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
        return "needs a non-empty string 'name'"
    value = m.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"{m['name']!r}: 'value' must be a finite number, got {value!r}"
    if m.get("direction") not in ("higher", "lower"):
        return f"{m['name']!r}: 'direction' must be 'higher' or 'lower', got {m.get('direction')!r}"
    noise = m.get("noise", 0.0)
    if isinstance(noise, bool) or not isinstance(noise, int | float) or not noise >= 0:
        return f"{m['name']!r}: 'noise' must be a number >= 0, got {noise!r}"
    return None


@dataclass
class Comparison:
    rows: list[dict[str, Any]]  # name, unit, direction, old, new, change, status
    only_old: list[str]
    only_new: list[str]
    threshold: float

    @property
    def regressions(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] == "regression"]


def classify(
    old: float, new: float, direction: str, threshold: float, noise: float = 0.0
) -> tuple[float | None, str]:
    """Relative change (new - old) / |old| and a status: ``regression`` when it moved more than
    ``threshold`` in the bad direction, ``improved`` when as much in the good one, else ``ok``;
    always ``ok`` when the absolute change is within ``noise``."""
    if old == 0:
        return None, "ok" if new == 0 else "n/a"  # no relative change from zero
    change = (new - old) / abs(old)
    if abs(new - old) <= noise:
        return change, "ok"
    worse = -change if direction == "higher" else change
    if worse > threshold:
        return change, "regression"
    if -worse > threshold:
        return change, "improved"
    return change, "ok"


def compare_reports(
    old: dict[str, Any], new: dict[str, Any], threshold: float = DEFAULT_THRESHOLD
) -> Comparison:
    """Metric by metric, in the new report's order. The direction is the new file's. Values whose
    ``context`` differs (another LLM server, other fit sizes) are ``not comparable``."""
    olds = {m["name"]: m for m in old["metrics"]}
    news = {m["name"]: m for m in new["metrics"]}
    rows = []
    for name, m in news.items():
        if name not in olds:
            continue
        o = olds[name]
        if o.get("direction") != m["direction"]:
            raise BenchFileError(
                f"metric {name!r}: direction {o.get('direction')!r} in the old "
                f"file but {m['direction']!r} in the new one"
            )
        if o.get("context") != m.get("context"):
            change, status = None, "not comparable"
        else:
            noise = max(float(o.get("noise", 0.0)), float(m.get("noise", 0.0)))
            change, status = classify(o["value"], m["value"], m["direction"], threshold, noise)
        rows.append(
            {
                "name": name,
                "unit": m.get("unit", ""),
                "direction": m["direction"],
                "old": o["value"],
                "new": m["value"],
                "change": change,
                "status": status,
            }
        )
    if not rows:
        raise BenchFileError("the two files share no metric")
    return Comparison(
        rows, [n for n in olds if n not in news], [n for n in news if n not in olds], threshold
    )


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:,.2f}"


def _serve_note(details: dict[str, Any] | None) -> str:
    if not details:
        return "served matches under load"
    return (
        f"{details['sessions']} concurrent remote-seat clients x "
        f"{details['decisions_per_session']} decisions ({details['scenario']}) against gpumarket "
        "serve on 127.0.0.1; step = action sent -> next observation held"
    )


def print_report(report: dict[str, Any], console: Any = None) -> None:
    """Every metric grouped by section, then the skipped sections and the targets."""
    console = console or _console()
    notes = {
        "startup": "wall seconds of a fresh interpreter running the command (median); python = "
        "the bare interpreter",
        "steps": "scripted agents in every seat, one process, one env reused",
        "expert": "rule_expert in every bidder seat: act CPU seconds / (act + env.step CPU seconds)",
        "episodes": "run_scenario, local process pool, transcripts off; pool start-up included",
        "ray": "run_scenario(backend='ray') on a private local Ray instance, after a warm-up run",
        "clearing": "median ms of clear() per call; exponent = slope of log(time) on log(n)",
        "memory": "per live reset env, fresh interpreter (RSS growth; tracemalloc bytes held)",
        "transcript": "steps/s without / with a transcript file per episode; digest_N = digests "
        "every N steps",
        "report": "the run report (report.html) built from N synthetic episodes' result rows: "
        "seconds and size",
        "llm": _llm_note(report["details"].get("llm")),
        "serve": _serve_note(report["details"].get("serve")),
        "peer": "steps per CPU second against the GPU-arena seed's env with its expert policy "
        "(median of interleaved passes); ratio = ours / the seed's",
    }
    for section in report["options"]["sections"]:
        metrics = [m for m in report["metrics"] if m["section"] == section]
        if not metrics:
            continue
        table = Table(title=f"{section}: {notes[section]}", title_justify="left")
        table.add_column("metric", no_wrap=True, min_width=max(len(m["name"]) for m in metrics))
        for col in ("value", "unit", "better"):
            table.add_column(col, justify="right")
        for m in metrics:
            table.add_row(m["name"], _fmt(m["value"]), m["unit"], m["direction"])
        console.print(table)
    clearing = report["details"].get("clearing")
    if clearing:
        console.print(
            f"n log n reference exponent over n in {clearing['fit_sizes']}: "
            f"{clearing['nlogn_exponent']:.3f}"
        )
    llm = report["details"].get("llm") or {}
    for row in llm.get("rows", []):
        if row["fallbacks"] or row.get("backend_errors"):
            why = (
                f"{row['length_cutoffs']} cut off by the token limit"
                if "length_cutoffs" in row
                else f"{row['backend_errors']} backend error(s)"
            )
            console.print(
                f"[yellow]llm at concurrency {row['concurrency']}: {row['fallbacks']} "
                f"fallback(s), {why}[/yellow]"
            )
    if "episode" in llm:
        one, many = llm["episode"]
        console.print(
            f"llm episode (market_round, 8 labs): {many['llm_seats']} LLM seats "
            f"{many['seconds']:g} s vs 1 LLM seat {one['seconds']:g} s "
            f"({llm['episode_ratio']:g}x)"
        )
    for section, reason in report["skipped"].items():
        console.print(f"[yellow]skipped {section}[/yellow]: {reason}")
    for t in report["targets"]:
        mark = "[green]OK[/green]" if t["ok"] else "[red]MISSED[/red]"
        console.print(f"target {t['target']}: {_fmt(t['value'])} {mark}")
    load = report["machine"].get("load_average")
    if load and load[0] > 0.5 * report["machine"]["cores"]:
        console.print(
            f"[yellow]the machine was busy (load average {load[0]:g} on "
            f"{report['machine']['cores']} cores at the start): the figures understate "
            "an idle machine[/yellow]"
        )
    if report["options"].get("quick"):
        console.print("[yellow]--quick: tiny budgets, the figures are smoke checks only[/yellow]")


def _console() -> Any:
    """The console of the tables: whole when piped or logged, records on a narrow terminal, so
    that no metric name or figure is cut (:mod:`market.record.console`)."""
    return terminal_console()


def _llm_note(details: dict[str, Any] | None) -> str:
    if not details:
        return "LLM decisions/s"
    if "server" not in details:  # a local model through the transformers backend
        return f"local model {details['model']} on {details['device']} ({details['dtype']})"
    if details["server"] == "fake":
        return (
            f"fake OpenAI-compatible server, fixed {details['latency_ms']:g} ms latency: "
            "measures the client stack, not a model"
        )
    return f"server {details['server']}, model {details['model']}"


def print_comparison(cmp: Comparison, old_label: str, new_label: str, console: Any = None) -> None:
    console = console or _console()
    table = Table(
        title=f"{old_label} -> {new_label} (flag: > {cmp.threshold:.0%} worse)",
        title_justify="left",
    )
    table.add_column("metric", no_wrap=True, min_width=max(len(r["name"]) for r in cmp.rows))
    for col in ("unit", "better", "old", "new", "change", "status"):
        table.add_column(col, justify="left" if col == "status" else "right")
    colours = {"regression": "red", "improved": "green"}
    for r in cmp.rows:
        change = "" if r["change"] is None else f"{r['change']:+.1%}"
        status = r["status"]
        if status in colours:
            status = f"[{colours[status]}]{status}[/{colours[status]}]"
        table.add_row(
            r["name"], r["unit"], r["direction"], _fmt(r["old"]), _fmt(r["new"]), change, status
        )
    console.print(table)
    if cmp.only_old:
        console.print(f"only in {old_label} ({len(cmp.only_old)}): {', '.join(cmp.only_old)}")
    if cmp.only_new:
        console.print(f"only in {new_label} ({len(cmp.only_new)}): {', '.join(cmp.only_new)}")
    bad = cmp.regressions
    if bad:
        console.print(
            f"[red]{len(bad)} regression(s) > {cmp.threshold:.0%}[/red]: "
            + ", ".join(r["name"] for r in bad)
        )
    else:
        console.print(f"no regression > {cmp.threshold:.0%}")
