"""``gpumarket bench``: the benchmark suite (throughput, scaling, memory) of this machine.

Sections, each selectable with ``--only`` (see ``docs/benchmarks.md`` for how each is measured):

- ``startup``: wall time of ``gpumarket --help`` and ``gpumarket agents`` in a fresh interpreter
  (:mod:`market.bench.startup`);
- ``steps``: AEC steps/s per built-in scenario, scripted agents in every seat, one process;
- ``expert``: the share of the step time the rule expert's decisions take, ``rule_expert`` in
  every bidder seat, per built-in scenario (:mod:`market.bench.expert`);
- ``episodes``: episodes/s of :func:`market.run.runner.run_scenario` with 1, 2 and all cores;
- ``ray``: the same on the Ray backend (a private local Ray instance); skipped when Ray is missing
  or fails;
- ``clearing``: median time of :func:`market.core.mechanisms.clear` against the number of bidders, the
  growth exponent of each auction type next to the n log n reference, and the env's clearing step;
- ``memory``: RSS and traced Python/numpy memory per live, reset env;
- ``transcript``: steps/s without a transcript, with one, and with sparse digests;
- ``llm``: LLM decisions/s at concurrency 1, 8 and 32 against a local OpenAI-compatible server;
- ``serve``: served matches under load: 64 concurrent scripted remote-seat clients against
  ``gpumarket serve`` on 127.0.0.1, remote decisions/s and p50/p99 step latency
  (:mod:`market.bench.serve`).

Targets (2-core machine): ``gpumarket --help`` and ``gpumarket agents`` in < 0.5 s; >= 10,000 AEC steps/s in ``market_round``; clearing a 1,000-bidder,
10,000-block market in < 20 ms; clearing time growing no faster than n log n.

A run is a JSON report (schema :data:`SCHEMA`): machine info and a flat list of named metrics,
each with a value, a unit and the better direction. :func:`compare_reports` compares two runs and
flags metrics that moved more than a threshold in the bad direction. Figures are measured, never
asserted in tests (shared machines are noisy).

This module runs the sections and holds the command; the sections are in
:mod:`market.bench.throughput`, :mod:`market.bench.clearing`, :mod:`market.bench.memory` and
:mod:`market.bench.llm`, the vocabulary in :mod:`market.bench.config`, reading and comparing
reports in :mod:`market.bench.compare`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from market import __version__
from market.bench.clearing import section_clearing
from market.bench.compare import compare_reports, load_report, print_comparison, print_report
from market.bench.config import (
    DEFAULT_THRESHOLD,
    SCHEMA,
    SECTIONS,
    TARGET_CLEARING_MS,
    TARGET_ENV_STEP_MS,
    TARGET_STARTUP_S,
    TARGET_STEPS_PER_SECOND,
    TARGET_TRANSCRIPT_PCT,
    BenchConfig,
    BenchFileError,
    SectionResult,
    SectionSkipped,
    first_line,
    parse_sections,
    quick_config,
)
from market.bench.expert import TARGET_SHARE, section_expert
from market.bench.llm import section_llm
from market.bench.llm_local import section_local_llm
from market.bench.memory import section_memory
from market.bench.peer import PeerArenaError, check_peer_dir, peer_targets, section_peer
from market.bench.report import TARGET_EPISODES, TARGET_MB, TARGET_SECONDS, section_report
from market.bench.serve import section_serve
from market.bench.startup import section_startup
from market.bench.throughput import section_episodes, section_ray, section_steps, section_transcript
from market.run.runner import default_workers

# the CLI reads the section names, the default threshold and the --only parser from here too
__all__ = [
    "DEFAULT_THRESHOLD",
    "RUNNERS",
    "SECTIONS",
    "bench_command",
    "machine_info",
    "parse_sections",
    "run_suite",
    "targets",
]

RUNNERS: dict[str, Callable[[BenchConfig], SectionResult]] = {
    "startup": section_startup,
    "steps": section_steps,
    "expert": section_expert,
    "episodes": section_episodes,
    "ray": section_ray,
    "clearing": section_clearing,
    "memory": section_memory,
    "transcript": section_transcript,
    "report": section_report,
    "llm": lambda config: section_local_llm(config) if config.llm_hf else section_llm(config),
    "serve": section_serve,
    "peer": section_peer,
}


def machine_info() -> dict[str, Any]:
    """Cores, Python, package version, git commit (if a checkout), time and load average."""
    info: dict[str, Any] = {
        "cores": default_workers(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "package_version": _package_version(__version__),
        "git_commit": _git_commit(),
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return info


def _package_version(fallback: str) -> str:
    try:
        return version("gpumarket")
    except PackageNotFoundError:
        return fallback


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            [git, "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            [git, "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return None
    return commit + ("+dirty" if dirty.stdout.strip() else "")


def run_suite(
    config: BenchConfig,
    sections: Iterable[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the selected sections (default: :func:`default_sections`); a section that cannot run
    (or fails) is listed in ``skipped`` with the reason and the others still run."""
    if sections is None:
        sections = default_sections(config.peer_arena is not None)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "machine": machine_info(),
        "options": {"quick": config.quick, "sections": list(sections)},
        "metrics": [],
        "skipped": {},
        "details": {},
    }
    for name in report["options"]["sections"]:
        if log:
            log(f"bench: {name} ...")
        began = time.perf_counter()
        try:
            result = RUNNERS[name](config)
        except SectionSkipped as exc:
            report["skipped"][name] = str(exc)
            continue
        except Exception as exc:  # one broken section must not lose the others' figures
            report["skipped"][name] = f"error: {type(exc).__name__}: {first_line(exc)}"
            continue
        report["metrics"].extend(result.metrics)
        report["details"][name] = {**result.details, "seconds": time.perf_counter() - began}
    report["targets"] = targets(report)
    return report


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The design targets that the report's figures can check: name, measured value, ok."""
    values = {m["name"]: m["value"] for m in report["metrics"]}
    out = []
    for label, command in (("help", "gpumarket --help"), ("agents", "gpumarket agents")):
        seconds = values.get(f"startup.{label}.seconds")
        if seconds is not None:
            out.append(
                {
                    "target": f"{command} answers in < {TARGET_STARTUP_S:g} s (median, fresh "
                    "interpreter)",
                    "value": seconds,
                    "ok": seconds < TARGET_STARTUP_S,
                }
            )
    steps = values.get("steps.market_round.steps_per_s")
    if steps is not None:
        out.append(
            {
                "target": f"market_round >= {TARGET_STEPS_PER_SECOND:,} AEC steps/s",
                "value": steps,
                "ok": steps >= TARGET_STEPS_PER_SECOND,
            }
        )
    expert = report["details"].get("expert")
    if expert and expert["rows"]:
        worst = max(expert["rows"], key=lambda r: r["share"])
        out.append(
            {
                "target": f"rule_expert decisions <= {TARGET_SHARE:.2f} of the step time "
                f"(worst: {worst['scenario']})",
                "value": worst["share"],
                "ok": worst["share"] <= TARGET_SHARE,
            }
        )
    big = report["details"].get("report", {}).get(str(TARGET_EPISODES))
    if big:
        out.append(
            {
                "target": f"run report of {TARGET_EPISODES:,} episodes <= {TARGET_MB:g} MB",
                "value": big["mb"],
                "ok": big["mb"] <= TARGET_MB,
            }
        )
        out.append(
            {
                "target": f"run report of {TARGET_EPISODES:,} episodes built in "
                f"<= {TARGET_SECONDS:g} s",
                "value": big["seconds"],
                "ok": big["seconds"] <= TARGET_SECONDS,
            }
        )
    peer = report["details"].get("peer")
    if peer:
        out.extend(peer_targets(peer))
    clearing = report["details"].get("clearing")
    if clearing:
        ref = clearing["nlogn_exponent"]
        for auction, slope in clearing["exponents"].items():
            out.append(
                {
                    "target": f"{auction} clearing grows <= n log n (exponent <= {ref:.3f})",
                    "value": slope,
                    "ok": slope <= ref,
                }
            )
        if 1000 in clearing["ms"]:
            worst = max(clearing["ms"][1000].values())
            out.append(
                {
                    "target": f"clear() at 1,000 bidders < {TARGET_CLEARING_MS:g} ms (slowest type)",
                    "value": worst,
                    "ok": worst < TARGET_CLEARING_MS,
                }
            )
        env_step = clearing["env_step"]
        if env_step["labs"] == 1000:
            out.append(
                {
                    "target": f"env clearing step at 1,000 labs < {TARGET_ENV_STEP_MS:g} ms",
                    "value": env_step["median_ms"],
                    "ok": env_step["median_ms"] < TARGET_ENV_STEP_MS,
                }
            )
    overhead = values.get("transcript.market_round.digest_1.overhead_pct")
    if overhead is not None:
        out.append(
            {
                "target": f"transcript overhead <= {TARGET_TRANSCRIPT_PCT:g}% with a state digest "
                "at every step (market_round)",
                "value": overhead,
                "ok": overhead <= TARGET_TRANSCRIPT_PCT,
            }
        )
    return out


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    config = BenchConfig(
        seconds=args.seconds,
        scenarios=tuple(args.scenario or ()),
        llm_base_url=args.llm_base_url,
        llm_model=args.llm_model,
        llm_hf=args.llm_hf,
        llm_device=args.llm_device,
        llm_dtype=args.llm_dtype,
        llm_static_cache=args.llm_static_cache,
        llm_unfused=args.llm_unfused,
        llm_quantize=args.llm_quantize,
        llm_mask_threads=args.llm_mask_threads,
        peer_arena=args.peer_arena,
    )
    if args.quick:
        config = quick_config(config)
        if args.seconds != 2.0:  # an explicit --seconds wins over the quick budget
            config = replace(config, seconds=args.seconds)
    elif args.llm_base_url or (args.llm_hf and args.llm_device == "cpu"):
        # a real model answers in ~0.1-1 s (seconds on a CPU), not 50 ms: fewer decisions
        config = replace(config, llm_decisions_per_slot=4)
    if args.llm_latency_ms is not None:
        config = replace(config, llm_latency_ms=args.llm_latency_ms)
    return config


