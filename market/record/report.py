"""A self-contained HTML report of one transcript or a folder of them.

``write_report("run/ep0.jsonl", "report.html")`` (or a folder, or a list of both) writes one HTML
file with everything inline: CSS, SVG plots (clearing price, welfare ratio, each seat's reward
components over the episode's steps), an SVG graph of trades, coalitions and private messages
between labs, and one section per round (mechanism, bids, clearing, allocations, payments,
shocks, judge verdicts with rationales, the round's actions). It needs no server and no network
and opens from ``file://``.

Transcript text is untrusted (LLM output, pitches, messages, even seat names): every string goes
through :func:`esc` on its way into the page, the page carries no script at all, and a strict
Content-Security-Policy forbids any script, so nothing a model wrote can run in a reader's browser.

The page is built with :func:`h`, which escapes every child and attribute value that is not
already :class:`Safe` (escaped) markup; code never concatenates transcript text into HTML itself.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import re
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- safe HTML building ------------------------------------------------------------------


class Safe(str):
    """Markup that is already escaped (built by :func:`h` or :func:`esc`)."""

    __slots__ = ()


def clean_text(value: Any) -> str:
    """``str(value)`` with lone surrogates replaced, so the page always encodes as UTF-8."""
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", "replace").decode("utf-8") if _has_surrogate(text) else text


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def esc(value: Any) -> Safe:
    """HTML-escape anything (quotes included) unless it is already :class:`Safe`."""
    if isinstance(value, Safe):
        return value
    return Safe(html.escape(clean_text(value), quote=True))


_VOID = frozenset({"meta", "br", "hr", "col", "wbr"})
_ATTR_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_:-]*$")


def _attr_name(key: str) -> str:
    name = key.rstrip("_").replace("_", "-")
    if not _ATTR_NAME.match(name) or name.lower().startswith("on"):
        raise ValueError(f"refusing attribute name {key!r}")  # names come from code, never data
    return name


def _children(items: Iterable[Any]) -> Iterable[Safe]:
    for item in items:
        if item is None or item is False:
            continue
        if isinstance(item, str):
            yield esc(item)
        elif isinstance(item, Iterable):
            yield from _children(item)
        else:
            yield esc(item)


def h(tag: str, *children: Any, **attrs: Any) -> Safe:
    """``<tag attrs>children</tag>`` with every child and attribute value escaped.

    Attribute names are keyword names (``class_`` -> ``class``, ``stroke_width`` ->
    ``stroke-width``; ``viewBox`` stays as written); ``None``/``False`` values are dropped and
    ``True`` writes a bare attribute. Event-handler attributes (``on*``) are refused.
    """
    parts = [tag]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = _attr_name(key)
        parts.append(name if value is True else f'{name}="{esc(value)}"')
    opening = "<" + " ".join(parts) + ">"
    if tag in _VOID:
        return Safe(opening)
    return Safe(opening + "".join(_children(children)) + f"</{tag}>")


def join(items: Iterable[Any], sep: str = "") -> Safe:
    return Safe(esc(sep).join(_children(items)))


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

    @property
    def reasoning(self) -> str | None:
        """The free-text ``reasoning`` an agent attached to its action, if any."""
        r = self.action.get("reasoning") if isinstance(self.action, Mapping) else None
        return None if r in (None, "") else _text_of(r)

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
        sc = _first(self.header, "scenario_name", "scenario")
        if isinstance(sc, Mapping):
            sc = sc.get("name", "?")
        return clean_text(sc if sc is not None else "?")

    @property
    def seed(self) -> Any:
        return _first(self.header, "seed")

    @property
    def seats(self) -> dict[str, str]:
        """Seat -> agent description (spec and model when known), in seat order."""
        raw = _first(self.header, "seats", "agents")
        out: dict[str, str] = {}
        items: Iterable[tuple[Any, Any]]
        if isinstance(raw, Mapping):
            items = raw.items()
        elif isinstance(raw, list):
            items = ((_first(s, "seat", "name") if isinstance(s, Mapping) else s, s) for s in raw)
        else:
            items = ()
        for seat, spec in items:
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
                for seat in _mapping(r.get(key)):
                    seen.setdefault(clean_text(seat), None)
        return sorted(seen, key=_seat_key)

    def totals(self) -> dict[str, dict[str, float]]:
        """Seat -> component -> sum over the episode (from events; the footer's when no events)."""
        totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for ev in self.events:
            for seat, comps in ev.components.items():
                for name, value in comps.items():
                    totals[seat][name] += value
        if not totals:
            for seat, comps in _mapping(
                _first(self.footer, "components", "reward_components")
            ).items():
                for name, value in _mapping(comps).items():
                    if _is_num(value):
                        totals[clean_text(seat)][clean_text(name)] += float(value)
        return {s: dict(c) for s, c in totals.items()}

    def returns(self) -> dict[str, float]:
        footer = _mapping(_first(self.footer, "returns", "totals"))
        out = {clean_text(s): float(v) for s, v in footer.items() if _is_num(v)}
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
            u[0] += _token_count(ev.tokens)
            u[1] += ev.latency if ev.latency is not None and math.isfinite(ev.latency) else 0.0
            u[2] += 1
        return {s: (u[0], u[1], int(u[2])) for s, u in usage.items()}

    def welfare_ratio(self) -> float:
        parts = [_num(_mapping(r.get("designer")).get("welfare_ratio")) for r in self.rounds]
        parts = [p for p in parts if math.isfinite(p)]
        return sum(parts) / len(parts) if parts else float("nan")


def _seat_key(seat: str) -> tuple[int, str, int]:
    m = re.match(r"^(.*?)(\d{1,18})$", seat)
    base, num = (m.group(1), int(m.group(2))) if m else (seat, -1)
    return (0 if base.startswith("designer") else 1, base, num)


def _describe_spec(spec: Any) -> str:
    if isinstance(spec, Mapping):
        name = _first(spec, "spec", "agent", "name", "kind")
        model = _first(spec, "model")
        text = clean_text(name) if name is not None else ""
        if model and clean_text(model) not in text:
            text = f"{text} ({clean_text(model)})" if text else clean_text(model)
        return text
    return "" if spec is None else clean_text(spec)


def _first(d: Any, *keys: str, default: Any = None) -> Any:
    if not isinstance(d, Mapping):
        return default
    for key in keys:
        if key in d and d[key] is not None:
            return d[key]
    return default


def _mapping(value: Any) -> Mapping[Any, Any]:
    return value if isinstance(value, Mapping) else {}


_NONFINITE = {
    "NaN": math.nan,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
}  # as transcripts write them


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _num(value: Any) -> float:
    if isinstance(value, str):
        return _NONFINITE.get(value, math.nan)
    return float(value) if _is_num(value) else math.nan


def _token_count(tokens: Any) -> float:
    if _is_num(tokens):
        return float(tokens)
    if isinstance(tokens, Mapping):
        total = _first(tokens, "total", "total_tokens")
        if _is_num(total):
            return float(total)
        return float(sum(v for v in tokens.values() if _is_num(v)))
    return 0.0


# --- reading transcripts -----------------------------------------------------------------

_KINDS = ("header", "step", "round", "footer")  # the record types of market.record.transcript


def _record_kind(rec: Mapping[str, Any]) -> str | None:
    kind = rec.get("type")
    return kind if kind in _KINDS else None


def _load_path(path: Path) -> tuple[Any, list[str]]:
    """(transcript, problems) through :func:`market.record.transcript.read_transcript`.

    A file whose digest chain is broken (edited after it was written) is still shown, read without
    verification, with the reader's error as a problem; anything that is not a transcript at all
    raises :class:`market.record.transcript.TranscriptError`.
    """
    from market.record.transcript import TranscriptError, read_transcript

    try:
        return read_transcript(path), []
    except TranscriptError as exc:
        first = str(exc)
    try:
        t = read_transcript(path, verify=False)
    except TranscriptError:
        raise TranscriptError(first) from None
    return t, [f"not verified: {first}"]


def _as_dict(obj: Any) -> Any:
    if isinstance(obj, Mapping | list | str | int | float | bool) or obj is None:
        return obj
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude={"prev", "digest"})
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if hasattr(obj, "__dataclass_fields__"):
        return {k: getattr(obj, k) for k in obj.__dataclass_fields__}
    return obj


