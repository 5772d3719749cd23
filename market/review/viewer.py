"""A transcript in the terminal, round by round (``gpumarket show FILE [--round N]``).

``render_transcript("run/ep0.jsonl", Console())`` prints the header (scenario, seed, seats), then
for each round: the mechanism and clearing, bids / allocations / payments, shocks, judge verdicts
with rationales, suspected cartels, every seat's reward components in that round and the round's
actions (messages, pitches, offers, bids, LLM output) each with the conduct judge's entries of its
step (claims, promises, manipulation flags with their verdicts), then the episode totals and each
seat's conduct scores (the footer's; for a cut-off file those after the last round).

Transcript text is untrusted: it is always printed as plain :class:`rich.text.Text` (never as
rich markup), with terminal control characters (ESC sequences and the like) and bidirectional
overrides shown as visible ``\\x1b``-style escapes, so model output cannot restyle, move the
cursor of, or retitle the reader's terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from rich.console import Console, Group
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from market.record.terminal import terminal_text
from market.review.report import (
    CONDUCT_COLUMNS,
    EDGE_KINDS,
    Episode,
    Event,
    action_summary,
    as_mapping,
    clean_text,
    clip,
    conduct_rows,
    conduct_text,
    episode_from,
    fmt,
    interaction_counts,
    quiet,
    round_components,
    seat_sort_key,
)


def safe_text(value: Any, style: str = "", limit: int | None = None) -> Text:
    """Transcript text for the terminal: controls made visible, never parsed as markup."""
    text = clean_text(value)
    if limit is not None:
        text = clip(text, limit)
    return Text(terminal_text(text), style=style)


def _table(
    title: str, *columns: str, numeric: tuple[int, ...] = (), wide: dict[int, int] | None = None
) -> Table:
    """A table; ``wide`` maps column index -> share of the spare width (the table then expands)."""
    wide = wide or {}
    table = Table(
        title=safe_text(title), title_justify="left", title_style="bold", expand=bool(wide)
    )
    for i, col in enumerate(columns):
        table.add_column(
            safe_text(col, limit=40),
            justify="right" if i in numeric else "left",
            overflow="fold",
            ratio=wide.get(i),
            no_wrap=bool(wide) and i not in wide,
        )
    return table


def _row(table: Table, *cells: Any, style: str | None = None) -> None:
    table.add_row(*(c if isinstance(c, Text) else safe_text(c) for c in cells), style=style)


def _header(ep: Episode) -> Panel:
    seats = _table("", "seat", "agent", "return", numeric=(2,))
    returns = ep.returns()
    for seat, agent in ep.seats.items():
        _row(seats, seat, agent, fmt(returns.get(seat), 3))
    footer = ep.footer
    lines = Text.assemble(
        ("scenario ", "dim"),
        safe_text(ep.scenario, "bold"),
        ("   seed ", "dim"),
        safe_text(fmt(ep.seed)),
        ("   rounds ", "dim"),
        str(len(ep.rounds)),
        ("   steps ", "dim"),
        str(len(ep.events)),
        ("   status ", "dim"),
        safe_text(footer.get("status", "no footer (cut off?)") if footer else "no footer"),
    )
    return Panel(Group(lines, seats), title=safe_text(ep.source or ep.label), title_align="left")


def _round_view(ep: Episode, r: Mapping[str, Any], events: list[Event], show_steps: bool) -> Group:
    rnd = r.get("round", "?")
    mech = as_mapping(r.get("mechanism"))
    designer = as_mapping(r.get("designer"))
    parts: list[Any] = [
        Rule(
            safe_text(
                f"Round {fmt(rnd)}: {clean_text(mech.get('auction_type', '?'))}, "
                f"price {fmt(r.get('price'))}"
            ),
            align="left",
        )
    ]
    market = _table("Market", "item", "value")
    _row(
        market, "mechanism", ", ".join(f"{clean_text(k)}={fmt(v)}" for k, v in mech.items()) or "-"
    )
    _row(market, "capacity / auctioned", f"{fmt(r.get('capacity'))} / {fmt(r.get('auctioned'))}")
    _row(market, "reserve / clearing price", f"{fmt(r.get('reserve'))} / {fmt(r.get('price'))}")
    _row(market, "sold / revenue", f"{fmt(r.get('sold'))} / {fmt(r.get('revenue'))}")
    _row(
        market,
        "welfare allocated / optimal",
        f"{fmt(r.get('allocated_welfare'))} / {fmt(r.get('optimal_welfare'))} "
        f"(ratio {fmt(designer.get('welfare_ratio'), 3)})",
    )
    _row(
        market,
        "designer parts",
        ", ".join(f"{clean_text(k)} {fmt(v, 3)}" for k, v in designer.items()) or "-",
    )
    parts.append(market)

    bids, won, paid = as_mapping(r.get("bids")), as_mapping(r.get("won")), as_mapping(r.get("paid"))
    shill, collusion = (
        as_mapping(r.get("shill_penalties")),
        as_mapping(r.get("collusion_penalties")),
    )
    who = list(dict.fromkeys([*bids, *won, *paid, *shill, *collusion]))
    if who:
        table = _table(
            "Bids, allocations, payments",
            "bidder",
            "bids",
            "won",
            "paid",
            "penalties",
            numeric=(2, 3),
        )
        for seat in who:
            b = bids.get(seat)
            units = [x for x in b if isinstance(x, int | float)] if isinstance(b, list) else []
            text = (
                f"{len(units)}: "
                + ", ".join(fmt(x) for x in units[:8])
                + (" ..." if len(units) > 8 else "")
                if units
                else "-"
            )
            pen = ", ".join(
                p
                for p in (
                    f"shill {fmt(shill[seat])}" if seat in shill else "",
                    f"collusion {fmt(collusion[seat])}" if seat in collusion else "",
                )
                if p
            )
            _row(table, seat, text, fmt(won.get(seat, 0)), fmt(paid.get(seat, 0.0)), pen or "-")
        parts.append(table)
    shocks = r.get("shocks") or []
    if shocks:
        parts.append(
            Text.assemble(
                ("shocks: ", "bold yellow"), safe_text("; ".join(clean_text(s) for s in shocks))
            )
        )
    verdicts = [v for v in r.get("judge") or [] if isinstance(v, Mapping)]
    if verdicts:
        table = _table(
            "Judge verdicts", "lab", "score", "granted", "judge", "rationale", numeric=(1, 2)
        )
        for v in verdicts:
            _row(
                table,
                v.get("lab", "?"),
                fmt(v.get("score")),
                fmt(v.get("granted")),
                v.get("judge", ""),
                safe_text(v.get("rationale", ""), limit=600),
            )
        parts.append(table)
    for cartel in r.get("suspected_cartels") or []:
        members = ", ".join(clean_text(m) for m in as_mapping(cartel).get("members") or [])
        parts.append(
            Text.assemble(
                ("suspected cartel: ", "bold red"),
                safe_text(members),
                f" (score {fmt(as_mapping(cartel).get('score'), 3)})",
            )
        )
    for entry in as_mapping(r.get("conduct")).get("verdicts") or []:
        if isinstance(entry, Mapping):
            style = _LABEL_STYLE.get(str(entry.get("label")), "magenta")
            parts.append(
                Text.assemble(
                    ("conduct at close: ", "bold"),
                    safe_text(clean_text(entry.get("seat", "?")) + " ", "bold"),
                    safe_text(conduct_text(entry), style, limit=600),
                )
            )
    comps = round_components(ep, rnd) if isinstance(rnd, int) else {}
    if comps:
        names = sorted({n for c in comps.values() for n in c})
        table = _table(
            "Reward components this round",
            "seat",
            *names,
            "total",
            numeric=tuple(range(1, len(names) + 2)),
        )
        for seat in sorted(comps, key=seat_sort_key):
            c = comps[seat]
            _row(table, seat, *(fmt(c.get(n, 0.0), 3) for n in names), fmt(sum(c.values()), 3))
        parts.append(table)
    if show_steps and events:
        parts.append(_events(events))
    return Group(*parts)


def _events(events: list[Event]) -> Table:
    table = _table(
        "Actions",
        "step",
        "seat",
        "phase",
        "action",
        "result / error",
        "reward",
        numeric=(0, 5),
        wide={3: 3, 4: 2},
    )
    hidden = 0
    for ev in events:
        if quiet(ev):
            hidden += 1
            continue
        if ev.error:
            outcome = safe_text(ev.error, "red", limit=300)
        else:
            outcome = safe_text(_brief(ev.result), limit=160)
        for label, text in (("agent error", ev.agent_error), ("LLM error", ev.llm_error)):
            if text:
                outcome.append_text(safe_text(f"\n{label}: {text}", "red", limit=300))
        action = safe_text(action_summary(ev, 400))
        if ev.reasoning:
            action.append_text(safe_text(f"\nreasoning: {ev.reasoning}", "italic", limit=400))
        if ev.model_reasoning:
            action.append_text(
                safe_text(f"\nmodel reasoning: {ev.model_reasoning}", "italic dim", limit=600)
            )
        if ev.raw_output is not None:
            action.append_text(safe_text(f"\nLLM: {ev.raw_output}", "dim", limit=400))
        for entry in ev.conduct:
            style = _LABEL_STYLE.get(str(entry.get("label")), "magenta")
            action.append_text(safe_text(f"\nconduct: {conduct_text(entry)}", style, limit=600))
        reward = sum(ev.components.get(ev.seat, {}).values()) if ev.components else ev.reward
        _row(
            table,
            str(ev.step),
            ev.seat,
            ev.phase,
            action,
            outcome,
            fmt(reward, 3) if reward is not None else "",
        )
    if hidden:
        table.caption = f"{hidden} wait or finished-seat step(s) not listed"
    return table


#: how a conduct entry is coloured by its label (a manipulation flag has none: magenta)
_LABEL_STYLE = {
    "true": "green",
    "kept": "green",
    "false": "bold red",
    "broken": "bold red",
    "pending": "dim",
    "unverifiable": "dim",
}


def _conduct_table(ep: Episode) -> Table | None:
    """Per-seat conduct scores: the footer's, or the last round's for a cut-off file."""
    scores, where = ep.conduct_scores()
    if not scores:
        return None
    table = _table(
        f"Conduct per seat ({where}; judge {clean_text(ep.header.get('conduct_judge') or '?')})",
        *CONDUCT_COLUMNS,
        numeric=tuple(range(1, len(CONDUCT_COLUMNS))),
    )
    for row in conduct_rows(scores):
        _row(table, *row)
    return table


def _brief(value: Any) -> str:
    if value in (None, {}):
        return ""
    if isinstance(value, Mapping):
        return ", ".join(
            f"{clean_text(k)}={_brief(v) if isinstance(v, Mapping | list) else fmt(v)}"
            for k, v in value.items()
        )
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value[:8]) + (" ..." if len(value) > 8 else "") + "]"
    return fmt(value)


def _totals(ep: Episode) -> Group:
    totals = ep.totals()
    names = sorted({n for c in totals.values() for n in c})
    table = _table(
        "Episode totals (reward components per seat)",
        "seat",
        *names,
        "return",
        "invalid",
        numeric=tuple(range(1, len(names) + 3)),
    )
    returns, invalid = ep.returns(), ep.invalid_actions()
    for seat in ep.seats:
        c = totals.get(seat, {})
        _row(
            table,
            seat,
            *(fmt(c.get(n, 0.0), 3) for n in names),
            fmt(returns.get(seat, 0.0), 3),
            str(invalid.get(seat, 0)),
        )
    parts: list[Any] = [Rule("Totals", align="left"), table]
    conduct = _conduct_table(ep)
    if conduct is not None:
        parts.append(conduct)
    counts = interaction_counts(ep)
    if counts:
        pairs = _table(
            "Trades, coalitions, private messages, suspected cartels",
            "pair",
            "trade",
            "coalition",
            "message",
            "cartel",
            numeric=(1, 2, 3, 4),
        )
        for (a, b), k in sorted(
            counts.items(), key=lambda kv: (seat_sort_key(kv[0][0]), seat_sort_key(kv[0][1]))
        ):
            _row(
                pairs,
                f"{a} - {b}",
                *(str(k[x]) for x in EDGE_KINDS),
            )
        parts.append(pairs)
    parts.append(Text(f"mean welfare ratio {fmt(ep.welfare_ratio(), 3)}", style="bold"))
    return Group(*parts)


def render_transcript(
    path_or_obj: Any,
    console: Console | None = None,
    round: int | None = None,  # noqa: A002
    steps: bool = True,
) -> Episode:
    """Print a transcript round by round (or only round ``round``); returns the parsed episode.

    ``path_or_obj``: a transcript path, the reader's :class:`~market.record.reader.Transcript` or
    an :class:`~market.review.report.Episode`. ``steps=False`` leaves out each round's list of actions.
    """
    console = console or Console()
    ep = episode_from(path_or_obj)
    rounds = sorted(
        (r for r in ep.rounds if isinstance(r, Mapping)),
        key=lambda r: cast(int, r.get("round")) if isinstance(r.get("round"), int) else -1,
    )
    if round is not None:
        rounds = [r for r in rounds if r.get("round") == round]
        if not rounds:
            have = ", ".join(fmt(r.get("round")) for r in ep.rounds) or "none"
            raise ValueError(f"round {round} is not in this transcript (rounds: {have})")
    by_round: dict[Any, list[Event]] = {}
    for ev in sorted(ep.events, key=lambda e: e.step):
        by_round.setdefault(ev.round, []).append(ev)
    console.print(_header(ep))
    for r in rounds:
        console.print(_round_view(ep, r, by_round.get(r.get("round"), []), steps))
    if round is None:
        console.print(_totals(ep))
    return ep
