"""The report page: the health box, the episode index, the aggregate over episodes, one section
per episode, the CSS and Content-Security-Policy, and :func:`build_report` / :func:`write_report`."""

from __future__ import annotations

import base64
import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from market.review.report.episode import (
    Episode,
    Event,
    as_float,
    as_mapping,
    first_of,
    is_number,
    load_episodes,
    seat_sort_key,
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
    short_text,
)
from market.review.report.plots import Series, bar_chart, component_color, graph_svg, line_chart
from market.review.report.tables import events_table, round_section
from market.review.report.views import (
    CONDUCT_COLUMNS,
    EDGE_KINDS,
    axis_unit,
    component_names,
    conduct_rows,
    cumulative_components,
    interaction_counts,
    reward_units_note,
    round_starts,
)
from market.run.conduct_table import CONDUCT_HEADERS, conduct_cells, seat_score, summarize
from market.run.health import WARN_SHARE, SeatHealth, from_episodes, over_share, warnings
from market.run.rollout import mean_ci95


def units_note(units: Mapping[str, float | None]) -> Safe:
    """The paragraph that says what a reward is in (:func:`reward_units_note`)."""
    return h("p", reward_units_note(units), class_="muted units")


def _units(episodes: Sequence[Episode]) -> dict[str, float | None]:
    return {ep.scenario: ep.value_unit for ep in episodes}