def _parse_action(action: Any) -> Any:
    action = _as_dict(action)
    if isinstance(action, str):
        try:
            parsed = json.loads(action)
        except (json.JSONDecodeError, RecursionError):
            return action
        return parsed if isinstance(parsed, dict) else action
    return action


def _components(
    rec: Mapping[str, Any], info: Mapping[str, Any], seat: str
) -> dict[str, dict[str, float]]:
    comps = _first(rec, "reward_components", "components")
    if comps is None:
        comps = _first(info, "reward_components")
    comps = _as_dict(comps)
    if not isinstance(comps, Mapping):
        return {}
    out: dict[str, dict[str, float]] = {}
    if comps and all(isinstance(_as_dict(v), Mapping) for v in comps.values()):
        for s, c in comps.items():  # seat -> components: every seat rewarded by this step
            vals = {clean_text(k): float(v) for k, v in _as_dict(c).items() if _is_num(v)}
            if vals:
                out[clean_text(s)] = vals
        return out
    vals = {clean_text(k): float(v) for k, v in comps.items() if _is_num(v)}
    return {seat: vals} if vals else {}


def _event(rec: Mapping[str, Any], index: int) -> Event:
    info = _mapping(_as_dict(_first(rec, "info", default={})))
    llm = _mapping(_as_dict(_first(rec, "llm", "model", default={})))
    seat = clean_text(_first(rec, "seat", "agent", default="?"))
    step = _first(rec, "step", "index", "i")
    rnd = _first(rec, "round", default=_first(info, "round"))
    latency = _first(llm, "latency", "latency_s", default=_first(rec, "latency", "latency_s"))
    tokens = _first(llm, "tokens", "usage", default=_first(rec, "tokens", "usage"))
    if tokens is None and any(k in llm for k in ("prompt_tokens", "completion_tokens")):
        tokens = {k: llm[k] for k in ("prompt_tokens", "completion_tokens") if k in llm}
    prompt = _first(llm, "prompt", "messages", default=_first(rec, "prompt"))
    raw = _first(
        llm,
        "raw_output",
        "raw",
        "output",
        "completion",
        "text",
        default=_first(rec, "raw_output", "raw"),
    )
    error = _first(rec, "error", default=_first(info, "error"))
    result = _first(rec, "result", default=_first(info, "result"))
    reward = _first(rec, "reward", default=_mapping(_first(rec, "rewards")).get(seat))
    agent_error, llm_error = _first(rec, "agent_error"), _first(llm, "error")
    attempts = llm.get("attempts")
    return Event(
        step=step if isinstance(step, int) and not isinstance(step, bool) else index,
        round=rnd if isinstance(rnd, int) and not isinstance(rnd, bool) else None,
        seat=seat,
        phase=clean_text(_first(rec, "phase", default=_first(info, "phase", default="?"))),
        action=_parse_action(_first(rec, "action", "parsed_action")),
        error=None
        if error in (None, "")
        else clean_text(error if isinstance(error, str) else json.dumps(error)),
        result=_as_dict(result),
        reward=float(reward) if _is_num(reward) else None,
        components=_components(rec, info, seat),
        prompt=None if prompt is None else _text_of(prompt),
        raw_output=None if raw is None else _text_of(raw),
        tokens=_as_dict(tokens),
        latency=float(latency) if _is_num(latency) else None,
        live=_first(rec, "live", default=True) is not False,
        agent_error=None if agent_error is None else clean_text(agent_error),
        llm_error=None if llm_error is None else clean_text(llm_error),
        fallback=llm.get("fallback") is True,
        repairs=max(0, attempts - 1) if isinstance(attempts, int) and not isinstance(attempts, bool)
        else 0,
    )


def _text_of(value: Any) -> str:
    value = _as_dict(value)
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list) and all(isinstance(_as_dict(m), Mapping) for m in value):
        msgs = [_as_dict(m) for m in value]
        return "\n\n".join(
            f"[{clean_text(m.get('role', '?'))}]\n{_text_of(m.get('content', ''))}" for m in msgs
        )
    try:
        return clean_text(json.dumps(value, indent=1, default=str))
    except (TypeError, ValueError):
        return clean_text(value)


def episode_from_records(records: Iterable[Mapping[str, Any]], label: str = "episode") -> Episode:
    """An episode from transcript records (dicts with a ``type``: header, step, round, footer)."""
    ep = Episode(label=label)
    for rec in records:
        rec = _mapping(_as_dict(rec))
        kind = _record_kind(rec)
        if kind == "header":
            ep.header = dict(rec)
        elif kind == "step":
            ep.events.append(_event(rec, len(ep.events)))
        elif kind == "round":
            body = rec.get("summary")
            ep.rounds.append(dict(body) if isinstance(body, Mapping) else dict(rec))
        elif kind == "footer":
            ep.footer = dict(rec)
    return ep


def episode_from(obj: Any, label: str | None = None) -> Episode:
    """Normalise a transcript: a path, an :class:`Episode`, the reader's transcript object, a dict
    ``{"header", "events", "rounds", "footer"}``, a list of records, or a rollout
    ``EpisodeResult`` (round summaries only)."""
    if isinstance(obj, Episode):
        return obj
    if isinstance(obj, str | Path):
        path = Path(obj)
        transcript, problems = _load_path(path)
        ep = episode_from(transcript, label or path.name)
        ep.source = str(path)
        ep.problems[:0] = problems
        return ep
    if isinstance(obj, list):
        return episode_from_records(obj, label or "episode")
    if hasattr(obj, "round_log") and hasattr(obj, "seats") and not hasattr(obj, "events"):
        header = {"scenario": obj.scenario, "seed": obj.seed, "seats": dict(obj.seats)}
        footer = {"returns": dict(obj.returns), "components": dict(obj.components)}
        return Episode(
            label or f"{obj.scenario} seed {obj.seed}", header, [], list(obj.round_log), footer
        )
    data = obj if isinstance(obj, Mapping) else None
    get = (lambda k: data.get(k)) if data is not None else (lambda k: getattr(obj, k, None))
    header, footer = _as_dict(get("header")), _as_dict(get("footer"))
    events = get("steps") if get("steps") is not None else get("events")
    rounds = get("rounds")
    if header is None and events is None and rounds is None:
        raise TypeError(f"cannot read a transcript from {type(obj).__name__}")
    path = get("path")
    ep = Episode(
        label=label or (Path(path).name if isinstance(path, str | Path) else "episode"),
        header=dict(_mapping(header)),
        footer=dict(_mapping(footer)),
        source=str(path) if isinstance(path, str | Path) else "",
    )
    incomplete = get("incomplete")
    if isinstance(incomplete, str):
        ep.problems.append(incomplete)
    ep.notes.extend(clean_text(n) for n in get("notes") or [] if isinstance(n, str))
    for i, rec in enumerate(events or []):
        ep.events.append(_event(_mapping(_as_dict(rec)), i))
    for rec in rounds or []:
        rec = _mapping(_as_dict(rec))
        body = rec.get("summary")
        ep.rounds.append(dict(body) if isinstance(body, Mapping) else dict(rec))
    return ep


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


# --- derived views -----------------------------------------------------------------------


