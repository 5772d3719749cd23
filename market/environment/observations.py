"""Per-seat observations: pydantic models with a prompt rendering and a fixed-size vector.

A seat sees its own private state, the public market view, what is addressed to it, and what the
mechanism reveals. Nothing private to another lab (jobs, values, budgets, pool balances of
coalitions it is not in) and never the seed. Observations are built lazily, only for the seat that
asks, with ``model_construct`` from already-validated state (no copies of env internals).
"""

from __future__ import annotations

import json
import math
from typing import ClassVar, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from market.core.summation import ordered_sum
from market.core.trust import quote_untrusted

Phase = Literal["design", "negotiation", "bidding", "done"]
PHASES: tuple[str, ...] = ("design", "negotiation", "bidding", "done")
M = TypeVar("M", bound=BaseModel)
MAX_JOBS_IN_VECTOR = 4
HOLDINGS_AHEAD = 3
#: feedback fields (the seat's last step's verdict, its offers closed this round): left out of
#: the transcript's ``obs_digest`` (:func:`digest_json`), so transcripts recorded before they
#: existed still replay exactly; the step's info and the state digest record what they show
FEEDBACK_FIELDS = frozenset({"last_action", "closed_offers"})


class _View(BaseModel):
    model_config = ConfigDict(frozen=True)


class JobView(_View):
    job_id: str
    size: int
    progress: int
    deadline: int
    value: float
    partial_credit: bool
    min_reliability: float
    status: str


class OfferView(_View):
    offer_id: str
    sender: str
    recipient: str
    side: str
    blocks: int
    price: float
    delivery_round: int
    expires_round: int
    status: str
    message: str | None = None
    short: bool = False  # a short forward sale: the seller may not own the blocks yet
    # a swap (buy offers only): the sender also hands over give_blocks of give_round; left out
    # of the JSON when absent, so observations without swaps keep their bytes (obs digests)
    give_blocks: int | None = Field(None, exclude_if=lambda v: v is None)
    give_round: int | None = Field(None, exclude_if=lambda v: v is None)


class ContractView(_View):
    contract_id: str
    seller: str
    buyer: str
    blocks: int
    price: float
    delivery_round: int
    short: int = 0  # blocks sold short (delivery risk)
    collateral: float = 0.0  # credits the seller posted for them


class DeliveryView(_View):
    """Delivery risk as this lab sees it (docs/world.md, Delivery risk): the rules, this round's
    probability that an owned block fails, and its own blocks that failed last round."""

    failure_rate: float  # this round's p_r (from the public capacity and reliability)
    base_failure_rate: float
    outage_exposure: float
    reliability_exposure: float
    short_sales: bool
    collateral_fraction: float
    collateral_per_block: float
    breach_compensation: float
    collateral_held: float  # the lab's collateral posted on open short contracts
    failed_last_round: int = 0  # its blocks that failed at the last close
    failed_block_ids: list[str] = []


class CoalitionView(_View):
    coalition_id: str
    leader: str
    members: list[str]
    invited: list[str]
    purpose: str
    split: str
    term_end: int
    status: str
    pool: float | None = None  # members only
    my_balance: float | None = None


class MessageView(_View):
    sender: str
    to: str | list[str]
    text: str
    round: int


class PitchView(_View):
    lab: str
    text: str
    blocks_requested: int
    counters: list[str]


class ShockView(_View):
    kind: str
    round: int
    duration: int
    magnitude: float
    target: str | None
    public: bool


class MarketResultView(_View):
    """Last round's clearing, as far as the mechanism reveals it."""

    round: int
    auction_type: str
    blocks_sold: int
    clearing_price: float | None = None
    reserve: float | None = None
    winners: dict[str, int] | None = None
    competing_bids: list[list[float]] | None = None  # anonymised unless winners are revealed
    bid_distribution: dict[str, float] | None = None
    my_won: int = 0
    my_paid: float = 0.0
    judge_grants: dict[str, int] | None = None


