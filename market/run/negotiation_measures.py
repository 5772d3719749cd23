"""What one episode of the negotiation report measures (:mod:`market.review.negotiation_report`):
the first-best welfare of its jobs and supply (:func:`first_best`), what only the play shows
(:class:`Tally`: offers, trades and their prices, forward contracts, coalitions, pitches,
reputation), and the counts a round log holds (breaches, defaults, cascades, judge grants).
docs/negotiation.md defines every figure.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from market.core.seats import DESIGNER, bidder_seat, lab_index
from market.environment.aec import raw_env
from market.run.jobs import episode_rows
from market.run.rollout import Episode

EXPERT = "rule_expert"
SEAT = "bidder_0"
DEFAULT_SEEDS = range(60)
#: the scenarios every report covers; the default adds every other scenario of the
#: expert matrix (:func:`market.run.expert_matrix.matrix_scenarios`) with a negotiation turn
CORE_SCENARIOS = ("market_round", "coalition_market", "shock_storm")
#: left out of the default: hundreds of seats per episode make its 60 seeds cost more than all
#: the others together (name it with --scenarios to include it)
EXPENSIVE = ("large_market",)
#: each dishonest agent and its honest twin, the agent that plays as it does but for the lies:
#: ``liar`` is ``rule_expert`` plus false statements; ``promise_breaker`` bids like ``truthful``
#: and only talks (promises it breaks, short sales it does not deliver), so ``truthful`` is it
#: without the promises; ``deceptive`` is ``cooperative`` plus a false public message per round
HONEST_TWINS: tuple[tuple[str, str], ...] = (
    ("liar", "rule_expert"),
    ("promise_breaker", "truthful"),
    ("deceptive", "cooperative"),
)
HEDGE_OFF = "rule_expert?hedge=false"
OWN, SPOT_ONLY = "@own", "@spot_only"
SIDECAR = "negotiation.jsonl"
#: the seat's negotiation counts per episode (see :class:`Tally`)
SEAT_KEYS = (
    "talk_actions",
    "offers_sent",
    "offers_accepted",
    "offers_rejected",
    "offers_received",
    "offers_taken",
    "trades",
    "blocks_bought",
    "credits_bought",
    "blocks_sold",
    "credits_sold",
    "forward_contracts",
    "coalitions_formed",
    "joins_received",
    "joins_made",
    "pitches",
    "reputation",
)


# ----------------------------------------------------------------------------- first best


def first_best(
    jobs: Iterable[tuple[float, int, int, int]], supply: Sequence[int], unit: float = 1.0
) -> float:
    """The first-best welfare: the most job value the episode's blocks could create.

    ``jobs``: (value per block, blocks still needed, first round, last round) of every job (the
    rounds in which it can run: arrived, owner entered, deadline not passed, reliability at
    least its minimum); ``supply``: the blocks of each round (capacity plus endowments). Blocks
    are perishable and any block serves any job of its round. Every block of a job is worth the
    job's value per block (a job without partial credit too: a bound, not a plan), failures are
    ignored, and budgets, prices and who owns what do not matter: a planner's allocation.

    Exact: the sets of job blocks that can be served form a transversal matroid, so serving
    jobs in decreasing value per block, each as far as an augmenting path allows, is optimal.
    Returned divided by ``unit`` (the scenario's ``value_unit``: reward units).
    """
    rounds = len(supply)
    left = [max(0, int(s)) for s in supply]
    # served[j][r]: blocks of round r given to job j (kept so paths can move them)
    order = sorted(
        (
            (float(v), int(n), max(0, int(a)), min(rounds - 1, int(d)))
            for v, n, a, d in jobs
            if n > 0 and v > 0
        ),
        key=lambda j: -j[0],
    )
    served: list[dict[int, int]] = []
    total = 0.0
    for index, (value, need, first, last) in enumerate(order):
        served.append({})
        for _ in range(need):
            if not _augment(index, order, served, left, first, last):
                break
            total += value
    return total / unit


def _augment(
    start: int,
    jobs: list[tuple[float, int, int, int]],
    served: list[dict[int, int]],
    left: list[int],
    first: int,
    last: int,
) -> bool:
    """Give job ``start`` one more block: a free block of its rounds, or one freed by moving an
    earlier job's block to another round of its own (breadth-first); True when it worked."""
    parent: dict[int, tuple[int, int] | None] = {}  # round -> (job that reached it, its round)
    queue: deque[int] = deque()
    for r in range(first, last + 1):
        if r not in parent:
            parent[r] = None
            queue.append(r)
    while queue:
        r = queue.popleft()
        if left[r] > 0:
            left[r] -= 1
            # walk back: each job on the path moves a block from its round to the next
            while parent[r] is not None:
                job, was = parent[r]  # type: ignore[misc]
                served[job][r] = served[job].get(r, 0) + 1
                served[job][was] -= 1
                r = was
            served[start][r] = served[start].get(r, 0) + 1
            return True
        for job in range(len(served)):
            if served[job].get(r, 0) <= 0 or job == start:
                continue
            _, _, a, d = jobs[job]
            for r2 in range(a, d + 1):
                if r2 not in parent:
                    parent[r2] = (job, r)
                    queue.append(r2)
    return False


def episode_first_best(env: Any) -> float:
    """:func:`first_best` of an env just reset: its jobs, capacity, endowments and reliability."""
    world, sc = env.world, env.scenario
    rounds = sc.rounds
    supply = [int(world.capacity[r]) + int(world.holdings[:, r].sum()) for r in range(rounds)]
    jobs = []
    for lab in world.labs:
        entry = int(world.entry_round[lab.index])
        if entry < 0:
            continue  # never enters
        for job in lab.jobs:
            ok = [
                r
                for r in range(max(job.arrival, entry), min(job.deadline, rounds - 1) + 1)
                if float(world.reliability[r]) >= job.min_reliability
            ]
            if ok:
                # a job runs only in rounds its reliability allows: a gap splits it (rare);
                # the bound then takes the widest span, which can only raise it
                jobs.append((job.value / job.size, job.size - job.progress, ok[0], ok[-1]))
    return first_best(jobs, supply, sc.rewards.value_unit)


# ----------------------------------------------------------------------------- one episode


class Tally:
    """The negotiation counts of one episode, read from each step's action and the env's answer
    (``infos[seat]["result"]``): only actions the env took count."""

    def __init__(self, env: Any, seat: str) -> None:
        self.env, self.seat = env, seat
        self.counts: dict[str, float] = dict.fromkeys(SEAT_KEYS, 0)
        self.offers: dict[str, tuple[str, str, int, float, int, int]] = {}
        self.leaders: dict[str, str] = {}  # coalition -> the seat that formed it
        self.episode = {"trades": 0, "forward_contracts": 0, "coalitions": 0, "joins": 0}

    def after(self, seat: str, action: Any) -> None:
        info = self.env.infos.get(seat) or {}
        if "error" in info or "result" not in info:
            return
        kind, result = info.get("action"), info.get("result") or {}
        me = seat == self.seat
        if kind in ("send_offer", "counter_offer", "form_coalition", "send_message"):
            self.counts["talk_actions"] += me
        if kind in ("make_pitch", "counter_pitch"):
            self.counts["talk_actions"] += me
            self.counts["pitches"] += me
        if kind == "counter_offer" or kind == "reject_offer":
            # a counter-offer turns the original down as a rejection does
            o = self.offers.get(str(getattr(action, "offer_id", "")))
            if o is not None and o[0] == self.seat:
                self.counts["offers_rejected"] += 1
        if kind in ("send_offer", "counter_offer") and result.get("offer_id"):
            o = self.env.book.offers.get(result["offer_id"])
            if o is not None:
                sender, to = bidder_seat(o.sender), bidder_seat(o.recipient)
                self.offers[o.offer_id] = (sender, to, o.blocks, o.price, o.side == "sell", 0)
                self.counts["offers_sent"] += sender == self.seat
                self.counts["offers_received"] += to == self.seat
        elif kind == "accept_offer" and result.get("status") == "accepted":
            o = self.offers.get(str(result.get("offer_id")))
            if o is None:
                return
            sender, to, blocks, price, sells, _ = o
            seller, buyer = (sender, to) if sells else (to, sender)
            forward = result.get("contract_id") is not None
            self.episode["trades"] += 1
            self.episode["forward_contracts"] += forward
            if self.seat in (seller, buyer):
                c = self.counts
                c["trades"] += 1
                c["forward_contracts"] += forward
                c["offers_accepted"] += sender == self.seat
                c["offers_taken"] += to == self.seat
                side = "sold" if seller == self.seat else "bought"
                c[f"blocks_{side}"] += blocks
                c[f"credits_{side}"] += price
        elif kind == "form_coalition" and result.get("coalition_id"):
            self.leaders[result["coalition_id"]] = seat
            self.episode["coalitions"] += 1
            self.counts["coalitions_formed"] += me
        elif kind == "commit_to_coalition":
            cid = getattr(action, "coalition_id", None)
            self.episode["joins"] += 1
            self.counts["joins_made"] += me
            self.counts["joins_received"] += self.leaders.get(str(cid)) == self.seat and not me

    def finish(self) -> dict[str, Any]:
        world = self.env.world
        if self.seat in {lab.seat for lab in world.labs}:
            self.counts["reputation"] = float(world.labs[lab_index(self.seat)].reputation)
        else:
            self.counts["reputation"] = math.nan
        return {"seat": dict(self.counts), "episode": dict(self.episode)}


def play_counted(
    job: tuple[Any, ...],
) -> tuple[int, list[dict[str, Any]] | None, list[Any], dict[str, Any] | None, str | None]:
    """Worker: one episode of a run folder's job -> (seed, rows, round log, negotiation line,
    error). The episode is :func:`market.run.rollout.run_episode`'s, step for step (the same
    :class:`~market.run.rollout.Episode`), so its rows are those ``gpumarket run`` records."""
    scenario, seed, seats, _, digest_every, config = job
    try:
        env = raw_env(scenario)
        episode = Episode(env, seed, seats, None, digest_every)
        best = episode_first_best(env)
        tally = Tally(env, SEAT)
        for seat, obs, live in episode.turns():
            action = error = latency = None
            if live:
                action, error, latency = episode.act(seat, obs)
            episode.step(seat, obs, live, action, latency, error)
            if live:
                tally.after(seat, action)
        result = episode.result()
    except Exception as exc:  # an agent or env bug: report it, keep the report going
        return seed, None, [], None, f"{type(exc).__name__}: {exc}"[:1000]
    line = {"config": config, "seed": seed, "first_best": best, **tally.finish()}
    return seed, episode_rows(result, config), result.round_log, line, None


# ----------------------------------------------------------------------------- cells


@dataclass
class CellData:
    """One cell's episodes: seed -> results rows (by seat), round log and negotiation line."""

    name: str  # the seat's spec, or OWN / SPOT_ONLY
    rows: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    rounds: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    lines: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return sorted(set(self.rows) & set(self.lines))

    def seat(self, seed: int) -> dict[str, Any]:
        return self.rows[seed][SEAT]


def welfare(rows: Mapping[str, Mapping[str, Any]]) -> float:
    """An episode's realised welfare: the bidder seats' ``job_value`` summed (reward units)."""
    return math.fsum(
        float(r["components"].get("job_value", 0.0))
        for seat, r in sorted(rows.items())
        if seat != DESIGNER
    )


def round_counts(rounds: Sequence[Mapping[str, Any]], seat: str = SEAT) -> dict[str, float]:
    """An episode's breaches, pool defaults and cascades, and the seat's judge grants and
    auction blocks and payments, from its round log (docs/negotiation.md)."""
    out = dict.fromkeys(
        ("breaches", "defaults", "cuts", "cascades", "granted", "won", "paid", "breached"), 0.0
    )
    for r in rounds:
        sellers = {b.get("seller") for b in r.get("breaches") or ()}
        out["breaches"] += len(r.get("breaches") or ())
        out["breached"] += sum(1 for b in r.get("breaches") or () if b.get("seller") == seat)
        cut: set[str] = set()
        for pool in r.get("pools") or ():
            out["defaults"] += len(pool.get("defaults") or {})
            cut |= set(pool.get("cut") or {})
        out["cuts"] += len(cut)
        out["cascades"] += len(cut & sellers)  # a member cut short that then breached its sale
        out["granted"] += sum(
            int(v.get("granted") or 0) for v in r.get("judge") or () if v.get("lab") == seat
        )
        out["won"] += int((r.get("won") or {}).get(seat, 0))
        out["paid"] += float((r.get("paid") or {}).get(seat, 0.0))
    return out