def seat_of(value: Any) -> str | None:
    """``"bidder_3"`` from a seat name or a lab index."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"bidder_{value}"
    return clean_text(value) if isinstance(value, str) else None


def _recipients(ev: Event) -> list[str]:
    result = _mapping(ev.result)
    delivered = result.get("delivered_to")
    if isinstance(delivered, list):
        return [s for s in (seat_of(d) for d in delivered) if s]
    if delivered == "all":
        return []
    to = _mapping(ev.action).get("to")
    if isinstance(to, str):
        return [] if to == "all" else [clean_text(to)]
    if isinstance(to, list):
        return [s for s in (seat_of(t) for t in to) if s]
    return []


EDGE_KINDS = ("trade", "coalition", "message", "cartel")


def interaction_counts(ep: Episode) -> dict[tuple[str, str], dict[str, int]]:
    """(seat, seat) (sorted) -> {"trade", "coalition", "message", "cartel"} counts.

    Trades: accepted offers (between the accepting seat and the offer's creator). Coalitions: one
    per coalition that became active, between every two members. Messages: private messages (each
    recipient). Cartels: rounds in which the collusion detector suspected both seats together.
    """
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(EDGE_KINDS, 0)
    )

    def add(a: str, b: str, kind: str, n: int = 1) -> None:
        if a and b and a != b:
            counts[(a, b) if _seat_key(a) <= _seat_key(b) else (b, a)][kind] += n

    offer_owner: dict[str, str] = {}
    coalition_members: dict[str, list[str]] = {}
    counted_coalitions: dict[str, set[frozenset[str]]] = {}
    for ev in sorted((e for e in ev_ok(ep.events)), key=lambda e: e.step):
        act, result, kind = _mapping(ev.action), _mapping(ev.result), ev.action_type
        if kind in ("send_offer", "counter_offer") and isinstance(result.get("offer_id"), str):
            offer_owner[result["offer_id"]] = ev.seat
        elif kind == "accept_offer" and result.get("status") == "accepted":
            owner = offer_owner.get(clean_text(result.get("offer_id", act.get("offer_id", ""))))
            if owner:
                add(owner, ev.seat, "trade")
        elif kind == "form_coalition" and isinstance(result.get("coalition_id"), str):
            coalition_members[result["coalition_id"]] = [ev.seat]
        elif kind == "commit_to_coalition" and isinstance(result.get("coalition_id"), str):
            cid = result["coalition_id"]
            members = coalition_members.setdefault(cid, [])
            if ev.seat not in members:
                members.append(ev.seat)
            if result.get("status") == "active":  # count each pair of members once
                pairs = counted_coalitions.setdefault(cid, set())
                for i, a in enumerate(members):
                    for b in members[i + 1 :]:
                        if frozenset((a, b)) not in pairs:
                            pairs.add(frozenset((a, b)))
                            add(a, b, "coalition")
        elif kind == "send_message":
            for other in _recipients(ev):
                add(ev.seat, other, "message")
    for r in ep.rounds:
        for cartel in r.get("suspected_cartels") or []:
            members = [s for s in (seat_of(m) for m in _mapping(cartel).get("members") or []) if s]
            for i, a in enumerate(members):
                for b in members[i + 1 :]:
                    add(a, b, "cartel")
    return {k: v for k, v in counts.items() if any(v.values())}


def quiet(ev: Event) -> bool:
    """A step not worth a row: a scripted ``wait`` or a finished seat stepped with None."""
    if ev.error or ev.agent_error or ev.prompt is not None or ev.raw_output is not None:
        return False
    return not ev.live or ev.action_type == "wait"


def ev_ok(events: Iterable[Event]) -> Iterable[Event]:
    """Events whose action was applied (no validation error)."""
    return (e for e in events if not e.error)


def component_names(ep: Episode) -> list[str]:
    names = {n for comps in ep.totals().values() for n in comps}
    return sorted(names)


def cumulative_components(ep: Episode, seat: str) -> dict[str, list[tuple[float, float]]]:
    """Component -> [(step, cumulative value)] at each step the component changed for ``seat``."""
    series: dict[str, list[tuple[float, float]]] = {}
    running: dict[str, float] = defaultdict(float)
    for ev in sorted(ep.events, key=lambda e: e.step):
        for name, value in ev.components.get(seat, {}).items():
            if not math.isfinite(value) or value == 0:
                continue
            running[name] += value
            series.setdefault(name, [(0.0, 0.0)]).append((float(ev.step), running[name]))
    return series


def round_starts(ep: Episode) -> list[tuple[int, int]]:
    """(round, first step of the round) for each round with events."""
    starts: dict[int, int] = {}
    for ev in ep.events:
        if ev.round is not None and (ev.round not in starts or ev.step < starts[ev.round]):
            starts[ev.round] = ev.step
    return sorted(starts.items())


def round_components(ep: Episode, rnd: int) -> dict[str, dict[str, float]]:
    """Seat -> component -> sum of the rewards paid during the steps of round ``rnd``."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for ev in ep.events:
        if ev.round == rnd:
            for seat, comps in ev.components.items():
                for name, value in comps.items():
                    out[seat][name] += value
    return {s: dict(c) for s, c in out.items()}


def action_summary(ev: Event, limit: int = 240) -> str:
    """A one-line description of an event's action (plain text, not escaped)."""
    act = ev.action
    if not isinstance(act, Mapping):
        return clip("(no action)" if act is None else f"unparsed: {_text_of(act)}", limit)
    a = dict(act)
    kind = clean_text(a.pop("action_type", "?"))
    a.pop("agent", None)
    a.pop("reasoning", None)
    if kind == "bid":
        bids = [b for b in a.get("bids") or [] if _is_num(b)]
        coal = f" for {clean_text(a['coalition_id'])}" if a.get("coalition_id") else ""
        if not bids:
            return f"bid: abstain{coal}"
        return clip(
            f"bid {len(bids)} unit(s){coal}: {', '.join(fmt(b) for b in bids[:8])}"
            f"{' ...' if len(bids) > 8 else ''}",
            limit,
        )
    if kind == "send_message":
        to = a.get("to", "all")
        to_s = ", ".join(map(clean_text, to)) if isinstance(to, list) else clean_text(to)
        return clip(f"message to {to_s}: {_text_of(a.get('text', ''))}", limit)
    if kind == "make_pitch":
        return clip(
            f"pitch for {fmt(a.get('blocks_requested'))} block(s): {_text_of(a.get('text', ''))}",
            limit,
        )
    if kind == "counter_pitch":
        return clip(
            f"counter-pitch on {_text_of(a.get('target', '?'))}: {_text_of(a.get('text', ''))}",
            limit,
        )
    if kind == "wait":
        return "wait"
    rest = ", ".join(
        f"{clean_text(k)}={_short(v)}" for k, v in a.items() if v not in (None, "", [], {})
    )
    return clip(f"{kind} {rest}".strip(), limit)


def _short(v: Any) -> str:
    if isinstance(v, Mapping):
        return (
            "{"
            + ", ".join(f"{clean_text(k)}: {_short(x)}" for k, x in v.items() if x is not None)
            + "}"
        )
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v[:8]) + (" ..." if len(v) > 8 else "") + "]"
    return fmt(v)


