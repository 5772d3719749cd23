"""What the env reports about a round: the round-log summary (the transcript's ``round`` lines),
what a closed round records (:func:`record_round`) and the ``ansi`` text rendering."""

from __future__ import annotations

from typing import Any, Protocol

from market.core.audit import audit_round
from market.core.execution import Breach
from market.core.mechanisms import Mechanism
from market.core.negotiation import Book
from market.core.round_close import RoundClose
from market.core.scenario_schema import Scenario
from market.core.seats import bidder_seat
from market.core.settlement import RoundResult
from market.core.shocks import Shock
from market.core.summation import ordered_sum
from market.core.world import World
from market.environment.conduct_log import ConductLog

RoundSummary = dict[str, Any]  # one JSON-ready round-log entry (the transcript's round summary)


def round_summary(
    result: RoundResult,
    parts: dict[str, float],
    optimum: float,
    allocated: float,
    shocks: list[Shock],
) -> RoundSummary:
    """One round's log entry: the clearing, the payments and penalties, welfare and shocks."""
    return {
        "round": result.round,
        "mechanism": result.mechanism.model_dump(),
        "reserve": result.reserve,
        "capacity": result.capacity,
        "auctioned": result.auctioned,
        "price": result.price,
        "sold": result.sold,
        "revenue": result.revenue,
        "bids": {
            (bidder_seat(e.lab) if e.coalition_id is None else e.coalition_id): e.bids
            for e in result.bids
        },
        "won": {bidder_seat(k): v for k, v in sorted(result.won.items())},
        "paid": {bidder_seat(k): v for k, v in sorted(result.paid.items())},
        "judge": [v.to_log() for v in result.verdicts],
        "shill_penalties": {bidder_seat(k): v for k, v in result.shill.items()},
        "collusion_penalties": {bidder_seat(k): v for k, v in result.collusion.items()},
        "suspected_cartels": [
            {"members": [bidder_seat(m) for m in ms], "score": s} for ms, s in result.suspected
        ],
        "optimal_welfare": optimum,
        "allocated_welfare": allocated,
        "designer": parts,
        "shocks": [s.describe() for s in shocks if s.round == result.round],
        "failures": [f.to_log() for f in result.failures],
        "breaches": [breach_log(b) for b in result.breaches],
        "pools": [p.to_log() for p in result.pools],
    }


def breach_log(breach: Breach) -> dict[str, Any]:
    """A breached forward contract as the round log records it."""
    c = breach.contract
    return {
        "contract_id": c.contract_id,
        "seller": bidder_seat(c.seller),
        "buyer": bidder_seat(c.buyer),
        "blocks": c.blocks,
        "short_sold": c.short,
        "shortfall": breach.shortfall,
        "refund": breach.refund,
        "compensation": breach.compensation,
        "penalty": breach.penalty,
    }


class RoundRecords(Protocol):
    """What a closed round is recorded in (``raw_env`` provides it)."""

    @property
    def designer_history(self) -> dict[str, list[float]]: ...
    @property
    def prices(self) -> list[float]: ...
    @property
    def results(self) -> list[RoundResult]: ...
    @property
    def round_log(self) -> list[RoundSummary]: ...
    @property
    def shocks(self) -> list[Shock]: ...
    @property
    def conduct(self) -> ConductLog: ...
    @property
    def world(self) -> World: ...
    @property
    def book(self) -> Book: ...


def record_round(m: RoundRecords, close: RoundClose) -> None:
    """Record a closed round: the designer's metrics, the clearing price and result, the round's
    summary, the conduct log's close of the round and the market's audit of its claims (the labs
    the judge committee charged with a false claim are not charged again)."""
    result, parts = close.result, close.parts
    for name, value in parts.items():
        m.designer_history[name].append(value)
    m.prices.append(result.price)
    m.results.append(result)
    m.round_log.append(round_summary(result, parts, close.optimum, close.allocated, m.shocks))
    m.conduct.round_closed(result, m.book.contracts)
    charged = {v.lab for v in result.verdicts if v.false_claims}  # by the committee
    audit_round(m.world, m.conduct.take_audit(), charged)  # the market's audit


class RenderState(Protocol):
    """What the text rendering reads of the env (``raw_env`` provides it)."""

    world: World
    mechanism: Mechanism
    round: int
    phase: str
    agent_selection: str
    scenario: Scenario
    results: list[RoundResult]


def render_text(env: RenderState) -> str:
    """The market at a glance: round, mechanism, capacity, each entered lab, the last clearing."""
    w, m, round_, rounds = env.world, env.mechanism, env.round, env.scenario.rounds
    phase, turn, results = env.phase, env.agent_selection, env.results
    lines = [
        f"round {round_ + 1}/{rounds}  phase {phase}  turn {turn}",
        f"mechanism {m.auction_type} reserve {m.reserve_price:g} policy {m.coalition_policy} judge_pool {m.judge_pool_share:g}",
        f"capacity {int(w.capacity[min(round_, rounds - 1)])}  operator credits {w.operator_credits:.2f}",
    ]
    for lab in w.labs:
        if not lab.entered:
            continue
        live = ordered_sum(1 for j in lab.jobs if j.status == "active")
        done = ordered_sum(1 for j in lab.jobs if j.status == "done")
        lines.append(
            f"  {lab.seat:<10} {'active' if lab.active else 'gone':<6} budget {lab.budget:9.2f} "
            f"rep {lab.reputation:.2f} jobs live {live} done {done}"
        )
    if results:
        r = results[-1]
        lines.append(
            f"last clearing: round {r.round + 1} price {r.price:.2f} sold {r.sold} revenue {r.revenue:.2f}"
        )
    return "\n".join(lines)
