"""The episode as the report and the terminal viewer show it: :class:`Episode` and :class:`Event`,
built from the typed transcript of :mod:`market.record.reader` (or a rollout result).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from agents.specs_redact import redact_spec
from market.record.reader import NON_FINITE, Transcript, decode_number, read_transcript
from market.record.schema import RoundSummary, StepEvent, TranscriptError
from market.review.report.markup import clean_text

# --- the episode model -------------------------------------------------------------------


@dataclass
class Event:
    """One env step as the report needs it (normalised from a transcript event record)."""

    step: int
    round: int | None
    seat: str
    phase: str
    action: Any  # a dict when the action parsed, else the raw value
    error: str | None = None
    result: Any = None
    reward: float | None = None
    components: dict[str, dict[str, float]] = field(default_factory=dict)  # seat -> name -> value
    prompt: str | None = None
    raw_output: str | None = None
    tokens: Any = None
    latency: float | None = None
    live: bool = True
    agent_error: str | None = None  # the agent raised or timed out; its fallback action was played
    llm_error: str | None = None  # the LLM agent's own parse/request error
    fallback: bool = False  # the LLM agent found no usable reply and played its fallback action
    repairs: int = 0  # the LLM agent's re-asks after an unusable reply
    cutoffs: int = 0  # the LLM agent's replies cut off by the token limit (finish_reason "length")
    degraded: list[str] = field(default_factory=list)  # the LLM exchange's degraded features
    model_reasoning: str | None = None  # the model's own reasoning (reasoning_content, <think>)
    # the conduct judge's entries of this step: claims, promises, flags (docs/conduct.md)
    conduct: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reasoning(self) -> str | None:
        """The free-text ``reasoning`` an agent attached to its action, if any."""
        r = self.action.get("reasoning") if isinstance(self.action, Mapping) else None
        return None if r in (None, "") else text_of(r)

    @property
    def action_type(self) -> str:
        if isinstance(self.action, Mapping):
            return str(self.action.get("action_type", "?"))
        return "none" if self.action is None else "unparsed"


@dataclass
class Episode:
    """A transcript normalised for viewing: header, events, round summaries, footer."""

    label: str
    header: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    footer: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    problems: list[str] = field(default_factory=list)  # broken digest chain, cut-off file, ...
    notes: list[str] = field(default_factory=list)  # e.g. "migrated from schema v1"

    # header views
    @property
    def scenario(self) -> str:
        sc = self.header.get("scenario_name")
        return clean_text(sc if sc is not None else "?")

    @property
    def seed(self) -> Any:
        return self.header.get("seed")

    @property
    def value_unit(self) -> float | None:
        """Credits per reward unit (the scenario's ``rewards.value_unit``), when the header
        records the scenario."""
        rewards = as_mapping(as_mapping(self.header.get("scenario")).get("rewards"))
        unit = rewards.get("value_unit")
        return float(unit) if is_number(unit) and math.isfinite(unit) and unit > 0 else None

    @property
    def seats(self) -> dict[str, str]:
        """Seat -> agent description (spec and model when known), in seat order."""
        out: dict[str, str] = {}
        for seat, spec in as_mapping(self.header.get("seats")).items():
            out[clean_text(seat)] = _describe_spec(spec)
        for seat in self._seen_seats():
            out.setdefault(seat, "")
        return out

    def _seen_seats(self) -> list[str]:
        seen: dict[str, None] = {}
        for ev in self.events:
            seen.setdefault(ev.seat, None)
            for seat in ev.components:
                seen.setdefault(seat, None)
        for r in self.rounds:
            for key in ("won", "paid"):
                for seat in as_mapping(r.get(key)):
                    seen.setdefault(clean_text(seat), None)
        return sorted(seen, key=seat_sort_key)

    def totals(self) -> dict[str, dict[str, float]]:
        """Seat -> component -> sum over the episode (from events; the footer's when no events)."""
        totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for ev in self.events:
            for seat, comps in ev.components.items():
                for name, value in comps.items():
                    totals[seat][name] += value
        if not totals:
            for seat, comps in as_mapping(self.footer.get("components")).items():
                for name, value in as_mapping(comps).items():
                    if is_number(value):
                        totals[clean_text(seat)][clean_text(name)] += float(value)
        return {s: dict(c) for s, c in totals.items()}

    def returns(self) -> dict[str, float]:
        footer = as_mapping(self.footer.get("returns"))
        out = {clean_text(s): float(v) for s, v in footer.items() if is_number(v)}
        for seat, comps in self.totals().items():
            out.setdefault(seat, sum(comps.values()))
        return out

    def invalid_actions(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for ev in self.events:
            if ev.error:
                counts[ev.seat] += 1
        return dict(counts)

    def llm_usage(self) -> dict[str, tuple[float, float, int]]:
        """Seat -> (tokens, seconds of model latency, model calls)."""
        usage: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for ev in self.events:
            if ev.prompt is None and ev.raw_output is None and ev.tokens is None:
                continue
            u = usage[ev.seat]
            u[0] += token_count(ev.tokens)
            u[1] += ev.latency if ev.latency is not None and math.isfinite(ev.latency) else 0.0
            u[2] += 1
        return {s: (u[0], u[1], int(u[2])) for s, u in usage.items()}

    def conduct_scores(self) -> tuple[dict[str, dict[str, Any]], str]:
        """(seat -> conduct score, where from): the footer's final scores, else those after
        the last round that carries them (a cut-off file), else none; seats in seat order."""
        scores: Any = self.footer.get("conduct")
        where = "final"
        if not isinstance(scores, Mapping):
            scores, where = {}, "none recorded"
            for r in self.rounds:
                got = as_mapping(r.get("conduct")).get("scores")
                if isinstance(got, Mapping):
                    scores, where = got, f"after round {fmt_round(r.get('round'))}"
        out = {clean_text(s): dict(v) for s, v in scores.items() if isinstance(v, Mapping)}
        return {s: out[s] for s in sorted(out, key=seat_sort_key)}, where

    def welfare_ratio(self) -> float:
        parts = [as_float(as_mapping(r.get("designer")).get("welfare_ratio")) for r in self.rounds]
        parts = [p for p in parts if math.isfinite(p)]
        return sum(parts) / len(parts) if parts else float("nan")


def fmt_round(value: Any) -> str:
    """A round number as shown (``?`` when it is not an integer)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "?"


def seat_sort_key(seat: str) -> tuple[int, str, int]:
    m = re.match(r"^(.*?)(\d{1,18})$", seat)
    base, num = (m.group(1), int(m.group(2))) if m else (seat, -1)
    return (0 if base.startswith("designer") else 1, base, num)


def _describe_spec(spec: Any) -> str:
    """A seat's agent as shown: a header's seat spec (spec and model), or a spec string; a
    secret in it (a file recorded before specs were masked) shown as ``***``."""
    if isinstance(spec, Mapping):
        name = first_of(spec, "spec", "name")
        model = spec.get("model")
        text = redact_spec(clean_text(name)) if name is not None else ""
        if model and clean_text(model) not in text:
            text = f"{text} ({clean_text(model)})" if text else clean_text(model)
        return text
    return "" if spec is None else redact_spec(clean_text(spec))


def first_of(d: Any, *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` that ``d`` (a mapping) holds with a value other than None."""
    if not isinstance(d, Mapping):
        return default
    for key in keys:
        if key in d and d[key] is not None:
            return d[key]
    return default


def as_mapping(value: Any) -> Mapping[Any, Any]:
    """``value`` when it is a mapping, else an empty one (round summaries are free-form)."""
    return value if isinstance(value, Mapping) else {}


def is_number(value: Any) -> TypeGuard[int | float]:
    """An int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def as_float(value: Any) -> float:
    """A recorded number as a float (non-finite strings decoded); NaN for anything else."""
    if isinstance(value, str):
        return decode_number(value) if value in NON_FINITE else math.nan
    return float(value) if is_number(value) else math.nan


def token_count(tokens: Any) -> float:
    """The tokens of a step: its total when recorded, else the sum of its counts."""
    if is_number(tokens):
        return float(tokens)
    if isinstance(tokens, Mapping):
        total = first_of(tokens, "total", "total_tokens")
        if is_number(total):
            return float(total)
        return float(sum(v for v in tokens.values() if is_number(v)))
    return 0.0


# --- reading transcripts -----------------------------------------------------------------


def _load_path(path: Path) -> tuple[Transcript, list[str]]:
    """(transcript, problems) through :func:`market.record.reader.read_transcript`.

    A file whose digest chain is broken (edited after it was written) is still shown, read without
    verification, with the reader's error as a problem; anything that is not a transcript at all
    raises :class:`market.record.schema.TranscriptError`.
    """
    try:
        return read_transcript(path), []
    except TranscriptError as exc:
        first = str(exc)
    try:
        t = read_transcript(path, verify=False)
    except TranscriptError:
        raise TranscriptError(first) from None
    return t, [f"not verified: {first}"]


def _parse_action(action: Any) -> Any:
    if isinstance(action, str):
        try:
            parsed = json.loads(action)
        except (json.JSONDecodeError, RecursionError):
            return action
        return parsed if isinstance(parsed, dict) else action
    return action


def _components(comps: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Seat -> component -> value of every seat rewarded by a step (numbers only)."""
    out: dict[str, dict[str, float]] = {}
    for s, c in comps.items():
        vals = {clean_text(k): float(v) for k, v in c.items() if is_number(v)}
        if vals:
            out[clean_text(s)] = vals
    return out


def _cutoffs(extra: Mapping[str, Any]) -> int:
    """The replies of an LLM exchange cut off by the token limit: its ``finish_reasons`` (one per
    attempt), else its last ``finish_reason``."""
    reasons = extra.get("finish_reasons")
    if not isinstance(reasons, list):
        reasons = [extra.get("finish_reason")]
    return sum(r == "length" for r in reasons)


def event_of(ev: StepEvent) -> Event:
    """The report's view of one recorded step."""
    llm = ev.llm
    extra = (llm.model_extra or {}) if llm is not None else {}
    error, reward, attempts = ev.info.error, ev.rewards.get(ev.seat), extra.get("attempts")
    return Event(
        step=ev.i,
        round=ev.round,
        seat=clean_text(ev.seat),
        phase=clean_text(ev.phase),
        action=_parse_action(ev.action),
        error=None if error in (None, "") else clean_text(error),
        result=ev.info.result,
        reward=float(reward) if is_number(reward) else None,
        components=_components(ev.components),
        prompt=None if llm is None or llm.messages is None else text_of(llm.messages),
        raw_output=None if llm is None or llm.raw is None else text_of(llm.raw),
        tokens=ev.tokens,
        latency=ev.latency_s,
        live=ev.live,
        agent_error=None if ev.agent_error is None else clean_text(ev.agent_error),
        llm_error=None if llm is None or llm.error is None else clean_text(llm.error),
        fallback=extra.get("fallback") is True,
        repairs=max(0, attempts - 1)
        if isinstance(attempts, int) and not isinstance(attempts, bool)
        else 0,
        cutoffs=_cutoffs(extra),
        degraded=[clean_text(str(d)) for d in extra.get("degraded") or [] if d]
        if isinstance(extra.get("degraded"), list)
        else [],
        model_reasoning=None
        if extra.get("reasoning") in (None, "")
        else text_of(extra.get("reasoning")),
        conduct=[dict(c) for c in ev.conduct or [] if isinstance(c, Mapping)],
    )


def text_of(value: Any) -> str:
    """Text to show: strings as they are, chat messages as ``[role]`` blocks, JSON indented."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list) and all(isinstance(m, Mapping) for m in value):
        msgs = list(value)
        return "\n\n".join(
            f"[{clean_text(m.get('role', '?'))}]\n{text_of(m.get('content', ''))}" for m in msgs
        )
    try:
        return clean_text(json.dumps(value, indent=1, default=str))
    except (TypeError, ValueError):
        return clean_text(value)


def episode_of(t: Transcript, label: str | None = None) -> Episode:
    """The episode of a transcript as read by :func:`market.record.reader.read_transcript`."""
    ep = Episode(
        label=label or (t.path.name if t.path is not None else "episode"),
        header=t.header.model_dump(mode="json", exclude={"prev", "digest"}),
        footer={}
        if t.footer is None
        else t.footer.model_dump(mode="json", exclude={"prev", "digest"}),
        source=str(t.path) if t.path is not None else "",
    )
    if t.incomplete is not None:
        ep.problems.append(t.incomplete)
    ep.notes.extend(clean_text(n) for n in t.notes)
    ep.events.extend(event_of(ev) for ev in t.steps)
    ep.rounds.extend(round_of(r) for r in t.rounds)
    return ep


def round_of(r: RoundSummary) -> dict[str, Any]:
    """A round line's summary, with the conduct judge's ``{"verdicts", "scores"}`` of the round
    (kept beside the summary in the file) under ``conduct``."""
    summary = dict(r.summary)
    if r.conduct is not None:
        summary["conduct"] = r.conduct
    return summary


def episode_from(obj: Any, label: str | None = None) -> Episode:
    """An episode from a transcript file, a :class:`~market.record.reader.Transcript`, an
    :class:`Episode`, or a rollout ``EpisodeResult`` (round summaries only)."""
    if isinstance(obj, Episode):
        return obj
    if isinstance(obj, str | Path):
        path = Path(obj)
        transcript, problems = _load_path(path)
        ep = episode_of(transcript, label or path.name)
        ep.source = str(path)
        ep.problems[:0] = problems
        return ep
    if isinstance(obj, Transcript):
        return episode_of(obj, label)
    if hasattr(obj, "round_log") and hasattr(obj, "seats"):
        header = {"scenario_name": obj.scenario, "seed": obj.seed, "seats": dict(obj.seats)}
        footer = {"returns": dict(obj.returns), "components": dict(obj.components)}
        return Episode(
            label or f"{obj.scenario} seed {obj.seed}", header, [], list(obj.round_log), footer
        )
    raise TypeError(f"cannot read a transcript from {type(obj).__name__}")


def transcript_paths(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Files named directly, and every ``*.jsonl`` in a named folder (sorted, not recursive);
    for a run folder of :mod:`market.run.runner` (``run.json``), those in its ``transcripts/``."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir() and (p / "run.json").is_file() and (p / "transcripts").is_dir():
            p = p / "transcripts"  # a run folder (market.run.runner): its transcripts
        if p.is_dir():
            out.extend(
                sorted(
                    (q for q in p.glob("*.jsonl") if q.is_file()),
                    key=lambda q: (len(q.stem), q.stem),
                )
            )
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"no transcript file or folder at {p}")
    return out


def load_episodes(paths: str | Path | Iterable[Any]) -> list[Episode]:
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    episodes: list[Episode] = []
    for item in items:
        if isinstance(item, str | Path):
            episodes.extend(episode_from(p) for p in transcript_paths(item))
        else:
            episodes.append(episode_from(item))
    return episodes
