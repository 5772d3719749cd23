"""``gpumarket run``, ``eval`` and ``tournament``: the commands that play episodes over seeds
(the exit codes are listed in :mod:`market.cli`).

``--out`` is the folder each writes its files into (docs/running.md, "One grammar"): run's run
folder (default ``runs/SCENARIO``), eval's tables and run folders (default ``runs/eval``), the
tournament's matches and ratings (default ``runs/tournament/SCENARIO``). A run folder of the old
layout, ``OUT/SCENARIO`` under the ``--out`` given, is pointed at in one line rather than mixed
with a new run. Tables are printed on a :class:`~market.record.console.FittingConsole`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from market.cli.expert_matrix_command import cmd_expert_matrix
from market.cli.flags import one_line, parse_seeds, parse_specs
from market.cli.leaderboard_command import cmd_leaderboard, wants_leaderboard
from market.cli.negotiation_command import cmd_negotiation
from market.record.console import terminal_console
from market.review.mechanism_comparison import METRICS, evaluate_mechanisms
from market.review.report import write_run_report
from market.review.report.run_page import files_in
from market.run.async_runner import given_llm_flags, llm_options
from market.run.conduct_table import CONDUCT_HEADERS
from market.run.evaluation import USAGE_COLUMNS, evaluate
from market.run.folders import MANIFEST
from market.run.health import (
    STRICT_EXIT,
    SeatHealth,
    from_matches,
    from_rows,
    print_health,
    strict_failures,
)
from market.run.jobs import RunConfigError, RunInterrupted, default_workers
from market.run.rollout import mean_ci95
from market.run.runner import run_scenario, summarise_rows
from market.run.tournament import (
    TournamentConfig,
    TournamentError,
    check_manifest,
    load_records,
    plan,
    rich_table,
    run_tournament,
)
from scenarios import ScenarioError, load_scenario


def _report_health(
    console: object, health: list[SeatHealth], strict: float | None, command: str
) -> bool:
    """Print the seats' failures under a results table; True when ``--strict`` fails the run."""
    print_health(console, health, strict=strict)
    reasons = strict_failures(health, strict)
    for reason in reasons:
        print(f"gpumarket {command}: --strict: {reason}", file=sys.stderr)
    return bool(reasons)


def _llm_options(args: argparse.Namespace, command: str) -> dict[str, Any] | None:
    """The LLM pool/budget options of run and eval, or None after printing why they are bad
    (a bad value, or pool flags with --backend ray, which has no shared pool)."""
    try:
        llm = llm_options(args)
    except ValueError as exc:
        print(f"gpumarket {command}: {exc}", file=sys.stderr)
        return None
    given = given_llm_flags(args)
    if args.backend == "ray" and given:
        print(
            f"gpumarket {command}: {', '.join(given)} apply to LLM runs on the local backend "
            "(one shared client pool); leave them out with --backend ray (see docs/ray.md)",
            file=sys.stderr,
        )
        return None
    return llm


def old_layout(out: Path, scenario: str) -> Path | None:
    """The run folder ``out/scenario`` when ``out`` is no run folder but holds one there: what
    ``--out out`` meant before ``--out`` named the run folder itself."""
    older = out / scenario
    if (out / MANIFEST).is_file() or not (older / MANIFEST).is_file():
        return None
    return older


