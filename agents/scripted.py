"""Scripted seats: enough of the population to exercise the environment.

Bidders: ``truthful`` (bids expected marginal values), ``random_valid`` (uniformly random among
legal actions, with valid-looking arguments), ``always_accept`` (accepts every offer, bids
truthfully), ``idle`` (does nothing: the do-nothing baseline every strategy must beat) and
three spam policies used to prove talk alone never pays. Designer: ``fixed`` (keeps the
scenario's mechanism).
"""

from __future__ import annotations

import numpy as np

from agents.base import BaseAgent
from market.core.actions import (
    DAEDALUS_PENALTY_MAX,
    AcceptOffer,
    ActionModel,
    AllocateToJob,
    Bid,
    CommitToCoalition,
    CounterOffer,
    FormCoalition,
    LeaveCoalition,
    MakePitch,
    RejectOffer,
    ReleaseCapacity,
    ReserveCapacity,
    SendMessage,
    SendOffer,
    SetMechanism,
    Wait,
)
from market.core.mechanisms import AUCTION_TYPES, COALITION_POLICIES, DAEDALUS_AUCTION_TYPES
from market.environment import Observation, affordable, marginal_values

WAIT = Wait()
# the most seats one form_coalition may invite (FormCoalition.members)
MAX_INVITEES: int = next(
    m.max_length for m in FormCoalition.model_fields["members"].metadata if hasattr(m, "max_length")
)


def truthful_bid(obs: Observation) -> Bid:
    """Its marginal values as far as budget and capacity allow (a valid schedule by
    construction, so built with :meth:`Bid.trusted`)."""
    return Bid.trusted(affordable(marginal_values(obs), obs.budget or 0.0, max(1, obs.capacity)))


class TruthfulBidder(BaseAgent):
    """Bids its expected marginal value for every block it could use; never negotiates."""

    name = "truthful"

    def act(self, obs: Observation) -> ActionModel:
        return truthful_bid(obs) if obs.phase == "bidding" else WAIT


class IdleBidder(BaseAgent):
    """Does nothing: waits every turn, so it never bids, talks or trades (its endowment blocks
    still run its jobs). The do-nothing baseline: a strategy earning less loses by playing."""

    name = "idle"

    def act(self, obs: Observation) -> ActionModel:
        return WAIT


class AlwaysAcceptBidder(BaseAgent):
    """Accepts the first offer it receives, whatever its terms (a GPU-arena baseline); bids truthfully."""

    name = "always_accept"

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase == "negotiation" and obs.offers_received:
            return AcceptOffer(offer_id=obs.offers_received[0].offer_id)
        return truthful_bid(obs) if obs.phase == "bidding" else WAIT


class RandomValidBidder(BaseAgent):
    """Picks uniformly among the legal action types, then random arguments that are usually valid."""

    name = "random_valid"

    def act(self, obs: Observation) -> ActionModel:
        kind = str(self.rng.choice([k for k in obs.legal_actions if k != "finish"] or ["wait"]))
        others = [s for s in obs.active_labs if s != obs.seat]
        rng = self.rng
        budget = obs.budget or 0.0
        held = (obs.holdings or [0])[0]
        live_jobs = [j for j in obs.jobs or () if j.status == "active"]
        if kind == "bid":
            n = int(rng.integers(0, max(1, obs.capacity) + 1))
            bids = sorted(
                (float(x) for x in rng.uniform(0, budget / max(1, n) if n else 0, n)), reverse=True
            )
            return Bid.trusted(affordable(bids, budget, max(1, obs.capacity)))
        if kind == "send_offer" and others:
            side = "sell" if held > 0 and rng.random() < 0.5 else "buy"
            blocks = int(rng.integers(1, max(1, held) + 1))
            price = (
                float(rng.uniform(0, min(budget, 100.0)))
                if side == "buy"
                else float(rng.uniform(0, 100.0))
            )
            return SendOffer(
                to=str(rng.choice(others)), side=side, blocks=blocks, price=round(price, 2)
            )
        if kind in ("accept_offer", "reject_offer", "counter_offer") and obs.offers_received:
            offer = obs.offers_received[int(rng.integers(len(obs.offers_received)))]
            if kind == "accept_offer":
                return AcceptOffer(offer_id=offer.offer_id)
            if kind == "reject_offer":
                return RejectOffer(offer_id=offer.offer_id)
            return CounterOffer(
                offer_id=offer.offer_id,
                blocks=offer.blocks,
                price=round(offer.price * float(rng.uniform(0.5, 1.5)), 2),
            )
        if kind == "form_coalition" and others:
            k = int(rng.integers(1, min(len(others), MAX_INVITEES) + 1))
            members = [str(m) for m in rng.choice(others, size=k, replace=False)]
            return FormCoalition(
                members=members,
                purpose="pool budget",
                contribution=round(float(rng.uniform(0, budget / 4)), 2),
            )
        invitations = [c for c in obs.coalitions or () if obs.seat in c.invited]
        if kind == "commit_to_coalition" and invitations:
            return CommitToCoalition(
                coalition_id=invitations[0].coalition_id,
                contribution=round(float(rng.uniform(0, budget / 4)), 2),
            )
        mine = [c for c in obs.coalitions or () if obs.seat in c.members]
        if kind == "leave_coalition" and mine:
            return LeaveCoalition(coalition_id=mine[int(rng.integers(len(mine)))].coalition_id)
        if kind == "send_message":
            to = "all" if not others or rng.random() < 0.5 else str(rng.choice(others))
            return SendMessage(to=to, text=f"round {obs.round}: looking for blocks")
        if kind == "make_pitch":
            return MakePitch(
                text="We need compute to finish our job before its deadline.",
                blocks_requested=int(rng.integers(1, 4)),
            )
        if kind == "allocate_to_job" and live_jobs:
            job = live_jobs[int(rng.integers(len(live_jobs)))]
            return AllocateToJob(
                job_id=job.job_id, blocks=int(rng.integers(0, job.size - job.progress + 1))
            )
        reserved = (obs.reserved or [0])[0]
        if kind == "reserve_capacity" and held > reserved:
            return ReserveCapacity(blocks=int(rng.integers(1, held - reserved + 1)))
        if kind == "release_capacity" and reserved:
            return ReleaseCapacity(blocks=int(rng.integers(1, reserved + 1)))
        return WAIT


