"""The browser human seat: a page that plays a remote seat of a served match.

``GET /matches/{id}/play`` serves one static page (and its script and stylesheet); the page
speaks the same seat protocol as any remote agent (docs/remote-agents.md): it asks
``GET /matches/{id}/seat?wait=25`` for the seat's view and answers
``POST /matches/{id}/seat/action`` with ``{"turn": N, "action": {...}}``. Open it as
``/matches/{id}/play#token=SEAT_TOKEN``: the token travels in the URL *fragment*, which a browser
never sends to the server, and the script sends it only in the ``Authorization`` header, so it
appears in no request line and no server log.

On the seat's turn the page shows the turn view's ``guide`` (:mod:`market.serve.seat_guide_view`,
the terminal seat's words from :mod:`market.environment.seat_guide`): the env's verdict on the
seat's previous action (accepted, or refused with the env's reason and the penalty; the action
endpoint only says an action was received, the env judges it when it plays it), the story since
its previous turn (offers to it, messages, trades, the auction's result, its rewards by
component), and the screen as headed sections. The action list holds only the actions valid now,
each with its one-line meaning; each action's form asks only the fields the guide names, in its
order: a select list where the guide lists the values valid now (seats, the seat's offers and
coalitions, rounds, jobs), a multiple choice for a set of seats, a number box, a list box
(``30, 20``) or a text box otherwise, the default filled in; the optional extras (``reasoning``,
``conditions``, ...) are folded away under "More". Blank optional fields are left out. A raw-JSON
box takes a whole action. An action the server refuses at the door (422: it does not parse, or
its type is not legal in the phase) shows the server's message and the turn stays open, so the
person corrects and resends. Once the match is over the page shows the return, the verdict on
the last action and the rewards since.

Safety: every text from the server (observations, other seats' messages and pitches, names,
error messages) is put in the page with ``textContent`` or as an input's ``value``, never as
markup; the page has no inline script and is served with a Content-Security-Policy that allows
only its own script and stylesheet, and connections to its own origin.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.responses import Response

router = APIRouter()

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpumarket seat</title>
<link rel="stylesheet" href="/human/seat.css">
<script src="/human/seat.js" defer></script>
</head><body>
<header><h1 id="title">gpumarket seat</h1><p id="status">connecting...</p></header>
<main>
<section id="news" hidden>
<h2>Since your last move</h2>
<p id="verdict" role="status"></p>
<ul id="story"></ul>
</section>
<section id="play" hidden>
<h2>Your move <span id="turn"></span></h2>
<p id="deadline" class="muted"></p>
<label class="pick">Action <select id="kind"></select></label>
<p id="doc" class="doc"></p>
<div id="forms"></div>
<details><summary>Raw JSON instead</summary>
<textarea id="raw" rows="4" placeholder='{"action_type": "wait"}'></textarea>
<button id="send-raw" type="button">Send JSON</button></details>
<p id="error" class="error" role="alert"></p>
</section>
<p id="sent" class="sent"></p>
<section><h2>What you see</h2><div id="screen"></div>
<details><summary>The prompt an LLM seat is shown</summary><pre id="prompt"></pre></details>
</section>
</main></body></html>
"""

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 64em; padding: 1em; }
header { border-bottom: 1px solid #ccc; }
h1 { font-size: 1.4em; margin: .3em 0; }
h2 { font-size: 1.15em; margin: .8em 0 .3em; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: .6em; overflow-wrap: anywhere; }
#news { border: 1px solid #ccd; background: #f7f8fc; padding: 0 .8em .4em; margin-top: .8em; }
#story { margin: .3em 0; padding-left: 1.3em; }
#screen h3 { font-size: 1em; margin: .7em 0 .2em; }
#screen ul { margin: 0; padding-left: 1.3em; }
#story li { margin: .15em 0; }
#verdict { padding: .4em .6em; margin: .4em 0; border-radius: 3px; white-space: pre-wrap; }
#verdict.accepted { background: #e9f6ea; color: #14501a; }
#verdict.refused { background: #fdeaea; color: #8a0000; font-weight: bold; }
fieldset { border: 1px solid #ccc; margin: .4em 0; }
.pick select { font-size: 1em; margin-left: .4em; max-width: 100%; }
.field { display: grid; grid-template-columns: 12em 1fr; gap: .2em .6em; margin: .45em 0; }
.hint { color: #666; font-size: 90%; grid-column: 2; }
.error { color: #a00; font-weight: bold; white-space: pre-wrap; }
.sent { color: #070; }
.muted { color: #555; }
.doc { color: #333; white-space: pre-wrap; }
form button { margin-top: .4em; font-size: 1em; }
textarea, input[type=text] { width: 100%; box-sizing: border-box; }
"""

SCRIPT = r"""
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";
  const base = location.pathname.replace(/\/play$/, "");
  const auth = { "Authorization": "Bearer " + token };
  let view = null;
  let forms = {};

  function text(id, value) { $(id).textContent = value == null ? "" : String(value); }
  function el(tag, props) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "text") node.textContent = String(v); else node[k] = v;
    }
    return node;
  }
  // the schema node behind a $ref, or the one non-null branch of an optional (anyOf [X, null])
  function resolve(schema, node) {
    if (node && node["$ref"]) return resolve(schema, schema["$defs"][node["$ref"].split("/").pop()]);
    if (node && Array.isArray(node.anyOf)) {
      const real = node.anyOf.filter((n) => n.type !== "null");
      if (real.length === 1) return resolve(schema, real[0]);
    }
    return node || {};
  }
  // the schema of an action's field; a dotted name (mechanism.reserve_price) is a nested one
  function propOf(schema, def, name) {
    let node = def;
    for (const part of name.split(".")) node = resolve(schema, (node.properties || {})[part]);
    return node;
  }
  // an optional field the guide does not ask by default (reasoning, conditions): from the schema
  function fromSchema(name, prop) {
    const items = prop.items || {};
    const kind = prop.enum ? "choice" : prop.type === "integer" ? "int" : prop.type === "number" ? "number"
      : prop.type === "boolean" ? "bool" : prop.type === "string" ? "text"
      : prop.type === "array" && (items.type === "number" || items.type === "integer") ? "numbers" : "json";
    return { name: name, prompt: prop.description || "", required: false, kind: kind,
      choices: (prop.enum || []).map((v) => ({ value: String(v), label: String(v) })), default: null };
  }
  function put(action, name, value) {
    const parts = name.split(".");
    let node = action;
    for (const part of parts.slice(0, -1)) node = node[part] = node[part] || {};
    node[parts[parts.length - 1]] = value;
  }
  function number(name, raw, integer) {
    const n = Number(raw);
    if (raw === "" || !Number.isFinite(n)) throw new Error(name + ": give a number, not " + JSON.stringify(raw));
    if (integer && !Number.isInteger(n)) throw new Error(name + ": give a whole number");
    return n;
  }
  function parseJSON(name, raw) {
    try { return JSON.parse(raw); } catch (e) { throw new Error(name + ": not valid JSON"); }
  }

  // one input for field ``f`` (the guide's: name, prompt, required, kind, choices, default);
  // ``prop`` is its schema (the JSON type a choice is sent as). Returns a reader:
  // () => [present, value], or throws Error(message) for a value it cannot read.
  function ask(parent, f, prop) {
    const row = el("div", { className: "field" });
    const id = "f-" + Math.random().toString(36).slice(2);
    const label = f.name.split(".").pop().replace(/_/g, " ");
    row.appendChild(el("label", { htmlFor: id, text: label + (f.required ? " *" : "") }));
    const choices = Array.isArray(f.choices) ? f.choices : [];
    const many = f.kind === "choices";
    let input;
    if (choices.length || f.kind === "bool") {
      const values = choices.length ? choices : [{ value: "true", label: "yes" }, { value: "false", label: "no" }];
      input = el("select", { id: id, name: f.name, multiple: many });
      if (many) input.size = Math.min(values.length, 6);
      else if (!(f.required && values.length === 1)) {
        input.appendChild(el("option", { value: "", text: f.required ? "(choose)" : "(leave out)" }));
      }
      for (const c of values) input.appendChild(el("option", { value: String(c.value), text: String(c.label || c.value) }));
    } else if (f.kind === "text" && /^(text|message|purpose|reasoning)$/.test(f.name)) {
      input = el("textarea", { id: id, name: f.name, rows: 2 });
    } else {
      const numeric = f.kind === "int" || f.kind === "number";
      input = el("input", { id: id, name: f.name, type: numeric ? "number" : "text" });
      if (numeric) input.step = f.kind === "int" ? "1" : "any";
    }
    if (f.default != null) {
      const given = String(f.default).split(",").map((s) => s.trim());
      if (many) for (const o of input.options) o.selected = given.includes(o.value);
      else input.value = String(f.default);
    }
    row.appendChild(input);
    let hint = f.prompt ? String(f.prompt) : "";
    if (f.kind === "numbers") hint += (hint ? " " : "") + "(a list: 30, 20)";
    if (many) hint += (hint ? " " : "") + "(pick one or more)";
    if (hint) row.appendChild(el("span", { className: "hint", text: hint }));
    parent.appendChild(row);
    return () => {
      if (many) {
        const picked = [...input.selectedOptions].map((o) => o.value);
        if (!picked.length && f.required) throw new Error(label + ": pick at least one");
        if (!picked.length) return [false, null];
        // one pick goes as a plain value where the field takes one (to: "all" or a seat)
        const single = prop.type === "string" || (prop.anyOf || []).some((n) => n.type === "string");
        return [true, single && picked.length === 1 ? picked[0] : picked];
      }
      const raw = input.value.trim();
      if (raw === "") {
        if (f.required) throw new Error(label + " is required");
        return [false, null];
      }
      if (f.kind === "int" || f.kind === "number") return [true, number(label, raw, f.kind === "int")];
      if (f.kind === "bool") return [true, raw === "true"];
      if (f.kind === "numbers") {
        if (raw.startsWith("[")) return [true, parseJSON(label, raw)];
        return [true, raw.split(/[\s,]+/).filter((s) => s !== "").map((s) => number(label, s, false))];
      }
      if (choices.length) {
        if (prop.type === "integer" || prop.type === "number") return [true, number(label, raw, prop.type === "integer")];
        return [true, prop.type === "array" ? [raw] : raw];
      }
      if (f.kind === "json" && (raw.startsWith("{") || raw.startsWith("["))) return [true, parseJSON(label, raw)];
      return [true, raw];
    };
  }

  // one form per action valid now (the guide's list), each asking only the fields it needs
  function build(v) {
    const schema = v.legal_action_schema || {};
    const defs = {};
    for (const option of schema.anyOf || []) {
      const def = resolve(schema, option);
      const kind = def.properties && def.properties.action_type && def.properties.action_type.const;
      if (kind) defs[kind] = def;
    }
    const kinds = $("kind");
    kinds.textContent = "";
    $("forms").textContent = "";
    forms = {};
    const valid = v.guide && Array.isArray(v.guide.valid) ? v.guide.valid : [];
    for (const entry of valid) {
      const kind = String(entry.action_type);
      const def = defs[kind] || { properties: {} };
      const form = el("form", { className: "action", hidden: true });
      form.dataset.kind = kind;
      const readers = (entry.fields || []).map((f) => [f.name, ask(form, f, propOf(schema, def, f.name))]);
      const extra = (entry.extra || []).filter((n) => Object.keys(propOf(schema, def, n)).length);
      if (extra.length) {
        const more = el("details", { className: "more" });
        const names = extra.map((n) => n.split(".").pop().replace(/_/g, " "));
        more.appendChild(el("summary", { text: "More, optional: " + names.join(", ") }));
        for (const n of extra) {
          const prop = propOf(schema, def, n);
          readers.push([n, ask(more, fromSchema(n, prop), prop)]);
        }
        form.appendChild(more);
      }
      form.appendChild(el("button", { type: "submit", text: "Send" }));
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        try {
          const action = { action_type: kind };
          for (const [n, read] of readers) { const [has, val] = read(); if (has) put(action, n, val); }
          submit(action);
        } catch (e) { text("error", e.message); }
      });
      $("forms").appendChild(form);
      const meaning = entry.meaning ? String(entry.meaning) : "";
      forms[kind] = { form: form, doc: meaning };
      kinds.appendChild(el("option", { value: kind, text: kind.replace(/_/g, " ") + (meaning ? ": " + meaning : "") }));
    }
    choose();
  }
  function choose() {
    const kind = $("kind").value;
    for (const [k, f] of Object.entries(forms)) f.form.hidden = k !== kind;
    text("doc", forms[kind] ? forms[kind].doc : "");
  }

  // what happened since the seat's last move: the env's verdict on it, then the story
  function news(v) {
    const guide = v.guide || {};
    const last = guide.last_action;
    const verdict = $("verdict");
    if (last) {
      verdict.hidden = false;
      verdict.className = last.accepted ? "accepted" : "refused";
      text("verdict", last.text);
      document.body.dataset.verdict = last.accepted ? "accepted" : "refused";
    } else {
      verdict.hidden = true;
      delete document.body.dataset.verdict;
    }
    const story = $("story");
    story.textContent = "";
    const lines = (Array.isArray(guide.story) ? guide.story : []).filter((line) => !last || line !== last.text);
    for (const line of lines) story.appendChild(el("li", { text: line }));
    if (!lines.length) story.appendChild(el("li", { text: last ? "Nothing else that you can see." : "Nothing yet: this is your first move." }));
    $("news").hidden = false;
  }

  // the screen's lines: a heading, then its sentences (indented by two spaces)
  function screen(lines) {
    const box = $("screen");
    box.textContent = "";
    let list = null;
    for (const line of lines) {
      if (line.startsWith("  ") && list) { list.appendChild(el("li", { text: line.trim() })); continue; }
      box.appendChild(el("h3", { text: line }));
      list = box.appendChild(el("ul"));
    }
  }

  async function submit(action) {
    text("error", "");
    const body = JSON.stringify({ turn: view.turn, action: action });
    const r = await fetch(base + "/seat/action", {
      method: "POST", headers: Object.assign({ "content-type": "application/json" }, auth), body: body,
    });
    const answer = await r.json().catch(() => ({ error: "HTTP " + r.status }));
    if (r.ok) {
      text("sent", "Sent " + action.action_type.replace(/_/g, " ") + " for turn " + view.turn +
        ". The market's verdict on it comes with your next turn.");
      document.body.dataset.sentTurn = String(view.turn);
      $("play").hidden = true;
      $("news").hidden = true;
      poll();
    } else {
      text("error", answer.error || ("HTTP " + r.status));
    }
  }

  // while a turn is shown: has it passed meanwhile (its deadline, or answered from elsewhere)?
  async function watch(turn) {
    for (;;) {
      await new Promise((ok) => setTimeout(ok, 2000));
      if (!view || view.turn !== turn || $("play").hidden) return;
      const r = await fetch(base + "/seat", { headers: auth, cache: "no-store" }).catch(() => null);
      if (!r || !r.ok) continue;
      const v = await r.json().catch(() => null);
      if (v && (v.status !== "your_turn" || v.turn !== turn)) {
        $("play").hidden = true;
        text("sent", "Turn " + turn + " passed without an answer from this page (its deadline, or another client).");
        poll();
        return;
      }
    }
  }

  async function poll() {
    for (;;) {
      let r;
      try {
        r = await fetch(base + "/seat?wait=25", { headers: auth, cache: "no-store" });
      } catch (e) { text("status", "Connection lost; retrying."); await new Promise((ok) => setTimeout(ok, 2000)); continue; }
      const v = await r.json().catch(() => ({ error: "HTTP " + r.status }));
      if (!r.ok) { text("status", v.error || ("HTTP " + r.status)); document.body.dataset.state = "error"; return; }
      view = v;
      text("title", "gpumarket: " + v.seat + " in match " + v.match_id);
      document.title = $("title").textContent;
      document.body.dataset.state = v.status;
      if (v.status === "your_turn") {
        const guide = v.guide || {};
        text("status", "Your turn.");
        text("sent", "");
        text("error", "");
        text("turn", "(turn " + v.turn + ")");
        text("deadline", "Answer within " + Math.round(v.seconds_left) + " s, or the seat plays its fallback (wait, or no bids).");
        news(v);
        screen(Array.isArray(guide.screen) ? guide.screen : [v.prompt]);
        text("prompt", v.prompt);
        build(v);
        $("play").hidden = false;
        document.body.dataset.turn = String(v.turn);
        watch(v.turn);
        return;
      }
      if (v.status === "done") {
        const ret = typeof v["return"] === "number" ? v["return"].toFixed(3) : String(v["return"]);
        text("status", "The match is over. Your return: " + ret + ".");
        text("sent", "");
        if (v.guide) news(v);
        return;
      }
      if (v.status === "aborted") { text("status", "the match was stopped" + (v.error ? " (" + v.error + ")" : "")); return; }
      text("status", "Waiting for the other seats (your next turn: " + v.turn + ").");
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("kind").addEventListener("change", choose);
    $("send-raw").addEventListener("click", () => {
      try { submit(parseJSON("raw JSON", $("raw").value)); } catch (e) { text("error", e.message); }
    });
    if (!token) { text("status", "No seat token: open this page as .../play#token=YOUR_SEAT_TOKEN"); return; }
    poll();
  });
})();
"""

MatchId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{16}$", description="the match id")]


@router.get("/matches/{match_id}/play", include_in_schema=False)
async def play_page(match_id: MatchId) -> Response:
    """The human seat page (open it with ``#token=SEAT_TOKEN``)."""
    return Response(PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/human/seat.js", include_in_schema=False)
async def play_script() -> Response:
    return Response(SCRIPT, media_type="text/javascript; charset=utf-8", headers=HEADERS)


@router.get("/human/seat.css", include_in_schema=False)
async def play_style() -> Response:
    return Response(STYLE, media_type="text/css; charset=utf-8", headers=HEADERS)
