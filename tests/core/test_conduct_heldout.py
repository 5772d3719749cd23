"""The rule reader on the held-out set ``tests/data/conduct_heldout.jsonl`` (written from
docs/conduct.md before the reader was read; ``tests/data/make_conduct_heldout.py`` says how).

Every case's text is read by the rule reader (:class:`~market.core.conduct.reading.RuleReader`)
with the addressees as counterparts, and every claim it reads is judged against the case's
private truth (:func:`~market.core.conduct.judge_claim`), as an episode's conduct log does.

- **False claims**: a labelled false claim is found when the reader reads a claim of its kind and
  value and the judge finds it false. Recall = found / labelled false claims; precision = found /
  claims the reader read and the judge found false.
- **Promises** (whether one is broken is then decided by acts, so the reading is what is
  measured): a labelled promise is found when the reader reads one of its kind, counterparts,
  due round (a text that names none is due the round it was said) and amount. Recall = found /
  labelled promises; precision = found / promises read.

Both must reach recall >= 0.9 and precision >= 0.95. ``python tests/core/test_conduct_heldout.py``
prints the confusion table and every miss.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from market.core.conduct import LiveJob, PublicFacts, SeatTruth, judge_claim
from market.core.conduct.reading import RuleReader

DATA = Path(__file__).resolve().parents[1] / "data" / "conduct_heldout.jsonl"
RECALL_FLOOR = 0.9
PRECISION_FLOOR = 0.95


def load() -> list[dict[str, Any]]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def truth_of(case: dict[str, Any]) -> SeatTruth:
    """The case's private truth as the market builds it: live jobs only, holdings this round."""
    t = case["truth"]
    jobs = tuple(
        LiveJob(j["size"], j["size"] - j["progress"], j["deadline"], j["value"])
        for j in t["jobs"]
        if j["status"] == "active" and j["size"] > j["progress"]
    )
    return SeatTruth(float(t["budget"]), int(t["holdings"][0]), jobs)


@dataclass
class Tally:
    """Matches of one category: labelled (gold), read (predicted), and both (found)."""

    gold: int = 0
    read: int = 0
    found: int = 0
    misses: list[str] = field(default_factory=list)  # labelled, not found
    extras: list[str] = field(default_factory=list)  # read, not labelled

    @property
    def recall(self) -> float:
        return self.found / self.gold if self.gold else 1.0

    @property
    def precision(self) -> float:
        return self.found / self.read if self.read else 1.0


def _take(pool: list[Any], item: Any) -> bool:
    """Remove one ``item`` from ``pool`` (multiset match); whether it was there."""
    if item in pool:
        pool.remove(item)
        return True
    return False


@dataclass
class Measure:
    false_claims: Tally = field(default_factory=Tally)
    claims: Tally = field(default_factory=Tally)  # any claim, kind and value
    promises: Tally = field(default_factory=Tally)
    # (labelled, read) -> count; labels "false"/"true"/"none", matched by kind and value
    confusion: Counter[tuple[str, str]] = field(default_factory=Counter)


def measure(cases: list[dict[str, Any]]) -> Measure:
    reader, out = RuleReader(), Measure()
    facts = PublicFacts(round=2, reserve=10.0, last_price=25.0)
    for case in cases:
        text, rnd, to = case["text"], case["round"], tuple(case["to"])
        reading = reader.read(case["seat"], rnd, case["source"], text, to, facts)
        truth = truth_of(case)
        # claims: (kind, value, label)
        got = [(c.kind, float(c.value), judge_claim(c, truth).label) for c in reading.claims]
        want = [(c["kind"], float(c["value"]), c["label"]) for c in case["claims"]]
        pool_read = [(k, v) for k, v, _ in got]
        for k, v, lab in want:
            read_label = next((gl for gk, gv, gl in got if (gk, gv) == (k, v)), "none")
            out.confusion[(lab, read_label if _take(pool_read, (k, v)) else "none")] += 1
        for k, v in pool_read:  # read but labelled nothing
            lab = next(gl for gk, gv, gl in got if (gk, gv) == (k, v))
            out.confusion[("none", lab)] += 1
        _tally(
            out.claims,
            case,
            [(k, v) for k, v, _ in want],
            [(k, v) for k, v, _ in got],
        )
        _tally(
            out.false_claims,
            case,
            [(k, v) for k, v, lab in want if lab == "false"],
            [(k, v) for k, v, lab in got if lab == "false"],
        )
        want_p = [
            (
                p["kind"],
                tuple(sorted(p["counterparts"])),
                rnd if p["due_round"] is None else p["due_round"],
                None if p["amount"] is None else float(p["amount"]),
            )
            for p in case["promises"]
        ]
        got_p = [
            (
                p.kind,
                tuple(sorted(p.counterparts)),
                p.due_round,
                None if p.amount is None else float(p.amount),
            )
            for p in reading.promises
        ]
        _tally(out.promises, case, want_p, got_p)
    return out


