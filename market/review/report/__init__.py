"""A self-contained HTML report of one transcript or a folder of them.

``write_report("run/ep0.jsonl", "report.html")`` (or a folder, or a list of both) writes one HTML
file with everything inline: CSS, SVG plots (clearing price, welfare ratio, each seat's reward
components over the episode's steps), an SVG graph of trades, coalitions and private messages
between labs, and one section per round (mechanism, bids, clearing, allocations, payments,
shocks, judge verdicts with rationales, the round's actions). It needs no server and no network
and opens from ``file://``. Every table and chart of rewards says their unit: a lab's rewards are
credits ÷ the scenario's ``rewards.value_unit`` (read from the transcript's header, or a run
folder's ``run.json``), the designer's a unitless score (:func:`reward_units_note`).

Transcript text is untrusted (LLM output, pitches, messages, even seat names): every string goes
through :func:`esc` on its way into the page, the page carries no script at all, and a strict
Content-Security-Policy forbids any script, so nothing a model wrote can run in a reader's browser.

The page is built with :func:`h`, which escapes every child and attribute value that is not
already :class:`Safe` (escaped) markup; code never concatenates transcript text into HTML itself.

The package: :mod:`.markup` (the safe HTML kit), :mod:`.episode` (the episode read from the typed
transcript), :mod:`.views` (derived views), :mod:`.plots` (SVG charts), :mod:`.tables` (the round
sections), :mod:`.page` (the page, its CSS and :func:`write_report`) and :mod:`.run_page` (the
report of a run folder: aggregates and an episode index from the result rows, and a page for a
sample of episodes, :func:`write_run_report`).
"""

from __future__ import annotations

from market.review.report.episode import (
    Episode,
    Event,
    as_float,
    as_mapping,
    episode_from,
    episode_of,
    event_of,
    first_of,
    is_number,
    load_episodes,
    seat_sort_key,
    text_of,
    token_count,
    transcript_paths,
)
from market.review.report.markup import (
    TEXT_LIMIT,
    Safe,
    clean_text,
    clip,
    esc,
    fmt,
    h,
    html_table,
    join,
    key_values,
    preformatted,
    short_text,
)
from market.review.report.page import (
    CSS,
    TITLE,
    build_report,
    content_security_policy,
    episode_title,
    health_box,
    write_report,
)
from market.review.report.plots import (
    COMPONENT_COLORS,
    EDGE_COLORS,
    GRAPH_NODES,
    PALETTE,
    Series,
    bar_chart,
    component_color,
    graph_svg,
    line_chart,
)
from market.review.report.run_page import (
    RunReport,
    build_run_report,
    episode_command,
    episode_page,
    sample_seeds,
    write_episode_page,
    write_run_report,
)
from market.review.report.tables import (
    events_table,
    round_section,
)
from market.review.report.views import (
    CONDUCT_COLUMNS,
    EDGE_KINDS,
    action_summary,
    component_names,
    conduct_rows,
    conduct_text,
    cumulative_components,
    ev_ok,
    interaction_counts,
    quiet,
    reward_unit,
    reward_units_note,
    round_components,
    round_starts,
    seat_of,
)

__all__ = [
    "COMPONENT_COLORS",
    "CONDUCT_COLUMNS",
    "CSS",
    "EDGE_COLORS",
    "EDGE_KINDS",
    "Episode",
    "Event",
    "GRAPH_NODES",
    "PALETTE",
    "RunReport",
    "Safe",
    "Series",
    "TEXT_LIMIT",
    "TITLE",
    "action_summary",
    "as_float",
    "as_mapping",
    "bar_chart",
    "build_report",
    "build_run_report",
    "clean_text",
    "clip",
    "component_color",
    "component_names",
    "conduct_rows",
    "conduct_text",
    "content_security_policy",
    "cumulative_components",
    "episode_from",
    "episode_command",
    "episode_of",
    "episode_page",
    "episode_title",
    "esc",
    "ev_ok",
    "event_of",
    "events_table",
    "first_of",
    "fmt",
    "graph_svg",
    "h",
    "health_box",
    "html_table",
    "interaction_counts",
    "is_number",
    "join",
    "key_values",
    "line_chart",
    "load_episodes",
    "preformatted",
    "quiet",
    "reward_unit",
    "reward_units_note",
    "round_components",
    "round_section",
    "round_starts",
    "sample_seeds",
    "seat_of",
    "seat_sort_key",
    "short_text",
    "text_of",
    "token_count",
    "transcript_paths",
    "write_episode_page",
    "write_report",
    "write_run_report",
]
