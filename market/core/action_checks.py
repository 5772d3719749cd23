"""The env's semantic checks of an action, read off the acting seat's observation.

:func:`validate_for` says why the env would refuse an already parsed action, using only what the
seat's :class:`~market.environment.observations.Observation` shows (its budget, holdings,
reservations, contracts, jobs, offers, coalitions, the active labs, this round's pitches, the
phase). The env runs the same checks first (:func:`check_action`, in
:meth:`market.environment.aec.raw_env.step`), and an LLM seat runs them before it sends an action
(``agents.llm.agent``), so a reply the env would refuse goes to the repair loop instead.

The checks follow the order and the words of the env's handlers (``market.core.negotiation``,
``coalitions``, ``reservations``, ``bidding``, ``phases``): the first refusal is the env's own
reason, word for word. The rule, checked over random actions on every built-in scenario
(tests/agents/test_semantic_validation.py): ``validate_for`` returns nothing iff the env accepts
the action. Where the observation cannot tell which of two reasons the env gives, the refusal is
marked inexact (:attr:`Refusal.exact`) and the env gives its own reason instead; these are the
documented exceptions (docs/llm-seats.md, Semantic validation):

* an address (``to``, ``target``, ``members``) that is neither the seat nor an active lab: a
  seat past the market's last lab "does not exist", an inactive one "is not in the market now";
* an offer id the seat cannot see: the env says it "does not exist", or, for an offer between
  two other labs, that it is not addressed to (nor from) the seat;
* a scenario with ``capacity.max_units_per_bid`` set: the unit cap is a scenario constant the
  observation does not carry, so a caller that does not pass it checks against the round's
  capacity (every built-in scenario leaves it 0, the round's capacity).

``market.core`` may not import ``market.environment``, so the observation is read by its field
names (any object with the Observation's fields will do).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from market.core import actions as a
from market.core.coalitions import MAX_OPEN_COALITIONS
from market.core.delivery import collateral, short_part
from market.core.ledger import ActionError
from market.core.negotiation import MAX_OPEN_OFFERS
from market.core.phases import LEGAL
from market.core.seats import is_bidder_seat
from market.core.summation import ordered_sum

__all__ = ["Refusal", "check_action", "choices", "refusals", "unit_cap", "validate_for"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """One reason the env refuses an action. ``exact``: the env refuses with these very words;
    otherwise it refuses, with a reason the observation cannot tell apart (module docstring)."""

    text: str
    exact: bool = True


def unit_cap(obs: Any, max_units_per_bid: int = 0) -> int:
    """Unit bids allowed this round: the scenario's cap, else the round's capacity (at least 1)."""
    return max_units_per_bid or max(1, int(obs.capacity))


def validate_for(action: a.ActionModel, obs: Any, max_units_per_bid: int = 0) -> list[str]:
    """Why the env would refuse ``action`` from the seat that sees ``obs`` (empty: it accepts).

    The first reason is the env's own (except the module docstring's exceptions); later ones are
    further problems found on the way, when the first does not make them moot."""
    return [r.text for r in refusals(action, obs, max_units_per_bid)]


def refusals(action: a.ActionModel, obs: Any, max_units_per_bid: int = 0) -> list[Refusal]:
    """:func:`validate_for` with each reason's :attr:`Refusal.exact`."""
    return list(_checks(action, obs, max_units_per_bid))


def check_action(action: a.ActionModel, obs: Any, max_units_per_bid: int = 0) -> None:
    """The env's pre-check: raise :class:`ActionError` with the first reason when it is exact
    (else the handler that follows refuses with its own words)."""
    for refusal in _checks(action, obs, max_units_per_bid):
        if refusal.exact:
            raise ActionError(refusal.text)
        return