def episode_section(ep: Episode, idx: int, public: bool = False) -> Safe:
    """One episode: its seats table, market and reward plots, interaction graph and rounds; the
    static report and the live match view (:mod:`market.serve.live_view`) both draw it.
    ``public``: leave out the seed, the source file, the versions and the file digest (a
    spectator's view of a running match)."""
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
    seats_table = html_table(
        ["seat", "agent", "return", *names, "invalid", "LLM tokens / calls / latency"],
        seat_rows,
        "seats",
        numeric=tuple(range(2, 4 + len(names))),
    )
    scores, where = ep.conduct_scores()
    conduct_table = html_table(
        list(CONDUCT_COLUMNS), conduct_rows(scores), "conduct", numeric=tuple(range(1, 8))
    )
    judge = clean_text(ep.header.get("conduct_judge") or "")
    rounds = sorted(
        (r for r in ep.rounds if isinstance(r, Mapping)), key=lambda r: as_float(r.get("round"))
    )
    round_ids = [r.get("round") for r in rounds]
    price_pts = [
        (float(r["round"]), as_float(r.get("price"))) for r in rounds if is_number(r.get("round"))
    ]
    reserve_pts = [
        (float(r["round"]), as_float(r.get("reserve"))) for r in rounds if is_number(r.get("round"))
    ]
    welfare_pts = [
        (float(r["round"]), as_float(as_mapping(r.get("designer")).get("welfare_ratio")))
        for r in rounds
        if is_number(r.get("round"))
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
    units = _units([ep])
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
                y_label=f"reward ({axis_unit(units)})",
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
        round_section(ep, idx, r, by_round.get(r.get("round"), []), seats) for r in rounds
    ]
    orphan = [ev for rnd, evs in by_round.items() if rnd not in round_ids for ev in evs]
    private_rows = {"seed", "source", "versions", "file SHA-256"} if public else set()
    meta_rows = [
        ("scenario", ep.scenario),
        ("seed", fmt(ep.seed)),
        ("source", ep.source or ep.label),
        ("rounds / steps", f"{len(rounds)} / {len(ep.events)}"),
        ("mean welfare ratio", fmt(ep.welfare_ratio(), 3)),
        (
            "versions",
            ", ".join(f"{clean_text(k)} {short_text(v)}" for k, v in _version_items(ep.header))
            or "-",
        ),
        ("status", clean_text(first_of(ep.footer, "status", default="no footer (cut off?)"))),
        ("file SHA-256", clean_text(first_of(ep.footer, "file_sha256", default="-"))),
    ]
    meta = key_values([row for row in meta_rows if row[0] not in private_rows])
    counts = interaction_counts(ep)
    pairs = sorted(
        counts.items(), key=lambda kv: (seat_sort_key(kv[0][0]), seat_sort_key(kv[0][1]))
    )
    pair_table = html_table(
        ["pair", *EDGE_KINDS],
        [[f"{a} - {b}", *(str(k[x]) for x in EDGE_KINDS)] for (a, b), k in pairs],
        "pairs",
        numeric=(1, 2, 3, 4),
    )
    return h(
        "section",
        h("h2", ep.label if public else episode_title(ep)),
        [h("p", f"\u26a0 {p}", class_="warn") for p in ep.problems],
        [h("p", n, class_="muted") for n in ep.notes],
        h("div", meta, class_="cols"),
        h("h3", "Seats: returns and reward components"),
        units_note(units),
        seats_table or h("p", "no seats recorded", class_="muted"),
        h("h3", f"Conduct per seat ({where}{'; judge ' + judge if judge else ''})"),
        conduct_table or h("p", "no claims, promises or manipulation flags", class_="muted"),
        h("h3", "Market over the episode"),
        h("div", plots, class_="plots"),
        h("h3", f"Reward components per seat ({axis_unit(units)})"),
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
            events_table(orphan, axis_unit(units)),
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
    return health_box(from_episodes(episodes))


def health_box(health: Sequence[SeatHealth]) -> Safe:
    """The box at the top of the page: per seat, the decisions that fell back (agent errors,
    timeouts, the agent's own fallbacks), LLM repairs and LLM-judge fallbacks, with the first
    error; red when a seat fell back on more than :data:`market.run.health.WARN_SHARE`."""
    troubled = [x for x in health if x.troubled]
    decisions = sum(x.decisions for x in health)
    if not troubled:
        return h(
            "p",
            f"Agent health: no fallbacks, agent errors, timeouts, repairs, refused actions, "
            f"cut-offs or degraded features in {decisions} decisions.",
            class_="ok",
            id="health",
        )
    loud = over_share(troubled, WARN_SHARE)
    rows = [
        [
            x.seat,
            x.agent,
            str(x.decisions),
            f"{x.fallbacks} ({x.share:.0%})",
            str(x.agent_errors),
            str(x.timeouts),
            str(x.repairs),
            f"{x.refused} ({x.refused_share:.0%})",
            f"{x.cutoffs} ({x.cutoff_share:.0%})",
            str(x.degraded),
            clip(x.first_error or "", 300),
        ]
        for x in troubled
    ]
    return h(
        "section",
        h("h2", "\u26a0 Agent failures" if loud else "Agent fallbacks and repairs"),
        [h("p", line, class_="err") for line in warnings(troubled)],
        html_table(
            [
                "seat",
                "agent",
                "decisions",
                "fell back",
                "errors",
                "timeouts",
                "repairs",
                "refused",
                "cut off",
                "degraded",
                "first error",
            ],
            rows,
            "health",
            numeric=(2, 3, 4, 5, 6, 7, 8, 9),
        ),
        h(
            "p",
            "A decision falls back when the agent raised, ran past the time limit or found "
            "no usable reply; the seat then played the safe fallback action (abstain in "
            "bidding, wait otherwise). Repairs are an LLM seat's re-asks after an unusable "
            "reply. Refused: actions the env refused. Cut off: model replies stopped by the token "
            "limit (raise max_tokens). Degraded: decisions that ran with a feature the backend "
            "did not honour (listed in the step's LLM exchange). The judge row counts an LLM "
            "judge's verdicts that fell back on the rule verdict.",
            class_="muted",
        ),
        class_="health alert" if loud else "health note",
        id="health",
    )


def _version_items(header: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [
        (key, header[key])
        for key in ("package_version", "schema_version", "judge", "python")
        if key in header
    ]


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
        units_note(_units(episodes)) if seats else None,
        html_table(
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
        units_note(_units(episodes)),
        html_table(
            ["seat", "agent", "episodes", "return", *names],
            rows,
            "aggregate",
            numeric=tuple(range(2, 4 + len(names))),
        ),
        h("p", f"welfare ratio: {fmt(welfare_m, 3)} \u00b1 {fmt(welfare_c, 3)}"),
        _conduct_by_agent(episodes),
        h(
            "div",
            bar_chart(
                "Mean return per seat (95% CI)",
                bars,
                plot_id="aggregate-returns",
                y_label=f"return ({axis_unit(_units(episodes))})",
            ),
            class_="plots",
        ),
        id="aggregate",
    )


def _conduct_by_agent(episodes: Sequence[Episode]) -> Safe:
    """Per agent spec: its seats' conduct over the episodes (:mod:`market.run.conduct_table`:
    ratios averaged over the seat-episodes that define them, n of them)."""
    scores: dict[str, list[Mapping[str, Any] | None]] = defaultdict(list)
    for ep in episodes:
        final = ep.footer.get("conduct")
        conduct = ep.conduct_scores()[0] if isinstance(final, Mapping) else None
        for seat, agent in ep.seats.items():
            scores[agent or seat].append(seat_score(conduct, seat))
    rows = []
    for agent in sorted(scores):
        s = summarize(scores[agent])
        rows.append([clip(agent, 120), str(len(scores[agent])), *conduct_cells(s)])
    return join(
        [
            h("h3", "Conduct per agent (seat-episodes with a final conduct score)"),
            html_table(
                ["agent", "seat-episodes", *CONDUCT_HEADERS],
                rows,
                "conduct-agents",
                numeric=(1, 2, 3, 4),
            ),
        ]
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
pre.reasoning{background:#f3f0ff;font-style:italic}
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
ul.conduct{margin:2px 0;padding-left:16px;font-size:12px}li.cv.ok{color:#1a7f37}
li.cv.bad{color:#b42318;font-weight:600}li.cv.flag{color:#8e3a8a}li.cv.open{color:var(--muted)}
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
            [episode_section(ep, i) for i, ep in enumerate(episodes)],
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
