"""Views derived from an episode for the report and the viewer: who interacted with whom, reward
components per round and over time, one-line action summaries."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from market.core.seats import bidder_seat
from market.review.report.episode import (
    Episode,
    Event,
    as_mapping,
    is_number,
    seat_sort_key,
    text_of,
)
from market.review.report.markup import clean_text, clip, fmt, short_text

# --- reward units --------------------------------------------------------------------------


def reward_unit(value_unit: float | None) -> str:
    """What one reward unit is: ``"credits ÷ 100"`` (unknown: the scenario key's name)."""
    if value_unit is None:
        return "credits \u00f7 the scenario's rewards.value_unit"
    return f"credits \u00f7 {value_unit:g}"


def reward_units_note(units: Mapping[str, float | None]) -> str:
    """The sentence shown with every table and chart of rewards, for ``units`` (scenario name ->
    its ``rewards.value_unit``, None when not recorded): lab rewards are credits ÷ value_unit,
    the designer's a score with no unit."""
    distinct = sorted(set(units.values()), key=lambda u: (u is None, u or 0.0))
    if len(distinct) == 1:
        unit = distinct[0]
        what = reward_unit(unit) + (
            f" (the scenario's rewards.value_unit), so 1.0 is {unit:g} credits"
            if unit is not None
            else " (not recorded here)"
        )
    else:
        what = "; ".join(
            f"{reward_unit(u)} in {', '.join(sorted(n for n, v in units.items() if v == u))}"
            for u in distinct
        )
    return (
        f"Lab rewards, returns and reward components are in reward units: {what}; "
        "invalid_action and talk_cost are charged in those units directly. The designer's "
        "reward is its composite score, which has no unit."
    )


def axis_unit(units: Mapping[str, float | None]) -> str:
    """A chart axis's unit: ``"credits ÷ 100"``, or ``"reward units"`` when scenarios differ
    or the unit is not recorded."""
    distinct = set(units.values())
    unit = distinct.pop() if len(distinct) == 1 else None
    return "reward units" if unit is None else reward_unit(unit)


# --- derived views -----------------------------------------------------------------------


def seat_of(value: Any) -> str | None:
    """``"bidder_3"`` from a seat name or a lab index."""
    if isinstance(value, int) and not isinstance(value, bool):
        return bidder_seat(value)
    return clean_text(value) if isinstance(value, str) else None


def _recipients(ev: Event) -> list[str]:
    result = as_mapping(ev.result)
    delivered = result.get("delivered_to")
    if isinstance(delivered, list):
        return [s for s in (seat_of(d) for d in delivered) if s]
    if delivered == "all":
        return []
    to = as_mapping(ev.action).get("to")
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
            counts[(a, b) if seat_sort_key(a) <= seat_sort_key(b) else (b, a)][kind] += n

    offer_owner: dict[str, str] = {}
    coalition_members: dict[str, list[str]] = {}
    counted_coalitions: dict[str, set[frozenset[str]]] = {}
    for ev in sorted((e for e in ev_ok(ep.events)), key=lambda e: e.step):
        act, result, kind = as_mapping(ev.action), as_mapping(ev.result), ev.action_type
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
            members = [
                s for s in (seat_of(m) for m in as_mapping(cartel).get("members") or []) if s
            ]
            for i, a in enumerate(members):
                for b in members[i + 1 :]:
                    add(a, b, "cartel")
    return {k: v for k, v in counts.items() if any(v.values())}


def quiet(ev: Event) -> bool:
    """A step not worth a row: a scripted ``wait`` or a finished seat stepped with None."""
    if ev.error or ev.agent_error or ev.prompt is not None or ev.raw_output is not None:
        return False
    if ev.conduct:  # a verdict is worth its row (e.g. a promise broken by waiting)
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
        return clip("(no action)" if act is None else f"unparsed: {text_of(act)}", limit)
    a = dict(act)
    kind = clean_text(a.pop("action_type", "?"))
    a.pop("agent", None)
    a.pop("reasoning", None)
    if kind == "bid":
        bids = [b for b in a.get("bids") or [] if is_number(b)]
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
        return clip(f"message to {to_s}: {text_of(a.get('text', ''))}", limit)
    if kind == "make_pitch":
        return clip(
            f"pitch for {fmt(a.get('blocks_requested'))} block(s): {text_of(a.get('text', ''))}",
            limit,
        )
    if kind == "counter_pitch":
        return clip(
            f"counter-pitch on {text_of(a.get('target', '?'))}: {text_of(a.get('text', ''))}",
            limit,
        )
    if kind == "wait":
        return "wait"
    rest = ", ".join(
        f"{clean_text(k)}={short_text(v)}" for k, v in a.items() if v not in (None, "", [], {})
    )
    return clip(f"{kind} {rest}".strip(), limit)


# --- conduct -----------------------------------------------------------------------------

#: the per-seat conduct table's columns (:func:`conduct_rows`)
CONDUCT_COLUMNS = (
    "seat",
    "truthfulness",
    "promise-keeping",
    "true claims",
    "false claims",
    "kept promises",
    "broken promises",
    "manipulation attempts",
)


def conduct_rows(scores: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """One text row per seat of :meth:`Episode.conduct_scores` (:data:`CONDUCT_COLUMNS`); a ratio
    without a judged claim or a due promise is ``-``."""
    rows = []
    for seat, s in scores.items():
        rows.append(
            [
                clean_text(seat),
                *(
                    fmt(s.get(k), 3) if is_number(s.get(k)) else "-"
                    for k in ("truthfulness", "promise_keeping")
                ),
                *(
                    fmt(s.get(k, 0), 0)
                    for k in (
                        "claims_true",
                        "claims_false",
                        "promises_kept",
                        "promises_broken",
                        "manipulation_attempts",
                    )
                ),
            ]
        )
    return rows


def conduct_text(entry: Mapping[str, Any], reason: bool = True, span: bool = True) -> str:
    """One conduct entry as plain text (not escaped): ``claim need=7 "our jobs need 7 more
    blocks": false (need 7 claimed; live jobs need 0 blocks)``, ``promise deliver 2 to
    bidder_1 due r3 [offer o4]: pending``, ``flag instructs_others "...": reason``. ``reason``
    and ``span`` False leave the judge's reason / the quoted text out."""
    kind = clean_text(entry.get("kind", "?"))
    quote = f' "{clip(text_of(entry.get("span", "")), 200)}"' if span and entry.get("span") else ""
    why = clip(text_of(entry.get("reason", "")), 300) if reason and entry.get("reason") else ""
    model = entry.get("model")
    method = clean_text(entry.get("method", "rule"))
    by = f" [{method}{': ' + clean_text(model) if model else ''}]" if method != "rule" else ""
    if kind == "claim":
        value = f"={fmt(entry.get('value'))}" if span else ""
        head = f"claim {clean_text(entry.get('claim', '?'))}{value}{quote}"
        label = clean_text(entry.get("label", "?"))
        return f"{head}: {label}{f' ({why})' if why else ''}{by}"
    if kind == "promise":
        parts = [f"promise {clean_text(entry.get('promise', '?'))}"]
        if is_number(entry.get("amount")):
            parts.append(fmt(entry["amount"]))
        to = entry.get("counterparts")
        if isinstance(to, list) and to:
            parts.append("to " + ", ".join(clean_text(c) for c in to))
        parts.append(f"due r{fmt(entry.get('due_round'))}")
        if entry.get("ref"):
            parts.append(f"[{clean_text(entry['ref'])}]")
        label = clean_text(entry.get("label", "?"))
        return f"{' '.join(parts)}{quote}: {label}{f' ({why})' if why else ''}{by}"
    if kind == "flag":
        head = f"manipulation flag {clean_text(entry.get('flag', '?'))}{quote}"
        return f"{head}{f': {why}' if why else ''}{by}"
    return clip(f"{kind}: {short_text(dict(entry))}", 300)
