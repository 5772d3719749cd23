"""The report's SVG charts (drawn as markup, no script): line charts, bar charts with confidence
intervals, and the graph of trades, coalitions, messages and cartels between labs; the palette."""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from market.review.report.episode import seat_sort_key
from market.review.report.markup import Safe, clip, fmt, h
from market.review.report.views import EDGE_KINDS

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
    return (
        known if known is not None else zlib.crc32(name.encode("utf-8", "replace")) % len(PALETTE)
    )


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
    ticks: list[float] = []
    t = first
    while t <= hi + step * 0.5 and len(ticks) < 3 * n:
        ticks.append(round(t, 10))
        t += step
    if ticks[-1] < hi and len(ticks) < 3 * n:  # the top tick must cover the data
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _y_grid(
    ticks: list[float], sy: Callable[[float], float], left: float, width: float
) -> list[Safe]:
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


def _plot_svg(
    parts: list[Any],
    y_label: str | None,
    top: float,
    ph: float,
    width: int,
    height: int,
    plot_id: str,
) -> Any:
    """The plot's <svg>: its parts plus the rotated y-axis label, if any."""
    if y_label:
        parts.append(
            h(
                "text",
                y_label,
                x=12,
                y=top + ph / 2,
                class_="axis",
                text_anchor="middle",
                transform=f"rotate(-90 12 {top + ph / 2})",
            )
        )
    return h(
        "svg",
        parts,
        xmlns="http://www.w3.org/2000/svg",
        viewBox=f"0 0 {width} {height}",
        width=width,
        height=height,
        class_="plot",
        role="img",
        data_plot=plot_id,
    )


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
        keep = set(sorted(activity, key=lambda s: (-activity[s], seat_sort_key(s)))[:GRAPH_NODES])
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