class LastActionView(_View):
    """What the env said about the seat's own previous action (from that step's info).

    ``action_type`` is None when the action could not be read at all (not JSON, no such type).
    When ``accepted`` is false, ``error`` is the env's reason, word for word, and ``penalty`` the
    invalid-action penalty it cost (reward units, a positive number); the action changed nothing.
    """

    round: int
    phase: str
    action_type: str | None
    accepted: bool
    error: str | None = None
    penalty: float = 0.0
    result: dict[str, JsonValue] | None = None  # what the env reported back (accepted actions)

    def sentence(self) -> str:
        """The verdict in one plain line, e.g. ``Your last action (accept_offer, round 1,
        negotiation) was refused: ...; it cost 0.05.``"""
        what = self.action_type or "an action that could not be read"
        head = f"Your last action ({what}, round {self.round}, {self.phase})"
        if not self.accepted:
            return f"{head} was refused: {self.error}; it cost {self.penalty:g}."
        # the designer's whole mechanism is in the prompt already
        shown = {k: v for k, v in (self.result or {}).items() if k != "mechanism"}
        return f"{head} was accepted" + (
            f": {json.dumps(shown, separators=(',', ':'))}." if shown else "."
        )


class MechanismView(_View):
    auction_type: str
    reserve_price: float | None  # None when the reserve is hidden
    reveal_reserve: bool
    reveal_competing_bids: bool
    reveal_winner_identity: bool
    reveal_clearing_price: bool
    reveal_bid_distribution: bool
    shill_penalty: float
    withdrawal_penalty: float
    collusion_penalty: float
    coalition_policy: str
    judge_pool_share: float


class DesignerStats(_View):
    """Market-health signals the operator sees (aggregates only, no lab's private state)."""

    welfare_ratio: list[float]
    fairness: list[float]
    participation: list[float]
    stability: list[float]
    revenue: list[float]
    prices: list[float]
    suspected_cartels: int
    active_labs: int


