"""The browser human seat: a page that plays a remote seat of a served match.

``GET /matches/{id}/play`` serves one static page (and its script and stylesheet); the page
speaks the same seat protocol as any remote agent (docs/remote-agents.md): it asks
``GET /matches/{id}/seat?wait=25`` for the seat's view and answers
``POST /matches/{id}/seat/action`` with ``{"turn": N, "action": {...}}``. Open it as
``/matches/{id}/play#token=SEAT_TOKEN``: the token travels in the URL *fragment*, which a browser
never sends to the server, and the script sends it only in the ``Authorization`` header, so it
appears in no request line and no server log.

On the seat's turn the page shows its observation (the ``to_prompt`` text and the structured
view) and builds one form per legal action type from the turn's ``legal_action_schema``: a field
per schema property (a number box for numbers, a choice for enums, a checkbox for true/false, a
text box for text and lists, nested fields for an object), required fields marked; blank
optional fields are left out. A raw-JSON box takes a whole action instead. A refused action
(422) shows the server's message and the turn stays open, so the person corrects and resends.

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
<section id="play" hidden>
<h2>Your move <span id="turn"></span></h2>
<p id="deadline"></p>
<label>Action <select id="kind"></select></label>
<p id="doc" class="doc"></p>
<div id="forms"></div>
<details><summary>Raw JSON instead</summary>
<textarea id="raw" rows="4" placeholder='{"action_type": "wait"}'></textarea>
<button id="send-raw" type="button">Send JSON</button></details>
<p id="error" class="error" role="alert"></p>
<p id="sent" class="sent"></p>
</section>
<section><h2>What you see</h2><pre id="prompt"></pre></section>
<section><h2>Last answer</h2><pre id="log"></pre></section>
</main></body></html>
"""

