"""A run with an ``llm:hf`` seat interrupted with a model call in flight exits 130, not 134
(SIGABRT from torch's and xgrammar's native threads at interpreter exit), with every finished
episode kept whole (``market.cli.local_exit``). A real ``gpumarket`` process on a tiny random
Llama with the test GGUF's tokenizer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from real_model_utils import (
    HF_INSTALL,
    HF_MODULES,
    require_gguf,
    require_modules,
    tiny_smollm_folder,
)
from support import ROOT, ctrl_c_able

from market.record.transcript import read_transcript

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def complete_seeds(results: Path, seats: int) -> dict[int, int]:
    """Seed -> rows of ``results.jsonl`` (every line must be a whole JSON row)."""
    rows: dict[int, int] = {}
    if results.is_file():
        for line in results.read_text().splitlines():
            row = json.loads(line)
            rows[row["seed"]] = rows.get(row["seed"], 0) + 1
    return {s: n for s, n in rows.items() if n == seats}


def tiny_model(folder: Path) -> Path:
    """A random 2-layer Llama on SmolLM2-135M's tokenizer and chat template: decisions take a
    fraction of a second, so that episodes finish within the test on a busy machine."""
    return tiny_smollm_folder(folder)


def start_run(model: Path, out: Path) -> subprocess.Popen[str]:
    """``gpumarket run single_trade`` over seeds 0:40 with ``model`` in bidder_0 (``llm:hf``),
    one episode at a time, in a process Ctrl-C can reach."""
    seat = f"bidder_0=llm:hf?path={model}&max_tokens=48&retries=0&memory=none"
    argv = [sys.executable, "-m", "market", "run", "single_trade", "--seeds", "0:40"]
    argv += ["--seat", seat, "--out", str(out), "--episodes-in-flight", "1", "--no-progress"]
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **ctrl_c_able(),
    )


def test_ctrl_c_with_a_local_model_call_in_flight_exits_130_keeping_finished_episodes(
    tmp_path: Path,
) -> None:
    require_modules(HF_MODULES, HF_INSTALL)
    model = tiny_model(tmp_path / "model")
    out = tmp_path / "run"
    proc = start_run(model, out)
    try:
        seats = 2  # single_trade: bidder_0 and bidder_1
        deadline = time.monotonic() + 300
        # the first episode finished, and the next one has made a model call (recorded steps)
        # and is playing its next one: a call in flight when the signal comes
        while time.monotonic() < deadline and proc.poll() is None:
            done = complete_seeds(out / "results.jsonl", seats)
            later = [out / "transcripts" / f"{s}.jsonl" for s in range(1, 40) if s not in done]
            started = [p for p in later if p.is_file() and '"llm"' in p.read_text()]
            if done and started:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert complete_seeds(out / "results.jsonl", seats), "no episode finished in 300 s"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "terminate called" not in stderr and "Fatal Python error" not in stderr
    assert "interrupted" in stderr and "run the same command again to resume" in stderr
    kept = complete_seeds(out / "results.jsonl", seats)
    rows = (out / "results.jsonl").read_text().splitlines()
    assert kept and len(rows) == seats * len(kept)  # whole episodes only, every line whole JSON
    for seed in kept:
        transcript = read_transcript(out / "transcripts" / f"{seed}.jsonl")
        assert transcript.complete, transcript.incomplete


def test_ctrl_c_during_a_smollm2_decision_exits_130_not_sigabrt(tmp_path: Path) -> None:
    """The case that aborted (exit 134): SmolLM2-135M on the CPU, Ctrl-C while a decision
    decodes (the seat's first decision is recorded, its next one is running)."""
    require_modules(HF_MODULES, HF_INSTALL)
    gguf = require_gguf()
    out = tmp_path / "run"
    proc = start_run(gguf, out)
    try:
        first = out / "transcripts" / "0.jsonl"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if first.is_file() and '"llm"' in first.read_text():
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert '"llm"' in first.read_text(), "no LLM decision recorded in 600 s"
        time.sleep(2.0)  # the next decision's prompt is being prefilled or decoded
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "terminate called" not in stderr and "Fatal Python error" not in stderr
    assert "interrupted" in stderr
