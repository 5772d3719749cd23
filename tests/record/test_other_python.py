"""A transcript recorded on another machine replays here bit for bit.

``tests/data/recorded_on_python312.jsonl`` is one held-out episode of docs/training.md's
designer evaluation (daedalus_stage_3, seed 1000, the distilled designer in ``designer_0``),
recorded on the device machine: Python 3.12.3, numpy 2.5.2, an H200 host's CPU. It was recorded
before ``market.core.summation.ordered_sum`` replaced the built-in ``sum``, so its floats come
from 3.12's compensated sum; here (3.11, another numpy build and CPU) it diverged at step 57.
With that sum put back in every ``ordered_sum`` call, all 214 state digests match: the
summation was the only difference between the two machines, and ``ordered_sum`` removes it.
If the market's economics change (goldens re-recorded), this file can no longer match; delete
it then, with this test."""

from __future__ import annotations

import importlib
import math
from functools import reduce
from typing import Any

import pytest
from support import ROOT

from market.review.replay import replay

RECORDED = ROOT / "tests" / "data" / "recorded_on_python312.jsonl"
IMPORT = "from market.core.summation import ordered_sum"


def compensated_sum(values: Any, start: Any = 0) -> Any:
    """CPython 3.12's ``sum`` of floats: Neumaier's compensated summation."""
    items = list(values)
    if start != 0 or not items or not all(type(v) is float for v in items):
        return reduce(lambda a, b: a + b, items, start)
    total, compensation = 0.0, 0.0
    for x in items:
        t = total + x
        if abs(total) >= abs(x):
            compensation += (total - t) + x
        else:
            compensation += (x - t) + total
        total = t
    if compensation and math.isfinite(compensation):
        total += compensation
    return total


def test_a_transcript_recorded_on_python_3_12_replays_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = replay(RECORDED)
    assert plain.mismatch is not None and plain.mismatch.step == 57  # the built-in sum's bit
    patched = 0
    for folder in ("market", "agents"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if IMPORT not in path.read_text(encoding="utf-8"):
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            try:
                module = importlib.import_module(name)
            except ImportError:  # an optional extra that is not installed
                continue
            monkeypatch.setattr(module, "ordered_sum", compensated_sum)
            patched += 1
    assert patched >= 30
    report = replay(RECORDED)
    assert report.mismatch is None, report.mismatch
    assert report.digests_checked == report.steps_recorded == 214