def fmt(v: Any, digits: int = 2) -> str:
    """A number rounded for display; anything else as text."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.{digits}f}" if v != int(v) or abs(v) >= 1e15 else str(int(v))
    return clean_text(v)


def clip(text: str, limit: int) -> str:
    text = clean_text(text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    from market.run.rollout import mean_ci95 as _m

    return _m(list(values))


# --- SVG plots ---------------------------------------------------------------------------

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
#: one palette index per reward component name, the same in every chart of every report; a name
#: not listed gets a stable index from its CRC-32
COMPONENT_COLORS = {
    "job_value": 0,
    "auction_payments": 1,
    "shill_penalty": 2,
    "composite": 3,
    "trade_balance": 4,
    "withdrawal_penalty": 5,
    "collusion_penalty": 6,
    "invalid_action": 7,
    "talk_cost": 8,
}


def component_color(name: str) -> int:
    """The palette index of a reward component (see :data:`COMPONENT_COLORS`)."""
    known = COMPONENT_COLORS.get(name)
    return known if known is not None else zlib.crc32(name.encode("utf-8", "replace")) % len(PALETTE)


EDGE_COLORS = {
    "trade": "#4e79a7",
    "coalition": "#59a14f",
    "message": "#b07aa1",
    "cartel": "#e15759",
}


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi - lo < 1e-12:
        lo, hi = lo - 1.0, hi + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t <= hi + step * 0.5 and len(ticks) < 3 * n:
        ticks.append(round(t, 10))
        t += step
    if ticks[-1] < hi and len(ticks) < 3 * n:  # the top tick must cover the data
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _y_grid(ticks: list[float], sy: Callable[[float], float], left: float,
            width: float) -> list[Safe]:
    """A horizontal grid line and a left-hand label at each y tick."""
    parts: list[Safe] = []
    for t in ticks:
        parts.append(h("line", x1=left, x2=left + width, y1=sy(t), y2=sy(t), class_="grid"))
        parts.append(
            h("text", _tick_label(t), x=left - 6, y=sy(t) + 4, class_="tick", text_anchor="end")
        )
    return parts


def _tick_label(t: float) -> str:
    if t == int(t) and abs(t) < 1e15:
        return str(int(t))
    return f"{t:.3g}"


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    color: int = 0
    dashed: bool = False
    step: bool = False  # draw as a step function (value holds until the next point)
    markers: bool = True


def _plot_svg(parts: list[Any], y_label: str | None, top: float, ph: float, width: int, height: int,
              plot_id: str) -> Any:
    """The plot's <svg>: its parts plus the rotated y-axis label, if any."""
    if y_label:
        parts.append(h("text", y_label, x=12, y=top + ph / 2, class_="axis", text_anchor="middle",
                       transform=f"rotate(-90 12 {top + ph / 2})"))
    return h("svg", parts, xmlns="http://www.w3.org/2000/svg", viewBox=f"0 0 {width} {height}",
             width=width, height=height, class_="plot", role="img", data_plot=plot_id)


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    plot_id: str,
    x_label: str = "",
    y_label: str = "",
    width: int = 520,
    height: int = 220,
    y_range: tuple[float, float] | None = None,
    x_marks: Sequence[tuple[float, str]] = (),
    x_range: tuple[float, float] | None = None,
) -> Safe:
    """An inline SVG line chart in a ``<figure>`` with an HTML legend.

    ``x_marks`` are labelled vertical guides (e.g. round starts); they replace numeric x ticks.
    """
    pts = [p for s in series for p in s.points if math.isfinite(p[0]) and math.isfinite(p[1])]
    left, right, top, bottom = 58, 14, 12, 40
    pw, ph = width - left - right, height - top - bottom
    if pts:
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        x0, x1 = x_range or (min(xs), max(xs))
        y0, y1 = y_range or (min(ys), max(ys))
    else:
        x0, x1, y0, y1 = 0.0, 1.0, 0.0, 1.0
    if x_marks:
        x0, x1 = min([x0, *(m[0] for m in x_marks)]), max([x1, *(m[0] for m in x_marks)])
    if x1 - x0 < 1e-12:
        x0, x1 = x0 - 1, x1 + 1
    yt = _nice_ticks(y0, y1) if y_range is None else _nice_ticks(*y_range)
    y0, y1 = min(y0, yt[0]), max(y1, yt[-1])
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 1, y1 + 1

    def sx(x: float) -> float:
        return round(left + (x - x0) / (x1 - x0) * pw, 2)

    def sy(y: float) -> float:
        return round(top + (1 - (y - y0) / (y1 - y0)) * ph, 2)

    parts: list[Safe] = [h("title", title), *_y_grid(yt, sy, left, pw)]
    if x_marks:
        every = max(1, math.ceil(len(x_marks) / 14))
        for i, (x, label) in enumerate(x_marks):
            parts.append(h("line", x1=sx(x), x2=sx(x), y1=top, y2=top + ph, class_="grid"))
            if i % every == 0:
                parts.append(
                    h("text", label, x=sx(x), y=top + ph + 16, class_="tick", text_anchor="middle")
                )
    else:
        for t in _nice_ticks(x0, x1, 6):
            if x0 - 1e-9 <= t <= x1 + 1e-9:
                parts.append(
                    h(
                        "text",
                        _tick_label(t),
                        x=sx(t),
                        y=top + ph + 16,
                        class_="tick",
                        text_anchor="middle",
                    )
                )
    if y0 < 0 < y1:
        parts.append(h("line", x1=left, x2=left + pw, y1=sy(0), y2=sy(0), class_="zero"))
    parts.append(h("rect", x=left, y=top, width=pw, height=ph, class_="frame"))
    for s in series:
        sp = [p for p in s.points if math.isfinite(p[0]) and math.isfinite(p[1])]
        if not sp:
            continue
        color = PALETTE[s.color % len(PALETTE)]
        coords: list[str] = []
        for i, (x, y) in enumerate(sp):
            if s.step and i:
                coords.append(f"{sx(x)},{sy(sp[i - 1][1])}")
            coords.append(f"{sx(x)},{sy(y)}")
        if s.step and x_range is not None and sp[-1][0] < x_range[1]:
            coords.append(f"{sx(x_range[1])},{sy(sp[-1][1])}")
        g = [
            h("title", s.name),
            h(
                "polyline",
                points=" ".join(coords),
                fill="none",
                stroke=color,
                stroke_width=2,
                stroke_dasharray="5 4" if s.dashed else None,
            ),
        ]
        if s.markers and len(sp) <= 60:
            for x, y in sp:
                g.append(
                    h(
                        "circle",
                        h("title", f"{s.name}: {fmt(y, 3)} at {_tick_label(x)}"),
                        cx=sx(x),
                        cy=sy(y),
                        r=3,
                        fill=color,
                    )
                )
        parts.append(h("g", g, class_="series"))
    if x_label:
        parts.append(
            h("text", x_label, x=left + pw / 2, y=height - 6, class_="axis", text_anchor="middle")
        )
    svg = _plot_svg(parts, y_label, top, ph, width, height, plot_id)
    legend = h(
        "ul",
        [
            h(
                "li",
                h("span", class_=f"sw c{s.color % len(PALETTE)}" + (" dash" if s.dashed else "")),
                s.name,
            )
            for s in series
        ],
        class_="legend",
    )
    return h("figure", h("figcaption", title), svg, legend if series else None, class_="chart")


def bar_chart(
    title: str,
    bars: Sequence[tuple[str, float, float]],
    *,
    plot_id: str,
    y_label: str = "",
    width: int = 520,
    height: int = 240,
) -> Safe:
    """Bars (label, value, 95% CI half-width) with whiskers, as an inline SVG figure."""
    left, right, top, bottom = 58, 14, 12, 56
    pw, ph = width - left - right, height - top - bottom
    vals = [
        v
        for _, m, c in bars
        for v in (m - (c if math.isfinite(c) else 0), m + (c if math.isfinite(c) else 0))
        if math.isfinite(v)
    ]
    yt = _nice_ticks(min([0.0, *vals]), max([0.0, *vals]))
    y0, y1 = yt[0], yt[-1]

    def sy(y: float) -> float:
        return round(top + (1 - (y - y0) / (y1 - y0)) * ph, 2)

    parts: list[Safe] = [h("title", title), *_y_grid(yt, sy, left, pw)]
    slot = pw / max(1, len(bars))
    for i, (label, mean, ci) in enumerate(bars):
        if not math.isfinite(mean):
            continue
        x = left + i * slot + slot * 0.2
        w = slot * 0.6
        top_y, base = sy(max(mean, 0.0)), sy(min(mean, 0.0))
        color = PALETTE[i % len(PALETTE)]
        g = [
            h("title", f"{label}: {fmt(mean, 3)} +/- {fmt(ci, 3)}"),
            h(
                "rect",
                x=round(x, 2),
                y=top_y,
                width=round(w, 2),
                height=round(max(0.5, base - top_y), 2),
                fill=color,
            ),
        ]
        if math.isfinite(ci) and ci > 0:
            cx = round(x + w / 2, 2)
            g.append(h("line", x1=cx, x2=cx, y1=sy(mean - ci), y2=sy(mean + ci), class_="whisker"))
            for yy in (mean - ci, mean + ci):
                g.append(h("line", x1=cx - 5, x2=cx + 5, y1=sy(yy), y2=sy(yy), class_="whisker"))
        g.append(
            h(
                "text",
                clip(label, 14),
                x=round(x + w / 2, 2),
                y=top + ph + 16,
                class_="tick",
                text_anchor="middle",
            )
        )
        parts.append(h("g", g))
    parts.append(h("line", x1=left, x2=left + pw, y1=sy(0), y2=sy(0), class_="zero"))
    svg = _plot_svg(parts, y_label, top, ph, width, height, plot_id)
    return h("figure", h("figcaption", title), svg, class_="chart")


