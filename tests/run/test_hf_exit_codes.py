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
from real_model_utils import HF_INSTALL, HF_MODULES, require_gguf, require_modules, tiny_llama
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
    """A random 2-layer Llama on SmolLM2-135M's tokenizer and chat template (from the test
    GGUF): the real backend, tokenizer, grammars and threads, with decisions that take a
    fraction of a second, so that episodes finish within the test on a busy machine."""
    from transformers import AutoTokenizer

    gguf = require_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tiny_llama(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=8192,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    ).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_ctrl_c_with_a_local_model_call_in_flight_exits_130_keeping_finished_episodes(
    tmp_path: Path,
) -> None:
    require_modules(HF_MODULES, HF_INSTALL)
    model = tiny_model(tmp_path / "model")
    out = tmp_path / "run"
    seat = f"bidder_0=llm:hf?path={model}&max_tokens=48&retries=0&memory=none"
    argv = [sys.executable, "-m", "market", "run", "single_trade", "--seeds", "0:40"]
    argv += ["--seat", seat, "--out", str(out), "--episodes-in-flight", "1", "--no-progress"]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **ctrl_c_able(),
    )
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
    seat = f"bidder_0=llm:hf?path={gguf}&max_tokens=48&retries=0&memory=none"
    argv = [sys.executable, "-m", "market", "run", "single_trade", "--seeds", "0:40"]
    argv += ["--seat", seat, "--out", str(out), "--episodes-in-flight", "1", "--no-progress"]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **ctrl_c_able(),
    )
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
