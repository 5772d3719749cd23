"""The rule reader on the TEST set ``tests/data/conduct_test_set.jsonl`` (250 texts; written by
``tests/data/make_conduct_test_set.py`` from docs/conduct.md alone, by an author who had read
neither the reader's patterns nor the held-out set's phrasings), scored exactly as the held-out
set is (:func:`test_conduct_heldout.measure`: false claims read with their kind and value and
judged false; promises read with their kind, counterparts, due round and amount).

The rule of this set: it is never used to tune the reader. Its floors are a REGRESSION FLOOR,
not a claim of quality: measured before the reader was generalised, the reader found 0.299 of
its false claims and 0.518 of its promises (precision 1.000 and 0.853); after one generalisation
(word classes, headlines, passive and inverted forms, relative rounds, pronouns across
sentences) and one round of fixes to those general mechanisms, it finds 1.000 of both at
precision 1.000. Those AFTER figures are optimistic: the same author wrote this set and then the
generalisation. A probe of fresh phrasings written after the reader was frozen
(``tests/data/conduct_probe.jsonl``) reads far less (docs/conduct.md, "How well the rule reader
reads"). Recall must stay at or above the AFTER figure rounded down to the next 0.05 (0.95);
precision at or above 0.95. ``python tests/core/test_conduct_test_set.py`` prints the table and
every miss.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_conduct_heldout import (
    Measure,
    disagreements,
    measure,
    print_misses,
    read_negatives,
    table,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "conduct_test_set.jsonl"
# regression floors: the AFTER recall (1.000 for both) rounded down to the next 0.05
FALSE_CLAIM_RECALL_FLOOR = 0.95
PROMISE_RECALL_FLOOR = 0.95
PRECISION_FLOOR = 0.95


def load() -> list[dict[str, Any]]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def measured() -> Measure:
    m = measure(load())
    print("\n" + table(m))
    return m


def test_test_set_is_large_balanced_and_varied() -> None:
    cases = load()
    assert len(cases) >= 200
    assert len({c["id"] for c in cases}) == len(cases)
    labels = Counter(c["label"] for case in cases for c in case["claims"])
    # about half the claims are false
    assert labels["false"] >= 60 and labels["true"] >= 60
    assert abs(labels["false"] - labels["true"]) <= 0.1 * (labels["false"] + labels["true"])
    kinds = Counter(c["kind"] for case in cases for c in case["claims"])
    assert set(kinds) == {"budget", "need", "deadline", "job_size", "value", "holdings"}
    pkinds = Counter(p["kind"] for case in cases for p in case["promises"])
    assert set(pkinds) == {"deliver", "pay", "join", "stay", "not_bid", "bid"}
    assert sum(not c["claims"] and not c["promises"] for c in cases) >= 40


def test_test_set_labels_agree_with_the_exact_judge() -> None:
    """The generator labels each claim by the rules of docs/conduct.md, written out on its own;
    the exact judge must give every labelled claim the same label."""
    assert disagreements(load()) == []


def test_test_set_false_claims_regression_floor(measured: Measure) -> None:
    t = measured.false_claims
    assert t.recall >= FALSE_CLAIM_RECALL_FLOOR, "\n".join(t.misses)
    assert t.precision >= PRECISION_FLOOR, "\n".join(t.extras)


def test_test_set_promises_regression_floor(measured: Measure) -> None:
    t = measured.promises
    assert t.recall >= PROMISE_RECALL_FLOOR, "\n".join(t.misses)
    assert t.precision >= PRECISION_FLOOR, "\n".join(t.extras)


def test_test_set_negatives_give_nothing() -> None:
    """Questions, conditionals, other labs' words, offer prices, negations, hedges, requests,
    past acts and public facts: none is read as a claim or promise of the speaker."""
    read = read_negatives(load())
    assert not read, "\n".join(map(str, read))


if __name__ == "__main__":
    print_misses(measure(load()))