class FixedDesigner(BaseAgent):
    """Keeps the scenario's mechanism in force."""

    name = "fixed"
    roles = frozenset({"designer"})

    def act(self, obs: Observation) -> ActionModel:
        return WAIT


DAEDALUS_RESERVE_MAX = 0.9  # DAEDALUS's reserve range is [0, 0.9] on its normalised value scale
REVEAL_FLAGS = (
    "reveal_reserve",
    "reveal_competing_bids",
    "reveal_winner_identity",
    "reveal_clearing_price",
    "reveal_bid_distribution",
)


def random_daedalus_mechanism(rng: np.random.Generator) -> dict[str, object]:
    """A mechanism drawn uniformly from DAEDALUS's action space, in DAEDALUS units.

    Auction type uniform over first_price, second_price and vcg; reserve ``U[0, 0.9]``; each
    reveal flag a fair coin; each penalty ``U[0, 3]``; coalition policy uniform over the four.
    """
    mech: dict[str, object] = {
        "units": "daedalus",
        "auction_type": str(rng.choice(DAEDALUS_AUCTION_TYPES)),
        "reserve_price": round(float(rng.uniform(0.0, DAEDALUS_RESERVE_MAX)), 4),
    }
    for flag in REVEAL_FLAGS:
        mech[flag] = bool(rng.random() < 0.5)
    for name in ("shill_penalty", "withdrawal_penalty", "collusion_penalty"):
        mech[name] = round(float(rng.uniform(0.0, DAEDALUS_PENALTY_MAX)), 4)
    mech["coalition_policy"] = str(rng.choice(COALITION_POLICIES))
    return mech


class RandomDesigner(BaseAgent):
    """A uniformly random mechanism every time it acts.

    ``space="gpumarket"`` (default) draws from this market's space in credits (every auction
    type, reserve ``U[0, 30]``, penalties ``U[0, 20]``, judge pool share ``U[0, 0.3]``);
    ``space="daedalus"`` draws from DAEDALUS's space in its own units
    (:func:`random_daedalus_mechanism`: the DAEDALUS uniform-random baseline).
    """

    name = "random"
    roles = frozenset({"designer"})

    def __init__(self, space: str = "gpumarket") -> None:
        super().__init__()
        if space not in ("gpumarket", "daedalus"):
            raise ValueError(f"space must be 'gpumarket' or 'daedalus', got {space!r}")
        self.space = space

    def act(self, obs: Observation) -> ActionModel:
        rng = self.rng
        if self.space == "daedalus":
            return SetMechanism.model_validate({"mechanism": random_daedalus_mechanism(rng)})
        return SetMechanism.model_validate(
            {
                "mechanism": {
                    "units": "credits",  # whatever units the scenario reads by default
                    "auction_type": str(rng.choice(AUCTION_TYPES)),
                    "reserve_price": round(float(rng.uniform(0, 30)), 2),
                    "reveal_reserve": bool(rng.random() < 0.5),
                    "reveal_competing_bids": bool(rng.random() < 0.5),
                    "reveal_winner_identity": bool(rng.random() < 0.5),
                    "reveal_clearing_price": bool(rng.random() < 0.5),
                    "reveal_bid_distribution": bool(rng.random() < 0.5),
                    "shill_penalty": round(float(rng.uniform(0, 20)), 2),
                    "withdrawal_penalty": round(float(rng.uniform(0, 20)), 2),
                    "collusion_penalty": round(float(rng.uniform(0, 20)), 2),
                    "coalition_policy": str(rng.choice(COALITION_POLICIES)),
                    "judge_pool_share": round(float(rng.uniform(0, 0.3)), 2),
                }
            }
        )


class _Spammer(BaseAgent):
    """Repeats one kind of talk every negotiation turn and never bids: talk alone must not pay."""

    def talk(self, obs: Observation) -> ActionModel:
        raise NotImplementedError

    def act(self, obs: Observation) -> ActionModel:
        return self.talk(obs) if obs.phase == "negotiation" else WAIT


class OfferSpammer(_Spammer):
    """Sends a zero-price buy offer every negotiation turn and never bids (proves offers alone never pay)."""

    name = "spam_offers"

    def talk(self, obs: Observation) -> ActionModel:
        others = [s for s in obs.active_labs if s != obs.seat]
        return SendOffer(to=others[0], side="buy", blocks=1, price=0.0) if others else WAIT


class CoalitionSpammer(_Spammer):
    """Proposes a coalition with everyone every negotiation turn and never bids."""

    name = "spam_coalitions"

    def talk(self, obs: Observation) -> ActionModel:
        others = [s for s in obs.active_labs if s != obs.seat]
        invited = others[:MAX_INVITEES]
        return (
            FormCoalition(members=invited, purpose="synergy alignment partnership")
            if others
            else WAIT
        )


class PitchSpammer(_Spammer):
    """Sends a keyword-stuffed pitch for 1000 blocks every negotiation turn and never bids."""

    name = "spam_pitches"

    def talk(self, obs: Observation) -> ActionModel:
        return MakePitch(
            text="URGENT critical deadline breakthrough safety impact " * 5, blocks_requested=1000
        )