def cmd_run(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    if args.out is None:
        out = Path("runs") / scenario.name
    else:
        out = args.out
        older = old_layout(out, scenario.name)
        if older is not None:
            print(
                f"gpumarket run: --out is the run folder itself now, and {out} is not one; "
                f"{older} holds this scenario's run: resume it with --out {older}, or name a "
                "new folder",
                file=sys.stderr,
            )
            return 2
    llm = _llm_options(args, "run")
    if llm is None:
        return 2
    try:
        summary = run_scenario(
            scenario,
            args.seeds,
            dict(args.seat),
            out,
            workers=args.workers,
            transcripts=not args.no_transcripts,
            progress=not args.no_progress,
            fresh=args.fresh,
            backend=args.backend,
            address=args.address,
            llm=llm,
            agent_timeout=args.agent_timeout,
        )
    except RunConfigError as exc:
        print(f"gpumarket run: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(exc, file=sys.stderr)
        return 130
    console = terminal_console()
    if summary.skipped:
        print(
            f"resumed {out}: {len(summary.skipped)} episode(s) were already complete, "
            f"{len(summary.played)} played now"
        )
    rows = summary.rows
    n = len(summary.episodes)
    table = Table(
        title=f"{scenario.name}: {n} episode(s), seeds {args.seeds[0]}..{args.seeds[-1]} (mean +/- 95% CI)"
    )
    for col in ("seat", "agent", "component", "mean", "+/- 95% CI"):
        table.add_column(col, justify="right" if col in ("mean", "+/- 95% CI") else "left")
    last_seat = None
    for row in summarise_rows(rows):
        if last_seat is not None and row["seat"] != last_seat:
            table.add_section()
        last_seat = row["seat"]
        style = "bold" if row["component"] == "return" else None
        table.add_row(
            row["seat"],
            row["agent"],
            row["component"],
            f"{row['mean']:.4f}",
            f"{row['ci95']:.4f}",
            style=style,
        )
    console.print(table)
    mean, half = mean_ci95(list(summary.episode("welfare_ratio").values()))
    console.print(
        f"welfare ratio (realised / optimal, per round): {mean:.3f} +/- {half:.3f}; "
        f"steps: {sum(summary.episode('steps').values())}"
    )
    strict_failed = _report_health(console, from_rows(rows), args.strict, "run")
    if args.json:
        by_seed: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            by_seed.setdefault(row["seed"], []).append(row)
        payload = [
            {
                "scenario": scenario.name,
                "seed": seed,
                "seats": {r["seat"]: r["agent"] for r in seat_rows},
                "returns": {r["seat"]: r["return"] for r in seat_rows},
                "components": {r["seat"]: r["components"] for r in seat_rows},
                "invalid_actions": {r["seat"]: r["invalid_actions"] for r in seat_rows},
                "steps": seat_rows[0]["steps"],
                "rounds": summary.round_logs.get(seed, []),
            }
            for seed, seat_rows in by_seed.items()
        ]
        args.json.write_text(json.dumps(payload, indent=1))
        console.print(f"results written to {args.json}")
    print(f"results: {out / 'results.jsonl'} ({len(rows)} row(s): one per episode and seat)")
    on_disk = files_in(out / "transcripts")
    transcripts = [s for s in summary.episodes if f"{s}.jsonl" in on_disk]
    if transcripts and not args.no_transcripts:
        print(
            f"transcripts: {out / 'transcripts'}/<seed>.jsonl ({len(transcripts)} file(s)); "
            f"verify with: gpumarket replay {out}"
        )
    if rows and not args.no_report:
        report = write_run_report(out, rows, workers=args.workers or default_workers())
        print(
            f"report: {report.path.resolve().as_uri()} ({len(report.pages)} episode page(s) "
            f"in {out / 'episodes'}; any other: gpumarket report {out} --episode SEED)"
        )
    if llm["budget"] is not None:  # what the run spent, and whether the budget stopped it
        print(f"gpumarket run: {llm['budget'].message()}", file=sys.stderr)
    for seed, error in sorted(summary.failed.items()):
        print(f"gpumarket run: episode seed {seed} failed: {error}", file=sys.stderr)
    return 1 if summary.failed else STRICT_EXIT if strict_failed else 0


DEFAULT_EVAL_AGENTS = (
    "rule_expert,truthful,no_negotiation,greedy_hoarder,always_accept,random_valid"
)
DEFAULT_EVAL_SCENARIOS = "single_trade,market_round,coalition_market"


def cmd_eval(args: argparse.Namespace) -> int:
    if args.negotiation:
        return cmd_negotiation(args)
    if args.expert_matrix:
        return cmd_expert_matrix(args)
    args.agents = args.agents or DEFAULT_EVAL_AGENTS
    args.scenarios = args.scenarios or DEFAULT_EVAL_SCENARIOS
    llm = _llm_options(args, "eval")
    if llm is None:
        return 2
    if wants_leaderboard(args):
        return cmd_leaderboard(args, llm)
    console = terminal_console()
    try:
        if args.mechanisms:
            name = load_scenario(args.scenario).name
            out = args.out or Path("runs") / "mechanisms" / name
            report = evaluate_mechanisms(
                args.scenario,
                args.seeds,
                out,
                args.workers,
                candidates=parse_specs(args.candidates) or None,
                alternatives=parse_specs(args.alternatives) or None,
                deviations=not args.no_deviations,
                progress=not args.no_progress,
                fresh=args.fresh,
                backend=args.backend,
                address=args.address,
                agent_timeout=args.agent_timeout,
            )
        else:
            out = args.out or Path("runs") / "eval"
            table = evaluate(
                parse_specs(args.agents),
                parse_specs(args.scenarios),
                args.seat,
                args.seeds,
                out,
                args.workers,
                transcripts=args.transcripts,
                progress=not args.no_progress,
                fresh=args.fresh,
                backend=args.backend,
                address=args.address,
                llm=llm,
                agent_timeout=args.agent_timeout,
            )
    except RunConfigError as exc:
        print(f"gpumarket eval: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(exc, file=sys.stderr)
        return 130
    if args.mechanisms:
        rich = Table(
            title=f"mechanisms on {report.scenario}: {len(report.seeds)} seed(s) (mean +/- 95% CI)"
        )
        for col in ("mechanism", *METRICS):
            rich.add_column(col, justify="left" if col == "mechanism" else "right")
        for row in report.table():
            rich.add_row(
                row["mechanism"],
                *(
                    f"{row[k]:.1f}±{row[k + '_ci95']:.1f}"
                    if k == "revenue"
                    else f"{row[k]:.3f}±{row[k + '_ci95']:.3f}"
                    for k in METRICS
                ),
            )
        console.print(rich)
        types = sorted({d.bidder_type for devs in report.deviations.values() for d in devs})
        if types:
            gains = Table(
                title="gain from deviating to the best alternative strategy "
                "(paired, mean +/- 95% CI; > 0: a profitable deviation)"
            )
            gains.add_column("mechanism")
            for kind in types:
                gains.add_column(kind, justify="right")
            for m in report.mechanisms:
                devs = {d.bidder_type: d for d in report.deviations.get(m, [])}
                cells = []
                for kind in types:
                    alt, gain, half = devs[kind].best if kind in devs else (None, 0.0, 0.0)
                    cells.append("" if alt is None else f"{gain:+.3f}±{half:.3f} {alt}")
                gains.add_row(m, *cells)
            console.print(gains)
        for note in report.notes:
            console.print(f"note: {note}", markup=False, highlight=False)
        print(
            f"tables: {out / 'mechanisms.md'}, {out / 'mechanisms.csv'}, "
            f"{out / 'deviations.csv'}; plots: {(out / 'mechanisms.html').resolve().as_uri()}"
        )
        failed, health = report.failed, report.health
    else:
        rich = Table(
            title=f"{table.seat}: mean return +/- 95% CI over {len(table.seeds)} seed(s)"
            " (* best per scenario)"
        )
        rich.add_column("agent")
        for scenario in table.scenarios:
            rich.add_column(scenario, justify="right")
        for column in USAGE_COLUMNS:  # the seat's tokens and cost over every scenario and seed
            rich.add_column(column, justify="right")
        conduct = Table(title=f"{table.seat}: conduct over every scenario and seed")
        conduct.add_column("agent")
        for column in CONDUCT_HEADERS:
            conduct.add_column(column, justify="right")
        width = 1 + len(table.scenarios) + len(USAGE_COLUMNS)
        for line in table.grid():
            rich.add_row(*(c.replace("±", "+/-") for c in line[:width]))
            conduct.add_row(line[0], *line[width:])
        console.print(rich)
        console.print(conduct)
        print(f"tables: {out / 'eval.md'}, {out / 'eval.csv'}")
        failed, health = table.failed, table.health
    strict_failed = _report_health(console, health, args.strict, "eval")
    if llm["budget"] is not None:  # what the run spent, and whether the budget stopped it
        print(f"gpumarket eval: {llm['budget'].message()}", file=sys.stderr)
    for where, seeds in sorted(failed.items()):
        for seed, error in sorted(seeds.items()):
            print(f"gpumarket eval: {where}: episode seed {seed} failed: {error}", file=sys.stderr)
    return 1 if failed else STRICT_EXIT if strict_failed else 0


def _tournament_config(args: argparse.Namespace) -> tuple[TournamentConfig, int, int | None]:
    """The tournament configuration from the arguments; ValueError with one line if bad."""

    def specs(text: str) -> tuple[str, ...]:
        return tuple(s.strip() for s in text.split(",") if s.strip())

    def count(flag: str, text: str, least: int) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: give a whole number") from None
        if value < least:
            raise ValueError(f"{flag} {text!r}: must be at least {least}")
        return value

    try:
        seeds = parse_seeds(args.seeds)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None
    populations = None
    for item in args.population:
        name, sep, members = item.partition("=")
        if not sep or not name.strip() or not specs(members):
            raise ValueError(
                f"--population {item!r}: write NAME=A,B,..., e.g. mixed=shader,colluder"
            )
        populations = populations or {}
        if name.strip() in populations:
            raise ValueError(f"--population {name.strip()!r} given twice")
        populations[name.strip()] = specs(members)
    config = TournamentConfig(
        args.scenario,
        specs(args.bidders),
        specs(args.designers),
        seeds,
        args.house_designer,
        populations,
    )
    workers = default_workers() if args.workers is None else count("--workers", args.workers, 1)
    limit = None if args.max_matches is None else count("--max-matches", args.max_matches, 0)
    return config, workers, limit


def cmd_tournament(args: argparse.Namespace) -> int:
    try:
        config, workers, limit = _tournament_config(args)
        planned = plan(config)
        out = args.out or Path("runs") / "tournament" / planned.scenario.name
        check_manifest(out, planned.manifest())
    except (TournamentError, ScenarioError, ValueError) as exc:
        print(f"gpumarket tournament: {one_line(exc)}", file=sys.stderr)
        return 2
    console = terminal_console()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True, disable=args.no_progress) as bar:
        task = bar.add_task("matches", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            result = run_tournament(
                config,
                out,
                workers=workers,
                max_matches=limit,
                progress=progress,
                backend=args.backend,
                address=args.address,
                agent_timeout=args.agent_timeout,
            )
        except (TournamentError, ScenarioError) as exc:
            bar.stop()
            print(f"gpumarket tournament: {one_line(exc)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            bar.stop()
            print(
                f"interrupted: finished matches are kept in {out}; rerun the same command to "
                "resume",
                file=sys.stderr,
            )
            return 130
    console.print(rich_table(planned, result.rows, result.done))
    state = "complete" if result.complete else "partial: rerun the same command to continue"
    console.print(
        f"{result.played} match(es) played now; {result.done} of {result.total} in "
        f"{out} ({state}). Tables: {out / 'ratings.md'}, {out / 'ratings.csv'}"
    )
    health = from_matches(load_records(out, planned).values())  # per agent: its seats rotate
    return STRICT_EXIT if _report_health(console, health, args.strict, "tournament") else 0


__all__ = ["cmd_eval", "cmd_run", "cmd_tournament", "old_layout"]
