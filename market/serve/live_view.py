"""The live match view: a browser page that follows a served match through server-sent events.

Two routes join the served-matches app (:func:`live_router`):

- ``GET /matches/{id}/live``: the page (HTML, one small script allowed by a per-page nonce);
- ``GET /matches/{id}/live/events``: the event stream (``text/event-stream``). Each ``state``
  event is one JSON snapshot with a rising ``seq``: status, round, phase, steps, the mechanism of
  the last cleared round, each seat's cumulative reward, the seats waited for, timeouts, the
  returns once done, and ``html``: the episode drawn by the static report's own renderer
  (:func:`market.review.report.page.episode_section`, so report and live view share their tables
  and plots). The stream ends with one ``end`` event when the match is no longer running.

The rule of what a spectator sees: exactly what the spectator endpoint shows, plus each step's
action without its free-text ``reasoning`` (and a private message without its text), its reward,
and each closed round's summary. A refused action shows as refused, never why: the reason the
market gave ("your bids add up to 99999.00 credits but you have 254.86") states the seat's private
budget, holdings or jobs, so spectators read "bidder_0's action was refused" (:data:`REFUSED`),
ever, and an agent's failure reads "bidder_0 timed out" or "bidder_0's agent failed"
(:func:`public_error`) without the exception's text; the seat itself reads the reason where it
always did. Bids are sealed while the match runs: a bid's amounts, and a closed round's ``bids``,
are shown only for rounds whose mechanism had ``reveal_competing_bids`` on (what the seats
themselves were shown); the rest appear once the match has ended, as in the report. The conduct
judge's entries are shown as they come (what each seat claimed and promised, and the manipulation
flags, which rest on public facts), but a claim's or promise's verdict is sealed like bids until
the match has ended: its label and ``reason`` derive from the seat's private truth ("budget 9999
claimed; budget 148.59") or from sealed bids ("not_bid broken"), and so do the per-seat scores
(``conduct`` is empty until the end); a private message's claims show neither span nor value, ever.
Never a seat's observation, prompt, model output or step result, never the seed, seat seeds or
digests (from which private state could be redrawn).

Everything user- or model-written is escaped server-side by the report's HTML builder; the page's
script writes text with ``textContent`` and inserts only that escaped HTML, parsed by
``DOMParser`` (scripts in it never run), under a Content-Security-Policy without inline scripts.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import secrets
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, StreamingResponse

from market.record.reader import Transcript, read_transcript
from market.record.schema import TranscriptError
from market.review.report.episode import Episode, Event, as_mapping, event_of, round_of
from market.review.report.markup import clean_text
from market.review.report.page import CSS, episode_section
from market.serve.matches import Match, MatchRegistry

MatchId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{16}$", description="the match id")]
#: seconds between two looks at a running match's transcript
POLL_S = 0.2
#: what a spectator sees instead of a private message's text
PRIVATE_TEXT = "(private message)"
#: seconds between keep-alive comments on an idle stream
KEEPALIVE_S = 15.0


#: what a spectator sees instead of a bid's amounts while they are sealed
SEALED = "(sealed)"
#: what a spectator sees of a refused action (the reason states the seat's private state)
REFUSED = "{seat}'s action was refused"


def public_error(seat: str, agent_error: str | None) -> str | None:
    """An agent's failure as a spectator sees it: timed out or failed, never the exception's text
    (a service's answer or an agent's message may quote anything the seat holds)."""
    if not agent_error:
        return None
    if agent_error.startswith("AgentTimeout"):
        return f"{seat} timed out; its fallback action was played"
    return f"{seat}'s agent failed; its fallback action was played"


def public_conduct(
    entries: Iterable[Mapping[str, Any]], reasons: bool, private: bool = False
) -> list[dict[str, Any]]:
    """Conduct entries as a spectator sees them: a claim's or promise's verdict (its ``label``
    and the judge's ``reason``, which state or imply the seat's private truth, e.g. "budget 9999
    claimed; budget 148.59") only when ``reasons`` (the match has ended), else ``label`` sealed;
    for a step that was a ``private`` message, neither the quoted span nor the claimed value."""
    out = []
    for e in entries:
        entry = {k: v for k, v in e.items() if reasons or k != "reason"}
        if not reasons and entry.get("kind") in ("claim", "promise"):
            entry["label"] = SEALED
        if private:
            entry.pop("value", None)
            if "span" in entry:
                entry["span"] = PRIVATE_TEXT
        out.append(entry)
    return out


def public_event(ev: Event, revealed: bool = True, reasons: bool = True) -> Event:
    """A step as a spectator sees it: the action without ``reasoning``, no result, no LLM data,
    a refusal or agent failure without its reason; a bid's amounts only when ``revealed``; its
    conduct entries by :func:`public_conduct`."""
    action = ev.action
    private = False
    if isinstance(action, Mapping):
        action = {k: v for k, v in action.items() if k != "reasoning"}
        if action.get("action_type") == "send_message" and action.get("to", "all") != "all":
            action["text"] = PRIVATE_TEXT  # a private message: who to whom, not what
            private = True
        if action.get("action_type") == "bid" and not revealed:
            action = {"action_type": "bid", "bids": SEALED}
    return Event(
        step=ev.step,
        round=ev.round,
        seat=ev.seat,
        phase=ev.phase,
        action=action,
        error=REFUSED.format(seat=ev.seat) if ev.error else None,
        reward=ev.reward,
        components=ev.components,
        live=ev.live,
        agent_error=public_error(ev.seat, ev.agent_error),
        conduct=public_conduct(ev.conduct, reasons, private),
    )


def public_steps(
    t: Transcript, ended: bool
) -> tuple[list[Event], list[dict[str, Any]], dict[str, list[float]]]:
    """A transcript as a spectator sees it: the public events, the round summaries and each
    seat's rewards step by step. Until the match has ended, bids are sealed except in the closed
    rounds whose mechanism revealed competing bids (what the seats themselves saw)."""
    revealed = {
        r.round
        for r in t.rounds
        if as_mapping(r.summary.get("mechanism")).get("reveal_competing_bids")
    }
    events: list[Event] = []
    rewards: dict[str, list[float]] = {}
    for step in t.steps:
        for seat, value in step.rewards.items():
            rewards.setdefault(clean_text(seat), []).append(float(value))
        events.append(public_event(event_of(step), ended or step.round in revealed, ended))
    rounds: list[dict[str, Any]] = []
    for r in t.rounds:
        summary = round_of(r)
        if not ended and r.round not in revealed:
            summary.pop("bids", None)
        conduct = as_mapping(summary.get("conduct"))
        if conduct:
            verdicts = [v for v in conduct.get("verdicts") or [] if isinstance(v, Mapping)]
            scores = conduct.get("scores") if ended else {}  # sealed with the verdicts
            summary["conduct"] = {"verdicts": public_conduct(verdicts, ended), "scores": scores}
        rounds.append(summary)
    return events, rounds, rewards


def public_snapshot(match: Match) -> dict[str, Any]:
    """The match as a spectator may see it now (see the module docstring for the rule)."""
    view = match.public_view()
    seats: dict[str, str] = dict(view["seats"])
    cumulative: dict[str, list[float]] = {s: [] for s in seats}
    ep = Episode(label=f"match {match.id}: {clean_text(view['scenario'])}")
    ep.header = {"scenario_name": view["scenario"], "seats": seats}
    try:
        t = read_transcript(match.transcript, verify=False)
    except TranscriptError:
        t = None  # not written yet
    if t is not None:
        events, rounds, rewards = public_steps(t, ended=view["status"] != "running")
        ep.events.extend(events)
        ep.rounds.extend(rounds)
        for seat, values in rewards.items():
            cumulative.setdefault(seat, []).extend(values)
    if "returns" in view:
        ep.footer = {"status": view["status"], "returns": view["returns"]}
    else:
        ep.footer = {"status": view["status"]}
    scores, where = ep.conduct_scores()  # counts and ratios only: no private fact
    mech = as_mapping(ep.rounds[-1].get("mechanism")) if ep.rounds else {}
    steps = len(ep.events)
    last = ep.events[-1] if ep.events else None
    snap: dict[str, Any] = {
        "match_id": match.id,
        "scenario": view["scenario"],
        "status": view["status"],
        "steps": steps,
        "round": last.round if last is not None else 0,
        "phase": last.phase if last is not None else None,
        "rounds_closed": len(ep.rounds),
        "mechanism": {clean_text(k): v for k, v in mech.items()},
        "seats": seats,
        "rewards": {s: math.fsum(v) for s, v in cumulative.items()},
        "conduct": scores,
        "conduct_as_of": where,
        "waiting_for": view["waiting_for"],
        "timeouts": view["timeouts"],
        "html": str(episode_section(ep, 0, public=True)),
    }
    for key in ("returns", "error"):
        if key in view:
            snap[key] = view[key]
    return snap


def sse(event: str, data: Mapping[str, Any], seq: int | None = None) -> str:
    """One server-sent event (the JSON ``data`` on one line)."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, allow_nan=False, default=str)}\n\n"


class SnapshotCache:
    """The last public snapshot of each match, shared by all its spectators: a match is read and
    drawn again only when its transcript has grown or its status or waited-for seats changed."""

    def __init__(self, registry: MatchRegistry | None = None) -> None:
        self.registry = registry
        self.last: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def key(self, match: Match) -> tuple[Any, ...]:
        try:
            size = match.transcript.stat().st_size
        except OSError:
            size = -1
        waiting = tuple(s for s, b in match.remote.items() if b.pending is not None)
        return (size, match.status, waiting)

    def snapshot(self, match: Match) -> dict[str, Any]:
        """The match's public snapshot (a copy: callers may add to it)."""
        key = self.key(match)
        held = self.last.get(match.id)
        if held is None or held[0] != key:
            held = (key, public_snapshot(match))
            if self.registry is not None:  # forget the matches the registry has forgotten
                for gone in [m for m in self.last if m not in self.registry.matches]:
                    self.last.pop(gone, None)
            self.last[match.id] = held
        return dict(held[1])


async def follow(
    match: Match, poll_s: float = POLL_S, cache: SnapshotCache | None = None
) -> AsyncIterator[str]:
    """The event stream of ``match``: a ``state`` event whenever the public snapshot changes,
    then one ``end`` event once the match is no longer running. Snapshots are read and drawn in
    a worker thread (a long match's page takes a while to draw; the match's own event loop must
    not wait for it), and never more often than they take to draw."""
    cache = cache or SnapshotCache()
    seq, last_key, idle = 0, None, 0.0
    while True:
        running = match.status == "running"
        started = time.monotonic()
        snap = await asyncio.to_thread(cache.snapshot, match)
        took = time.monotonic() - started
        key = (snap["steps"], snap["status"], tuple(snap["waiting_for"]))
        if key != last_key:
            seq += 1
            snap["seq"] = seq
            yield sse("state", snap, seq)
            last_key, idle = key, 0.0
        if not running:
            yield sse("end", {"seq": seq + 1, "status": snap["status"]}, seq + 1)
            return
        pause = max(poll_s, took)
        await asyncio.sleep(pause)
        idle += pause
        if idle >= KEEPALIVE_S:
            yield ": keep-alive\n\n"
            idle = 0.0


LIVE_CSS = """
.live{display:flex;gap:1.5em;flex-wrap:wrap;align-items:flex-start}
.live .box{border:1px solid #ccc;border-radius:6px;padding:.5em 1em}
.live .big{font-size:1.6em;font-weight:bold}
"""

SCRIPT = """
(function () {
  "use strict";
  var updates = 0;
  function text(id, value) { document.getElementById(id).textContent = String(value); }
  function fmt(x) { return (typeof x === "number") ? x.toFixed(3) : String(x); }
  function rewards(snap) {
    var body = document.getElementById("rewards");
    var rows = [];
    Object.keys(snap.seats).forEach(function (seat) {
      var tr = document.createElement("tr");
      var cells = [seat, snap.seats[seat], fmt(snap.rewards[seat] || 0),
                   snap.returns ? fmt(snap.returns[seat]) : "-",
                   String((snap.timeouts || {})[seat] || 0)];
      cells.forEach(function (c, i) {
        var td = document.createElement("td");
        td.textContent = c;
        if (i >= 2) { td.className = "num"; }
        tr.appendChild(td);
      });
      tr.setAttribute("data-seat", seat);
      rows.push(tr);
    });
    body.replaceChildren.apply(body, rows);
  }
  function show(snap) {
    updates += 1;
    document.body.setAttribute("data-updates", String(updates));
    document.body.setAttribute("data-seq", String(snap.seq));
    document.body.setAttribute("data-status", snap.status);
    text("round", snap.round);
    text("phase", snap.phase || "-");
    text("status", snap.status);
    text("steps", snap.steps);
    var m = snap.mechanism || {};
    var parts = Object.keys(m).map(function (k) { return k + "=" + String(m[k]); });
    text("mechanism", parts.length ? parts.join(", ") : "- (no round cleared yet)");
    text("waiting", (snap.waiting_for || []).join(", ") || "-");
    rewards(snap);
    // the episode as the report draws it: HTML escaped by the server, parsed inert
    var doc = new DOMParser().parseFromString(snap.html, "text/html");
    var target = document.getElementById("episode");
    target.replaceChildren.apply(target, Array.prototype.slice.call(doc.body.childNodes));
  }
  var source = new EventSource(location.pathname.replace(/\\/$/, "") + "/events");
  source.addEventListener("state", function (e) { show(JSON.parse(e.data)); });
  source.addEventListener("end", function () {
    source.close();
    document.body.setAttribute("data-ended", "1");
  });
  source.onerror = function () { text("connection", "connection lost; reload to resume"); };
})();
"""


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def live_policy(nonce: str) -> str:
    """The live page's Content-Security-Policy: its one script (by nonce), its stylesheet (by
    hash), event-stream requests to its own origin, nothing else."""
    return (
        "default-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'; "
        f"script-src 'nonce-{nonce}'; style-src 'sha256-{_sha256(CSS + LIVE_CSS)}'; "
        "img-src data:; connect-src 'self'; frame-ancestors 'none'"
    )


def live_page(match_id: str, nonce: str) -> str:
    """The page's shell: counters, the rewards table and the episode, filled by the stream."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpumarket live match {match_id}</title>
<style>{CSS + LIVE_CSS}</style></head>
<body data-updates="0">
<header><h1>gpumarket live match</h1><p class="muted">match {match_id}
<span id="connection"></span></p></header>
<main>
<div class="live">
<div class="box">round<div class="big" id="round">-</div></div>
<div class="box">phase<div class="big" id="phase">-</div></div>
<div class="box">status<div class="big" id="status">connecting</div></div>
<div class="box">steps<div class="big" id="steps">0</div></div>
<div class="box">waiting for<div id="waiting">-</div></div>
</div>
<p>mechanism in force (last cleared round): <span id="mechanism">-</span></p>
<h2>Cumulative reward per seat</h2>
<table><thead><tr><th>seat</th><th>agent</th><th>cumulative reward</th><th>return</th>
<th>timeouts</th></tr></thead><tbody id="rewards"></tbody></table>
<div id="episode"></div>
</main>
<script nonce="{nonce}">{SCRIPT}</script>
</body></html>
"""


def live_router(registry: MatchRegistry) -> APIRouter:
    """The live view's routes for the app holding ``registry``."""
    router = APIRouter()
    cache = SnapshotCache(registry)

    @router.get("/matches/{match_id}/live", response_class=HTMLResponse)
    async def live(match_id: MatchId) -> HTMLResponse:
        """The live view page of a match (public: no token needed)."""
        registry.get(match_id)  # 404 for an unknown match
        nonce = secrets.token_urlsafe(18)
        return HTMLResponse(
            live_page(match_id, nonce),
            headers={
                "Content-Security-Policy": live_policy(nonce),
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
            },
        )

    @router.get("/matches/{match_id}/live/events")
    async def events(match_id: MatchId, request: Request) -> StreamingResponse:
        """The match's public snapshots as server-sent events (``state`` ..., then ``end``)."""
        match = registry.get(match_id)

        async def stream() -> AsyncIterator[str]:
            async for chunk in follow(match, cache=cache):
                if await request.is_disconnected():
                    return
                yield chunk

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return router
