"""Trust: a seat's private memory of each other lab, built only from its own observations.

:class:`TrustLedger` keeps one score per lab in [0, 1]. It reads nothing but the observations it
is given (the public reputations, the seat's own open contracts, the coalitions it can see), so
any bidder may keep one; the population's trust-reading agents (``rule_expert``, ``reciprocal``,
``retaliatory``) use it to refuse, price and prefer counterparties (docs/agents.md, Trust).

The rule (:meth:`TrustLedger.observe`), applied at every observation to what changed since the
previous one, in this order (labs and ids in sorted order, so the floats never depend on hash
order):

1. *Public record.* A lab seen for the first time starts at its public reputation. Every later
   fall of its public reputation (the market's audit of false claims and broken promises, a
   breached contract or pledge, a coalition left early: all of it public) lowers its score by
   ``DROP_WEIGHT`` (2) times the fall, and is a *wrong* (:attr:`TrustLedger.wrongs`).
2. *Its own contracts.* A forward contract of the seat's that leaves the seat's view after its
   delivery round has settled. Where the seat was the buyer: if the seller's public reputation
   fell in that same observation (a short delivery costs reputation at the close that settles
   it), the seller failed it: ``-OWN_BREACH_LOSS`` and a wrong; otherwise it delivered:
   ``+KEPT_GAIN``. (A buyer pays at acceptance, so a buyer cannot fail the seat.)
3. *Its own coalitions.* For an active coalition the seat belongs to: a member that is gone from it
   while its term still runs (before ``term_end`` has passed) left early: ``-EXIT_LOSS`` and a
   wrong; once the term has passed, each member that stayed to its end kept its word:
   ``+KEPT_GAIN``. A lab's *kept* count (:meth:`TrustLedger.kept`) counts rules 2 and 3's gains.

Every score is clipped to [0, 1] after each change. A lab is *trusted* while its score is at
least ``threshold`` (:data:`TRUST_THRESHOLD` unless given). Nothing here draws randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from market.environment import CoalitionView, Observation

#: below this score a lab is not traded with, joined or invited
TRUST_THRESHOLD = 0.35
#: at or above this score a lab is priced at par; below it the record margin grows
FULL_TRUST = 0.5
#: the record margin at trust 0 (a premium to sell to it, a discount to buy from it)
RECORD_MARGIN = 0.5
#: each fall of a lab's public reputation lowers its score by this many times the fall: the
#: seat weighs what the lab did more than where it started
DROP_WEIGHT = 2.0
#: a contract the lab failed to deliver to the seat
OWN_BREACH_LOSS = 0.2
#: a coalition of the seat's that the lab left before its term ended
EXIT_LOSS = 0.15
#: a contract delivered to the seat, a coalition term stayed to its end
KEPT_GAIN = 0.05
_EPS = 1e-9


def record_margin(trust: float) -> float:
    """The price margin for a counterparty of ``trust``: 0 at or above :data:`FULL_TRUST`,
    rising linearly to :data:`RECORD_MARGIN` at trust 0."""
    return RECORD_MARGIN * max(0.0, FULL_TRUST - trust) / FULL_TRUST


@dataclass(slots=True)
class _Contract:
    seller: str
    buyer: str
    delivery_round: int


@dataclass(slots=True)
class _Coalition:
    members: tuple[str, ...]
    term_end: int


@dataclass
class TrustLedger:
    """Per-lab trust from the seat's own observations (rule: module docstring)."""

    threshold: float = TRUST_THRESHOLD
    scores: dict[str, float] = field(default_factory=dict)
    #: (round, lab, what) of every wrong seen, in the order seen
    wrongs: list[tuple[int, str, str]] = field(default_factory=list)
    _kept: dict[str, int] = field(default_factory=dict)
    _seen: dict[str, float] = field(default_factory=dict)  # last public reputation seen
    _contracts: dict[str, _Contract] = field(default_factory=dict)
    _coalitions: dict[str, _Coalition] = field(default_factory=dict)

    # --- reading ---------------------------------------------------------------------------
    def trust(self, lab: str) -> float:
        """The lab's score; a lab never seen is trusted at par (:data:`FULL_TRUST`)."""
        return self.scores.get(lab, FULL_TRUST)

    def trusted(self, lab: str) -> bool:
        """Whether the lab's score is at least the threshold."""
        return self.trust(lab) >= self.threshold - _EPS

    def kept(self, lab: str) -> int:
        """How many contracts the lab delivered to the seat and coalition terms it stayed."""
        return self._kept.get(lab, 0)

    def margin(self, lab: str) -> float:
        """The record margin of the lab (:func:`record_margin` of its trust)."""
        return record_margin(self.trust(lab))

    def wronged_since(self, round_: int) -> list[str]:
        """The labs with a wrong seen in round ``round_`` or later, sorted."""
        return sorted({lab for r, lab, _ in self.wrongs if r >= round_})

    # --- writing ---------------------------------------------------------------------------
    def _move(self, lab: str, delta: float) -> None:
        self.scores[lab] = min(1.0, max(0.0, self.trust(lab) + delta))

    def observe(self, obs: Observation) -> None:
        """Update from one observation (rule: module docstring)."""
        now, me = obs.round, obs.seat
        fell: set[str] = set()
        for lab in sorted(obs.reputations):
            if lab == me:
                continue
            rep = float(obs.reputations[lab])
            if lab not in self._seen:
                self.scores.setdefault(lab, min(1.0, max(0.0, rep)))
            elif self._seen[lab] - rep > _EPS:
                self._move(lab, DROP_WEIGHT * (rep - self._seen[lab]))
                self.wrongs.append((now, lab, "reputation fell"))
                fell.add(lab)
            self._seen[lab] = rep
        open_now = {c.contract_id for c in obs.contracts or ()}
        for cid in sorted(self._contracts):
            c = self._contracts[cid]
            if cid in open_now or c.delivery_round >= now:
                continue
            del self._contracts[cid]
            if c.buyer != me:
                continue
            if c.seller in fell:
                self._move(c.seller, -OWN_BREACH_LOSS)
                self.wrongs.append((now, c.seller, "contract delivered short"))
            else:
                self._gain(c.seller)
        for view in obs.contracts or ():
            self._contracts.setdefault(
                view.contract_id, _Contract(view.seller, view.buyer, view.delivery_round)
            )
        self._coalitions_seen(obs, now, me)

    def _gain(self, lab: str) -> None:
        self._move(lab, KEPT_GAIN)
        self._kept[lab] = self._kept.get(lab, 0) + 1

    def _coalitions_seen(self, obs: Observation, now: int, me: str) -> None:
        views: dict[str, CoalitionView] = {c.coalition_id: c for c in obs.public_coalitions}
        views.update({c.coalition_id: c for c in obs.coalitions or ()})  # its own view first
        for cid in sorted(self._coalitions):
            tracked, view = self._coalitions[cid], views.get(cid)
            if now > tracked.term_end:  # the term has passed: who stayed kept its word
                del self._coalitions[cid]
                for lab in tracked.members:
                    if lab != me:
                        self._gain(lab)
                continue
            if view is None:
                continue
            for lab in tracked.members:
                if lab != me and lab not in view.members:
                    self._move(lab, -EXIT_LOSS)
                    self.wrongs.append((now, lab, "left a coalition early"))
            tracked.members = tuple(m for m in tracked.members if m in view.members)
        for cid in sorted(views):
            view = views[cid]
            if me not in view.members or view.status != "active" or now > view.term_end:
                continue
            tracked = self._coalitions.setdefault(
                cid, _Coalition(tuple(view.members), view.term_end)
            )
            new = [m for m in view.members if m not in tracked.members]
            if new:  # joined since: it is held to the term from now on
                tracked.members = (*tracked.members, *new)
