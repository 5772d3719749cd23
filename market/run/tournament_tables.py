"""A tournament's outputs: the ratings table (terminal, Markdown, CSV) and its files."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table

from market.core.seats import DESIGNER
from market.run.conduct_table import CONDUCT_HEADERS, CONDUCT_KEYS, ConductSummary, conduct_cells
from market.run.rollout import mean_ci95
from market.run.tournament_plan import Plan, bidder_seats

CSV_COLUMNS = (
    "role",
    "agent",
    "mu",
    "sigma",
    "ordinal",
    "matches",
    "wins",
    "win_rate",
    "win_ci_low",
    "win_ci_high",
    "mean_return",
    "return_ci95",
    "tokens",
    "cost_usd",
    *CONDUCT_KEYS,
)


def designer_by_population(plan_: Plan, records: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """designer -> population -> mean designer return, its 95% CI half-width, episodes."""
    out: dict[str, Any] = {}
    for d in plan_.designers:
        out[d] = {}
        for pop in plan_.populations:
            vals = [
                float(records[i]["returns"][DESIGNER])
                for seed in plan_.seeds
                if (i := f"designer|{pop}|seed={seed}|{d}") in records
            ]
            mean, half = mean_ci95(vals)
            out[d][pop] = {"mean_return": mean, "return_ci95": half, "episodes": len(vals)}
    return out


# ----------------------------------------------------------------------------- storage


def fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def display_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Rows as text cells: role, agent, mu, sigma, ordinal, matches, win rate [CI], return ± CI,
    tokens, cost in USD, conduct (:func:`market.run.conduct_table.conduct_cells`)."""
    cells = []
    for r in rows:
        win = (
            f"{fmt(r['win_rate'], 2)} [{fmt(r['win_ci_low'], 2)},{fmt(r['win_ci_high'], 2)}]"
            if r["matches"]
            else "-"
        )
        cells.append(
            [
                r["role"],
                r["agent"],
                fmt(r["mu"], 2),
                fmt(r["sigma"], 2),
                fmt(r["ordinal"], 2),
                str(r["matches"]),
                win,
                f"{fmt(r['mean_return'])} ± {fmt(r['return_ci95'])}"
                if r["matches"] or not math.isnan(r["mean_return"])
                else "-",
                f"{r['tokens']:,}",
                f"{r['cost_usd']:.4f}",
                *conduct_cells(ConductSummary(**{k: r[k] for k in CONDUCT_KEYS})),
            ]
        )
    return cells


HEADERS = (
    "role",
    "agent",
    "mu",
    "sigma",
    "mu-3σ",
    "matches",
    "win rate [CI]",
    "return ± CI",
    "tokens",
    "cost USD",
    *CONDUCT_HEADERS,
)


def title(plan_: Plan, done: int) -> str:
    seeds = plan_.seeds
    span = (
        f"{seeds[0]}..{seeds[-1]}"
        if list(seeds) == list(range(seeds[0], seeds[-1] + 1))
        else ",".join(map(str, seeds))
    )
    total = len(plan_.matches)
    state = "" if done == total else f" (partial: {done} of {total} matches)"
    return f"Tournament on {plan_.scenario.name}, seeds {span}{state}"


def markdown(plan_: Plan, rows: list[dict[str, Any]], done: int) -> str:
    lines = [f"# {title(plan_, done)}", ""]
    if plan_.bidders:
        lines.append(
            f"- bidder matches: {len(plan_.bidders)} rotations per seed through "
            f"{len(bidder_seats(plan_.scenario))} bidder seats; house designer "
            f"`{plan_.house_designer}`"
        )
    for name, seats in plan_.populations.items():
        lines.append(f"- designer population `{name}`: {', '.join(seats.values())}")
    lines += [
        "- ratings: OpenSkill Plackett-Luce, bidders and designers rated separately; "
        "mu-3σ is the conservative ordinal the table is sorted by",
        "- win rate: share of "
        "matches ranked first (a shared first place counts 1/k), Wilson 95% CI; return: "
        "mean episode return, Student-t 95% CI",
        "- tokens (prompt + completion) and cost (USD, for LLM seats whose spec sets "
        "price_prompt/price_completion): of the agent's seats over all its matches",
        "- conduct: mean truthfulness and promise-keeping of the agent's seats over the "
        "seat-episodes with a judged claim / a due promise (n of them), manipulation attempts "
        "per seat-episode (docs/conduct.md)",
        "",
    ]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(HEADERS))) + "|")
    lines += ["| " + " | ".join(c) + " |" for c in display_rows(rows)]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow([fmt(r[c], 6) for c in CSV_COLUMNS])
    return buf.getvalue()


def write_outputs(
    out: Path, plan_: Plan, records: Mapping[str, dict[str, Any]], rows: list[dict[str, Any]]
) -> None:
    done = len(records)
    (out / "ratings.csv").write_text(to_csv(rows), encoding="utf-8")
    (out / "ratings.md").write_text(markdown(plan_, rows, done), encoding="utf-8")
    summary = {
        "title": title(plan_, done),
        "matches_done": done,
        "matches_total": len(plan_.matches),
        "rating_model": "openskill PlackettLuce (default mu=25, sigma=25/3)",
        "rows": no_nan(rows),
        "designer_by_population": no_nan(designer_by_population(plan_, records)),
    }
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, out / "summary.json")


def no_nan(value: Any) -> Any:
    """NaN (no data yet) as null, so that summary.json is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_nan(v) for v in value]
    return value


def rich_table(plan_: Plan, rows: list[dict[str, Any]], done: int) -> Any:
    """A rich renderable: the title, then one table per role (bidders, designers)."""
    parts: list[Any] = [f"[bold]{title(plan_, done)}[/bold] (CI: 95% confidence interval)"]
    for role in ("bidder", "designer"):
        mine = [r for r in rows if r["role"] == role]
        if not mine:
            continue
        # the conduct columns get a table of their own: in one, a terminal wraps the cells
        split = len(HEADERS) - len(CONDUCT_HEADERS)
        main, conduct = (
            Table(
                title=f"{role}s{suffix}",
                box=box.SIMPLE_HEAD,
                title_justify="left",
                pad_edge=False,
                collapse_padding=True,
            )
            for suffix in ("", ": conduct")
        )
        for i, h in enumerate(HEADERS[1:split]):
            main.add_column(h, justify="left" if i == 0 else "right")
        for i, h in enumerate((HEADERS[1], *HEADERS[split:])):
            conduct.add_column(h, justify="left" if i == 0 else "right")
        for cells in display_rows(mine):
            main.add_row(*cells[1:split])
            conduct.add_row(cells[1], *cells[split:])
        parts += [main, conduct]
    return Group(*parts)
