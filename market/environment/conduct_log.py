"""The conduct judge in an episode: every claim, promise and manipulation attempt of every seat,
judged as play goes on (the rules: :mod:`market.core.conduct`, docs/conduct.md).

The env calls :class:`ConductLog` at three points: before an action is applied (the seat's private
truth as it spoke), after it succeeded (what it said and promised, and acts that keep or break
earlier promises), and at each round's close (contract deliveries and pool pledges, then every
promise whose due round has closed). The log only reads the market, and its entries go to the
transcript, never to an observation or an info (a verdict would reveal a seat's private truth).
At each round's close the env hands the round's false claims and broken promises
(:meth:`ConductLog.take_audit`) to the market's audit (:mod:`market.core.audit`), which costs the
speaker public reputation. With the scenario's ``rewards.conduct`` flag on, the env turns false
claims, broken promises and manipulation flags into reward components.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from market.core import actions
from market.core.conduct import (
    RUBRIC_VERSION,
    Claim,
    ConductScore,
    ManipulationFlag,
    Promise,
    PublicFacts,
    SeatTruth,
    Transfer,
    Verdict,
    judge_claim,
    judge_promise,
)
from market.core.conduct.judging import (
    structured_claims,
    structured_promises,
    text_counterparts,
    text_of,
)
from market.core.conduct.model import SeatRecord
from market.core.conduct.reading import ConductReader, RuleReader, TextReading
from market.core.negotiation import Contract, Offer
from market.core.rewards import LabComponent
from market.core.scenario_schema import RewardSpec
from market.core.seats import DESIGNER, bidder_seat, lab_index

if TYPE_CHECKING:
    from market.core.settlement import RoundResult
    from market.core.world import World

Entry = dict[str, Any]  # one JSON-ready conduct entry (the transcript's step and round lines)
# actions that can keep or break a promise (the record judge_promise reads)
_RECORDED = (
    actions.Bid,
    actions.FormCoalition,
    actions.CommitToCoalition,
    actions.LeaveCoalition,
    actions.Finish,
)
# actions that can carry text, a structured claim or a structured promise (see judging.text_of,
# structured_claims, structured_promises)
_BINDS = (
    actions.SendMessage,
    actions.SendOffer,
    actions.MakePitch,
    actions.CounterPitch,
    actions.FormCoalition,
    actions.CommitToCoalition,
)
_SCORE_SLOTS = {"true": 0, "false": 1, "kept": 2, "broken": 3}


def claim_entry(v: Verdict, method: str = "rule", model: str | None = None) -> Entry:
    """A judged claim as the transcript records it."""
    c = v.subject
    assert isinstance(c, Claim)
    entry: Entry = {
        "kind": "claim",
        "seat": c.seat,
        "round": c.round,
        "source": c.source,
        "claim": c.kind,
        "value": c.value,
        "span": c.span,
        "label": v.label,
        "reason": v.reason,
        "method": method,
        "rubric": v.rubric,
    }
    if model is not None:
        entry["model"] = model
    return entry


def promise_entry(v: Verdict, method: str = "rule", model: str | None = None) -> Entry:
    """A promise and its verdict so far (``pending``, ``kept`` or ``broken``)."""
    p = v.subject
    assert isinstance(p, Promise)
    entry: Entry = {
        "kind": "promise",
        "seat": p.seat,
        "round": p.round,
        "source": p.source,
        "promise": p.kind,
        "counterparts": list(p.counterparts),
        "due_round": p.due_round,
        "amount": p.amount,
        "ref": p.ref,
        "span": p.span,
        "label": v.label,
        "reason": v.reason,
        "method": method,
        "rubric": v.rubric,
    }
    if model is not None:
        entry["model"] = model
    return entry


def flag_entry(
    f: ManipulationFlag,
    method: str = "rule",
    model: str | None = None,
    rubric: str = RUBRIC_VERSION,
) -> Entry:
    """A manipulation flag as the transcript records it (a flag is the reader's own verdict, so
    it carries the reader's rubric: ``conduct-llm-1`` for a model's reading)."""
    entry: Entry = {
        "kind": "flag",
        "seat": f.seat,
        "round": f.round,
        "flag": f.kind,
        "span": f.span,
        "reason": f.reason,
        "method": method,
        "rubric": rubric,
    }
    if model is not None:
        entry["model"] = model
    return entry


def score_dict(s: ConductScore) -> dict[str, Any]:
    """A seat's :class:`ConductScore` as JSON (counts and the two ratios)."""
    return {
        "claims_true": s.claims_true,
        "claims_false": s.claims_false,
        "promises_kept": s.promises_kept,
        "promises_broken": s.promises_broken,
        "manipulation_attempts": s.manipulation_attempts,
        "truthfulness": s.truthfulness,
        "promise_keeping": s.promise_keeping,
    }


