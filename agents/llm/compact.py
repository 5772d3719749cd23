"""Fitting an observation into a small context: the same observation with its long lists cut to
their most relevant items, and a note of what was left out.

Rule: :func:`compact_observation` keeps at most ``limit`` items of every list the prompt shows
(and of every per-lab mapping), choosing the most relevant ones first, and never cuts what the
seat needs to act (:data:`PROTECTED`): its counterparties' names, its own live jobs and the
messages addressed to it stay whatever the limit:

- labs (active labs, reputations, last clearing's winners): the seat itself, then the labs it
  deals with (offers, contracts, coalitions, messages; all of them kept), then the others in
  their listed order;
- jobs: live ones by deadline (all of them kept), then finished and expired ones;
- offers and contracts (at least one of each kept): by delivery round (offers: expiry first); coalitions: the active ones;
- messages, pitches and shocks: the newest (messages addressed to the seat by name always);
  competing bids: each schedule's top ``limit`` bids;
- the designer's market-health series: their last ``limit`` values.

Floats of the designer's series and reputations are rounded to 3 decimals, prices and pool balances to 2, a
coalition's invitee list is cut too, and the seat's holdings lose their trailing zeros. What was cut is counted in the note
(``"... 280 more active labs"``), so a model knows the list goes on. The seat acts on the full
observation: only what the prompt shows is cut.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from agents.llm.rules import MAX_JOB_LINES
from market.environment import Observation

T = TypeVar("T")

#: active labs' names every form shows (besides the seat's counterparties): a few names are
#: cheap, and a seat that sees no other lab cannot address one
MIN_LABS = 8
#: what no limit cuts (the module docstring)
PROTECTED = ("counterparties' names", "the seat's live jobs", "messages addressed to the seat")


def _cut(
    items: Sequence[T],
    limit: int,
    what: str,
    notes: list[str],
    keep: Callable[[T], bool] | None = None,
) -> list[T]:
    """The first ``limit`` items and every item ``keep`` protects, in their order."""
    if len(items) <= limit:
        return list(items)
    chosen = [x for i, x in enumerate(items) if i < limit or (keep is not None and keep(x))]
    if len(chosen) < len(items):
        notes.append(f"... {len(items) - len(chosen)} more {what}")
    return chosen


def _by_relevance(labs: Iterable[str], first: Sequence[str]) -> list[str]:
    labs = list(labs)
    present = set(labs)
    head = [s for s in dict.fromkeys(first) if s in present]
    chosen = set(head)
    return head + [s for s in labs if s not in chosen]


def _counterparties(obs: Observation) -> list[str]:
    """The seat itself, then the labs it deals with, in the order they appear."""
    out = [obs.seat]
    for offer in [*(obs.offers_received or []), *(obs.offers_sent or [])]:
        out += [offer.sender, offer.recipient]
    for c in obs.contracts or []:
        out += [c.seller, c.buyer]
    for co in obs.coalitions or []:
        out += [co.leader, *co.members, *co.invited]
    out += [m.sender for m in reversed(obs.messages)]
    return out


def compact_observation(obs: Observation, limit: int | None) -> tuple[Observation, list[str]]:
    """``obs`` with every shown list cut to ``limit`` items (see the module docstring), and the
    notes of what was cut. ``limit=None`` returns ``obs`` itself and no notes."""
    if limit is None:
        return obs, []
    n = max(0, int(limit))
    notes: list[str] = []
    first = _counterparties(obs)
    dealt = set(first).__contains__
    update: dict[str, Any] = {}
    labs = _by_relevance(obs.active_labs, first)
    update["active_labs"] = _cut(labs, max(n, MIN_LABS), "active labs", notes, dealt)
    rep_keys = _cut(_by_relevance(obs.reputations, first), max(n, 1), "reputations", notes, dealt)
    update["reputations"] = {k: round(obs.reputations[k], 3) for k in rep_keys}
    if obs.holdings:
        held = list(obs.holdings)
        while len(held) > 1 and held[-1] == 0:
            held.pop()
        if len(held) < len(obs.holdings):
            notes.append(f"you own no blocks after round {obs.round + len(held) - 1}")
        update["holdings"] = held
    if obs.jobs is not None:
        order = {"active": 0, "pending": 1}
        jobs = sorted(obs.jobs, key=lambda j: (order.get(j.status, 2), j.deadline))
        update["jobs"] = _cut(jobs, max(n, 1), "jobs", notes, lambda j: j.status in order)
    if obs.offers_received is not None:
        offers = sorted(obs.offers_received, key=lambda o: (o.expires_round, o.delivery_round))
        update["offers_received"] = _cut(offers, max(n, 1), "offers to you", notes)
    if obs.offers_sent is not None:
        offers = sorted(obs.offers_sent, key=lambda o: (o.expires_round, o.delivery_round))
        update["offers_sent"] = _cut(offers, max(n, 1), "open offers of yours", notes)
    if obs.contracts is not None:
        contracts = sorted(obs.contracts, key=lambda c: c.delivery_round)
        update["contracts"] = _cut(contracts, max(n, 1), "forward contracts", notes)
    if obs.coalitions is not None:
        mine = sorted(obs.coalitions, key=lambda c: c.status != "active")
        update["coalitions"] = [
            c.model_copy(
                update={
                    "pool": _r(c.pool),
                    "my_balance": _r(c.my_balance),
                    "invited": c.invited[: max(n, 2)],
                }
            )
            for c in _cut(mine, max(n, 1), "coalitions", notes)
        ]
    public = sorted(obs.public_coalitions, key=lambda c: c.status != "active")
    update["public_coalitions"] = _cut(public, n, "declared coalitions", notes)
    newest = list(reversed(obs.messages[-10:]))  # to_prompt shows the last 10
    update["messages"] = list(reversed(_cut(newest, n, "messages", notes, _to_seat(obs.seat))))
    update["pitches"] = _cut(obs.pitches, n, "pitches", notes)
    shocks = sorted(obs.shocks, key=lambda s: -s.round)
    update["shocks"] = _cut(shocks, n, "shocks", notes)
    if obs.last_result is not None:
        update["last_result"] = _compact_result(obs, n, first, notes)
    if obs.designer_stats is not None:
        stats = obs.designer_stats
        series = {
            name: [round(x, 3) for x in getattr(stats, name)[-max(n, 1) :]]
            for name in (
                "welfare_ratio",
                "fairness",
                "participation",
                "stability",
                "revenue",
                "prices",
            )
        }
        if len(stats.prices) > max(n, 1):
            notes.append(f"market-health series: the last {max(n, 1)} rounds shown")
        update["designer_stats"] = stats.model_copy(update=series)
    return obs.model_copy(update=update), notes


def _compact_result(obs: Observation, n: int, first: Sequence[str], notes: list[str]) -> Any:
    result = obs.last_result
    assert result is not None
    update: dict[str, Any] = {}
    if result.winners is not None:
        keys = _cut(_by_relevance(result.winners, first), n, "winners", notes)
        update["winners"] = {k: result.winners[k] for k in keys}
    if result.judge_grants is not None:
        keys = _cut(_by_relevance(result.judge_grants, first), n, "judge grants", notes)
        update["judge_grants"] = {k: result.judge_grants[k] for k in keys}
    if result.competing_bids is not None:
        rows = _cut(result.competing_bids, n, "competing bid schedules", notes)
        update["competing_bids"] = [row[: max(n, 1)] for row in rows]
    update["clearing_price"] = _r(result.clearing_price)
    update["my_paid"] = round(result.my_paid, 2)
    return result.model_copy(update=update)


def _to_seat(seat: str) -> Callable[[Any], bool]:
    """Whether a message names ``seat`` among its recipients (a broadcast does not)."""
    return lambda m: m.to == seat or (isinstance(m.to, list) and seat in m.to)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# ---------------------------------------------------------------------------------------------
# the prompt's repeated text

#: the mechanism fields a bidder's rules state (:func:`agents.llm.rules.bidder_rules`: the
#: auction, the reserve, the penalties); left out of the observation's mechanism JSON when the
#: system prompt shows the rules
RULED_FIELDS = ("auction_type", "reserve_price", "withdrawal_penalty", "shill_penalty")


#: the job fields a bidder's rules state for the jobs they list (:func:`agents.llm.rules.job_line`)
RULED_JOB_FIELDS = ("size", "progress", "deadline", "value", "partial_credit")
#: mechanism fields that only say what the observation shows (left out at ``level`` 2)
REVEAL_FIELDS = (
    "reveal_reserve",
    "reveal_competing_bids",
    "reveal_winner_identity",
    "reveal_clearing_price",
    "reveal_bid_distribution",
)


def trim_repeats(
    text: str, obs: Observation, *, formats_shown: bool, rules_shown: bool, level: int = 1
) -> tuple[str, list[str]]:
    """``obs.to_prompt()`` text without what the rest of the prompt already says: the line of
    legal action types when the prompt lists each one's format (``formats_shown``), and, when the
    system prompt shows the rules (``rules_shown``), the mechanism fields they state (a
    designer's rules state every field and its value, so its mechanism line goes) and the sizes,
    deadlines and values of the jobs they list (those jobs leave the jobs line). ``level`` 2 also leaves out the mechanism's
    ``reveal_*`` flags (what is revealed shows in the observation itself). Lines are matched by
    the prefixes ``Observation.to_prompt`` writes; other seats' texts are quoted with ``| `` and
    never match."""
    out: list[str] = []
    notes: list[str] = []
    legal = mechanism = jobs = False
    ruled_jobs = rules_shown and obs.role == "bidder" and bool(obs.jobs)
    for line in text.split("\n"):
        if ruled_jobs and not jobs and line.startswith("Your jobs: "):
            jobs = True
            line = _jobs_line(obs)
        if formats_shown and not legal and line.startswith("Legal action types now: "):
            legal = True
            continue
        if rules_shown and not mechanism and line.startswith("Mechanism in force: "):
            mechanism = True
            if obs.role == "designer":
                notes.append("the mechanism (its fields are listed in the rules)")
                continue
            rest = {
                k: v
                for k, v in obs.mechanism.model_dump(exclude_none=True).items()
                if k not in RULED_FIELDS and (level < 2 or k not in REVEAL_FIELDS)
            }
            line = "Mechanism in force, besides the rules: " + json.dumps(
                rest, separators=(",", ":")
            )
        out.append(line)
    return "\n".join(out), notes


def _jobs_line(obs: Observation) -> str:
    """The jobs line without the jobs the rules describe line by line (the rules say all an
    observation's job says: blocks left, deadline, value a block, credit rule, and the needed
    reliability when it is above this round's)."""
    live = sorted(
        (j for j in obs.jobs or () if j.status == "active"), key=lambda j: (j.deadline, j.job_id)
    )
    ruled = [j.job_id for j in live[:MAX_JOB_LINES]]
    rows = [j.model_dump(exclude_none=True) for j in obs.jobs or () if j.job_id not in ruled]
    head = f"Your other jobs (besides {', '.join(ruled)} in the rules)" if ruled else "Your jobs"
    return f"{head}: {json.dumps(rows, separators=(',', ':'))}"