GRAPH_NODES = 40


def graph_svg(
    seats: Sequence[str],
    counts: Mapping[tuple[str, str], Mapping[str, int]],
    *,
    plot_id: str,
    size: int = 420,
) -> Safe:
    """Labs on a circle; one curved edge per (pair, kind), width by count, count as a label.

    In a big market only labs with an interaction are drawn, at most :data:`GRAPH_NODES` of them
    (the most active); the caption says how many were left out.
    """
    nodes = [s for s in seats if not s.startswith("designer")]
    for a, b in counts:
        for s in (a, b):
            if s not in nodes:
                nodes.append(s)
    hidden = 0
    if len(nodes) > 24:
        activity: dict[str, int] = defaultdict(int)
        for (a, b), kinds in counts.items():
            activity[a] += sum(kinds.values())
            activity[b] += sum(kinds.values())
        keep = set(sorted(activity, key=lambda s: (-activity[s], _seat_key(s)))[:GRAPH_NODES])
        hidden = len(nodes) - len(keep)
        nodes = [s for s in nodes if s in keep]
        counts = {k: v for k, v in counts.items() if k[0] in keep and k[1] in keep}
    cx = cy = size / 2
    radius = size / 2 - 52
    pos = {
        s: (
            cx + radius * math.cos(2 * math.pi * i / max(1, len(nodes)) - math.pi / 2),
            cy + radius * math.sin(2 * math.pi * i / max(1, len(nodes)) - math.pi / 2),
        )
        for i, s in enumerate(nodes)
    }
    parts: list[Safe] = [h("title", "trades, coalitions and private messages between labs")]
    bend = {"trade": 0.0, "coalition": 0.18, "message": -0.18, "cartel": 0.34}
    for (a, b), kinds in sorted(counts.items()):
        (x1, y1), (x2, y2) = pos[a], pos[b]
        for kind in EDGE_KINDS:
            n = kinds.get(kind, 0)
            if not n:
                continue
            mx, my = (x1 + x2) / 2, (y1 + y2) / 2
            dx, dy = x2 - x1, y2 - y1
            qx, qy = mx - dy * bend[kind], my + dx * bend[kind]
            width = round(min(8.0, 1.5 + math.log2(1 + n) * 1.5), 2)
            label_x, label_y = (mx + qx) / 2, (my + qy) / 2
            parts.append(
                h(
                    "g",
                    h("title", f"{a} - {b}: {n} {kind}{'s' if n != 1 else ''}"),
                    h(
                        "path",
                        d=f"M{x1:.1f},{y1:.1f} Q{qx:.1f},{qy:.1f} {x2:.1f},{y2:.1f}",
                        fill="none",
                        stroke=EDGE_COLORS[kind],
                        stroke_width=width,
                        stroke_opacity=0.75,
                        stroke_dasharray={"message": "6 4", "cartel": "2 3"}.get(kind),
                    ),
                    h(
                        "text",
                        str(n),
                        x=round(label_x, 1),
                        y=round(label_y, 1),
                        class_="elabel",
                        text_anchor="middle",
                    ),
                    class_=f"edge {kind}",
                )
            )
    for s in nodes:
        x, y = pos[s]
        parts.append(
            h(
                "g",
                h("title", s),
                h("circle", cx=round(x, 1), cy=round(y, 1), r=18, class_="node"),
                h(
                    "text",
                    clip(s.replace("bidder_", "b"), 8),
                    x=round(x, 1),
                    y=round(y + 4, 1),
                    class_="nlabel",
                    text_anchor="middle",
                ),
                class_="lab",
            )
        )
    svg = h(
        "svg",
        parts,
        xmlns="http://www.w3.org/2000/svg",
        viewBox=f"0 0 {size} {size}",
        width=size,
        height=size,
        class_="plot graph",
        role="img",
        data_plot=plot_id,
    )
    legend = h(
        "ul",
        [
            h(
                "li",
                h("span", class_=f"sw e-{k}"),
                {
                    "trade": "trades (accepted offers)",
                    "coalition": "coalitions (active)",
                    "message": "private messages",
                    "cartel": "suspected cartel (rounds)",
                }[k],
            )
            for k in EDGE_KINDS
        ],
        class_="legend",
    )
    caption = "Who dealt with whom" + (f" ({hidden} labs not drawn)" if hidden else "")
    return h("figure", h("figcaption", caption), svg, legend, class_="chart")


# --- page sections -----------------------------------------------------------------------

TEXT_LIMIT = 20_000  # characters of one prompt or model output shown in the page


def _pre(text: str, cls: str = "") -> Safe:
    text = clean_text(text)
    more = len(text) - TEXT_LIMIT
    body = text[:TEXT_LIMIT] + (f"\n... ({more} more characters not shown)" if more > 0 else "")
    return h("pre", body, class_=cls or None)


def _table(
    head: Sequence[Any], rows: Iterable[Sequence[Any]], cls: str = "", numeric: Sequence[int] = ()
) -> Safe:
    rows = list(rows)
    if not rows:
        return Safe("")
    cells = [
        h("th", clip(c, 40), title=c if len(c) > 40 else None)
        if isinstance(c, str) and not isinstance(c, Safe)
        else h("th", c)
        for c in head
    ]
    return h(
        "div",
        h(
            "table",
            h("thead", h("tr", cells)),
            h(
                "tbody",
                [
                    h(
                        "tr",
                        [
                            h("td", c, class_="num" if i in numeric else None)
                            for i, c in enumerate(r)
                        ],
                    )
                    for r in rows
                ],
            ),
            class_=cls or None,
        ),
        class_="tw",
    )


def _kv(pairs: Iterable[tuple[str, Any]]) -> Safe:
    return h("dl", [(h("dt", k), h("dd", v)) for k, v in pairs], class_="kv")


def _mechanism_text(mech: Mapping[str, Any]) -> str:
    if not mech:
        return "-"
    keys = [k for k in mech if k != "auction_type"]
    return ", ".join(
        [clean_text(mech.get("auction_type", "?"))]
        + [f"{clean_text(k)}={_short(mech[k])}" for k in keys]
    )


