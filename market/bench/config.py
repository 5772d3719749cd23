"""The bench suite's vocabulary: section names, budgets (:class:`BenchConfig`), metrics, section
results and errors. Light on purpose: the CLI imports it to build its parser, and
``gpumarket --help`` should stay fast (the sections that import the env live in the other
``market.bench`` modules)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SCHEMA = "gpumarket-bench/1"
# Ray last: its processes keep a core busy for a few seconds after shutdown
SECTIONS: tuple[str, ...] = (
    "startup",
    "steps",
    "expert",
    "episodes",
    "clearing",
    "memory",
    "transcript",
    "report",
    "llm",
    "serve",
    "ray",
    "peer",  # only with --peer-arena DIR
)
TARGET_STEPS_PER_SECOND = 10_000
TARGET_CLEARING_MS = 20.0  # clear() at 1,000 bidders
TARGET_ENV_STEP_MS = 8.0  # the env step that closes a round at 1,000 labs
TARGET_TRANSCRIPT_PCT = 30.0  # recording overhead with a state digest at every step
TARGET_STARTUP_S = 0.5  # gpumarket --help and gpumarket agents, interpreter start included
DEFAULT_THRESHOLD = 0.2
CLEARING_NOISE_MS = 0.1  # clearing a small market takes ~0.1 ms: changes below this are noise
#: glibc settings for the clearing timings (a fresh interpreter): keep freed memory rather than
#: hand it back to the OS between calls. Otherwise, depending on the allocator's state, a call
#: at 10,000 bidders may page-fault its megabytes of arrays back in (+30-60%), which bends the
#: growth curve by an amount that changes from run to run (see docs/benchmarks.md)
STEADY_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "67108864"}

Metric = dict[str, Any]


class BenchFileError(ValueError):
    """A bench JSON file that cannot be read or compared (the message is one line)."""


class SectionSkipped(RuntimeError):
    """A section that cannot run here (the message says why)."""


@dataclass(frozen=True)
class BenchConfig:
    """Budgets and sizes of every section. :func:`quick_config` shrinks them for smoke tests."""

    seconds: float = 2.0  # per scenario (steps) and per variant (transcript)
    startup_runs: int = 11  # fresh interpreters per start-up figure (the median is reported)
    scenarios: tuple[str, ...] = ()  # steps: () means every built-in scenario
    # about 2-3 s per batch on 2 cores: shorter batches make episodes/s swing by 20%
    episode_batches: tuple[tuple[str, int], ...] = (("market_round", 600), ("large_market", 20))
    clearing_sizes: tuple[int, ...] = (10, 30, 100, 300, 1000, 3000, 10000)
    clearing_fit_min: int = 300  # below it fixed per-call overhead dominates the time
    clearing_repeats: int = 15  # interleaved passes; the median resists load spikes
    blocks_per_bidder: int = 10
    units_per_bidder: int = 20
    env_clearing_labs: int = 1000
    memory_envs: tuple[tuple[str, int], ...] = (("market_round", 200), ("large_market", 20))
    transcript_scenario: str = "market_round"
    digest_every: int = 10
    report_episodes: tuple[int, ...] = (600, 3000)  # run report built from N synthetic episodes
    llm_concurrency: tuple[int, ...] = (1, 8, 32)
    llm_decisions_per_slot: int = 20  # decisions at concurrency c: max(2 * this, this * c)
    llm_base_url: str | None = None  # None: spawn the fake server
    llm_model: str = "fake-model"
    llm_latency_ms: float = 50.0
    llm_hf: str | None = None  # a local model for the in-process transformers backend
    llm_device: str = "cpu"
    llm_dtype: str | None = None  # the model's dtype (None: the checkpoint's)
    llm_quantize: str | None = None  # the local model's quantize mode (None: none)
    llm_mask_threads: int | None = None  # threads writing the grammar masks (None: the engine's)
    llm_static_cache: bool = (
        False  # the local model decodes into static KV caches (CUDA graphs on a GPU)
    )
    llm_unfused: bool = False  # the local model runs its own kernels (no hf_fused rewrite)
    llm_episode_labs: int = 8  # labs (each an LLM seat) of the local model's episode figure
    serve_sessions: int = 64  # concurrent remote-seat clients of the served-matches load test
    serve_decisions: int = 20  # remote decisions per client
    serve_scenario: str = "market_round"
    peer_arena: Path | None = None  # a checkout of the GPU-arena seed to time against
    quick: bool = False


def quick_config(config: BenchConfig | None = None) -> BenchConfig:
    """Tiny budgets for tests and CI smoke runs: the figures are only sanity checks."""
    return replace(
        config or BenchConfig(),
        seconds=0.05,
        startup_runs=3,
        episode_batches=(("market_round", 6),),
        clearing_sizes=(10, 30, 100, 300, 1000),
        clearing_fit_min=100,
        clearing_repeats=3,
        env_clearing_labs=100,
        memory_envs=(("market_round", 10), ("large_market", 2)),
        llm_decisions_per_slot=2,
        llm_latency_ms=5.0,
        serve_sessions=50,
        serve_decisions=2,
        report_episodes=(20,),
        quick=True,
    )


def parse_sections(text: str) -> tuple[str, ...]:
    """``--only steps,clearing`` -> ("steps", "clearing"), in the suite's order."""
    wanted = {s.strip() for s in text.split(",") if s.strip()}
    unknown = sorted(wanted - set(SECTIONS))
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"--only {text!r}: unknown section(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {','.join(SECTIONS)}"
        )
    return tuple(s for s in SECTIONS if s in wanted)


