"""The report's per-round sections: market, bids, clearing, allocations, payments, shocks, judge
verdicts, reward components, and the table of a round's actions."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from market.review.report.episode import (
    Episode,
    Event,
    as_float,
    as_mapping,
    is_number,
    seat_sort_key,
    text_of,
    token_count,
)
from market.review.report.markup import (
    Safe,
    clean_text,
    clip,
    fmt,
    h,
    html_table,
    join,
    key_values,
    preformatted,
    short_text,
)
from market.review.report.views import (
    action_summary,
    axis_unit,
    conduct_text,
    quiet,
    round_components,
)

#: a conduct entry's CSS class by its label (a manipulation flag: ``flag``)
LABEL_CLASS = {"true": "ok", "kept": "ok", "false": "bad", "broken": "bad"}


def conduct_list(entries: list[dict[str, Any]], seat: bool = False) -> Safe | None:
    """Conduct entries as a list (each: its text, classed by label); None when there are none.
    ``seat``: start each with the seat (a round's verdicts, where the row has no seat)."""
    items = [
        h(
            "li",
            f"{clean_text(e.get('seat', '?'))}: " if seat else "",
            conduct_text(e),
            class_=f"cv {LABEL_CLASS.get(str(e.get('label')), 'flag' if e.get('kind') == 'flag' else 'open')}",
        )
        for e in entries
        if isinstance(e, Mapping)
    ]
    return h("ul", items, class_="conduct") if items else None


def _mechanism_text(mech: Mapping[str, Any]) -> str:
    if not mech:
        return "-"
    keys = [k for k in mech if k != "auction_type"]
    return ", ".join(
        [clean_text(mech.get("auction_type", "?"))]
        + [f"{clean_text(k)}={short_text(mech[k])}" for k in keys]
    )


def round_section(
    ep: Episode, idx: int, r: Mapping[str, Any], events: list[Event], seats: list[str]
) -> Safe:
    rnd = r.get("round", "?")
    mech = as_mapping(r.get("mechanism"))
    designer = as_mapping(r.get("designer"))
    shocks = r.get("shocks") or []
    verdicts = [v for v in r.get("judge") or [] if isinstance(v, Mapping)]
    bids = as_mapping(r.get("bids"))
    won, paid = as_mapping(r.get("won")), as_mapping(r.get("paid"))
    shill, collusion = (
        as_mapping(r.get("shill_penalties")),
        as_mapping(r.get("collusion_penalties")),
    )
    bidders = list(dict.fromkeys([*bids, *won, *paid, *shill, *collusion]))
    opt, alloc = as_float(r.get("optimal_welfare")), as_float(r.get("allocated_welfare"))
    head = h(
        "h3",
        f"Round {fmt(rnd)}: ",
        h("span", clean_text(mech.get("auction_type", "?")), class_="mech"),
        f", price {fmt(r.get('price'))}, sold {fmt(r.get('sold'))}"
        f" of {fmt(r.get('auctioned', r.get('capacity')))}",
    )
    summary = key_values(
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
        bl = [x for x in b if is_number(x)] if isinstance(b, list) else []
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
    bids_table = html_table(
        ["bidder / coalition", "bids (per unit, best first)", "won", "paid", "penalties"],
        bid_rows,
        "bids",
        numeric=(2, 3),
    )
    verdict_table = html_table(
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
    comp_table = html_table(
        ["seat", *names, "total"],
        [
            [s, *(fmt(comps[s].get(n, 0.0), 3) for n in names), fmt(sum(comps[s].values()), 3)]
            for s in sorted(comps, key=seat_sort_key)
        ],
        "components",
        numeric=tuple(range(1, len(names) + 2)),
    )
    shock_list = (
        h("ul", [h("li", text_of(s)) for s in shocks], class_="shocks")
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
    delivery = delivery_table(r)
    if delivery:
        body += [h("h4", "Delivery risk: failed blocks, breaches, pledge defaults"), delivery]
    if cartel_list:
        body += [h("h4", "Suspected cartels"), cartel_list]
    conduct = conduct_list(list(as_mapping(r.get("conduct")).get("verdicts") or []), seat=True)
    if conduct:
        body += [h("h4", "Conduct verdicts at the round's close"), conduct]
    unit = axis_unit({ep.scenario: ep.value_unit})
    if comp_table:
        body += [h("h4", f"Reward components this round ({unit})"), comp_table]
    if events:
        body += [h("h4", f"Actions ({len(events)} steps)"), events_table(events, unit)]
    return h(
        "section",
        h("details", h("summary", head), body, open=True),
        class_="round",
        id=f"ep{idx}-round-{fmt(rnd)}" if isinstance(rnd, int) else None,
        data_round=rnd if isinstance(rnd, int) else None,
    )


def delivery_table(r: Mapping[str, Any]) -> Safe | None:
    """A round's delivery-risk events (the round log's ``failures``, ``breaches`` and ``pools``)
    as one table, or None when there were none."""
    rows: list[list[Any]] = []
    for f in r.get("failures") or []:
        if isinstance(f, Mapping):
            rows.append(
                [
                    clean_text(f.get("seat", "?")),
                    "blocks failed",
                    f"{fmt(f.get('failed'))} of {fmt(f.get('held'))} held",
                    "-",
                ]
            )
    for b in r.get("breaches") or []:
        if isinstance(b, Mapping):
            rows.append(
                [
                    clean_text(b.get("seller", "?")),
                    f"breach of {clean_text(b.get('contract_id', '?'))} to {clean_text(b.get('buyer', '?'))}",
                    f"short {fmt(b.get('shortfall'))} of {fmt(b.get('blocks'))}"
                    f" ({fmt(b.get('short_sold'))} sold short)",
                    f"refund {fmt(b.get('refund'))}, compensation {fmt(b.get('compensation'))},"
                    f" penalty {fmt(b.get('penalty'))}",
                ]
            )
    for p in r.get("pools") or []:
        if not isinstance(p, Mapping):
            continue
        cut = ", ".join(f"{clean_text(k)} {fmt(v)}" for k, v in as_mapping(p.get("cut")).items())
        for seat, missing in as_mapping(p.get("defaults")).items():
            rows.append(
                [
                    clean_text(seat),
                    f"pledge default in {clean_text(p.get('coalition_id', '?'))}",
                    f"{fmt(missing)} of {fmt(as_mapping(p.get('pledged')).get(seat))} pledged",
                    f"cut: {cut or '-'}",
                ]
            )
    if not rows:
        return None
    return html_table(["lab", "event", "blocks", "credits / cascade"], rows, "delivery")


def events_table(events: list[Event], unit: str | None = None) -> Safe:
    """The steps' table; ``unit``: what the reward column is in (e.g. ``credits ÷ 100``)."""
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
            outcome.append(h("div", clip(short_text(ev.result), 200)))
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
                    preformatted(json.dumps(ev.action, indent=1, ensure_ascii=False, default=str)),
                )
            )
        if ev.raw_output is not None or ev.prompt is not None or ev.model_reasoning:
            usage = ", ".join(
                x
                for x in (
                    f"{fmt(token_count(ev.tokens), 0)} tokens" if ev.tokens is not None else "",
                    f"{fmt(ev.latency, 2)} s" if ev.latency is not None else "",
                )
                if x
            )
            inner = [
                h("div", "model output", class_="muted"),
                preformatted(ev.raw_output or "", "llm"),
            ]
            if ev.model_reasoning:
                inner[:0] = [
                    h("div", "model reasoning", class_="muted"),
                    preformatted(ev.model_reasoning, "reasoning"),
                ]
            if ev.prompt is not None:
                inner.append(
                    h("details", h("summary", "prompt"), preformatted(ev.prompt, "prompt"))
                )
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
                    conduct_list(ev.conduct),
                    detail,
                ],
                outcome,
                fmt(reward, 3) if reward is not None else "",
            ]
        )
    table = html_table(
        [
            "step",
            "seat",
            "phase",
            "action",
            "result / error",
            f"reward ({unit})" if unit else "reward",
        ],
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