def _round_section(
    ep: Episode, idx: int, r: Mapping[str, Any], events: list[Event], seats: list[str]
) -> Safe:
    rnd = r.get("round", "?")
    mech = _mapping(r.get("mechanism"))
    designer = _mapping(r.get("designer"))
    shocks = r.get("shocks") or []
    verdicts = [v for v in r.get("judge") or [] if isinstance(v, Mapping)]
    bids = _mapping(r.get("bids"))
    won, paid = _mapping(r.get("won")), _mapping(r.get("paid"))
    shill, collusion = _mapping(r.get("shill_penalties")), _mapping(r.get("collusion_penalties"))
    bidders = list(dict.fromkeys([*bids, *won, *paid, *shill, *collusion]))
    opt, alloc = _num(r.get("optimal_welfare")), _num(r.get("allocated_welfare"))
    head = h(
        "h3",
        f"Round {fmt(rnd)}: ",
        h("span", clean_text(mech.get("auction_type", "?")), class_="mech"),
        f", price {fmt(r.get('price'))}, sold {fmt(r.get('sold'))}"
        f" of {fmt(r.get('auctioned', r.get('capacity')))}",
    )
    summary = _kv(
        [
            ("mechanism", _mechanism_text(mech)),
            ("capacity / auctioned", f"{fmt(r.get('capacity'))} / {fmt(r.get('auctioned'))}"),
            ("reserve", fmt(r.get("reserve"))),
            ("clearing price", fmt(r.get("price"))),
            ("sold / revenue", f"{fmt(r.get('sold'))} / {fmt(r.get('revenue'))}"),
            (
                "welfare (allocated / optimal)",
                f"{fmt(alloc)} / {fmt(opt)} = ratio {fmt(designer.get('welfare_ratio'), 3)}",
            ),
            (
                "designer parts",
                ", ".join(f"{clean_text(k)} {fmt(v, 3)}" for k, v in designer.items()) or "-",
            ),
        ]
    )
    bid_rows = []
    for seat in bidders:
        b = bids.get(seat)
        bl = [x for x in b if _is_num(x)] if isinstance(b, list) else []
        bid_text = (
            (
                f"{len(bl)} unit(s): "
                + ", ".join(fmt(x) for x in bl[:12])
                + (" ..." if len(bl) > 12 else "")
            )
            if bl
            else "-"
        )
        pen = [
            f"shill {fmt(shill[seat])}" if seat in shill else None,
            f"collusion {fmt(collusion[seat])}" if seat in collusion else None,
        ]
        bid_rows.append(
            [
                seat,
                bid_text,
                fmt(won.get(seat, 0)),
                fmt(paid.get(seat, 0.0)),
                ", ".join(p for p in pen if p) or "-",
            ]
        )
    bids_table = _table(
        ["bidder / coalition", "bids (per unit, best first)", "won", "paid", "penalties"],
        bid_rows,
        "bids",
        numeric=(2, 3),
    )
    verdict_table = _table(
        ["lab", "score", "granted", "judge", "rationale"],
        [
            [
                clean_text(v.get("lab", "?")),
                fmt(v.get("score")),
                fmt(v.get("granted")),
                clean_text(v.get("judge", "")),
                h("div", clean_text(v.get("rationale", "")), class_="text"),
            ]
            for v in verdicts
        ],
        "verdicts",
        numeric=(1, 2),
    )
    cartels = [c for c in r.get("suspected_cartels") or [] if isinstance(c, Mapping)]
    cartel_list = (
        h(
            "ul",
            [
                h(
                    "li",
                    ", ".join(clean_text(m) for m in c.get("members") or []),
                    f" (score {fmt(c.get('score'), 3)})",
                )
                for c in cartels
            ],
        )
        if cartels
        else None
    )
    comps = round_components(ep, rnd) if isinstance(rnd, int) else {}
    names = sorted({n for c in comps.values() for n in c})
    comp_table = _table(
        ["seat", *names, "total"],
        [
            [s, *(fmt(comps[s].get(n, 0.0), 3) for n in names), fmt(sum(comps[s].values()), 3)]
            for s in sorted(comps, key=_seat_key)
        ],
        "components",
        numeric=tuple(range(1, len(names) + 2)),
    )
    shock_list = (
        h("ul", [h("li", _text_of(s)) for s in shocks], class_="shocks")
        if shocks
        else h("p", "none", class_="muted")
    )
    body = [
        h("div", summary, class_="cols"),
        h("h4", "Bids, allocations and payments"),
        bids_table or h("p", "no bids", class_="muted"),
        h("h4", "Shocks"),
        shock_list,
        h("h4", "Judge verdicts"),
        verdict_table or h("p", "no pitches judged", class_="muted"),
    ]
    if cartel_list:
        body += [h("h4", "Suspected cartels"), cartel_list]
    if comp_table:
        body += [h("h4", "Reward components this round"), comp_table]
    if events:
        body += [h("h4", f"Actions ({len(events)} steps)"), _events_table(events)]
    return h(
        "section",
        h("details", h("summary", head), body, open=True),
        class_="round",
        id=f"ep{idx}-round-{fmt(rnd)}" if isinstance(rnd, int) else None,
        data_round=rnd if isinstance(rnd, int) else None,
    )


def _events_table(events: list[Event]) -> Safe:
    rows = []
    waits = 0
    for ev in events:
        if quiet(ev):
            waits += 1
            continue
        outcome: list[Any] = []
        if ev.error:
            outcome.append(h("div", clip(ev.error, 400), class_="err"))
        elif ev.result not in (None, {}):
            outcome.append(h("div", clip(_short(ev.result), 200)))
        for label, text in (("agent error", ev.agent_error), ("LLM error", ev.llm_error)):
            if text:
                outcome.append(h("div", f"{label}: {clip(text, 400)}", class_="err"))
        reward = sum(ev.components.get(ev.seat, {}).values()) if ev.components else ev.reward
        detail: list[Safe] = []
        if isinstance(ev.action, Mapping):
            detail.append(
                h(
                    "details",
                    h("summary", "action JSON"),
                    _pre(json.dumps(ev.action, indent=1, ensure_ascii=False, default=str)),
                )
            )
        if ev.raw_output is not None or ev.prompt is not None:
            usage = ", ".join(
                x
                for x in (
                    f"{fmt(_token_count(ev.tokens), 0)} tokens" if ev.tokens is not None else "",
                    f"{fmt(ev.latency, 2)} s" if ev.latency is not None else "",
                )
                if x
            )
            inner = [h("div", "model output", class_="muted"), _pre(ev.raw_output or "", "llm")]
            if ev.prompt is not None:
                inner.append(h("details", h("summary", "prompt"), _pre(ev.prompt, "prompt")))
            detail.append(
                h(
                    "details",
                    h("summary", f"LLM{': ' + usage if usage else ''}"),
                    inner,
                    class_="llm",
                )
            )
        rows.append(
            [
                str(ev.step),
                ev.seat,
                ev.phase,
                [
                    h("div", action_summary(ev), class_="text"),
                    h("div", f"reasoning: {clip(ev.reasoning, 2000)}", class_="text reason")
                    if ev.reasoning
                    else None,
                    detail,
                ],
                outcome,
                fmt(reward, 3) if reward is not None else "",
            ]
        )
    table = _table(
        ["step", "seat", "phase", "action", "result / error", "reward"],
        rows,
        "events",
        numeric=(0, 5),
    )
    note = (
        h("p", f"{waits} wait or finished-seat step(s) not listed", class_="muted")
        if waits
        else None
    )
    return join([table, note])


