"""The fast transcript writer writes exactly the bytes of the plain one.

The reference below is the writer's original rule spelled out with ``json.dumps``: the record
with ``digest`` dropped and ``prev`` set, dumped compact, ASCII-only and refusing NaN (falling back
to ``jsonable`` for what the encoder cannot write), then the SHA-256 of that text appended as
``digest``. Every golden transcript must re-chain to its own bytes, every record of freshly played
episodes must encode as the reference does, and so must fuzzed records with awkward floats,
strings and keys.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market.record import writer
from market.record.transcript import TranscriptWriter, rewrite
from market.run.rollout import run_episode

GOLDEN = Path(__file__).resolve().parents[2] / "transcripts" / "golden"


def reference_line(record: dict[str, Any], prev: str) -> bytes:
    """The line the writer must produce for ``record`` after ``prev`` (its original rule)."""
    record = dict(record)
    record.pop("digest", None)
    record["prev"] = prev
    opts: dict[str, Any] = {"ensure_ascii": True, "allow_nan": False, "separators": (",", ":")}
    try:
        body = json.dumps(record, default=writer.jsonable, **opts)
    except (ValueError, TypeError):
        body = json.dumps(writer.jsonable(record), **opts)
    digest = hashlib.sha256(body.encode("ascii")).hexdigest()
    return f'{body[:-1]},"digest":"{digest}"}}\n'.encode("ascii")


def test_every_golden_rechains_to_its_own_bytes(tmp_path: Path) -> None:
    files = sorted(GOLDEN.glob("*.jsonl"))
    assert len(files) >= 20
    for path in files:
        data = path.read_bytes()
        records = [json.loads(line) for line in data.splitlines()]
        out = rewrite(tmp_path / path.name, records)
        assert out.read_bytes() == data, f"{path.name}: re-chained bytes differ"


@pytest.mark.parametrize(
    "scenario", ["market_round", "single_trade", "coalition_market", "shock_storm"]
)
def test_played_records_encode_as_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    """Live records (numpy values, models, tuples, conduct entries) as the episode hands them."""
    seen: list[bytes] = []
    original = TranscriptWriter.write

    def checked(self: TranscriptWriter, record: dict[str, Any]) -> str:
        expected = reference_line(record, self._prev)
        digest = original(self, record)
        seen.append(expected)
        assert digest == json.loads(expected)["digest"]
        return digest

    monkeypatch.setattr(TranscriptWriter, "write", checked)
    path = tmp_path / "t.jsonl"
    run_episode(scenario, 3, transcript=path)
    assert path.read_bytes() == b"".join(seen)
    assert len(seen) > 10


awkward_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [
            1e16,
            1e15,
            5e-324,
            -0.0,
            0.1 + 0.2,
            1e-5,
            1e-7,
            9.6e-05,
            2.0**53,
            1e22,
            sys.float_info.max,
        ]
    ),
)
keys = st.one_of(st.text(max_size=6), st.integers(-5, 5), awkward_floats, st.booleans(), st.none())
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    awkward_floats,
    st.text(max_size=12),  # non-ASCII, control characters, DEL, quotes, backslashes
    awkward_floats.map(np.float64),
    st.integers(-1000, 1000).map(np.int64),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    body=st.dictionaries(st.text(max_size=5), values, max_size=5),
    prev=st.text("0123456789abcdef", min_size=64, max_size=64),
)
def test_fuzzed_records_encode_as_the_reference(body: dict[str, Any], prev: str) -> None:
    record = {"type": "step", **body}
    expected = reference_line(record, prev)
    digest, line = writer._chained(record, prev)
    assert line == expected
    assert digest == json.loads(expected)["digest"]


def test_non_finite_numbers_are_strings_as_before() -> None:
    record = {"type": "x", "a": math.nan, "b": [math.inf, -math.inf], "c": {1.5: np.float64(-0.0)}}
    _, line = writer._chained(record, "0" * 64)
    assert line == reference_line(record, "0" * 64)
    decoded = json.loads(line)
    assert decoded["a"] == "NaN" and decoded["b"] == ["Infinity", "-Infinity"]
    assert decoded["c"] == {"1.5": -0.0}
