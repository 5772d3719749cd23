"""Agent health: how often each seat's agent failed, and how often an LLM judge fell back.

A decision *fails* when the seat played the fallback action instead of its agent's choice: the
agent raised (``agent_errors``), ran past the time limit (``timeouts``), or fell back on its own
(an LLM seat without a usable reply after its repairs). ``fallbacks`` counts all three, and a
seat's failure share is ``fallbacks / decisions``. ``repairs`` (an LLM seat re-asked after an
unusable reply) are shown but are not failures: the decision may still have succeeded. An LLM
judge fails a verdict when it falls back on the rule verdict (``kind="llm-fallback"``).
``refused`` counts the seat's actions the env refused (``infos[seat]["error"]``, the result rows'
``invalid_actions``); ``cutoffs`` the model replies cut off by the token limit (``finish_reason``
``"length"``, an LLM seat's ``stats["cutoffs"]``); ``degraded`` the decisions that ran with a
degraded feature (a request feature the backend did not honour, a model without a chat template,
a token counter that fell back: ``stats["degraded_features"]``). A seat fails ``--strict SHARE``
when its fallbacks, its refused actions or its cut-offs exceed SHARE of its decisions
(:attr:`SeatHealth.worst`); degraded decisions are shown, and warned about, but do not fail it.

The same counts come from a run's result rows (:func:`from_rows`: ``gpumarket run``, ``eval``,
``tournament``) and from transcripts (:func:`from_episodes`: the HTML report), so a run whose
seats failed says so where its results are shown, and ``--strict`` can fail it
(:func:`over_share`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.markup import escape
from rich.table import Table

#: a seat that failed on more than this share of its decisions gets a loud warning
WARN_SHARE = 0.10
#: the exit code of ``gpumarket run/eval/tournament --strict`` when a seat failed too often
STRICT_EXIT = 3
#: the prefix of a timed-out decision's ``agent_error`` (``market.run.rollout.AgentTimeout``)
TIMEOUT_PREFIX = "AgentTimeout:"
JUDGE = "judge"  # the row of an LLM judge's verdicts


@dataclass
class SeatHealth:
    """One seat's (or the judge's) counts over the episodes it is summed over."""

    seat: str
    agent: str
    decisions: int = 0
    fallbacks: int = 0
    agent_errors: int = 0
    timeouts: int = 0
    repairs: int = 0
    refused: int = 0  # actions the env refused
    cutoffs: int = 0  # replies cut off by the token limit (finish_reason "length")
    degraded: int = 0  # decisions with a degraded feature (stats["degraded_features"])
    first_error: str | None = None
    episodes: int = 0

    @property
    def share(self) -> float:
        """Share of its decisions that fell back (0 when it made none)."""
        return self.fallbacks / self.decisions if self.decisions else 0.0

    @property
    def refused_share(self) -> float:
        """Share of its decisions the env refused (0 when it made none)."""
        return min(1.0, self.refused / self.decisions) if self.decisions else 0.0

    @property
    def cutoff_share(self) -> float:
        """Cut-off replies per decision, at most 1 (0 when it made none)."""
        return min(1.0, self.cutoffs / self.decisions) if self.decisions else 0.0

    @property
    def worst(self) -> float:
        """The largest of the fallback, refused and cut-off shares: what ``--strict`` compares."""
        return max(self.share, self.refused_share, self.cutoff_share)

    @property
    def troubled(self) -> bool:
        return bool(
            self.fallbacks
            or self.agent_errors
            or self.timeouts
            or self.repairs
            or self.refused
            or self.cutoffs
            or self.degraded
        )

    @property
    def label(self) -> str:
        return f"{self.seat} ({self.agent})" if self.agent else self.seat

    def add(
        self,
        decisions: int = 0,
        fallbacks: int = 0,
        agent_errors: int = 0,
        timeouts: int = 0,
        repairs: int = 0,
        first_error: str | None = None,
        refused: int = 0,
        cutoffs: int = 0,
        degraded: int = 0,
    ) -> None:
        self.decisions += decisions
        self.refused += refused
        self.cutoffs += cutoffs
        self.degraded += degraded
        self.fallbacks += fallbacks
        self.agent_errors += agent_errors
        self.timeouts += timeouts
        self.repairs += repairs
        if self.first_error is None and first_error:
            self.first_error = first_error
        self.episodes += 1


def judge_counts(round_log: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """An episode's LLM-judge verdicts: how many the model was asked for (``verdicts``), how
    many fell back on the rule verdict, the judge's model, and the first failure's message."""
    asked = failed = 0
    model = first = None
    for entry in round_log:
        for verdict in entry.get("judge") or []:
            if not isinstance(verdict, Mapping):
                continue
            kind = verdict.get("judge")
            if kind not in ("llm", "llm-fallback"):  # rule verdicts and audits ask no model
                continue
            asked += 1
            model = model or verdict.get("model")
            if kind == "llm-fallback":
                failed += 1
                if first is None:
                    first = str(verdict.get("rationale") or "").split("; rule verdict:")[0]
    return {"verdicts": asked, "fallbacks": failed, "model": model, "first_error": first}


def _judge_row(
    health: dict[tuple[str, str], SeatHealth], where: str, counts: Mapping[str, Any] | None
) -> None:
    if not counts or not counts.get("verdicts"):
        return
    model = counts.get("model")
    key = (where, JUDGE)
    if key not in health:
        health[key] = SeatHealth(f"{where}{JUDGE}", f"LLM judge {model}" if model else "LLM judge")
    health[key].add(
        decisions=int(counts["verdicts"]),
        fallbacks=int(counts.get("fallbacks", 0)),
        first_error=counts.get("first_error"),
    )


def from_rows(rows: Iterable[Mapping[str, Any]], prefix: str = "") -> list[SeatHealth]:
    """Per-seat health of result rows (:data:`market.run.runner.ROW_KEYS`), seats in row order.
    ``prefix`` starts each seat's label (e.g. ``"market_round/rule_expert: "`` in an eval); the
    episode-level judge counts are summed once per episode. Rows written before these counts
    existed count as healthy."""
    health: dict[tuple[str, str], SeatHealth] = {}
    judged: set[tuple[Any, ...]] = set()
    for row in rows:
        key = (prefix, str(row["seat"]))
        if key not in health:
            health[key] = SeatHealth(f"{prefix}{row['seat']}", str(row.get("agent", "")))
        stats = row.get("stats") or {}
        health[key].add(
            decisions=int(row.get("decisions", stats.get("decisions", 0)) or 0),
            fallbacks=int(row.get("fallbacks", 0) or 0),
            agent_errors=int(row.get("agent_errors", 0) or 0),
            timeouts=int(row.get("timeouts", 0) or 0),
            repairs=int(row.get("repairs", stats.get("retries", 0)) or 0),
            first_error=row.get("first_error") or row.get("last_agent_error"),
            refused=int(row.get("invalid_actions", 0) or 0),
            cutoffs=int(row.get("cutoffs", stats.get("cutoffs", 0)) or 0),
            degraded=int(row.get("degraded", stats.get("degraded_features", 0)) or 0),
        )
        episode = (prefix, row.get("config"), row.get("seed"))
        if episode not in judged:
            judged.add(episode)
            _judge_row(health, prefix, row.get("judge"))
    return list(health.values())


def seat_counts(result: Any) -> dict[str, dict[str, Any]]:
    """Seat -> the counts of one :class:`~market.run.rollout.EpisodeResult` (as in result rows)."""
    out = {}
    for seat in result.seats:
        stats = result.agent_stats.get(seat) or {}
        errors, timeouts = int(result.agent_errors.get(seat, 0)), int(result.timeouts.get(seat, 0))
        out[seat] = {
            "decisions": int(result.decisions.get(seat, 0)),
            "agent_errors": errors,
            "timeouts": timeouts,
            "fallbacks": errors + timeouts + int(stats.get("fallbacks", 0) or 0),
            "repairs": int(stats.get("retries", 0) or 0),
            "refused": int(result.invalid_actions.get(seat, 0)),
            "cutoffs": int(stats.get("cutoffs", 0) or 0),
            "degraded": int(stats.get("degraded_features", 0) or 0),
            "first_error": result.first_error.get(seat),
        }
    return out


def from_matches(records: Iterable[Mapping[str, Any]]) -> list[SeatHealth]:
    """Per-agent health of tournament match records (``health`` and ``judge`` of
    :func:`market.run.tournament._play`): an agent's seats rotate, so counts are summed per agent
    spec and role."""
    health: dict[tuple[str, str], SeatHealth] = {}
    for rec in records:
        for seat, counts in sorted((rec.get("health") or {}).items()):
            agent = str((rec.get("seats") or {}).get(seat, "?"))
            role = "designer" if seat.startswith("designer") else "bidder"
            key = (role, agent)
            if key not in health:
                health[key] = SeatHealth(role, agent)
            health[key].add(
                **{
                    k: counts.get(k, 0)
                    for k in (
                        "decisions",
                        "fallbacks",
                        "agent_errors",
                        "timeouts",
                        "repairs",
                        "refused",
                        "cutoffs",
                        "degraded",
                    )
                },
                first_error=counts.get("first_error"),
            )
        _judge_row(health, "", rec.get("judge"))
    return list(health.values())


def from_episodes(episodes: Sequence[Any]) -> list[SeatHealth]:
    """Per-seat health of transcripts (:class:`market.review.report.Episode`): live steps are decisions,
    a step's ``agent_error`` is an error or a timeout, an LLM exchange marked ``fallback`` is the
    agent's own fallback, its attempts after the first are repairs, its replies with
    ``finish_reason`` ``"length"`` cut-offs and a non-empty ``degraded`` a degraded decision."""
    health: dict[tuple[str, str], SeatHealth] = {}
    for ep in episodes:
        seats = ep.seats
        counts: dict[str, dict[str, Any]] = {}
        for ev in ep.events:
            if not ev.live:
                continue
            c = counts.setdefault(
                ev.seat,
                {
                    "decisions": 0,
                    "fallbacks": 0,
                    "agent_errors": 0,
                    "timeouts": 0,
                    "repairs": 0,
                    "refused": 0,
                    "cutoffs": 0,
                    "degraded": 0,
                    "first_error": None,
                },
            )
            c["decisions"] += 1
            c["repairs"] += ev.repairs
            c["refused"] += ev.error is not None
            c["cutoffs"] += ev.cutoffs
            c["degraded"] += bool(ev.degraded)
            error = ev.agent_error or (
                f"fallback: {ev.llm_error or 'no usable reply'}" if ev.fallback else None
            )
            if error is None:
                continue
            c["fallbacks"] += 1
            if ev.agent_error is not None:
                c["timeouts" if ev.agent_error.startswith(TIMEOUT_PREFIX) else "agent_errors"] += 1
            c["first_error"] = c["first_error"] or error
        for seat, c in counts.items():
            key = ("", seat)
            if key not in health:
                health[key] = SeatHealth(seat, seats.get(seat, ""))
            health[key].add(**c)
        _judge_row(health, "", judge_counts(ep.rounds))
    return list(health.values())


def over_share(health: Iterable[SeatHealth], share: float) -> list[SeatHealth]:
    """The seats that fell back, were refused by the env or were cut off by the token limit on
    more than ``share`` of their decisions."""
    return [h for h in health if h.decisions and h.worst > share]


def warnings(health: Iterable[SeatHealth], share: float = WARN_SHARE) -> list[str]:
    """One line per seat that fell back on more than ``share`` of its decisions."""
    out = []
    for h in over_share(health, share):
        parts = [f"{h.agent_errors} raised"] if h.agent_errors else []
        parts += [f"{h.timeouts} timed out"] if h.timeouts else []
        own = h.fallbacks - h.agent_errors - h.timeouts
        if own:
            parts.append(
                f"{own} model failures"
                if h.seat.endswith(JUDGE)
                else f"{own} without a usable reply"
            )
        if h.share > share:
            out.append(
                f"{h.label} fell back on {h.share:.0%} of its {h.decisions} decisions "
                f"({', '.join(parts)}); first error: {h.first_error or 'none recorded'}"
            )
        if h.refused_share > share:
            out.append(
                f"{h.label} had {h.refused} of its {h.decisions} actions refused by the env "
                f"({h.refused_share:.0%})"
            )
        if h.cutoff_share > share:
            out.append(
                f"{h.label} had {h.cutoffs} replies cut off by the token limit in its "
                f"{h.decisions} decisions ({h.cutoff_share:.0%}): raise max_tokens"
            )
    return out


def print_health(
    console: Any,
    health: Sequence[SeatHealth],
    *,
    strict: float | None = None,
    what: str = "decisions",
) -> None:
    """Under a results table: a table of the seats with any failure or repair, then a loud
    warning per seat above :data:`WARN_SHARE` and the first error of the others; or one line
    saying there was none."""
    troubled = [h for h in health if h.troubled]
    total = sum(h.decisions for h in health)
    if not troubled:
        console.print(
            f"agent health: no fallbacks, agent errors, timeouts or repairs in {total} {what}; "
            "no action refused by the env, no reply cut off, no degraded feature",
            style="green",
            highlight=False,
        )
        return
    table = Table(
        title="agent health: decisions that fell back (errors + timeouts + the "
        "agent's own fallbacks), LLM repairs, actions the env refused, replies cut off by the "
        "token limit and decisions with a degraded feature",
        title_justify="left",
    )
    for col in (
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
    ):
        table.add_column(
            col,
            justify="left" if col in ("seat", "agent") else "right",
            no_wrap=col not in ("seat", "agent"),
            overflow="fold",
        )
    for h in troubled:
        style = (
            "bold red"
            if h.worst > WARN_SHARE
            else ("yellow" if h.fallbacks or h.cutoffs or h.degraded else None)
        )
        table.add_row(
            escape(h.seat),
            escape(h.agent),
            str(h.decisions),
            f"{h.fallbacks} ({h.share:.0%})",
            str(h.agent_errors),
            str(h.timeouts),
            str(h.repairs),
            f"{h.refused} ({h.refused_share:.0%})",
            f"{h.cutoffs} ({h.cutoff_share:.0%})",
            str(h.degraded),
            style=style,
        )
    console.print(table)
    loud = {id(h) for h in over_share(troubled, WARN_SHARE)}
    for line in warnings(troubled):
        console.print(f"[bold red]WARNING[/]: {escape(line)}", highlight=False)
    for h in troubled:
        if id(h) not in loud and h.first_error:
            console.print(
                f"{escape(h.label)}: first error: {escape(h.first_error[:300])}", highlight=False
            )
    degraded = [h for h in troubled if h.degraded]
    for h in degraded:
        console.print(
            f"[yellow]{escape(h.label)}: {h.degraded} of its {h.decisions} decisions ran with a "
            "degraded feature[/] (the transcript's LLM exchange lists it under degraded)",
            highlight=False,
        )
    if strict is None and any(h.fallbacks or h.refused or h.cutoffs for h in health):
        console.print(
            f"(--strict [SHARE] exits with code {STRICT_EXIT} when a seat falls back, has its "
            "actions refused or its replies cut off, on more than SHARE of its decisions)",
            style="dim",
            highlight=False,
        )


def strict_failures(health: Sequence[SeatHealth], share: float | None) -> list[str]:
    """The one-line reasons a ``--strict SHARE`` run fails (empty: it passes)."""
    if share is None:
        return []
    out = []
    for h in over_share(health, share):
        if h.share > share:
            out.append(
                f"{h.label} fell back on {h.fallbacks} of {h.decisions} decisions "
                f"({h.share:.1%}), above --strict {share:g}"
            )
        if h.refused_share > share:
            out.append(
                f"{h.label} had {h.refused} of {h.decisions} actions refused by the env "
                f"({h.refused_share:.1%}), above --strict {share:g}"
            )
        if h.cutoff_share > share:
            out.append(
                f"{h.label} had {h.cutoffs} replies cut off by the token limit in "
                f"{h.decisions} decisions ({h.cutoff_share:.1%}), above --strict {share:g}"
            )
    return out


def parse_share(text: str) -> float:
    """``--strict`` values: a share in [0, 1] (``0.1``) or a percentage (``10%``)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--strict {text!r}: give the share of failed decisions a seat may have, from 0 to 1 "
            "(e.g. 0.1) or as a percentage (e.g. 10%)"
        ) from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(
            f"--strict {text!r}: give a share from 0 to 1 (or 0% to 100%)"
        )
    return value