def choices(obs: Any, action_type: str | None = None, max_units_per_bid: int = 0) -> str:
    """The valid choices a repair needs, in one line: the ids ``action_type`` may name (all of
    them when None), the unit cap and the budget; e.g. ``offers you may accept, counter or
    reject: o3, o5; labs you may address: bidder_1, bidder_2; at most 7 unit bids this round;
    your budget: 120.00 credits``."""
    if obs.role != "bidder":
        return f"legal action types now: {', '.join(obs.legal_actions)}"
    view = _Seat(obs)

    def want(*kinds: str) -> bool:
        return action_type is None or action_type in kinds

    parts: list[str] = []

    def listed(label: str, items: list[str]) -> None:
        parts.append(f"{label}: {', '.join(items) if items else 'none'}")

    if want("accept_offer", "counter_offer", "reject_offer"):
        listed("offers you may accept, counter or reject", list(view.received))
    if want("reject_offer"):
        listed("your open offers (reject_offer withdraws one)", list(view.sent))
    if want("send_offer", "send_message", "form_coalition", "counter_pitch"):
        listed("labs you may address", sorted(view.active - {view.me}, key=_lab_order))
    if want("counter_pitch"):
        listed("labs that pitched this round", [p.lab for p in obs.pitches or ()])
    if want("commit_to_coalition"):
        listed(
            "coalitions inviting you",
            [cid for cid, c in view.coalitions.items() if view.me in c.invited],
        )
    if want("leave_coalition", "bid"):
        listed("your coalitions", list(view.coalitions))
    if want("allocate_to_job", "make_pitch", "reserve_capacity"):
        listed(
            "your active jobs (blocks still needed)",
            [f"{j.job_id} ({j.size - j.progress})" for j in obs.jobs or () if j.status == "active"],
        )
    if want("send_offer", "counter_offer", "reserve_capacity"):
        parts.append(
            f"blocks you own for rounds {view.now}..: {list(obs.holdings or [])}; "
            f"rounds run {view.now}..{view.rounds - 1}"
        )
    if want("release_capacity"):
        parts.append(f"blocks you reserved for rounds {view.now}..: {list(obs.reserved or [])}")
    if want("bid"):
        parts.append(f"at most {unit_cap(obs, max_units_per_bid)} unit bids this round")
    parts.append(f"your budget: {view.cash:.2f} credits")
    return "; ".join(parts)


def _lab_order(seat: str) -> tuple[int, str]:
    return (len(seat), seat)


# ---------------------------------------------------------------------------------------------
# the checks, in the env's order


def _checks(act: a.ActionModel, obs: Any, max_units_per_bid: int) -> Iterator[Refusal]:
    seat, phase = obs.seat, obs.phase
    if act.agent is not None and act.agent != seat:  # market.core.phases.check_turn
        yield Refusal(
            f"this action is addressed to {act.agent!r} but it is {seat}'s turn; drop 'agent' or set it to {seat!r}"
        )
        return
    legal = LEGAL[phase]
    if act.action_type not in legal:
        yield Refusal(
            f"{act.action_type} is not allowed in the {phase} phase; legal now: {', '.join(legal)}"
        )
        return
    if obs.role != "bidder":
        return
    view = _Seat(obs)
    match act:
        case a.SendOffer():
            yield from view.send_offer(act)
        case a.CounterOffer():
            yield from view.counter(act)
        case a.AcceptOffer():
            yield from view.accept(act)
        case a.RejectOffer():
            yield from view.reject(act)
        case a.FormCoalition():
            yield from view.form(act)
        case a.CommitToCoalition():
            yield from view.commit(act)
        case a.LeaveCoalition():
            if act.coalition_id not in view.coalitions:
                yield Refusal(f"you are not in coalition {act.coalition_id!r}")
        case a.SendMessage():
            yield from view.message(act)
        case a.MakePitch():
            yield from view.pitch(act)
        case a.CounterPitch():
            yield from view.counter_pitch(act)
        case a.ReserveCapacity():
            yield from view.reserve(act)
        case a.ReleaseCapacity():
            yield from view.release(act)
        case a.AllocateToJob():
            yield from view.allocate(act)
        case a.Bid():
            yield from view.bid(act, unit_cap(obs, max_units_per_bid))