STYLE = """
body { font: 15px/1.4 system-ui, sans-serif; margin: 0 auto; max-width: 70em; padding: 1em; }
header { border-bottom: 1px solid #ccc; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: .6em; overflow-wrap: anywhere; }
fieldset { border: 1px solid #ccc; margin: .4em 0; }
.field { display: grid; grid-template-columns: 14em 1fr; gap: .5em; margin: .3em 0; }
.hint { color: #666; font-size: 90%; grid-column: 2; }
.error { color: #a00; font-weight: bold; white-space: pre-wrap; }
.sent { color: #070; }
.doc { color: #444; white-space: pre-wrap; }
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
  function resolve(schema, node) {
    if (node && node["$ref"]) return schema["$defs"][node["$ref"].split("/").pop()];
    return node || {};
  }
  function kindOf(prop) {
    if (prop.enum) return "enum";
    if (prop.anyOf) return "json";
    return prop.type || "json";
  }

  // one input per property; returns a reader: () => [present, value] or throws Error(message)
  function field(schema, parent, name, prop, required) {
    prop = resolve(schema, prop);
    const kind = prop.properties ? "object" : kindOf(prop);
    if (kind === "object") {
      const box = el("fieldset");
      box.appendChild(el("legend", { text: name + (required ? " *" : "") }));
      const readers = fields(schema, box, prop);
      parent.appendChild(box);
      return () => {
        const out = {};
        let any = false;
        for (const [k, read] of readers) {
          const [has, v] = read();
          if (has) { out[k] = v; any = true; }
        }
        return [any || required, out];
      };
    }
    const row = el("div", { className: "field" });
    const id = "f-" + Math.random().toString(36).slice(2);
    row.appendChild(el("label", { htmlFor: id, text: name + (required ? " *" : "") }));
    let input;
    if (kind === "enum") {
      input = el("select", { id: id, name: name });
      input.appendChild(el("option", { value: "", text: required ? "(choose)" : "(default)" }));
      for (const v of prop.enum) input.appendChild(el("option", { value: String(v), text: String(v) }));
    } else if (kind === "boolean") {
      input = el("select", { id: id, name: name });
      for (const v of ["", "true", "false"]) input.appendChild(el("option", { value: v, text: v || "(default)" }));
    } else if (kind === "string" && /^(text|message|purpose|reasoning)$/.test(name)) {
      input = el("textarea", { id: id, name: name, rows: 2 });
    } else {
      input = el("input", { id: id, name: name, type: (kind === "integer" || kind === "number") ? "number" : "text" });
      if (input.type === "number") input.step = kind === "integer" ? "1" : "any";
    }
    row.appendChild(input);
    let hint = kind === "array" ? "a list: comma-separated, or JSON" : kind === "json" ? "JSON" : kind;
    if (prop.minimum !== undefined) hint += ", at least " + prop.minimum;
    if (prop.maximum !== undefined) hint += ", at most " + prop.maximum;
    if (prop.description) hint += " - " + prop.description;
    row.appendChild(el("span", { className: "hint", text: hint }));
    parent.appendChild(row);
    return () => {
      const raw = input.value.trim();
      if (raw === "") {
        if (required) throw new Error(name + " is required");
        return [false, null];
      }
      if (kind === "integer" || kind === "number") {
        const n = Number(raw);
        if (!Number.isFinite(n)) throw new Error(name + ": give a number");
        return [true, n];
      }
      if (kind === "boolean") return [true, raw === "true"];
      if (kind === "array") {
        if (raw.startsWith("[")) return [true, parseJSON(name, raw)];
        const itemKind = kindOf(resolve(schema, prop.items));
        const items = raw.split(",").map((s) => s.trim()).filter((s) => s !== "");
        return [true, items.map((s) => (itemKind === "number" || itemKind === "integer") ? Number(s) : s)];
      }
      if (kind === "json") return [true, raw.startsWith("{") || raw.startsWith("[") ? parseJSON(name, raw) : raw];
      return [true, raw];
    };
  }
  function parseJSON(name, raw) {
    try { return JSON.parse(raw); } catch (e) { throw new Error(name + ": not valid JSON"); }
  }
  function fields(schema, parent, def) {
    const required = new Set(def.required || []);
    const readers = [];
    const names = Object.keys(def.properties || {}).filter((n) => n !== "action_type" && n !== "agent");
    names.sort((a, b) => (required.has(b) - required.has(a)) || ((a === "reasoning") - (b === "reasoning")));
    for (const n of names) readers.push([n, field(schema, parent, n, def.properties[n], required.has(n))]);
    return readers;
  }

  function build(v) {
    const schema = v.legal_action_schema;
    const kinds = $("kind");
    kinds.textContent = "";
    $("forms").textContent = "";
    forms = {};
    for (const option of schema.anyOf || []) {
      const def = resolve(schema, option);
      const kind = def.properties && def.properties.action_type && def.properties.action_type.const;
      if (!kind) continue;
      const form = el("form", { className: "action", hidden: true });
      form.dataset.kind = kind;
      const readers = fields(schema, form, def);
      const send = el("button", { type: "submit", text: "Send " + kind });
      form.appendChild(send);
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        try {
          const action = { action_type: kind };
          for (const [n, read] of readers) { const [has, val] = read(); if (has) action[n] = val; }
          submit(action);
        } catch (e) { text("error", e.message); }
      });
      $("forms").appendChild(form);
      forms[kind] = { form: form, doc: def.description || "" };
      kinds.appendChild(el("option", { value: kind, text: kind }));
    }
    choose();
  }
  function choose() {
    const kind = $("kind").value;
    for (const [k, f] of Object.entries(forms)) f.form.hidden = k !== kind;
    text("doc", forms[kind] ? forms[kind].doc : "");
  }

  async function submit(action) {
    text("error", "");
    const body = JSON.stringify({ turn: view.turn, action: action });
    const r = await fetch(base + "/seat/action", {
      method: "POST", headers: Object.assign({ "content-type": "application/json" }, auth), body: body,
    });
    const answer = await r.json().catch(() => ({ error: "HTTP " + r.status }));
    text("log", JSON.stringify(answer, null, 2));
    if (r.ok) {
      text("sent", "sent " + action.action_type + " for turn " + view.turn);
      document.body.dataset.sentTurn = String(view.turn);
      $("play").hidden = true;
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
        text("sent", "turn " + turn + " passed without an answer from this page (deadline, or another client)");
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
      } catch (e) { text("status", "connection lost; retrying"); await new Promise((ok) => setTimeout(ok, 2000)); continue; }
      const v = await r.json().catch(() => ({ error: "HTTP " + r.status }));
      if (!r.ok) { text("status", v.error || ("HTTP " + r.status)); document.body.dataset.state = "error"; return; }
      view = v;
      text("title", "gpumarket: " + v.seat + " in match " + v.match_id);
      document.title = $("title").textContent;
      document.body.dataset.state = v.status;
      if (v.status === "your_turn") {
        text("status", "your turn (" + v.legal_actions.length + " legal actions)");
        text("sent", "");
        text("turn", "(turn " + v.turn + ")");
        text("deadline", "answer within " + Math.round(v.seconds_left) + " s, or the seat plays its fallback");
        text("prompt", v.prompt);
        build(v);
        $("play").hidden = false;
        document.body.dataset.turn = String(v.turn);
        watch(v.turn);
        return;
      }
      if (v.status === "done") { text("status", "the match is over; your return: " + v["return"]); return; }
      if (v.status === "aborted") { text("status", "the match was stopped" + (v.error ? " (" + v.error + ")" : "")); return; }
      text("status", "waiting for the other seats (your next turn: " + v.turn + ")");
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("kind").addEventListener("change", choose);
    $("send-raw").addEventListener("click", () => {
      try { submit(parseJSON("raw JSON", $("raw").value)); } catch (e) { text("error", e.message); }
    });
    if (!token) { text("status", "no seat token: open this page as .../play#token=YOUR_SEAT_TOKEN"); return; }
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
