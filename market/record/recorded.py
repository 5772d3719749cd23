"""Judges on recorded episodes: a model's pitch verdicts and conduct readings played back, and
conduct re-judged.

A transcript judged with an LLM pitch judge replays with :class:`RecordedJudge` (its recorded
verdicts). A transcript judged with an LLM reader (``conduct_judge = "llm:..."``) replays without calling
the model: :class:`RecordedReader` hands the env, for each text a seat said, the reading recorded
in that step's conduct entries. :func:`rejudge_conduct` replays an episode exactly (same actions,
same market) with another reader, ``rule`` or ``llm:...``, and reports each seat's conduct
scores before and after: a new judge version or model re-scores old episodes without re-running
their agents.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from market.core import judge_specs
from market.core.actions import ActionParseError, parse_action
from market.core.conduct import (
    RUBRIC_VERSION,
    Claim,
    ManipulationFlag,
    Promise,
    PublicFacts,
    Source,
)
from market.core.conduct.judging import text_of
from market.core.conduct.reading import ConductReader, TextReading
from market.core.judge import Verdict
from market.record.reader import Transcript, decode_action, decode_number
from market.record.schema import RoundSummary, TranscriptError
from market.record.terminal import terminal_text


def reading_of(entries: list[dict[str, Any]]) -> TextReading:
    """The reader's part of one step's conduct entries (text claims and promises, flags)."""
    claims, promises, flags = [], [], []
    method, model, rubric = "rule", None, RUBRIC_VERSION
    for e in entries:
        if e.get("source") == "action":
            continue  # structured: the env makes these itself
        method, model = str(e.get("method", method)), e.get("model", model)
        if e["kind"] == "claim":
            claims.append(
                Claim(e["seat"], e["round"], e["source"], e["claim"], float(e["value"]), e["span"])
            )
        elif e["kind"] == "promise":
            amount = e.get("amount")
            promises.append(
                Promise(
                    e["seat"], e["round"], e["source"], e["promise"], tuple(e["counterparts"]),
                    int(e["due_round"]), None if amount is None else float(amount), e.get("ref"),
                    False, e.get("span", ""),
                )
            )  # fmt: skip
        elif e["kind"] == "flag":
            flags.append(ManipulationFlag(e["seat"], e["round"], e["flag"], e["span"], e["reason"]))
            rubric = str(e.get("rubric") or RUBRIC_VERSION)  # a flag is the reader's verdict
    return TextReading(tuple(claims), tuple(promises), tuple(flags), method, model, rubric)


class RecordedJudge:
    """Plays back the verdicts of a transcript's round summaries (for LLM judges on replay)."""

    kind = "recorded"
    version = "recorded"
    model: str | None = None

    def __init__(self, rounds: list[RoundSummary]) -> None:
        self._verdicts = {
            (r.round, str(v.get("lab"))): v
            for r in rounds
            for v in r.summary.get("judge", [])
            if isinstance(v, dict)
        }

    def describe(self) -> str:
        return "recorded verdicts"

    def score(self, pitch: Any, lab: Any, context: Any) -> Any:
        v = self._verdicts.get((context.round, lab.seat))
        if v is None:
            return Verdict(
                lab=lab.index,
                scores={},
                total=0.0,
                granted=0,
                rationale="replay: no recorded verdict for this pitch",
            )
        fields = {
            "lab": lab.index,
            "scores": {k: decode_number(x) for k, x in (v.get("scores") or {}).items()},
            "total": decode_number(v.get("score", 0.0)),
            "granted": 0,
            "rationale": v.get("rationale", ""),
            "kind": v.get("judge", "llm"),
            "version": v.get("version", "?"),
            "model": v.get("model"),
            "claims_checked": tuple(v.get("claims_checked", ())),
            "false_claims": tuple(v.get("false_claims", ())),
            "requested": int(v.get("requested", 0)),
            "cached": bool(v.get("cached", False)),
        }
        known = set(getattr(Verdict, "__dataclass_fields__", fields))
        return Verdict(**{k: x for k, x in fields.items() if k in known})


class RecordedReader:
    """Plays back a transcript's readings: each text a seat said gets the reading recorded in
    its step, in order per (seat, round). A text with no recorded reading reads as nothing."""

    def __init__(self, t: Transcript) -> None:
        self.name = str(t.header.conduct_judge or "recorded")
        self._queue: dict[tuple[str, int], deque[TextReading]] = defaultdict(deque)
        for ev in t.steps:
            if not ev.live or ev.info.error is not None or ev.seat.startswith("designer"):
                continue
            try:
                act = parse_action(decode_action(ev.action_kind, ev.action))
            except (ActionParseError, ValueError):
                continue
            said = text_of(act)
            if said is not None and said[1].strip():
                self._queue[(ev.seat, ev.round)].append(reading_of(ev.conduct or []))

    def read(
        self,
        seat: str,
        round: int,
        source: Source,
        text: str,
        counterparts: tuple[str, ...],
        facts: PublicFacts,
    ) -> TextReading:
        queue = self._queue.get((seat, round))
        return queue.popleft() if queue else TextReading(method="recorded-missing")


@dataclass
class ConductRejudge:
    """Each seat's conduct scores as recorded and as ``judge`` gives them."""

    judge: str
    before: dict[str, dict[str, Any]]
    after: dict[str, dict[str, Any]]
    entries_after: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> list[str]:
        """The seats whose scores differ."""
        seats = sorted(set(self.before) | set(self.after))
        return [s for s in seats if self.before.get(s) != self.after.get(s)]


def make_reader(spec: str) -> ConductReader | None:
    """The conduct reader a ``--rejudge`` spec names (as a scenario's ``conduct_judge``); None
    for a ``py:`` pitch judge, which re-judges pitches only."""
    if spec.startswith("py:"):
        return None
    try:
        return judge_specs.make_reader(spec)
    except Exception as exc:
        raise TranscriptError(f"--rejudge {spec}: {exc}") from None


def print_conduct_rejudge(rj: ConductRejudge) -> None:
    """Per seat: the recorded and the new conduct scores (``*`` marks a change)."""

    def fmt(s: dict[str, Any] | None) -> str:
        if not s:
            return "-"
        t, p = s.get("truthfulness"), s.get("promise_keeping")
        return (
            f"truth {'-' if t is None else f'{t:.2f}'} ({s['claims_false']} false), "
            f"promises {'-' if p is None else f'{p:.2f}'} ({s['promises_broken']} broken), "
            f"manipulation {s['manipulation_attempts']}"
        )

    # seat names and notes come from the transcript: printed with controls made visible
    print(
        terminal_text(f"conduct rejudge with {rj.judge}: {len(rj.changed)} seat(s) change", False)
    )
    for note in rj.notes:
        print(terminal_text(f"  note: {note}", False))
    for seat in sorted(set(rj.before) | set(rj.after)):
        mark = "* " if seat in rj.changed else "  "
        line = f"  {mark}{seat}: {fmt(rj.before.get(seat))} -> {fmt(rj.after.get(seat))}"
        print(terminal_text(line, False))


def recorded_scores(t: Transcript) -> dict[str, dict[str, Any]]:
    """The footer's conduct scores, else the last round's (a partial transcript)."""
    if t.footer is not None and t.footer.conduct is not None:
        return dict(t.footer.conduct)
    for r in reversed(t.rounds):
        if r.conduct is not None:
            return dict(r.conduct.get("scores", {}))
    return {}