class Observation(BaseModel):
    """What one seat sees when it is its turn."""

    model_config = ConfigDict(frozen=True)
    # PettingZoo's api_test compares space.dtype with observation.dtype; this is a structured object.
    dtype: ClassVar[None] = None

    seat: str
    role: Literal["designer", "bidder"]
    round: int
    rounds_total: int
    value_unit: float  # credits per reward unit (public scenario constant; scales the vector)
    phase: Phase
    legal_actions: list[str]
    mechanism: MechanismView
    capacity: int
    reliability: float
    energy_floor: float
    active_labs: list[str]
    reputations: dict[str, float]
    public_coalitions: list[CoalitionView]
    messages: list[MessageView]
    pitches: list[PitchView]
    shocks: list[ShockView]
    price_history: list[float | None]
    last_result: MarketResultView | None = None
    # private to the seat (bidders)
    budget: float | None = None
    reputation: float | None = None
    holdings: list[int] | None = None  # blocks owned for rounds round, round+1, ...
    reserved: list[int] | None = None  # of those, blocks reserved (reserve_capacity), same rounds
    jobs: list[JobView] | None = None
    offers_received: list[OfferView] | None = None
    offers_sent: list[OfferView] | None = None
    # this round's offers to or from the seat that are no longer open (feedback: FEEDBACK_FIELDS)
    closed_offers: list[OfferView] | None = None
    contracts: list[ContractView] | None = None
    coalitions: list[CoalitionView] | None = None
    delivery: DeliveryView | None = None  # delivery risk (bidders)
    # the designer's market view
    designer_stats: DesignerStats | None = None
    # feedback on the seat's own previous action (None before its first action), from that
    # step's info: left out of the transcript's obs digest, as closed_offers (FEEDBACK_FIELDS)
    last_action: LastActionView | None = None

    def to_prompt(self) -> str:
        """A compact text rendering for LLM seats (JSON sections with short headings).

        Trust boundary (:mod:`market.core.trust`): structured data is compact JSON; every
        free text another seat wrote (messages, pitches, counter-pitches, offer notes, coalition
        purposes) is left out of the JSON and shown only as a quoted ``[untrusted ...]`` block
        naming its sender, so no text can pose as the prompt's own instructions. The seat's own
        texts are shown plainly.
        """
        quotes: list[str] = []

        def dump(value: object, drop: str | None = None) -> str:
            if isinstance(value, BaseModel):
                value = value.model_dump(exclude_none=True)
            elif isinstance(value, list):
                value = [
                    v.model_dump(exclude_none=True) if isinstance(v, BaseModel) else v
                    for v in value
                ]
            if drop is not None and isinstance(value, list):
                value = [{k: v for k, v in d.items() if k != drop} for d in value]
            return json.dumps(value, separators=(",", ":"))

        def said(sender: str, kind: str, text: str, where: str = "") -> str:
            """Another seat's text as a quoted block; the seat's own text as a JSON string."""
            if sender == self.seat:
                return f"your {kind}{where}: {json.dumps(text)}"
            quotes.append(sender)
            return quote_untrusted(sender + where, kind, text)

        lines = [
            f"You are {self.seat} ({self.role}) in a GPU capacity market. Round {self.round} "
            f"(rounds are numbered 0..{self.rounds_total - 1}; deadlines and deliveries use these numbers), "
            f"phase: {self.phase}.",
            *([self.last_action.sentence()] if self.last_action is not None else []),
            f"Legal action types now: {', '.join(self.legal_actions)}.",
            f"Mechanism in force: {dump(self.mechanism)}",
            f"This round: {self.capacity} blocks released, block reliability {self.reliability:.2f}, "
            f"operator floor price {self.energy_floor:g}. Active labs: {', '.join(self.active_labs)}.",
            f"Reputations: {dump(self.reputations)}",
        ]
        if self.role == "bidder":
            lines += [
                f"Your budget: {self.budget:.2f} credits. Your reputation: {self.reputation:.3f}.",
                f"Blocks you own for rounds {self.round}, {self.round + 1}, ...: {self.holdings}",
                *(
                    [f"Of those, reserved for your own jobs (not for sale): {self.reserved}"]
                    if any(self.reserved or ())
                    else []
                ),
                f"Your jobs: {dump(self.jobs or [])}",
                f"Offers to you: {dump(self.offers_received or [], 'message')}",
                *[
                    said(o.sender, "offer note", o.message, f" on offer {o.offer_id}")
                    for o in self.offers_received or []
                    if o.message
                ],
                f"Your open offers: {dump(self.offers_sent or [])}",
                *(
                    [f"Your offers closed this round: {dump(self.closed_offers, 'message')}"]
                    if self.closed_offers
                    else []
                ),
                f"Your forward contracts: {dump(self.contracts or [])}",
                f"Your coalitions and invitations: {dump(self.coalitions or [], 'purpose')}",
                *[
                    said(c.leader, "coalition purpose", c.purpose, f" for {c.coalition_id}")
                    for c in self.coalitions or []
                    if c.purpose
                ],
            ]
            if self.delivery is not None:
                lines.append(_delivery_line(self.delivery))
        if self.designer_stats is not None:
            lines.append(f"Market health so far: {dump(self.designer_stats)}")
        if self.last_result is not None:
            lines.append(f"Last clearing: {dump(self.last_result)}")
        if self.public_coalitions:
            lines.append(f"Declared coalitions: {dump(self.public_coalitions, 'purpose')}")
            mine = {c.coalition_id for c in self.coalitions or []}
            lines += [
                said(c.leader, "coalition purpose", c.purpose, f" for {c.coalition_id}")
                for c in self.public_coalitions
                if c.purpose and c.coalition_id not in mine
            ]
        if self.shocks:
            lines.append(f"Shocks you know of: {dump(self.shocks)}")
        if self.messages:
            lines.append("Messages (oldest first):")
            for m in self.messages[-10:]:
                to = m.to if isinstance(m.to, str) else ",".join(m.to)
                lines.append(said(m.sender, "message", m.text, f" in round {m.round} to {to}"))
        if self.pitches:
            lines.append("Pitches to the judge this round:")
            for p in self.pitches:
                lines.append(said(p.lab, "pitch", p.text, f" for {p.blocks_requested} blocks"))
                for counter in p.counters:
                    author, _, text = counter.partition(": ")
                    lines.append(said(author, "counter-pitch", text, f" on {p.lab}'s pitch"))
        return "\n".join(lines)

    def to_vector(self) -> np.ndarray:
        """A fixed-size float32 vector (``vector_size()`` entries) for RL policies."""
        return observation_vector(self, self.value_unit)


