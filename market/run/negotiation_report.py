"""The negotiation report (``gpumarket eval --negotiation``): what talk, honesty, contracts and
hedging are worth in each scenario, on paired seeds. docs/negotiation.md defines every figure.

Per scenario, each *cell* is one line-up played over the same seeds, recorded in its own run
folder ``OUT/<scenario>/<cell>`` (resumable, as ``gpumarket eval``'s):

* seat cells: an agent in seat ``bidder_0``, the other seats the scenario's own: ``rule_expert``
  (and every ``--agents`` spec) and its talk-off twin (``talk_off:SPEC``, :mod:`agents.talk_off`),
  ``rule_expert?hedge=false``, each dishonest agent of :data:`HONEST_TWINS` and its honest twin;
* ``@own``: the scenario's own seats; ``@spot_only``: every bidder seat the talk-off twin of the
  scenario's own agent for it (nobody negotiates).

Figures are paired: a difference is taken seed by seed (the same worlds and the same opponents'
draws) and reported as its mean and the half-width of its 95% CI (Student t,
:func:`market.run.rollout.mean_ci95`, as in ``eval --expert-matrix``).

Besides the run folder's rows and round logs, each episode leaves one line in the folder's
``negotiation.jsonl`` (written with the episode, keyed by the folder's configuration hash): what
only the play itself shows (offers sent, accepted and refused, trades and their prices, forward
contracts, coalitions formed and joined, pitches, the seat's reputation at the end) and the
episode's first-best welfare (:func:`first_best`). Episodes run in a local process pool.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.registry import REGISTRY
from agents.talk_off import PREFIX as TALK_OFF
from market.core.seats import DESIGNER, bidder_seat, lab_index
from market.environment.aec import raw_env
from market.run.evaluation import csv_value, md_cell, seed_text, slug
from market.run.expert_matrix import matrix_scenarios
from market.run.folders import RunFolder, open_folder, read_jsonl
from market.run.jobs import ProgressFn, RunConfigError, default_workers, episode_rows, json_line
from market.run.rollout import Episode, default_seats, mean_ci95
from market.run.runner import progress_bar
from market.run.worker_pool import TaskFailed, WorkerPool
from scenarios import load_scenario
from scenarios.schema import Scenario

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
    from collections import deque

    parent: dict[int, tuple[int, int] | None] = {}  # round -> (job that reached it, its round)
    queue = deque()
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


def _seat_specs(sc: Scenario) -> dict[str, str]:
    return {s: spec for s, spec in default_seats(sc).items() if s != DESIGNER}


def cell_plan(
    sc: Scenario, agents: Sequence[str], expert: str = EXPERT
) -> dict[str, dict[str, str]]:
    """Cell name -> the seats it sets (the rest: the scenario's own)."""
    specs: list[str] = []
    for agent in dict.fromkeys([expert, *agents]):
        specs += [agent, TALK_OFF + agent]
    if expert == EXPERT:
        specs.append(HEDGE_OFF)
    for liar, honest in HONEST_TWINS:
        if liar in REGISTRY and honest in REGISTRY:
            specs += [liar, honest]
    cells = {spec: {SEAT: spec} for spec in dict.fromkeys(specs)}
    cells[OWN] = {}
    cells[SPOT_ONLY] = {s: TALK_OFF + spec for s, spec in _seat_specs(sc).items()}
    return cells


def _folder_name(cell: str) -> str:
    return cell if cell in (OWN, SPOT_ONLY) else slug(cell)


def _read_lines(folder: RunFolder) -> dict[int, dict[str, Any]]:
    lines = {}
    for line in read_jsonl(folder.out / SIDECAR):
        if (
            line is not None
            and line.get("config") == folder.config
            and line.get("seed") in folder.done
        ):
            lines[int(line["seed"])] = line
    return lines


# ----------------------------------------------------------------------------- figures


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, float, int]:
    """Mean and 95% CI half-width of ``a - b`` over the seeds both have, and how many."""
    seeds = sorted(set(a) & set(b))
    values = [a[s] - b[s] for s in seeds if math.isfinite(a[s]) and math.isfinite(b[s])]
    mean, half = mean_ci95(values)
    return mean, half, len(values)