def _tally(t: Tally, case: dict[str, Any], want: list[Any], got: list[Any]) -> None:
    pool = list(got)
    t.gold += len(want)
    t.read += len(got)
    for w in want:
        if _take(pool, w):
            t.found += 1
        else:
            t.misses.append(f"{case['id']} {case['text']!r}: wanted {w}, read {got}")
    want_pool = list(want)
    for g in got:
        if not _take(want_pool, g):
            t.extras.append(f"{case['id']} {case['text']!r}: read {g}, labelled {want}")


def table(m: Measure) -> str:
    rows = [
        "| category | labelled | read | found | precision | recall |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, t in (
        ("false claims", m.false_claims),
        ("claims (any label)", m.claims),
        ("promises", m.promises),
    ):
        rows.append(
            f"| {name} | {t.gold} | {t.read} | {t.found} | {t.precision:.3f} | {t.recall:.3f} |"
        )
    labels = ("false", "true", "none")
    rows += [
        "",
        "claims by label (rows: labelled, columns: read and judged)",
        "",
        "| labelled \\ read | " + " | ".join(labels) + " |",
        "|---|---:|---:|---:|",
    ]
    for lab in labels:
        rows.append(f"| {lab} | " + " | ".join(str(m.confusion[(lab, r)]) for r in labels) + " |")
    return "\n".join(rows)


@pytest.fixture(scope="module")
def measured() -> Measure:
    m = measure(load())
    print("\n" + table(m))
    return m


def test_heldout_set_is_large_varied_and_labelled_by_the_rules() -> None:
    cases = load()
    assert len(cases) >= 200
    assert len({c["id"] for c in cases}) == len(cases)
    assert len({c["text"] for c in cases}) >= 0.9 * len(cases)
    labels = Counter(c["label"] for case in cases for c in case["claims"])
    assert labels["false"] >= 60 and labels["true"] >= 60
    assert sum(len(c["promises"]) for c in cases) >= 60
    assert sum(not c["claims"] and not c["promises"] for c in cases) >= 50
    # every claim kind and promise kind has several phrasings
    kinds = Counter(c["kind"] for case in cases for c in case["claims"])
    assert set(kinds) == {"budget", "need", "deadline", "job_size", "value", "holdings"}
    assert min(kinds.values()) >= 10
    pkinds = Counter(p["kind"] for case in cases for p in case["promises"])
    assert set(pkinds) == {"deliver", "pay", "join", "stay", "not_bid", "bid"}
    assert min(pkinds.values()) >= 6


def disagreements(cases: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The labelled claims the exact judge labels otherwise: (case id, claim)."""
    from market.core.conduct import Claim

    out = []
    for case in cases:
        truth = truth_of(case)
        for c in case["claims"]:
            claim = Claim(case["seat"], case["round"], "message", c["kind"], float(c["value"]), "")
            if judge_claim(claim, truth).label != c["label"]:
                out.append((case["id"], c))
    return out


def read_negatives(cases: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The texts labelled with no claim or promise that the rule reader reads one in."""
    reader, facts = RuleReader(), PublicFacts(round=2)
    read = []
    for case in cases:
        if case["claims"] or case["promises"]:
            continue
        r = reader.read(
            case["seat"], case["round"], case["source"], case["text"], tuple(case["to"]), facts
        )
        if r.claims or r.promises:
            read.append((case["id"], case["text"], r.claims, r.promises))
    return read


def print_misses(m: Measure) -> None:
    """The table and every miss and extra (``python tests/core/test_conduct_*.py``)."""
    print(table(m))
    for name, t in (("false claims", m.false_claims), ("promises", m.promises)):
        print(f"\n## {name}: missed {len(t.misses)}, read but not labelled {len(t.extras)}")
        print("\n".join(["missed:", *t.misses, "extra:", *t.extras]))


def test_heldout_labels_agree_with_the_exact_judge() -> None:
    """A labelled claim, handed straight to the judge, gets its label: the set's labels and the
    judge's rules (docs/conduct.md, The rules) say the same of every claim."""
    assert disagreements(load()) == []


def test_heldout_false_claims_recall_and_precision(measured: Measure) -> None:
    t = measured.false_claims
    assert t.recall >= RECALL_FLOOR, "\n".join(t.misses)
    assert t.precision >= PRECISION_FLOOR, "\n".join(t.extras)


def test_heldout_promises_recall_and_precision(measured: Measure) -> None:
    t = measured.promises
    assert t.recall >= RECALL_FLOOR, "\n".join(t.misses)
    assert t.precision >= PRECISION_FLOOR, "\n".join(t.extras)


def test_heldout_negatives_give_nothing() -> None:
    """The texts with numbers that are no claim or promise of the speaker (questions,
    conditionals, others' words, offer terms, negations, requests, past acts, public facts)."""
    read = read_negatives(load())
    assert len(read) <= 2, "\n".join(map(str, read))


if __name__ == "__main__":
    print_misses(measure(load()))
