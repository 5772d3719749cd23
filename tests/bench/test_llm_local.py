"""The ``llm`` bench section with a local model (``gpumarket bench --only llm --llm-hf``): the
real SmolLM2-135M on the CPU, tiny budgets. What it must hold: every level's figures are there,
every parse failure is a reply the token limit cut off (the grammar allows nothing else), the
episode with N LLM seats asked N times as many decisions as the one with 1, and the report
prints without a server."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from real_model_utils import HF_INSTALL, HF_MODULES, require_gguf, require_modules
from rich.console import Console

from market.bench import config as bench_config
from market.bench import suite
from market.bench.compare import print_report

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def test_local_model_section_reports_levels_cut_offs_and_the_episode_ratio() -> None:
    require_modules(HF_MODULES, HF_INSTALL)
    gguf = require_gguf()
    config = replace(
        bench_config.quick_config(),
        llm_hf=str(gguf),
        llm_concurrency=(1, 3),
        llm_decisions_per_slot=2,  # one per slot: 2 decisions at 1, 3 at 3
        llm_episode_labs=3,
        llm_mask_threads=2,
    )
    report = suite.run_suite(config, ["llm"])
    assert report["skipped"] == {}
    details = report["details"]["llm"]
    assert (details["mask_threads"], details["quantize"]) == (2, "none")  # as asked; the default
    rows = {r["concurrency"]: r for r in details["rows"]}
    assert set(rows) == {1, 3} and rows[1]["decisions"] == 2 and rows[3]["decisions"] == 3
    for row in rows.values():
        assert row["parse_failures"] == row["length_cutoffs"] <= row["decisions"]
        assert row["tokens_per_s"] > 0 and 1 <= row["mean_batch"] <= row["concurrency"]
    one, many = details["episode"]
    assert (one["llm_seats"], many["llm_seats"]) == (1, 3)
    assert many["decisions"] == 3 * one["decisions"] > 0
    assert details["episode_ratio"] == round(many["seconds"] / one["seconds"], 2)
    names = {m["name"] for m in report["metrics"]}
    assert {"llm.c1.tokens_per_s", "llm.c3.parse_failures", "llm.episode_3_vs_1_seat"} <= names
    out = io.StringIO()
    print_report(report, Console(file=out, width=160))
    text = out.getvalue()
    assert "local model" in text and "3 LLM seats" in text