def _mean(values: Iterable[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return math.fsum(finite) / len(finite) if finite else math.nan


def per_block(credits: Mapping[int, float], blocks: Mapping[int, float]) -> float:
    """Credits per block over all episodes (NaN without a block)."""
    total = math.fsum(blocks.values())
    return math.fsum(credits.values()) / total if total > 0 else math.nan


@dataclass
class Figure:
    """One line of negotiation.csv."""

    scenario: str
    section: str
    metric: str
    subject: str
    versus: str
    n: int
    mean: float
    ci95: float
    subject_mean: float = math.nan
    versus_mean: float = math.nan

    @property
    def low(self) -> float:
        return self.mean - self.ci95

    @property
    def high(self) -> float:
        return self.mean + self.ci95

    def text(self, digits: int = 3, percent: bool = False) -> str:
        if not math.isfinite(self.mean):
            return "n/a"
        if percent:
            return f"{100 * self.mean:+.1f}% ± {100 * self.ci95:.1f}"
        return f"{self.mean:+.{digits}f} ± {self.ci95:.{digits}f}"


KEYS = (
    "scenario",
    "section",
    "metric",
    "subject",
    "versus",
    "n",
    "mean",
    "ci95",
    "low",
    "high",
    "subject_mean",
    "versus_mean",
)


def _series(cell: CellData, get: Any) -> dict[int, float]:
    out = {}
    for s in cell.seeds:
        try:
            out[s] = float(get(s))
        except (KeyError, TypeError, ValueError):
            out[s] = math.nan
    return out


def _returns(cell: CellData) -> dict[int, float]:
    return _series(cell, lambda s: cell.seat(s)["return"])


def _diff(scenario: str, section: str, metric: str, a: CellData, b: CellData, get: Any) -> Figure:
    sa, sb = _series(a, get(a)), _series(b, get(b))
    mean, half, n = paired(sa, sb)
    return Figure(
        scenario,
        section,
        metric,
        a.name,
        b.name,
        n,
        mean,
        half,
        _mean(sa.values()),
        _mean(sb.values()),
    )


def _component(name: str) -> Any:
    return lambda c: lambda s: c.seat(s)["components"].get(name, 0.0)


def _count(name: str) -> Any:
    return lambda c: lambda s: c.lines[s]["seat"][name]


def _rounds(name: str) -> Any:
    return lambda c: lambda s: round_counts(c.rounds[s])[name]


def _conduct(name: str) -> Any:
    return lambda c: lambda s: (c.seat(s).get("conduct") or {}).get(name, 0)


#: the decomposition of a dishonest agent's loss: (metric, how a cell's seed gives it)
DECOMPOSITION: tuple[tuple[str, Any], ...] = (
    ("return", lambda c: lambda s: c.seat(s)["return"]),
    ("job_value", _component("job_value")),
    ("auction_payments", _component("auction_payments")),
    ("trade_balance", _component("trade_balance")),
    ("talk_cost", _component("talk_cost")),
    (
        "penalties",
        lambda c: (
            lambda s: math.fsum(
                v
                for k, v in c.seat(s)["components"].items()
                if k not in ("job_value", "auction_payments", "trade_balance", "talk_cost")
            )
        ),
    ),
    ("offers_sent", _count("offers_sent")),
    ("offers_accepted", _count("offers_accepted")),
    ("offers_rejected", _count("offers_rejected")),
    ("trades", _count("trades")),
    ("blocks_bought", _count("blocks_bought")),
    ("blocks_sold", _count("blocks_sold")),
    ("coalitions_formed", _count("coalitions_formed")),
    ("joins_received", _count("joins_received")),
    ("joins_made", _count("joins_made")),
    ("judge_granted", _rounds("granted")),
    ("auction_blocks", _rounds("won")),
    ("reputation", _count("reputation")),
    ("claims_false", _conduct("claims_false")),
    ("promises_broken", _conduct("promises_broken")),
)


def scenario_figures(
    scenario: str, cells: Mapping[str, CellData], talkers: Sequence[str]
) -> list[Figure]:
    """Every figure of one scenario (docs/negotiation.md defines each)."""
    out: list[Figure] = []
    ret = lambda c: lambda s: c.seat(s)["return"]  # noqa: E731
    for agent in talkers:
        out.append(
            _diff(scenario, "value_of_talk", "return", cells[agent], cells[TALK_OFF + agent], ret)
        )
    for liar, honest in HONEST_TWINS:
        if liar not in cells or honest not in cells:
            continue
        h, d = cells[honest], cells[liar]
        loss = _diff(scenario, "cost_of_lying", "return", h, d, ret)
        # the loss as a share of the honest twin's mean return (that mean taken as fixed)
        base = abs(loss.subject_mean)
        share = Figure(
            scenario,
            "cost_of_lying",
            "share",
            liar,
            honest,
            loss.n,
            loss.mean / base if base > 0 else math.nan,
            loss.ci95 / base if base > 0 else math.nan,
            loss.versus_mean,
            loss.subject_mean,
        )
        out.append(share)
        for metric, get in DECOMPOSITION:
            f = _diff(scenario, "lying_decomposition", metric, d, h, get)
            out.append(f)
        for metric, credits, blocks in (
            ("price_bought", "credits_bought", "blocks_bought"),
            ("price_sold", "credits_sold", "blocks_sold"),
        ):
            a = per_block(_series(d, _count(credits)(d)), _series(d, _count(blocks)(d)))
            b = per_block(_series(h, _count(credits)(h)), _series(h, _count(blocks)(h)))
            out.append(
                Figure(
                    scenario,
                    "lying_decomposition",
                    metric,
                    liar,
                    honest,
                    len(d.seeds),
                    a - b,
                    math.nan,
                    a,
                    b,
                )
            )
        for metric, credits, blocks in (("price_auction", "paid", "won"),):
            a = per_block(_series(d, _rounds(credits)(d)), _series(d, _rounds(blocks)(d)))
            b = per_block(_series(h, _rounds(credits)(h)), _series(h, _rounds(blocks)(h)))
            out.append(
                Figure(
                    scenario,
                    "lying_decomposition",
                    metric,
                    liar,
                    honest,
                    len(d.seeds),
                    a - b,
                    math.nan,
                    a,
                    b,
                )
            )
    if EXPERT in cells and HEDGE_OFF in cells:
        out.append(_diff(scenario, "hedging_gain", "return", cells[EXPERT], cells[HEDGE_OFF], ret))
    own, spot = cells[OWN], cells[SPOT_ONLY]
    for metric, get in (
        ("forward_contracts", lambda s: own.lines[s]["episode"]["forward_contracts"]),
        (
            "episodes_with_forward",
            lambda s: float(own.lines[s]["episode"]["forward_contracts"] > 0),
        ),
        ("trades", lambda s: own.lines[s]["episode"]["trades"]),
        ("coalition_joins", lambda s: own.lines[s]["episode"]["joins"]),
        ("breaches", lambda s: round_counts(own.rounds[s])["breaches"]),
        ("episodes_with_breach", lambda s: float(round_counts(own.rounds[s])["breaches"] > 0)),
        ("defaults", lambda s: round_counts(own.rounds[s])["defaults"]),
        ("episodes_with_default", lambda s: float(round_counts(own.rounds[s])["defaults"] > 0)),
        ("cascades", lambda s: round_counts(own.rounds[s])["cascades"]),
    ):
        values = _series(own, get)
        mean, half = mean_ci95([v for v in values.values() if math.isfinite(v)])
        out.append(Figure(scenario, "rates", metric, OWN, "", len(values), mean, half, mean))
    fb = _series(own, lambda s: own.lines[s]["first_best"])
    actual = _series(own, lambda s: welfare(own.rows[s]))
    spot_w = _series(spot, lambda s: welfare(spot.rows[s]))
    for metric, a, b, subject, versus in (
        ("negotiable", fb, spot_w, "first_best", SPOT_ONLY),
        ("captured", actual, spot_w, OWN, SPOT_ONLY),
        ("left", fb, actual, "first_best", OWN),
    ):
        mean, half, n = paired(a, b)
        out.append(
            Figure(
                scenario,
                "welfare",
                metric,
                subject,
                versus,
                n,
                mean,
                half,
                _mean(a.values()),
                _mean(b.values()),
            )
        )
    negotiable, captured = out[-3], out[-2]
    share = captured.mean / negotiable.mean if negotiable.mean > 0 else math.nan
    out.append(
        Figure(
            scenario, "welfare", "share_captured", OWN, "first_best", captured.n, share, math.nan
        )
    )
    return out


# ----------------------------------------------------------------------------- the report


@dataclass
class NegotiationReport:
    scenarios: list[str]
    seeds: list[int]
    talkers: list[str]
    figures: list[Figure]
    failed: dict[str, dict[int, str]] = field(default_factory=dict)

    def get(
        self, scenario: str, section: str, metric: str, subject: str | None = None
    ) -> Figure | None:
        for f in self.figures:
            if (f.scenario, f.section, f.metric) == (scenario, section, metric) and (
                subject is None or f.subject == subject
            ):
                return f
        return None

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(KEYS)
        for f in self.figures:
            row = {k: getattr(f, k) for k in KEYS}
            writer.writerow([csv_value(row[k]) for k in KEYS])
        return buf.getvalue()

    def headline(self) -> tuple[list[str], list[list[str]]]:
        """The summary table: one row per scenario (docs/negotiation.md, "The table")."""
        liars = [liar for liar, _ in HONEST_TWINS if any(f.subject == liar for f in self.figures)]
        head = [
            "scenario",
            *(f"talk: {a}" for a in self.talkers),
            *(f"lying: {liar}" for liar in liars),
            "forward %",
            "breach %",
            "defaults/ep",
            "cascades/ep",
            "hedging gain",
            "negotiable",
            "captured",
        ]
        rows = []
        for sc in self.scenarios:
            line = [sc]
            for a in self.talkers:
                f = self.get(sc, "value_of_talk", "return", a)
                line.append(_marked(f))
            for liar in liars:
                f = self.get(sc, "cost_of_lying", "share", liar)
                line.append(_marked(f, percent=True, beyond=0.10))
            for metric in ("episodes_with_forward", "episodes_with_breach"):
                f = self.get(sc, "rates", metric)
                line.append(f"{100 * f.mean:.0f}%" if f and math.isfinite(f.mean) else "n/a")
            for metric in ("defaults", "cascades"):
                f = self.get(sc, "rates", metric)
                line.append(f"{f.mean:.3f}" if f and math.isfinite(f.mean) else "n/a")
            line.append(_marked(self.get(sc, "hedging_gain", "return")))
            f = self.get(sc, "welfare", "negotiable")
            line.append(f.text(2) if f else "n/a")
            f = self.get(sc, "welfare", "share_captured")
            line.append(f"{100 * f.mean:.0f}%" if f and math.isfinite(f.mean) else "n/a")
            rows.append(line)
        return head, rows

    def markdown(self, plot: str | None = None) -> str:
        head, rows = self.headline()
        lines = [
            f"# Negotiation report\n\nSeat `{SEAT}`, {len(self.seeds)} paired seed(s) "
            f"({seed_text(self.seeds)}); every figure is a paired mean ± 95% CI (docs/negotiation.md). "
            "`>` marks a CI above 0 (for lying: entirely beyond a 10% loss).",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
        ]
        lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
        if plot:
            lines += ["", f"![value of talk, cost of lying and hedging gain per scenario]({plot})"]
        lines += [
            "",
            "## Where the dishonest agents' loss comes from",
            "",
            "Dishonest agent minus its honest twin, per episode (paired mean ± 95% CI); prices "
            "are credits per block over all episodes (dishonest minus honest).",
        ]
        for sc in self.scenarios:
            figs = [
                f for f in self.figures if f.scenario == sc and f.section == "lying_decomposition"
            ]
            if not figs:
                continue
            liars = list(dict.fromkeys(f.subject for f in figs))
            metrics = list(dict.fromkeys(f.metric for f in figs))
            lines += [
                "",
                f"### {sc}",
                "",
                "| metric | "
                + " | ".join(
                    f"{liar} − {next(f.versus for f in figs if f.subject == liar)}"
                    for liar in liars
                )
                + " |",
                "|---|" + "---:|" * len(liars),
            ]
            for m in metrics:
                cells = []
                for liar in liars:
                    f = next(f for f in figs if f.subject == liar and f.metric == m)
                    cells.append(
                        f.text()
                        if math.isfinite(f.ci95)
                        else (f"{f.mean:+.2f}" if math.isfinite(f.mean) else "n/a")
                    )
                lines.append(f"| {m} | " + " | ".join(md_cell(c) for c in cells) + " |")
        if self.failed:
            lines += ["", "## Episodes that failed", ""]
            lines += [
                f"- {k}: {len(v)} seed(s), e.g. {next(iter(v.values()))}"
                for k, v in self.failed.items()
            ]
        return "\n".join(lines) + "\n"

    def svg(self) -> str:
        """Value of talk, cost of lying (share) and hedging gain per scenario, with 95% CIs."""
        bars = []
        for f in self.figures:
            if (f.section, f.metric) in (
                ("value_of_talk", "return"),
                ("hedging_gain", "return"),
                ("cost_of_lying", "share"),
            ):
                label = {
                    "value_of_talk": f"talk {f.subject}",
                    "hedging_gain": "hedging gain",
                    "cost_of_lying": f"lying {f.subject} (share)",
                }[f.section]
                bars.append((f"{f.scenario}: {label}", f.mean, f.ci95))
        return bar_svg("Paired differences, mean and 95% CI", bars)


def _marked(f: Figure | None, percent: bool = False, beyond: float = 0.0) -> str:
    if f is None:
        return "n/a"
    return f.text(percent=percent) + (">" if math.isfinite(f.low) and f.low > beyond else "")


def bar_svg(title: str, bars: Sequence[tuple[str, float, float]]) -> str:
    """A standalone SVG of horizontal bars (label, mean, CI half-width) with whiskers."""
    from market.record.report.markup import h

    finite = [
        v
        for _, m, c in bars
        for v in (m - (c if math.isfinite(c) else 0), m + (c if math.isfinite(c) else 0))
        if math.isfinite(v)
    ]
    lo, hi = min([0.0, *finite]), max([0.0, *finite])
    hi = hi if hi > lo else lo + 1
    left, width, row = 300, 720, 18
    plot_w = width - left - 20
    height = 40 + row * max(1, len(bars)) + 24

    def x(v: float) -> float:
        return round(left + (v - lo) / (hi - lo) * plot_w, 2)

    parts = [h("text", title, x=10, y=18, font_size=14, font_family="sans-serif")]
    for i, (label, mean, ci) in enumerate(bars):
        y = 32 + i * row
        parts.append(
            h(
                "text",
                label,
                x=left - 6,
                y=y + 12,
                font_size=11,
                font_family="sans-serif",
                text_anchor="end",
            )
        )
        if not math.isfinite(mean):
            continue
        a, b = sorted((x(0.0), x(mean)))
        color = "#4e79a7" if mean >= 0 else "#e15759"
        parts.append(
            h("rect", x=a, y=y + 3, width=round(max(0.5, b - a), 2), height=row - 6, fill=color)
        )
        if math.isfinite(ci) and ci > 0:
            parts.append(
                h(
                    "line",
                    x1=x(mean - ci),
                    x2=x(mean + ci),
                    y1=y + row / 2,
                    y2=y + row / 2,
                    stroke="#222",
                    stroke_width=1.2,
                )
            )
    zero = x(0.0)
    parts.append(h("line", x1=zero, x2=zero, y1=28, y2=height - 22, stroke="#888"))
    for v in (lo, hi):
        parts.append(
            h(
                "text",
                f"{v:.2f}",
                x=x(v),
                y=height - 8,
                font_size=10,
                font_family="sans-serif",
                text_anchor="middle",
            )
        )
    return (
        str(
            h(
                "svg",
                parts,
                xmlns="http://www.w3.org/2000/svg",
                viewBox=f"0 0 {width} {height}",
                width=width,
                height=height,
            )
        )
        + "\n"
    )


def default_scenarios(seat: str = SEAT) -> list[str]:
    """:data:`CORE_SCENARIOS` plus every scenario of the expert matrix with a negotiation turn,
    but :data:`EXPENSIVE`."""
    names = list(CORE_SCENARIOS)
    for name in matrix_scenarios(seat):
        if (
            name not in names
            and name not in EXPENSIVE
            and load_scenario(name).negotiation_turns > 0
        ):
            names.append(name)
    return names


def negotiation_report(
    out_dir: str | Path,
    seeds: Iterable[int] = DEFAULT_SEEDS,
    *,
    scenarios: Sequence[str | Path] | None = None,
    agents: Sequence[str] = (),
    workers: int | None = None,
    progress: bool | ProgressFn = True,
    fresh: bool = False,
) -> NegotiationReport:
    """Play every cell of every scenario over ``seeds`` (resuming what ``out_dir`` holds) and
    write ``negotiation.csv``, ``negotiation.md`` and ``negotiation.svg`` there.

    ``agents``: specs whose value of talk is measured besides ``rule_expert``. Raises
    :class:`RunConfigError` for an unknown scenario or agent, or no seeds."""
    seed_list = list(dict.fromkeys(int(s) for s in seeds))
    if len(seed_list) < 2:
        raise RunConfigError("give at least two seeds (e.g. --seeds 0:60) for paired CIs")
    out = Path(out_dir)
    talkers = list(dict.fromkeys([EXPERT, *agents]))
    plan: dict[str, dict[str, RunFolder]] = {}
    for spec in default_scenarios() if scenarios is None else scenarios:
        try:
            sc = load_scenario(spec)
        except ValueError as exc:
            raise RunConfigError(str(exc)) from None
        if sc.name in plan:
            raise RunConfigError(f"scenario {sc.name!r} is listed twice")
        if SEAT not in default_seats(sc):
            raise RunConfigError(f"scenario {sc.name!r} has no seat {SEAT}")
        plan[sc.name] = {
            cell: open_folder(
                sc, seed_list, seats, out / sc.name / _folder_name(cell), False, fresh, 1
            )
            for cell, seats in cell_plan(sc, agents).items()
        }
    folders = [(sc, cell, f) for sc, cells in plan.items() for cell, f in cells.items()]
    lines = [_read_lines(f) for _, _, f in folders]
    jobs = [
        (i, seed)
        for i, (_, _, f) in enumerate(folders)
        for seed in f.seeds
        if seed not in f.done or seed not in lines[i]
    ]
    failed: dict[str, dict[int, str]] = {}
    _play_all(folders, lines, jobs, failed, workers, progress)
    figures: list[Figure] = []
    for name, cells in plan.items():
        data = {}
        for cell, f in cells.items():
            d = CellData(cell)
            index = next(i for i, (s, c, _) in enumerate(folders) if (s, c) == (name, cell))
            for seed in f.seeds:
                if seed in f.done and seed in lines[index]:
                    d.rows[seed] = {r["seat"]: r for r in f.done[seed]}
                    d.rounds[seed] = f.rounds.get(seed, [])
                    d.lines[seed] = lines[index][seed]
            data[cell] = d
        figures += scenario_figures(name, data, talkers)
    report = NegotiationReport(list(plan), seed_list, talkers, figures, failed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "negotiation.csv").write_text(report.csv(), encoding="utf-8")
    (out / "negotiation.svg").write_text(report.svg(), encoding="utf-8")
    (out / "negotiation.md").write_text(report.markdown("negotiation.svg"), encoding="utf-8")
    return report


_FOLDER_JOBS: tuple[tuple[Any, ...], ...] = ()


def _start(folder_jobs: tuple[tuple[Any, ...], ...]) -> None:
    global _FOLDER_JOBS
    _FOLDER_JOBS = folder_jobs


def _play_task(task: tuple[int, int]) -> tuple[int, Any]:
    index, seed = task
    scenario, _, seats, transcript, digest_every, config = _FOLDER_JOBS[index]
    return index, play_counted((scenario, seed, seats, transcript, digest_every, config))


def _play_all(
    folders: list[tuple[str, str, RunFolder]],
    lines: list[dict[int, dict[str, Any]]],
    jobs: list[tuple[int, int]],
    failed: dict[str, dict[int, str]],
    workers: int | None,
    progress: bool | ProgressFn,
) -> None:
    """Play ``jobs`` (folder index, seed) in a process pool, recording each episode in its run
    folder (rows, round log) and its negotiation line in the folder's sidecar."""
    total = len(jobs)
    workers = default_workers() if workers is None else max(1, int(workers))
    callback = progress if callable(progress) else None
    folder_jobs = tuple(f.job(0) for _, _, f in folders)
    pool = (
        WorkerPool(_play_task, min(workers, total), initializer=_start, initargs=(folder_jobs,))
        if workers > 1 and total > 1
        else None
    )
    if pool is None:
        _start(folder_jobs)
    bar = progress_bar(progress is True and total > 0, "negotiation")
    sidecars = [open(f.out / SIDECAR, "a", encoding="utf-8") for _, _, f in folders]  # noqa: SIM115
    for _, _, f in folders:
        f.open()
    done = 0
    try:
        with bar:
            task = bar.add_task("negotiation", total=total)
            results = (
                (
                    (jobs[pos][0], (jobs[pos][1], None, [], None, f"episode not finished: {res}"))
                    if isinstance(res, TaskFailed)
                    else res
                    for pos, res in pool.imap_unordered(jobs)
                )
                if pool is not None
                else map(_play_task, jobs)
            )
            for index, (seed, rows, rounds, line, error) in results:
                scenario, cell, folder = folders[index]
                if error is not None or rows is None or line is None:
                    failed.setdefault(f"{scenario}/{cell}", {})[seed] = error or "no result"
                else:
                    if seed not in folder.done:
                        folder.record(seed, rows, rounds)
                    elif _returns_of(folder.done[seed]) != _returns_of(rows):
                        failed.setdefault(f"{scenario}/{cell}", {})[seed] = (
                            "replayed episode differs from the run folder's"
                        )
                        continue
                    sidecars[index].write(json_line(line))
                    sidecars[index].flush()
                    lines[index][seed] = line
                done += 1
                bar.update(task, completed=done)
                if callback is not None:
                    callback(done, total)
            if pool is not None:
                pool.close()
    finally:
        if pool is not None:
            pool.terminate()
        for fh in sidecars:
            fh.close()
        for _, _, f in folders:
            f.close()


def _returns_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    return {r["seat"]: r["return"] for r in rows}


__all__ = [
    "CORE_SCENARIOS",
    "DEFAULT_SEEDS",
    "HONEST_TWINS",
    "NegotiationReport",
    "Tally",
    "default_scenarios",
    "episode_first_best",
    "first_best",
    "negotiation_report",
    "paired",
    "round_counts",
    "welfare",
]