def digest_json(obs: BaseModel) -> bytes:
    """The JSON bytes a transcript's ``obs_digest`` hashes: the observation without its
    :data:`FEEDBACK_FIELDS` (the serializer's own bytes, as ``model_dump_json`` would give)."""
    exclude = set(FEEDBACK_FIELDS) if isinstance(obs, Observation) else None
    return obs.__pydantic_serializer__.to_json(obs, exclude=exclude)


def _delivery_line(d: DeliveryView) -> str:
    """Delivery risk in one line of the prompt: only what applies (short sales when allowed, the
    lab's collateral and failed blocks when there are any)."""
    parts = [f"each block you own fails this round with probability {d.failure_rate:.3f}"]
    if d.short_sales:
        parts.append(
            f"short sales allowed: collateral {d.collateral_fraction:g} x price + "
            f"{d.collateral_per_block:g} a block; a breach pays the buyer "
            f"{d.breach_compensation:g} x the price of the blocks short"
        )
    if d.collateral_held:
        parts.append(f"your collateral held: {d.collateral_held:.2f}")
    if d.failed_last_round:
        parts.append(f"your blocks that failed last round: {d.failed_last_round}")
    return "Delivery risk: " + "; ".join(parts) + "."


def can_complete(job: JobView, obs: Observation) -> bool:
    """Whether a job could still finish by its deadline, as far as this seat can tell.

    A job with partial credit always pays per block. One without pays only if it finishes, so a
    block for it is worth something only if the job can still get all its remaining blocks: its
    own blocks up to the deadline plus an equal share (capacity / active labs) of each round's
    blocks, times the reliability (failed blocks must be run again).
    """
    if job.partial_credit:
        return True
    rounds = job.deadline - obs.round + 1
    own = ordered_sum((obs.holdings or [])[:rounds])
    share = max(1, obs.capacity) / max(1, len(obs.active_labs))
    return job.size - job.progress <= (own + share * rounds) * obs.reliability + 1e-9


def marginal_values(obs: Observation) -> list[float]:
    """Expected value of each extra block this round, after blocks already held; non-increasing.

    The env runs a lab's blocks on its jobs earliest deadline first (unless it plans otherwise
    with ``allocate_to_job``), so the k-th block held this round goes to the k-th remaining unit
    in deadline order: that unit's value is the job's value per block times this round's
    reliability and, where owned blocks can fail (``delivery.failure_rate``, docs/world.md), times
    the chance the block survives the round's close. Only live jobs this round's reliability can
    run, and that :func:`can_complete`, count. A bid schedule must be non-increasing, so each
    unit is capped at the value of every unit before it: winning ``n`` blocks at a price ``p`` at most the ``n``-th bid then never
    pays more than the blocks are worth (sorting by value instead would pay the best job's value
    for blocks that go to an earlier, cheaper job).
    """
    live = [
        (job.deadline, k, job)
        for k, job in enumerate(obs.jobs or ())
        if job.status == "active"
        and job.min_reliability <= obs.reliability
        and can_complete(job, obs)
    ]
    # a block bought now fails at the close with the round's public failure rate; each block
    # counts at its own survival chance (a lower bound when a failed block's unit is taken by
    # the next block, the exact value when every remaining block is needed)
    survive = 1.0 - (obs.delivery.failure_rate if obs.delivery is not None else 0.0)
    units: list[float] = []
    for _, _, job in sorted(live, key=lambda t: t[:2]):  # the env's order: deadline, then arrival
        units += [job.value / job.size * obs.reliability * survive] * (job.size - job.progress)
    held = (obs.holdings or [0])[0]
    values: list[float] = []
    cap = math.inf
    for unit in units[held:]:
        cap = min(cap, unit)
        values.append(cap)
    return values