class _Seat:
    """A bidder's observation, indexed for the checks."""

    def __init__(self, obs: Any) -> None:
        self.obs = obs
        self.me = obs.seat
        self.now = int(obs.round)
        self.rounds = int(obs.rounds_total)
        self.cash = float(obs.budget or 0.0)
        self.received = {o.offer_id: o for o in obs.offers_received or ()}
        self.sent = {o.offer_id: o for o in obs.offers_sent or ()}
        self.closed = {o.offer_id: o for o in obs.closed_offers or ()}
        self.coalitions = {c.coalition_id: c for c in obs.coalitions or ()}
        self.public = {c.coalition_id: c for c in obs.public_coalitions or ()}
        self.active = set(obs.active_labs)

    # --- shared pieces (negotiation.py's helpers) -------------------------------------------
    def address(self, seat: str, field_name: str) -> Refusal | None:
        """``_active_counterparty``: another lab in the market now."""
        if not is_bidder_seat(seat):
            return Refusal(f"{field_name} must be a bidder seat such as 'bidder_1', got {seat!r}")
        if seat == self.me:
            return Refusal(f"{field_name} is yourself; address another lab")
        if seat not in self.active:
            return Refusal(
                f"{seat} is not in the market now; pick an active lab from the observation",
                exact=False,
            )
        return None

    def round_range(self, name: str, r: int) -> Refusal | None:
        if not self.now <= r < self.rounds:
            return Refusal(
                f"{name} must be between the current round {self.now} and the last round {self.rounds - 1}"
            )
        return None

    def owned(self, r: int) -> int:
        holdings = self.obs.holdings or []
        k = r - self.now
        return int(holdings[k]) if 0 <= k < len(holdings) else 0

    def reserved(self, r: int) -> int:
        reserved = self.obs.reserved or []
        k = r - self.now
        return int(reserved[k]) if 0 <= k < len(reserved) else 0

    def committed(self, r: int) -> int:
        """Blocks promised on open forward contracts for round ``r`` (the seat's contracts)."""
        return int(
            ordered_sum(
                c.blocks
                for c in self.obs.contracts or ()
                if c.seller == self.me and c.delivery_round == r
            )
        )

    def can_deliver(self, blocks: int, r: int) -> Refusal | None:
        """``_check_can_deliver`` for the seat itself."""
        free = self.owned(r) - self.committed(r)
        reserved = self.reserved(r)
        if free - reserved < blocks:
            kept = f" (and {reserved} reserved: release_capacity frees them)" if reserved else ""
            free = max(free - reserved, 0) if reserved else free
            return Refusal(
                f"you own {free} uncommitted block(s) for round {r}{kept}, not {blocks}; "
                f"offer at most {max(free, 0)} or buy blocks first"
            )
        return None

    def can_pay(self, price: float) -> Refusal | None:
        if self.cash + 1e-9 < price:
            return Refusal(f"you have {self.cash:.2f} credits, not {price:.2f}; lower the price")
        return None

    def short_sale(self, blocks: int, price: float, r: int) -> Refusal | None:
        """``market.core.delivery.check_short_sale`` for the seat itself."""
        spec = self.obs.delivery
        if spec is None or not spec.short_sales:
            return Refusal(
                "short sales are off in this scenario (delivery.short_sales = false); "
                "offer only blocks you own, without 'short'"
            )
        if r <= self.now:
            return Refusal(
                f"a short sale must be forward: set delivery_round after the current round {self.now}"
            )
        committed = self.committed(r) + self.reserved(r)
        short = short_part(self.owned(r), committed, blocks)
        need = collateral(spec, price, blocks, short)
        if self.cash + price + 1e-9 < need:
            return Refusal(
                f"you would post {need:.2f} credits of collateral for {short} short block(s) but "
                f"have {self.cash:.2f} (plus the price {price:.2f}); "
                "sell fewer blocks or at a lower price"
            )
        return None

    def give_leg(self, give_blocks: int, give_round: int | None) -> Iterator[Refusal]:
        if not give_blocks:
            return
        r = self.now if give_round is None else give_round
        yield from _some(self.round_range("give_round", r))
        if self.now <= r < self.rounds:
            yield from _some(self.can_deliver(give_blocks, r))

    def offer_to_me(self, offer_id: str, verb: str) -> tuple[Any, Refusal | None]:
        """``_open_offer_to_me``: an open offer in offers_received."""
        offer = self.received.get(offer_id)
        if offer is not None:
            return offer, None
        seen = self.closed.get(offer_id) or self.sent.get(offer_id)
        if seen is None:
            return None, Refusal(
                f"offer {offer_id!r} does not exist; use an offer_id from offers_received",
                exact=False,
            )
        if seen.recipient != self.me:
            return None, Refusal(
                f"offer {offer_id} is not addressed to you; you can only {verb} offers in offers_received"
            )
        return None, Refusal(
            f"offer {offer_id} is already {seen.status}; it can no longer be {verb}ed"
        )

    def open_offers(self) -> Refusal | None:
        if len(self.sent) >= MAX_OPEN_OFFERS:
            return Refusal(
                f"you already have {MAX_OPEN_OFFERS} open offers; wait for replies or withdraw one with reject_offer"
            )
        return None

    # --- one method per action (the handler's order) ----------------------------------------
    def send_offer(self, act: a.SendOffer) -> Iterator[Refusal]:
        bad = self.address(act.to, "to")
        if bad is not None:
            yield bad
            return
        delivery = self.now if act.delivery_round is None else act.delivery_round
        yield from _some(self.round_range("delivery_round", delivery))
        yield from _some(self.open_offers())
        yield from self.give_leg(act.give_blocks, act.give_round)
        if not self.now <= delivery < self.rounds:
            return
        if act.side == "sell" and act.short:
            yield from _some(self.short_sale(act.blocks, act.price, delivery))
        elif act.side == "sell":
            yield from _some(self.can_deliver(act.blocks, delivery))
        else:
            yield from _some(self.can_pay(act.price))

    def counter(self, act: a.CounterOffer) -> Iterator[Refusal]:
        original, bad = self.offer_to_me(act.offer_id, "counter")
        if bad is not None:
            yield bad
            return
        side = "buy" if original.side == "sell" else "sell"
        yield from _some(self.open_offers())
        if act.give_blocks and side != "buy":
            yield Refusal(
                f"offer {original.offer_id} is a buy offer, so your counter sells; a swap's "
                "give_blocks go with a counter that buys: drop them (blocks = what you sell)"
            )
            return
        yield from self.give_leg(act.give_blocks, act.give_round)
        if side == "sell":
            yield from _some(self.can_deliver(act.blocks, original.delivery_round))
        else:
            yield from _some(self.can_pay(act.price))

    def accept(self, act: a.AcceptOffer) -> Iterator[Refusal]:
        offer, bad = self.offer_to_me(act.offer_id, "accept")
        if bad is not None:
            yield bad
            return
        if offer.expires_round < self.now:
            yield Refusal(
                f"offer {offer.offer_id} expired at the end of round {offer.expires_round}"
            )
            return
        if offer.sender not in self.active:
            return  # the env voids the offer: not a refusal
        if offer.side == "buy":  # the sender buys: the seat sells
            yield from _some(self.can_deliver(offer.blocks, offer.delivery_round))
        else:
            yield from _some(self.can_pay(offer.price))

    def reject(self, act: a.RejectOffer) -> Iterator[Refusal]:
        if act.offer_id in self.received or act.offer_id in self.sent:
            return
        closed = self.closed.get(act.offer_id)
        if closed is not None:
            yield Refusal(f"offer {act.offer_id} is already {closed.status}")
            return
        yield Refusal(
            f"offer {act.offer_id!r} does not exist; use an offer_id from your observation",
            exact=False,
        )

    def form(self, act: a.FormCoalition) -> Iterator[Refusal]:
        for seat in act.members:
            if not is_bidder_seat(seat):
                yield Refusal(f"members must be a bidder seat such as 'bidder_1', got {seat!r}")
                return
            if seat == self.me:
                yield Refusal("members lists yourself; list only the labs you invite")
                return
            if seat not in self.active:
                yield Refusal(f"{seat} is not in the market now; invite active labs only", False)
                return
        if (
            ordered_sum(1 for c in self.coalitions.values() if c.leader == self.me)
            >= MAX_OPEN_COALITIONS
        ):
            yield Refusal(
                f"you already lead {MAX_OPEN_COALITIONS} coalitions; leave one before proposing another"
            )
        yield from _some(self.contribute(act.contribution))

    def contribute(self, amount: float) -> Refusal | None:
        if self.cash + 1e-9 < amount:
            return Refusal(f"you have {self.cash:.2f} credits, not {amount:.2f}; contribute less")
        return None

    def commit(self, act: a.CommitToCoalition) -> Iterator[Refusal]:
        cid = act.coalition_id
        c = self.coalitions.get(cid) or self.public.get(cid)
        if c is None:
            yield Refusal(
                f"coalition {cid!r} is not open; use a coalition_id from your invitations"
            )
            return
        if self.me in c.members:
            yield Refusal(f"you are already a member of {cid}")
            return
        if self.me not in c.invited:
            yield Refusal(f"you are not invited to {cid}")
            return
        yield from _some(self.contribute(act.contribution))

    def message(self, act: a.SendMessage) -> Iterator[Refusal]:
        if not act.text.strip():
            yield Refusal("text is empty; write the message in 'text'")
            return
        if act.to == "all" or act.to == ["all"]:
            return
        seats = [act.to] if isinstance(act.to, str) else act.to
        if not seats:
            yield Refusal("'to' is empty; use 'all' or a list of seats")
            return
        for s in seats:
            bad = self.address(s, "to")
            if bad is not None:
                yield bad
                return

    def pitch(self, act: a.MakePitch) -> Iterator[Refusal]:
        if not act.text.strip():
            yield Refusal("text is empty; explain to the judge why you need blocks")
        elif act.job_id is not None and not any(
            j.job_id == act.job_id and j.status == "active" for j in self.obs.jobs or ()
        ):
            yield Refusal(
                f"job_id {act.job_id!r} is not one of your active jobs; omit it or use one from your jobs"
            )

    def counter_pitch(self, act: a.CounterPitch) -> Iterator[Refusal]:
        bad = self.address(act.target, "target")
        if bad is not None:
            yield bad
        elif not any(p.lab == act.target for p in self.obs.pitches or ()):
            yield Refusal(f"{act.target} has not pitched this round; there is nothing to counter")
        elif not act.text.strip():
            yield Refusal("text is empty; say what is wrong with the pitch")

    def by_round(
        self, act: a.ReserveCapacity | a.ReleaseCapacity
    ) -> tuple[dict[int, int], dict[int, str], Refusal | None]:
        """``reservations._by_round``: blocks asked for per round and the last label of each."""
        counts: dict[int, int] = {}
        label: dict[int, str] = {}
        for name, r in act.requested(self.now):
            if not self.now <= r < self.rounds:
                return (
                    counts,
                    label,
                    Refusal(
                        f"block {name}: round {r} is not between the current round {self.now} and the last "
                        f"round {self.rounds - 1}; reserve blocks of this or a later round"
                    ),
                )
            counts[r] = counts.get(r, 0) + 1
            label[r] = name
        return counts, label, None

    def reserve(self, act: a.ReserveCapacity) -> Iterator[Refusal]:
        counts, label, bad = self.by_round(act)
        if bad is not None:
            yield bad
            return
        if act.job_id is not None and not any(
            j.job_id == act.job_id and j.status == "active" for j in self.obs.jobs or ()
        ):
            yield Refusal(
                f"job_id {act.job_id!r} is not one of your active jobs; omit it or use an "
                "active job_id from your jobs"
            )
            return
        for r, n in sorted(counts.items()):
            owned = self.owned(r)
            free = owned - self.committed(r) - self.reserved(r)
            if n > free:
                yield Refusal(
                    f"block {label[r]}: you own {owned} block(s) for round {r}, of which {max(free, 0)} "
                    f"are neither reserved nor promised on a contract, not {n}; reserve at most "
                    f"{max(free, 0)} or buy blocks first"
                )
                return

    def release(self, act: a.ReleaseCapacity) -> Iterator[Refusal]:
        counts, label, bad = self.by_round(act)
        if bad is not None:
            yield bad
            return
        for r, n in sorted(counts.items()):
            have = self.reserved(r)
            if n > have:
                yield Refusal(
                    f"block {label[r]}: you have {have} reserved block(s) for round {r}, not {n}; "
                    f"release at most {have}"
                )
                return

    def allocate(self, act: a.AllocateToJob) -> Iterator[Refusal]:
        """``market.core.bidding.check_allocation``."""
        job = next((j for j in self.obs.jobs or () if j.job_id == act.job_id), None)
        if job is None:
            yield Refusal(
                f"job_id {act.job_id!r} is not one of your jobs; use a job_id from your jobs"
            )
        elif job.status != "active":
            yield Refusal(f"job {act.job_id} is {job.status}; allocate blocks to an active job")
        elif act.blocks > job.size - job.progress:
            yield Refusal(
                f"job {act.job_id} needs only {job.size - job.progress} more block(s); allocate at most that"
            )

    def bid(self, act: a.Bid, cap: int) -> Iterator[Refusal]:
        """``market.core.bidding.RoundOrders.place_bid``."""
        if len(act.bids) > cap:
            yield Refusal(
                f"{len(act.bids)} unit bids exceed the limit of {cap} this round; bid for at most {cap} blocks"
            )
            return
        total = float(ordered_sum(act.bids))
        if act.coalition_id is None:
            if total > self.cash + 1e-9:
                yield Refusal(
                    f"your bids add up to {total:.2f} credits but you have {self.cash:.2f}; bid less so you can pay for every block you might win"
                )
            return
        c = self.coalitions.get(act.coalition_id)
        if c is None or c.status != "active" or self.me not in c.members:
            yield Refusal(f"{act.coalition_id!r} is not an active coalition you belong to")
        elif c.leader != self.me:
            yield Refusal(f"only the leader {c.leader} bids for {c.coalition_id}")
        elif self.obs.mechanism.coalition_policy == "restrict":
            yield Refusal(
                "the coalition policy is 'restrict': joint bids are forbidden; bid for yourself"
            )
        elif total > (c.pool or 0.0) + 1e-9:
            yield Refusal(
                f"the bids add up to {total:.2f} but the pool of {c.coalition_id} holds {c.pool or 0.0:.2f}"
            )


def _some(refusal: Refusal | None) -> Iterator[Refusal]:
    if refusal is not None:
        yield refusal