@dataclass(slots=True)
class _Open:
    """A promise not yet decided, with who read it (for its entries)."""

    promise: Promise
    method: str
    model: str | None
    listed: bool = False  # its pending entry is in a step's entries


#: the conduct counters' slots that carry a penalty, and its reward component
_PENALISED: dict[int, LabComponent] = {1: "false_claim", 3: "broken_promise", 4: "manipulation"}


@dataclass
class ConductLog:
    """Judges one episode's conduct (see the module docstring). ``step_entries`` holds the last
    step's entries, ``rounds`` one ``{"verdicts", "scores"}`` per closed round."""

    reader: ConductReader = field(default_factory=RuleReader)
    step_entries: list[Entry] = field(default_factory=list)
    step_exchanges: list[dict[str, Any]] = field(default_factory=list)  # a model reader's
    rounds: list[dict[str, Any]] = field(default_factory=list)
    # seat -> [claims true, claims false, kept, broken, flags]
    _counts: dict[str, list[int]] = field(default_factory=dict)
    _open: list[_Open] = field(default_factory=list)
    _actions: dict[str, list[tuple[int, actions.ActionModel]]] = field(default_factory=dict)
    _transfers: dict[str, list[Transfer]] = field(default_factory=dict)
    _truth: SeatTruth | None = None
    _penalties: list[tuple[str, LabComponent]] = field(default_factory=list)
    _offer_of: dict[str, str] = field(default_factory=dict)  # contract id -> offer id
    _excused: dict[str, str] = field(default_factory=dict)  # offer id -> why
    # (seat, coalition id) -> why, for pledges whose every default failed blocks explain
    _pledge_excused: dict[tuple[str, str], str] = field(default_factory=dict)
    _pledge_unexcused: set[tuple[str, str]] = field(default_factory=set)
    _delivered: set[str] = field(default_factory=set)  # contract ids whose delivery is recorded
    _audit: list[Entry] = field(default_factory=list)  # false and broken since the last close
    # replay with another reader (``--rejudge``): the recorded readings' log, whose verdicts the
    # market's audit keeps reading so the market replays exactly (see take_audit)
    market: ConductLog | None = None

    @property
    def name(self) -> str:
        """The reader's name (recorded in the transcript header as ``conduct_judge``)."""
        return str(getattr(self.reader, "name", type(self.reader).__name__))

    # --- scores ------------------------------------------------------------------------
    def scores(self) -> dict[str, ConductScore]:
        """Per-seat conduct so far (seats that said or promised nothing judged are absent)."""
        return {seat: ConductScore(*row) for seat, row in sorted(self._counts.items())}

    def score_dicts(self) -> dict[str, dict[str, Any]]:
        """:meth:`scores` as JSON."""
        return {seat: score_dict(s) for seat, s in self.scores().items()}

    def penalties(self, spec: RewardSpec) -> list[tuple[str, LabComponent, float]]:
        """The conduct reward: (seat, component, cost) of each false claim, broken promise and
        manipulation flag since the last call, costed by the scenario's penalties; none while
        ``rewards.conduct`` is off (the default), so judging changes no reward."""
        taken, self._penalties = self._penalties, []
        if not spec.conduct:
            return []
        cost = {
            "false_claim": spec.false_claim_penalty,
            "broken_promise": spec.broken_promise_penalty,
            "manipulation": spec.manipulation_penalty,
        }
        return [(seat, component, cost[component]) for seat, component in taken]

    def take_audit(self) -> list[Entry]:
        """The claims judged false and promises decided broken since the last call (the env
        calls it at each round's close, after :meth:`round_closed`, for the market's audit);
        with a ``market`` log set, that log's instead."""
        if self.market is not None:
            self._audit = []
            return self.market.take_audit()
        taken, self._audit = self._audit, []
        return taken

    def _count(self, seat: str, slot: int) -> None:
        self._counts.setdefault(seat, [0] * 5)[slot] += 1
        component = _PENALISED.get(slot)
        if component is not None:
            self._penalties.append((seat, component))

    # --- the env's hooks ---------------------------------------------------------------
    def begin_step(self) -> None:
        """A new step: its entries start empty."""
        self.step_entries = []
        self.step_exchanges = []
        self._truth = None
        if self.market is not None:
            self.market.begin_step()

    def before_action(self, world: World, seat: str, act: actions.ActionModel, now: int) -> None:
        """Note the seat's private truth as it speaks (only for actions that can make a claim)."""
        if self.market is not None:
            self.market.before_action(world, seat, act, now)
        if seat == DESIGNER:
            return
        if isinstance(act, _BINDS):
            lab = world.labs[lab_index(seat)]
            self._truth = SeatTruth.of(lab, int(world.holdings[lab.index, now]))

    def after_action(
        self,
        seat: str,
        act: actions.ActionModel,
        result: dict[str, object],
        now: int,
        results: list[RoundResult],
    ) -> None:
        """Judge what a successful action said and promised, and the promises it keeps or breaks
        (``results``: the rounds closed so far, for the public facts a text may misstate)."""
        if self.market is not None:
            self.market.after_action(seat, act, result, now, results)
        if seat == DESIGNER:
            return
        if isinstance(act, _RECORDED):
            self._actions.setdefault(seat, []).append((now, act))
        if not isinstance(act, _BINDS):  # no text, claim or promise: it can only decide one
            if self._open:
                self._settle(seat, now, self.step_entries)
            return
        ref = result.get("coalition_id") if isinstance(act, actions.FormCoalition) else None
        promises = structured_promises(seat, now, act, str(ref) if ref is not None else None)
        if isinstance(act, actions.SendOffer):
            promises = []  # an offer binds only once accepted (see accepted)
        claims = structured_claims(seat, now, act)
        reading = TextReading()
        said = text_of(act)
        if said is not None and said[1].strip():
            facts = public_facts(now, results)
            reading = self.reader.read(seat, now, said[0], said[1], text_counterparts(act), facts)
            if reading.exchange is not None:
                self.step_exchanges.append(dict(reading.exchange))
        truth = self._truth
        if truth is not None:
            for c in claims:
                self._claim(judge_claim(c, truth), "rule", None)
            for c in reading.claims:
                self._claim(judge_claim(c, truth), reading.method, reading.model)
        for f in reading.flags:
            self._count(f.seat, 4)
            self.step_entries.append(flag_entry(f, reading.method, reading.model, reading.rubric))
        for p in promises:
            self._promise(p, "rule", None)
        for p in reading.promises:
            self._promise(p, reading.method, reading.model)
        self._settle(seat, now, self.step_entries)

    def accepted(self, offer: Offer, contract: Contract | None, now: int) -> None:
        """An accepted offer binds both sides: the seller to deliver its blocks at the delivery
        round, the buyer to pay its price (credits move at acceptance; spot blocks too, and a
        later round's blocks become ``contract``)."""
        if self.market is not None:
            self.market.accepted(offer, contract, now)
        seller, buyer = bidder_seat(offer.seller), bidder_seat(offer.buyer)
        self._transfer(Transfer(now, buyer, seller, credits=offer.price))
        if contract is None:
            self._transfer(Transfer(now, seller, buyer, blocks=offer.blocks))
        else:
            self._offer_of[contract.contract_id] = offer.offer_id
        ref = offer.offer_id
        deliver = Promise(
            seller, now, "action", "deliver", (buyer,), offer.delivery_round, float(offer.blocks),
            ref, False, "accepted offer",
        )  # fmt: skip
        pay = Promise(
            buyer, now, "action", "pay", (seller,), now, float(offer.price), ref, False,
            "accepted offer",
        )  # fmt: skip
        for p in (deliver, pay):
            self._promise(p, "rule", None)
        self._settle(None, now, self.step_entries)

    def round_closed(self, result: RoundResult, contracts: list[Contract]) -> None:
        """Record the round's contract deliveries and pledges, then decide every promise the
        close decides (due round closed, or fulfilled); appends the round's record to ``rounds``."""
        if self.market is not None:
            self.market.round_closed(result, contracts)
        now = result.round
        for contract in contracts:
            # due now, or settled early because a party left the market (delivered before its
            # round: the promise is kept by that round)
            settled = contract.delivery_round == now or contract.delivered >= 0
            if settled and contract.delivered > 0 and contract.contract_id not in self._delivered:
                self._delivered.add(contract.contract_id)
                self._transfer(
                    Transfer(
                        now,
                        bidder_seat(contract.seller),
                        bidder_seat(contract.buyer),
                        blocks=int(contract.delivered),
                    )
                )
        failed = {f.lab: len(f.slots) for f in result.failures}
        for b in result.breaches:  # a shortfall that failed blocks explain is no broken word
            c = b.contract
            if c.contract_id in self._offer_of and 0 < b.shortfall <= failed.get(c.seller, 0):
                self._excused[self._offer_of[c.contract_id]] = (
                    f"{b.shortfall} of {c.blocks} blocks short: {failed[c.seller]} of its blocks "
                    f"failed in round {now} (delivery risk)"
                )
        for pool in result.pools:
            for member, short in sorted(pool.defaults.items()):  # as for breaches above
                key = (bidder_seat(member), pool.coalition_id)
                if short <= failed.get(member, 0):
                    self._pledge_excused.setdefault(
                        key,
                        f"pledge {short} short in round {now}: {failed[member]} of its blocks "
                        "failed (delivery risk)",
                    )
                else:
                    self._pledge_unexcused.add(key)
            for member, given in sorted(pool.given.items()):
                if given:
                    self._transfer(Transfer(now, bidder_seat(member), pool.coalition_id, given))
        # a pledge is owed only to a pool that settles: one no member joined, or that dissolved,
        # called for no block this round
        pools_settled = {pool.coalition_id for pool in result.pools}
        for o in self._open:
            p = o.promise
            if (
                p.every_round
                and p.ref
                and p.ref not in pools_settled
                and p.round <= now <= p.due_round
            ):
                self._pledge_excused.setdefault(
                    (p.seat, p.ref),
                    f"pledge to {p.ref} not called in round {now}: its pool did not settle "
                    "(no member joined, or it dissolved)",
                )
        verdicts: list[Entry] = []
        self._settle(None, now + 1, verdicts)
        self.rounds.append({"verdicts": verdicts, "scores": self.score_dicts()})

    # --- internals ---------------------------------------------------------------------
    def _claim(self, v: Verdict, method: str, model: str | None) -> None:
        if v.label in _SCORE_SLOTS:
            self._count(v.subject.seat, _SCORE_SLOTS[v.label])
        entry = claim_entry(v, method, model)
        self.step_entries.append(entry)
        if v.label == "false":
            self._audit.append(entry)

    def _promise(self, p: Promise, method: str, model: str | None) -> None:
        self._open.append(_Open(p, method, model))

    def _transfer(self, t: Transfer) -> None:
        self._transfers.setdefault(t.sender, []).append(t)

    def _settle(self, seat: str | None, now: int, out: list[Entry]) -> None:
        """Judge the open promises (of ``seat`` only, or all): a decided one leaves the open list
        with its entry in ``out``; one made this step is listed as pending."""
        still: list[_Open] = []
        for o in self._open:
            p = o.promise
            if seat is not None and p.seat != seat:
                still.append(o)
                continue
            record = SeatRecord(
                tuple(self._actions.get(p.seat, ())), tuple(self._transfers.get(p.seat, ()))
            )
            v = judge_promise(p, record, now)
            if v.label == "broken" and p.kind == "deliver":
                v = self._excuse(p, v)
            if v.label in ("kept", "broken", "excused"):
                if v.label in _SCORE_SLOTS:  # an excused promise is not held against the seat
                    self._count(p.seat, _SCORE_SLOTS[v.label])
                entry = promise_entry(v, o.method, o.model)
                out.append(entry)
                if v.label == "broken":
                    self._audit.append(entry)
            else:
                still.append(o)
                if not o.listed and out is self.step_entries:
                    o.listed = True
                    out.append(promise_entry(v, o.method, o.model))
        self._open = still

    def _excuse(self, p: Promise, v: Verdict) -> Verdict:
        """A broken delivery that failed blocks explain: a contract's shortfall, or a pledge
        whose every short round was a default its failed blocks cover."""
        if not p.every_round:
            why = self._excused.get(p.ref) if p.ref is not None else None
        else:
            key = (p.seat, p.ref or "")
            why = None if key in self._pledge_unexcused else self._pledge_excused.get(key)
        return v if why is None else Verdict(p, "excused", why)


def public_facts(round: int, results: list[RoundResult]) -> PublicFacts:
    """What every seat can see and so can misstate: the round, and the last clearing's reserve
    and price where that round's mechanism revealed them (as observations show them)."""
    if not results:
        return PublicFacts(round)
    r = results[-1]
    m = r.mechanism
    reserve = r.reserve if m.reveal_reserve else None
    price = r.price if m.reveal_clearing_price and (r.sold or m.reveal_reserve) else None
    return PublicFacts(round, reserve, price)