def bench_command(args: argparse.Namespace) -> int:
    """``gpumarket bench``: run (unless two files are compared), print, write, compare.

    Exit codes: 0 fine, 1 a regression was flagged, 2 a bad file or option.
    """
    compare = list(args.compare or [])
    if len(compare) > 2:
        return _fail("--compare takes OLD.json, or OLD.json NEW.json")
    if not 0 < args.threshold < 10:
        return _fail(f"--threshold {args.threshold}: give a fraction such as 0.2 (20%)")
    if args.json and not args.json.parent.is_dir() and str(args.json.parent) not in ("", "."):
        return _fail(f"--json {args.json}: folder {args.json.parent} does not exist")
    try:
        if args.peer_arena is not None:
            check_peer_dir(args.peer_arena)
    except PeerArenaError as exc:
        return _fail(str(exc))
    try:
        old = load_report(Path(compare[0])) if compare else None
        if len(compare) == 2:
            new, new_label = load_report(Path(compare[1])), compare[1]
        else:
            new = run_suite(
                config_from_args(args),
                args.only,
                log=lambda text: print(text, file=sys.stderr),
            )
            print_report(new)
            new_label = str(args.json) if args.json else "this run"
            if args.json:
                args.json.write_text(json.dumps(new, indent=1, default=str) + "\n")
                print(f"wrote {args.json}")
        if old is None:
            return 0
        cmp = compare_reports(old, new, args.threshold)
    except BenchFileError as exc:
        return _fail(str(exc))
    print_comparison(cmp, compare[0], new_label)
    return 1 if cmp.regressions else 0


def default_sections(peer: bool) -> tuple[str, ...]:
    """Every section; ``peer`` only when a seed checkout was given."""
    return SECTIONS if peer else tuple(s for s in SECTIONS if s != "peer")


def _fail(message: str) -> int:
    print(f"gpumarket bench: {message}", file=sys.stderr)
    return 2