def _episode_section(ep: Episode, idx: int) -> Safe:
    seat_specs = ep.seats
    seats = list(seat_specs)
    totals, returns, invalid, usage = (
        ep.totals(),
        ep.returns(),
        ep.invalid_actions(),
        ep.llm_usage(),
    )
    names = component_names(ep)
    seat_rows = []
    for seat in seats:
        t, (tok, lat, calls) = totals.get(seat, {}), usage.get(seat, (0.0, 0.0, 0))
        seat_rows.append(
            [
                seat,
                seat_specs.get(seat, ""),
                fmt(returns.get(seat, 0.0), 3),
                *(fmt(t.get(n, 0.0), 3) for n in names),
                str(invalid.get(seat, 0)),
                f"{fmt(tok, 0)} / {calls} / {fmt(lat, 1)} s" if calls else "-",
            ]
        )
    seats_table = _table(
        ["seat", "agent", "return", *names, "invalid", "LLM tokens / calls / latency"],
        seat_rows,
        "seats",
        numeric=tuple(range(2, 4 + len(names))),
    )
    rounds = sorted(
        (r for r in ep.rounds if isinstance(r, Mapping)), key=lambda r: _num(r.get("round"))
    )
    round_ids = [r.get("round") for r in rounds]
    price_pts = [
        (float(r["round"]), _num(r.get("price"))) for r in rounds if _is_num(r.get("round"))
    ]
    reserve_pts = [
        (float(r["round"]), _num(r.get("reserve"))) for r in rounds if _is_num(r.get("round"))
    ]
    welfare_pts = [
        (float(r["round"]), _num(_mapping(r.get("designer")).get("welfare_ratio")))
        for r in rounds
        if _is_num(r.get("round"))
    ]
    plots = [
        line_chart(
            "Clearing price per round",
            [
                Series("clearing price", price_pts, 0),
                Series("reserve", reserve_pts, 2, dashed=True, markers=False),
            ],
            plot_id="price",
            x_label="round",
            y_label="credits per block",
        ),
        line_chart(
            "Welfare ratio per round (allocated / optimal)",
            [Series("welfare ratio", welfare_pts, 4)],
            plot_id="welfare",
            x_label="round",
            y_label="ratio",
            y_range=(0.0, 1.0),
        ),
    ]
    seat_plots: list[Safe] = []
    marks = [(float(step), f"r{r}") for r, step in round_starts(ep)]
    last_step = float(max((e.step for e in ep.events), default=0))
    shown = seats[:24]
    for seat in shown:
        cum = cumulative_components(ep, seat)
        if not cum:
            continue
        series = [
            Series(n, pts, component_color(n), step=True, markers=False)
            for n, pts in sorted(cum.items())
        ]
        seat_plots.append(
            line_chart(
                f"{seat}: cumulative reward by component",
                series,
                plot_id=f"rewards-{seats.index(seat)}",
                x_label="step (r = round start)",
                y_label="reward",
                x_marks=marks,
                x_range=(0.0, last_step),
                width=440,
                height=210,
            )
        )
    by_round: dict[Any, list[Event]] = defaultdict(list)
    for ev in sorted(ep.events, key=lambda e: e.step):
        by_round[ev.round].append(ev)
    round_secs = [
        _round_section(ep, idx, r, by_round.get(r.get("round"), []), seats) for r in rounds
    ]
    orphan = [ev for rnd, evs in by_round.items() if rnd not in round_ids for ev in evs]
    meta = _kv(
        [
            ("scenario", ep.scenario),
            ("seed", fmt(ep.seed)),
            ("source", ep.source or ep.label),
            ("rounds / steps", f"{len(rounds)} / {len(ep.events)}"),
            ("mean welfare ratio", fmt(ep.welfare_ratio(), 3)),
            (
                "versions",
                ", ".join(f"{clean_text(k)} {_short(v)}" for k, v in _version_items(ep.header))
                or "-",
            ),
            ("status", clean_text(_first(ep.footer, "status", default="no footer (cut off?)"))),
            ("file SHA-256", clean_text(_first(ep.footer, "file_sha256", "digest", default="-"))),
        ]
    )
    counts = interaction_counts(ep)
    pairs = sorted(counts.items(), key=lambda kv: (_seat_key(kv[0][0]), _seat_key(kv[0][1])))
    pair_table = _table(
        ["pair", *EDGE_KINDS],
        [[f"{a} - {b}", *(str(k[x]) for x in EDGE_KINDS)] for (a, b), k in pairs],
        "pairs",
        numeric=(1, 2, 3, 4),
    )
    return h(
        "section",
        h("h2", episode_title(ep)),
        [h("p", f"\u26a0 {p}", class_="warn") for p in ep.problems],
        [h("p", n, class_="muted") for n in ep.notes],
        h("div", meta, class_="cols"),
        h("h3", "Seats: returns and reward components"),
        seats_table or h("p", "no seats recorded", class_="muted"),
        h("h3", "Market over the episode"),
        h("div", plots, class_="plots"),
        h("h3", "Reward components per seat"),
        h("div", seat_plots, class_="plots")
        if seat_plots
        else h("p", "no step events with rewards", class_="muted"),
        h("p", f"plots for {len(seats) - len(shown)} more seat(s) not drawn", class_="muted")
        if len(seats) > len(shown)
        else None,
        h("h3", "Trades, coalitions and messages"),
        h(
            "div",
            graph_svg(seats, counts, plot_id=f"graph-{idx}"),
            pair_table or h("p", "no interactions", class_="muted"),
            class_="plots",
        ),
        h("h3", f"Rounds ({len(rounds)})"),
        round_secs or h("p", "no round summaries", class_="muted"),
        h(
            "section",
            h("h3", "Steps outside any summarised round"),
            _events_table(orphan),
            class_="round",
        )
        if orphan
        else None,
        class_="episode",
        id=f"ep-{idx}",
        data_episode=idx,
    )


def episode_title(ep: Episode) -> str:
    """An episode's heading: named by its seed (the key to replay it), never by its position."""
    if ep.seed is None:
        return f"{ep.scenario}: {ep.label}"
    return f"{ep.scenario}, seed {fmt(ep.seed)}"


def _health(episodes: Sequence[Episode]) -> Safe:
    """The box at the top of the page: per seat, the decisions that fell back (agent errors,
    timeouts, the agent's own fallbacks), LLM repairs and LLM-judge fallbacks, with the first
    error; red when a seat fell back on more than :data:`market.run.health.WARN_SHARE`."""
    from market.run.health import WARN_SHARE, from_episodes, over_share, warnings

    health = from_episodes(episodes)
    troubled = [x for x in health if x.troubled]
    decisions = sum(x.decisions for x in health)
    if not troubled:
        return h("p", f"Agent health: no fallbacks, agent errors, timeouts or repairs in "
                      f"{decisions} decisions.", class_="ok", id="health")
    loud = over_share(troubled, WARN_SHARE)
    rows = [[x.seat, x.agent, str(x.decisions), f"{x.fallbacks} ({x.share:.0%})",
             str(x.agent_errors), str(x.timeouts), str(x.repairs), clip(x.first_error or "", 300)]
            for x in troubled]
    return h(
        "section",
        h("h2", "\u26a0 Agent failures" if loud else "Agent fallbacks and repairs"),
        [h("p", line, class_="err") for line in warnings(troubled)],
        _table(["seat", "agent", "decisions", "fell back", "errors", "timeouts", "repairs",
                "first error"], rows, "health", numeric=(2, 3, 4, 5, 6)),
        h("p", "A decision falls back when the agent raised, ran past the time limit or found "
               "no usable reply; the seat then played the safe fallback action (abstain in "
               "bidding, wait otherwise). Repairs are an LLM seat's re-asks after an unusable "
               "reply. The judge row counts an LLM judge's verdicts that fell back on the rule "
               "verdict.", class_="muted"),
        class_="health alert" if loud else "health note",
        id="health",
    )


def _version_items(header: Mapping[str, Any]) -> list[tuple[str, Any]]:
    versions = _first(header, "versions")
    items = list(_mapping(versions).items())
    for key in ("package_version", "schema_version", "judge", "judge_version", "python"):
        if key in header and not isinstance(header[key], Mapping | list):
            items.append((key, header[key]))
    return items


def _index(episodes: Sequence[Episode]) -> Safe:
    seats = list(dict.fromkeys(s for ep in episodes for s in ep.seats))
    rows = []
    for i, ep in enumerate(episodes):
        ret = ep.returns()
        rows.append(
            [
                h("a", clip(ep.label, 60), href=f"#ep-{i}"),
                clip(ep.scenario, 60),
                fmt(ep.seed),
                str(len(ep.rounds)),
                str(len(ep.events)),
                fmt(ep.welfare_ratio(), 3),
                *(fmt(ret.get(s), 2) for s in seats),
            ]
        )
    return h(
        "section",
        h("h2", f"Episodes ({len(episodes)})"),
        _table(
            ["transcript", "scenario", "seed", "rounds", "steps", "welfare ratio", *seats],
            rows,
            "index",
            numeric=tuple(range(2, 6 + len(seats))),
        ),
        id="index",
    )