def affordable(bids: list[float], budget: float, max_units: int) -> list[float]:
    """The longest prefix of a non-increasing schedule that fits the budget and the unit limit."""
    out: list[float] = []
    total = 0.0
    for b in bids[:max_units]:
        if total + b > budget:
            break
        b = round(b, 6)
        out.append(b)
        total += b
    return out


def fast_model(cls: type[M], /, **fields: object) -> M:
    """Build a model from trusted env state without validation (3x faster than model_construct).

    The env's state is validated where it enters (actions, scenarios); observations are built on
    every turn, so this skips re-validating it. Missing fields take their declared defaults.
    """
    cached = _DEFAULTS.get(cls)
    if cached is None:
        fields_info = cls.model_fields
        cached = _DEFAULTS[cls] = (
            {name: f.default for name, f in fields_info.items() if not f.is_required()},
            len(fields_info),
        )
    data = {**cached[0], **fields} if len(fields) < cached[1] else fields
    obj = cls.__new__(cls)
    _set(obj, "__dict__", data)
    _set(obj, "__pydantic_fields_set__", set(fields))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


_DEFAULTS: dict[type[BaseModel], tuple[dict[str, object], int]] = {}
_set = object.__setattr__  # pydantic's own __setattr__ validates: bypassed, as model_construct does


def vector_size() -> int:
    return 10 + 3 + HOLDINGS_AHEAD + 5 * MAX_JOBS_IN_VECTOR + 3 + 5


def observation_vector(obs: Observation, value_unit: float = 100.0) -> np.ndarray:
    v = np.zeros(vector_size(), dtype=np.float32)
    v[0] = obs.role == "designer"
    v[1] = obs.round / max(1, obs.rounds_total)
    v[2 + PHASES.index(obs.phase)] = 1.0
    v[6] = obs.capacity / 10.0
    v[7] = obs.reliability
    reserve = obs.mechanism.reserve_price
    v[8] = -1.0 if reserve is None else reserve / value_unit
    v[9] = (obs.price_history[-1] or 0.0) / value_unit if obs.price_history else 0.0
    k = 10
    if obs.role == "bidder":
        v[k] = (obs.budget or 0.0) / value_unit
        v[k + 1] = obs.reputation or 0.0
        v[k + 2] = len(obs.offers_received or [])
        k += 3
        for i, h in enumerate((obs.holdings or [])[:HOLDINGS_AHEAD]):
            v[k + i] = h / 10.0
        k += HOLDINGS_AHEAD
        live = [j for j in (obs.jobs or []) if j.status == "active"]
        live.sort(key=lambda j: (j.deadline, -j.value))
        for job in live[:MAX_JOBS_IN_VECTOR]:
            v[k] = (job.size - job.progress) / 10.0
            v[k + 1] = (job.deadline - obs.round + 1) / max(1, obs.rounds_total)
            v[k + 2] = job.value / job.size / value_unit
            v[k + 3] = job.partial_credit
            v[k + 4] = job.min_reliability <= obs.reliability
            k += 5
        k = 10 + 3 + HOLDINGS_AHEAD + 5 * MAX_JOBS_IN_VECTOR
        v[k] = len(obs.coalitions or [])
        v[k + 1] = len(obs.contracts or [])
        v[k + 2] = len(obs.active_labs) / 10.0
    stats = obs.designer_stats
    k = vector_size() - 5
    if stats is not None:
        for i, series in enumerate(
            (stats.welfare_ratio, stats.fairness, stats.participation, stats.stability)
        ):
            v[k + i] = series[-1] if series else 1.0
        v[k + 4] = stats.suspected_cartels
    return v
