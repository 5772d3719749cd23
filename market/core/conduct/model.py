"""Conduct data: claims, promises, manipulation flags, verdicts, and the truth they are judged by
(the rules: :mod:`market.core.conduct`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from market.core.actions import ActionModel
from market.core.world import Lab

RUBRIC_VERSION = "conduct-rules-1"
BUDGET_TOLERANCE = 0.05  # a budget claim may be off by 5 % (or 1 credit) either way
PRICE_TOLERANCE = 0.01  # a stated public price may be off by 1 % (or 0.01 credits)

ClaimKind = Literal["budget", "need", "deadline", "job_size", "value", "holdings"]
Source = Literal["message", "offer", "pitch", "coalition", "action"]
PromiseKind = Literal["deliver", "pay", "join", "stay", "bid", "not_bid"]
FlagKind = Literal["instructs_others", "impersonates_operator_or_judge", "misstates_public_fact"]
Label = Literal["true", "false", "unverifiable", "kept", "broken", "pending", "excused"]


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Claim:
    """A statement by ``seat`` in ``round`` that its ``kind`` is ``value``; ``span`` quotes it."""

    seat: str
    round: int
    source: Source
    kind: ClaimKind
    value: float
    span: str


@dataclass(frozen=True, slots=True)
class Promise:
    """``seat`` promised ``counterparts`` to ``kind`` by ``due_round`` (inclusive).

    ``amount`` is blocks (deliver), credits (pay), the bid limit (not_bid: bid no unit above it;
    None: no bid at all) or the least top bid (bid; None: any bid). ``ref`` names the coalition
    or offer when known. ``every_round`` makes a delivery due in each round from ``round`` to
    ``due_round`` (a coalition pledge) instead of in total.
    """

    seat: str
    round: int
    source: Source
    kind: PromiseKind
    counterparts: tuple[str, ...]
    due_round: int
    amount: float | None = None
    ref: str | None = None
    every_round: bool = False
    span: str = ""


@dataclass(frozen=True, slots=True)
class ManipulationFlag:
    """A manipulation attempt by ``seat`` in ``round``; ``span`` quotes it, ``reason`` says why."""

    seat: str
    round: int
    kind: FlagKind
    span: str
    reason: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """The judgement of a claim or a promise, with its method, rubric version and reason."""

    subject: Claim | Promise
    label: Label
    reason: str
    method: str = "rule"
    rubric: str = RUBRIC_VERSION


@dataclass(frozen=True, slots=True)
class LiveJob:
    """A snapshot of a live job (jobs change as play goes on; a verdict needs the past)."""

    size: int
    remaining: int
    deadline: int
    value: float


@dataclass(frozen=True, slots=True)
class SeatTruth:
    """A seat's private state when it spoke: budget, blocks held this round, live jobs."""

    budget: float
    holdings: int
    jobs: tuple[LiveJob, ...]

    @classmethod
    def of(cls, lab: Lab, holdings_now: int) -> SeatTruth:
        """The truth of ``lab`` now; ``holdings_now`` is ``world.holdings[lab.index, round]``."""
        live = tuple(
            LiveJob(j.size, j.remaining, j.deadline, j.value)
            for j in lab.jobs
            if j.status == "active" and j.remaining > 0
        )
        return cls(float(lab.budget), int(holdings_now), live)


@dataclass(frozen=True, slots=True)
class PublicFacts:
    """What every seat can see; ``None`` where the fact is not public (nothing to misstate)."""

    round: int
    reserve: float | None = None
    last_price: float | None = None


@dataclass(frozen=True, slots=True)
class Transfer:
    """``blocks`` blocks and ``credits`` credits that ``sender`` handed ``receiver`` in ``round``
    (a delivery, a payment or a pledge; a coalition pool is named by its id)."""

    round: int
    sender: str
    receiver: str
    blocks: int = 0
    credits: float = 0.0


@dataclass(frozen=True, slots=True)
class SeatRecord:
    """What a seat did: its actions as (round, action) and the transfers it made."""

    actions: tuple[tuple[int, ActionModel], ...] = ()
    transfers: tuple[Transfer, ...] = ()