def _aggregate(episodes: Sequence[Episode]) -> Safe:
    seats = list(dict.fromkeys(s for ep in episodes for s in ep.seats))
    names = sorted({n for ep in episodes for n in component_names(ep)})
    rows, bars = [], []
    totals = [ep.totals() for ep in episodes]
    returns = [ep.returns() for ep in episodes]
    seat_maps = [ep.seats for ep in episodes]
    for seat in seats:
        having = [i for i, m in enumerate(seat_maps) if seat in m]
        agents = sorted({seat_maps[i].get(seat, "") for i in having} - {""})
        ret_m, ret_c = mean_ci95([returns[i].get(seat, 0.0) for i in having])
        bars.append((seat, ret_m, ret_c))
        cells = []
        for n in names:
            m, c = mean_ci95([totals[i].get(seat, {}).get(n, 0.0) for i in having])
            cells.append(f"{fmt(m, 3)} \u00b1 {fmt(c, 3)}")
        rows.append(
            [
                seat,
                clip(", ".join(agents), 120),
                str(len(having)),
                f"{fmt(ret_m, 3)} \u00b1 {fmt(ret_c, 3)}",
                *cells,
            ]
        )
    welfare_m, welfare_c = mean_ci95(
        [w for ep in episodes if math.isfinite(w := ep.welfare_ratio())]
    )
    return h(
        "section",
        h("h2", "Aggregate per seat (mean \u00b1 95% CI over episodes)"),
        _table(
            ["seat", "agent", "episodes", "return", *names],
            rows,
            "aggregate",
            numeric=tuple(range(2, 4 + len(names))),
        ),
        h("p", f"welfare ratio: {fmt(welfare_m, 3)} \u00b1 {fmt(welfare_c, 3)}"),
        h(
            "div",
            bar_chart(
                "Mean return per seat (95% CI)", bars, plot_id="aggregate-returns", y_label="return"
            ),
            class_="plots",
        ),
        id="aggregate",
    )


CSS = """
:root{--fg:#1d2330;--muted:#6b7280;--line:#d9dde5;--bg:#fff;--panel:#f6f7f9;--accent:#4e79a7}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
background:var(--bg);margin:0 auto;padding:16px 24px 48px;max-width:1280px}
h1{font-size:22px;margin:4px 0 2px}
h2{font-size:19px;margin:28px 0 8px;border-bottom:2px solid var(--accent);padding-bottom:4px}
h3{font-size:16px;margin:18px 0 6px}h4{font-size:14px;margin:12px 0 4px;color:#374151}
.muted{color:var(--muted)}.err{color:#b42318}
.warn{background:#fff4e5;border:1px solid #f5b971;padding:4px 8px;border-radius:4px}
.health{margin:12px 0;padding:4px 14px 8px;border-radius:6px}.health h2{margin-top:8px}
.health.alert{background:#fdecea;border:2px solid #b42318}.health.alert h2{color:#b42318}
.health.note{background:#fff4e5;border:1px solid #f5b971}.ok{color:#1a7f37}
table{border-collapse:collapse;margin:4px 0 10px;font-size:13px}.tw{max-width:100%;overflow-x:auto}
th,td{border:1px solid var(--line);padding:3px 7px;text-align:left;vertical-align:top}
th{background:var(--panel);font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
table.events td:nth-child(-n+3){white-space:nowrap;overflow-wrap:normal}
td,pre,.text,dd{overflow-wrap:anywhere;unicode-bidi:plaintext}
.text{white-space:pre-wrap;max-width:60em}.reason{color:#4b5563;font-style:italic}
pre{white-space:pre-wrap;background:var(--panel);border:1px solid var(--line);padding:6px 8px;
margin:4px 0;max-height:28em;overflow:auto;font-size:12px}
pre.llm{background:#fffbea}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:4px 0}
dl.kv dt{color:var(--muted)}dl.kv dd{margin:0}
section.round{border:1px solid var(--line);border-radius:6px;padding:2px 12px;margin:10px 0;
background:#fcfcfd}
section.round>details>summary{cursor:pointer}section.round h3{display:inline;font-size:15px}
.mech{color:var(--accent);font-weight:600}
.plots{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start}
figure.chart{margin:0;border:1px solid var(--line);border-radius:6px;padding:6px 8px;
background:#fff}
figcaption{font-weight:600;font-size:13px;margin-bottom:2px}
svg.plot{display:block;max-width:100%;height:auto}svg .grid{stroke:#e5e7eb;stroke-width:1}
svg .zero{stroke:#9ca3af;stroke-width:1}svg .frame{fill:none;stroke:#9ca3af}
svg .whisker{stroke:#111827;stroke-width:1.5}svg text{font:11px system-ui,sans-serif;fill:#374151}
svg .axis{font-size:12px;fill:#111827}svg .node{fill:#eef2f7;stroke:#4e79a7;stroke-width:2}
svg .nlabel{font-size:11px;font-weight:600}svg .elabel{font-size:10px;fill:#111827}
ul.legend{list-style:none;padding:0;margin:4px 0 0;display:flex;flex-wrap:wrap;gap:4px 12px;
font-size:12px}
.sw{display:inline-block;width:14px;height:4px;margin-right:5px;vertical-align:middle}
.sw.dash{height:0;border-top-width:3px;border-top-style:dashed}
.c0{background:#4e79a7;border-color:#4e79a7}.c1{background:#f28e2b;border-color:#f28e2b}
.c2{background:#e15759;border-color:#e15759}.c3{background:#76b7b2;border-color:#76b7b2}
.c4{background:#59a14f;border-color:#59a14f}.c5{background:#edc948;border-color:#edc948}
.c6{background:#b07aa1;border-color:#b07aa1}.c7{background:#ff9da7;border-color:#ff9da7}
.c8{background:#9c755f;border-color:#9c755f}.c9{background:#bab0ac;border-color:#bab0ac}
.sw.dash{background:none}.e-trade{background:#4e79a7}.e-coalition{background:#59a14f}
.e-message{background:#b07aa1}.e-cartel{background:#e15759}nav a{margin-right:12px}
"""

TITLE = "gpumarket report"


def content_security_policy(css: str = CSS) -> str:
    """No script of any kind; styles only from the page's own stylesheet (by hash); no fetches."""
    digest = base64.b64encode(hashlib.sha256(css.encode("utf-8")).digest()).decode("ascii")
    return (
        "default-src 'none'; script-src 'none'; object-src 'none'; base-uri 'none'; "
        "form-action 'none'; "
        f"img-src data:; font-src 'none'; connect-src 'none'; style-src 'sha256-{digest}'"
    )


def build_report(episodes: Sequence[Episode]) -> str:
    """The whole page as a string (see the module docstring)."""
    episodes = list(episodes)
    many = len(episodes) > 1
    nav = (
        h("nav", [h("a", "episodes", href="#index"), h("a", "aggregate", href="#aggregate")])
        if many
        else None
    )
    subtitle = (
        f"{len(episodes)} episodes"
        if many
        else (
            f"{episodes[0].scenario}, seed {fmt(episodes[0].seed)}, "
            f"{len(episodes[0].rounds)} rounds"
            if episodes
            else "no transcripts"
        )
    )
    body = h(
        "body",
        h("header", h("h1", TITLE), h("p", subtitle, class_="muted"), nav),
        h(
            "main",
            _health(episodes) if episodes else None,
            _index(episodes) if many else None,
            _aggregate(episodes) if many else None,
            [_episode_section(ep, i) for i, ep in enumerate(episodes)],
        ),
    )
    head = h(
        "head",
        h("meta", charset="utf-8"),
        h("meta", http_equiv="Content-Security-Policy", content=content_security_policy()),
        h("meta", name="referrer", content="no-referrer"),
        h("meta", name="viewport", content="width=device-width, initial-scale=1"),
        h("title", TITLE),
        Safe(f"<style>{CSS}</style>"),
    )
    return "<!DOCTYPE html>\n" + h("html", head, body, lang="en") + "\n"


def write_report(paths: str | Path | Iterable[Any], out_html: str | Path) -> Path:
    """Write the report for transcripts (files, folders of ``*.jsonl``, or transcript objects)."""
    episodes = load_episodes(paths)
    if not episodes:
        raise FileNotFoundError(f"no transcripts (*.jsonl) found in {paths}")
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build_report(episodes), encoding="utf-8")
    return out