def metric(
    name: str,
    value: float,
    unit: str,
    direction: str,
    section: str,
    context: dict[str, Any] | None = None,
    noise: float = 0.0,
) -> Metric:
    """One named figure. ``context`` holds what makes two values comparable (e.g. the LLM
    server); values whose contexts differ are reported as not comparable, never as regressions.
    ``noise``: an absolute change no larger than this is never flagged (timings of a few
    microseconds move by more than 20% from one run to the next)."""
    assert direction in ("higher", "lower"), direction
    out: Metric = {
        "name": name,
        "value": float(value),
        "unit": unit,
        "direction": direction,
        "section": section,
    }
    if context:
        out["context"] = context
    if noise:
        out["noise"] = float(noise)
    return out


@dataclass
class SectionResult:
    metrics: list[Metric] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_in_subprocess(
    module: str, function: str, *args: Any, env: dict[str, str] | None = None
) -> Any:
    """``module.function(*args)`` in a fresh interpreter (JSON in, JSON out), so that what
    earlier sections left in this process's allocator cannot colour the figure."""
    code = (
        "import importlib, json, sys; function = getattr(importlib.import_module(sys.argv[1]), "
        "sys.argv[2]); print(json.dumps(function(*json.loads(sys.argv[3]))))"
    )
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code, module, function, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{function} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_bench_arguments(bench: argparse.ArgumentParser) -> None:
    """The options of ``gpumarket bench``."""
    bench.add_argument(
        "--seconds",
        type=float,
        default=2.0,
        help="time per scenario and per transcript variant (default 2)",
    )
    bench.add_argument(
        "--scenario", action="append", help="steps: only these scenarios (repeatable)"
    )
    bench.add_argument(
        "--only",
        type=parse_sections,
        metavar="S1,S2",
        help=f"only these sections: {','.join(SECTIONS)} (default: all; peer only with "
        "--peer-arena)",
    )
    bench.add_argument("--quick", action="store_true", help="tiny budgets: a smoke run for CI")
    bench.add_argument(
        "--peer-arena",
        type=Path,
        metavar="DIR",
        help="peer: also time the GPU-arena seed's env from this checkout (the folder holding "
        "gpu_budget_arena/) against the built-in scenarios of the same names",
    )
    bench.add_argument("--json", type=Path, help="write the figures (and machine info) as JSON")
    bench.add_argument(
        "--compare",
        nargs="+",
        metavar="FILE",
        help="OLD.json: compare this run with it; OLD.json NEW.json: compare two "
        "files without running",
    )
    bench.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="flag a metric worse by more than this fraction (default 0.2)",
    )
    bench.add_argument(
        "--llm-base-url", help="llm: an OpenAI-compatible server (…/v1) instead of the fake one"
    )
    bench.add_argument("--llm-model", default="fake-model", help="llm: the model name to request")
    bench.add_argument(
        "--llm-hf",
        metavar="MODEL",
        help="llm: a local model (directory, .gguf or Hub id) through the in-process transformers "
        "backend instead of a server (see docs/benchmarks.md)",
    )
    bench.add_argument(
        "--llm-device", default="cpu", help="llm: the torch device of --llm-hf (cpu, cuda, ...)"
    )
    bench.add_argument(
        "--llm-dtype", help="llm: the dtype of --llm-hf (float32, bfloat16; default: the model's)"
    )
    bench.add_argument(
        "--llm-quantize",
        choices=("none", "int8"),
        help="llm: int8 products for --llm-hf on the CPU (faster, lower fidelity; default none)",
    )
    bench.add_argument(
        "--llm-mask-threads",
        type=int,
        help="llm: threads writing --llm-hf's grammar masks (default: the cores, at most 16)",
    )
    bench.add_argument(
        "--llm-static-cache",
        action="store_true",
        help="llm: --llm-hf decodes into static KV caches (captured CUDA graphs on a GPU)",
    )
    bench.add_argument(
        "--llm-unfused",
        action="store_true",
        help="llm: --llm-hf runs the model's own kernels, not the fused ones (a baseline)",
    )
    bench.add_argument(
        "--llm-latency-ms",
        type=float,
        default=None,
        help="llm: the fake server's fixed latency (default 50; 5 with --quick)",
    )
