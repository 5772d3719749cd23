"""The rule expert bidder (``rule_expert``): negotiates, forms buying clubs and bids from the
job plan of :mod:`agents.population.planning`; adapts to shocks."""

from __future__ import annotations

import math

from agents.base import as_flag
from agents.population.common import (
    StatefulAgent,
    ValueRange,
    credits_down,
    last_price,
    price_floor,
    schedule,
    shade,
    unit_limit,
)
from agents.population.delivery_risk import (
    completion_cover_values,
    cover_values,
    deliverable,
    failure_rate_at,
    forward_sale_blocks,
    owed,
)
from agents.population.planning import MarketMemory, Plan, reduce_demand
from agents.population.trust import TrustLedger
from agents.scripted import MAX_INVITEES, WAIT
from market.core.actions import (
    AcceptOffer,
    ActionModel,
    AllocateToJob,
    Bid,
    CommitToCoalition,
    FormCoalition,
    MakePitch,
    SendOffer,
)
from market.core.summation import ordered_sum
from market.environment import CoalitionView, Observation, affordable

MAX_COVER = 20  # most cover blocks it bids for in one round

# ------------------------------------------------------------------------------------------
# Rule expert
# ------------------------------------------------------------------------------------------


class RuleExpert(StatefulAgent):
    """Negotiates, forms useful coalitions and bids from job values; adapts to shocks.

    Valuation (:func:`plan_jobs`, recomputed from the observation and memory at every turn whose
    inputs changed, :meth:`MarketMemory.plan`):
    a block's value is its job's value per block x the reliability; a job without partial credit
    counts only if it can still complete by its deadline from its own blocks and the blocks it
    can plausibly win within its budget; jobs are served highest value per block first. Shocks
    enter through the observation: the current reliability re-values every block and rules out
    jobs that cannot run; known outages and reliability drops lower the supply of later rounds;
    an energy spike raises the floor, and blocks worth less than the floor are not bid for.

    Each negotiation turn takes the first rule that applies:

    1. accept an offer to *sell* it blocks whose price is at most the value of those blocks to
       it (the values of the blocks it would otherwise try to win in that round), or an offer
       to *buy* blocks it holds spare, at a price of at least the floor per block;
    2. commit to a coalition invitation that helps it: it still needs blocks this round, the
       coalition's term ends this round, and the purpose states a price per block at most its
       value for them; it contributes that price for each block it needs (at most half its
       budget); or, with no blocks to win this round, pledge its spare blocks of this round to
       a one-round coalition it is invited to (no contribution), and join a block pool it needs
       blocks from (no contribution: it pays the clearing price per block it draws);
    3. keep a job it cannot complete off this round's blocks (``allocate_to_job`` with 0) when
       earliest-deadline-first execution would otherwise give that job blocks before a job it
       pursues;
    4. pitch to the judge, when the mechanism has a judge pool, for as many blocks as the pool
       holds and it still needs this round (once per round);
    5a. propose a one-round block pool (once per round, never while it leads a coalition) to
       the labs it trusts, pledging its spare blocks of this round that it has neither sold nor
       pledged: a member that needs blocks draws them at the close and pays the round's
       clearing price for each (market.core.pledges); with ``hedge`` it pledges only the blocks
       whose pay beats the expected cost of falling short on them (:meth:`_pledge_blocks`);
    5. offer spare held blocks for sale at the market price (the last revealed price, else its
       own median value per block, at least the floor) to each other active lab in turn, first
       those that won blocks last round (they need blocks); one offer per lab, round and delivery
       round, and none while 8 of its offers are open;
    6. propose a one-round buying club (a coalition with proportional split) to the other active
       labs when a deadline job it could complete with the blocks on offer is beyond its budget
       (once per round). It contributes the part of its budget its own bid leaves idle, so an
       unanswered proposal costs it nothing but the talk fee, and states the price per block it
       will bid for the members' blocks: the expected price, at most its own value;
    7. otherwise wait.

    Bidding: as the leader of an active club it bids from the pool: its own bid (including the
    short job's blocks), plus one block at the stated price for every such price the other
    members paid in; if the pool cannot carry its own bid, it bids alone. Otherwise it bids its
    own values, shaded under ``first_price`` exactly as the ``shader`` does (:func:`shade`) and
    with demand reduction under ``second_price`` (:func:`reduce_demand`). If it has nothing to
    bid and a rule-3 fix is pending, it makes that fix instead (bidding nothing and planning
    blocks both leave it out of the auction).

    Trust (:class:`~agents.population.trust.TrustLedger`, from its own observations): it
    accepts no offer from, offers nothing to, invites no lab and joins no club led by a lab whose
    trust is below the threshold; it buys from a lab with a poor record only at a discount and
    sells to it only at a premium (the record margin, :func:`~agents.population.trust.record_margin`:
    0 at trust 0.5 or more); and it offers spare blocks first to the labs that kept their word
    to it (delivered contracts, stayed in its clubs), then to last round's winners.

    It honours commitments: it never leaves a coalition early, never sells blocks a pursued job
    needs and never sells forward more than it owns.

    Delivery risk (:mod:`agents.population.delivery_risk`; off with ``hedge=false``): owned
    blocks fail with the probability ``p_t`` it reads from the observation and the shocks it
    knows of. It sells forward for round ``t`` each spare block whose price beats the expected
    cost of its being the one missing (the refund of its price plus the withdrawal penalty,
    times the chance the blocks it holds then fall short of what it owes including it:
    :func:`~agents.population.delivery_risk.forward_sale_blocks`), capped, with a
    ``confidence``, at what it delivers with that probability; it never sells short. A block it
    bids for now is worth its value times ``1 - p`` (it must survive the round's close to run).
    It buys cover in the round a forward sale or a job is due: each block beyond its holdings
    is worth the drop in the expected cost of being short that it buys (a missing contracted
    block costs the refund of its price, the withdrawal penalty and any compensation; a job
    without partial credit is lost whole), so it bids for cover only while that drop is worth
    something.
    """

    name = "rule_expert"
    PURPOSE = "buying club"
    POOL = "block pool"

    def __init__(self, hedge: bool | str = True, confidence: float | str | None = None) -> None:
        self.hedge = as_flag(hedge, "hedge")
        self.confidence: float | None = None  # None: no cap beyond the expected-cost rule
        if confidence is not None and confidence != "":
            try:
                self.confidence = float(confidence)
            except (TypeError, ValueError):
                raise ValueError(f"confidence must be a number, got {confidence!r}") from None
            if not 0.0 < self.confidence < 1.0:
                raise ValueError(
                    f"confidence must lie strictly between 0 and 1, got {confidence!r}"
                )
        super().__init__()

    def clear(self) -> None:
        self.memory = MarketMemory()
        self.values = ValueRange()
        self.offered: set[tuple[int, str, int]] = set()
        # (round, delivery round) -> the active labs when every rival had that round's offer:
        # while they are the same labs, rule 5 has nothing left to offer for that delivery round
        self.sold_out: dict[tuple[int, int], list[str]] = {}
        self.pitched: set[int] = set()
        self.pooled: set[int] = set()  # rounds in which it proposed a block pool
        self.kept_off: set[tuple[int, str]] = set()
        self.club_job: dict[int, str] = {}
        self.pledged: dict[int, int] = {}  # round -> blocks it pledged to pools for that round
        self.ledger = TrustLedger()  # what it has seen each lab do (agents/population/trust.py)

    # --- helpers --------------------------------------------------------------------------
    def _market_price(self, obs: Observation, plan: Plan) -> float:
        price = last_price(obs)
        if price is None or price <= price_floor(obs):
            own = sorted(j.value / j.size * obs.reliability for j in obs.jobs or ())
            price = own[len(own) // 2] if own else price_floor(obs)
        return round(max(price, price_floor(obs)), 2)

    def _accept(self, obs: Observation, plan: Plan) -> ActionModel | None:
        budget = obs.budget or 0.0
        for offer in obs.offers_received or ():
            t = offer.delivery_round
            if t < obs.round or offer.expires_round < obs.round:
                continue
            if not self.ledger.trusted(offer.sender):
                continue  # a lab it does not trust: no trade
            margin = self.ledger.margin(offer.sender)  # its record's price margin
            if offer.side == "sell":  # it would buy: at a discount from a poor record
                values = plan.wanted.get(t, [])[: offer.blocks]
                if len(values) == offer.blocks and offer.price <= min(
                    ordered_sum(values) * (1.0 - margin), budget
                ):
                    return AcceptOffer(offer_id=offer.offer_id)
            elif offer.blocks <= min(
                plan.spare.get(t, 0), _unsold(obs, t, self.pledged)
            ) and offer.price >= offer.blocks * price_floor(obs) * (1.0 + margin):
                return AcceptOffer(offer_id=offer.offer_id)
        return None

    def _commit(self, obs: Observation, plan: Plan) -> ActionModel | None:
        for c in obs.coalitions or ():
            if obs.seat not in c.invited or c.term_end != obs.round or c.split != "proportional":
                continue
            if not self.ledger.trusted(c.leader):
                continue  # a club led by a lab it does not trust
            if c.purpose.startswith(self.POOL) or not plan.bid_values:
                # a pool: it draws blocks it needs at the clearing price (no contribution), or
                # pledges its spare blocks to a one-round coalition for that price
                spare = 0 if plan.bid_values else self._pledge_blocks(obs, plan)
                if not plan.bid_values and spare <= 0:
                    continue
                if spare:
                    self.pledged[obs.round] = self.pledged.get(obs.round, 0) + spare
                return CommitToCoalition(coalition_id=c.coalition_id, pledge_blocks=spare)
            price = _club_price(c)
            if price is None:
                continue
            blocks = [v for v in plan.bid_values if v >= price]
            contribution = min(len(blocks) * price, (obs.budget or 0.0) / 2)
            if blocks and contribution >= price:
                return CommitToCoalition(
                    coalition_id=c.coalition_id, contribution=credits_down(contribution)
                )
        return None

    def _spare_now(self, obs: Observation, plan: Plan) -> int:
        """Spare blocks it owns for this round, unsold and unpledged."""
        return min(plan.spare.get(obs.round, 0), _unsold(obs, obs.round, self.pledged))

    def _pledge_blocks(self, obs: Observation, plan: Plan) -> int:
        """How many spare blocks of this round it pledges to a pool, paid the clearing price
        (its ``ask``: the last revealed price, at least the floor) for each one a member draws:
        with ``hedge``, those whose pay beats the expected cost of falling short on them (a
        default costs the refund of the pay and the withdrawal penalty as the price of its
        reputation; it pays no default compensation, as it pledges without a pool balance:
        :func:`forward_sale_blocks` with the blocks it keeps for its jobs and sales as already
        owed); a spare block has no other use to it this round."""
        spare = self._spare_now(obs, plan)
        if spare <= 0 or not self.hedge:
            return max(0, spare)
        held = (obs.holdings or [0])[0]
        ask = max(last_price(obs) or 0.0, price_floor(obs))  # the clearing price it expects
        loss = ask + obs.mechanism.withdrawal_penalty
        keep = max(0, held - spare)
        p = failure_rate_at(obs, obs.round)
        return forward_sale_blocks(held, keep, p, ask, loss, spare)

    def _pool(self, obs: Observation, plan: Plan) -> ActionModel | None:
        """Propose a one-round block pool (rule 5a): pledge this round's spare blocks to the
        other active labs it trusts; those that join and need blocks draw them at the close and
        pay the clearing price for each (market.core.pledges)."""
        if (
            obs.round in self.pooled
            or obs.mechanism.coalition_policy == "restrict"
            or "form_coalition" not in obs.legal_actions
            or any(c.leader == obs.seat for c in obs.coalitions or ())
        ):
            return None
        others = [s for s in obs.active_labs if s != obs.seat and self.ledger.trusted(s)]
        blocks = self._pledge_blocks(obs, plan) if others else 0
        if blocks <= 0:
            return None
        self.pooled.add(obs.round)
        self.pledged[obs.round] = self.pledged.get(obs.round, 0) + blocks
        return FormCoalition(
            members=others[:MAX_INVITEES],
            purpose=f"{self.POOL}: spare blocks for this round at the clearing price",
            contribution=0.0,
            split="proportional",
            term_rounds=1,
            pledge_blocks=blocks,
        )

    def _keep_off(self, obs: Observation, plan: Plan) -> ActionModel | None:
        runnable = [p for p in plan.jobs if p.job.min_reliability <= obs.reliability]
        pursued = [p.job for p in runnable if p.pursue]
        if not pursued or not ((obs.holdings or [0])[0] or plan.bid_values):
            return None
        last = max((j.deadline, j.job_id) for j in pursued)
        for p in runnable:
            key = (obs.round, p.job.job_id)
            if not p.pursue and (p.job.deadline, p.job.job_id) < last and key not in self.kept_off:
                self.kept_off.add(key)
                return AllocateToJob(job_id=p.job.job_id, blocks=0)
        return None

    def _pitch(self, obs: Observation, plan: Plan) -> ActionModel | None:
        pool = math.floor(obs.capacity * obs.mechanism.judge_pool_share + 1e-9)
        if pool < 1 or obs.round in self.pitched or not plan.bid_values:
            return None
        urgent = min(
            (p.job for p in plan.jobs if p.pursue and p.job.min_reliability <= obs.reliability),
            key=lambda j: (j.deadline, -j.value),
            default=None,
        )
        if urgent is None:
            return None
        self.pitched.add(obs.round)
        want = min(pool, len(plan.bid_values))
        return MakePitch(
            text=f"{urgent.job_id} needs {urgent.size - urgent.progress} more block(s) "
            f"by round {urgent.deadline}",
            blocks_requested=want,
            job_id=urgent.job_id,
        )

    def _sell(self, obs: Observation, plan: Plan) -> ActionModel | None:
        if len(obs.offers_sent or ()) >= 8 or all(s == obs.seat for s in obs.active_labs):
            return None  # no rival to sell to, or enough offers out
        ask = self._market_price(obs, plan)
        others: list[str] = []
        ranked = False  # rivals are ranked (last round's winners first) once a block is for sale
        for t in sorted(plan.spare):
            blocks = plan.spare[t]
            if blocks <= 0 or self.sold_out.get((obs.round, t)) == obs.active_labs:
                continue
            if self.hedge and t > obs.round:  # forward: only blocks whose sale pays its risk
                blocks = self._forward_blocks(obs, t, blocks, ask)
            # only blocks it owns: one bought on a contract is not its to sell before delivery
            blocks = min(blocks, _unsold(obs, t, self.pledged))
            if blocks <= 0:
                continue
            if not ranked:
                winners = (obs.last_result.winners or {}) if obs.last_result is not None else {}
                # trusted labs only; reciprocity first (labs that kept their word to it)
                others = sorted(
                    (s for s in obs.active_labs if s != obs.seat and self.ledger.trusted(s)),
                    key=lambda s: (-self.ledger.kept(s), -winners.get(s, 0), s),
                )
                ranked = True
            for other in others:
                key = (obs.round, other, t)
                if key in self.offered:
                    continue
                self.offered.add(key)
                return SendOffer(
                    to=other,
                    side="sell",
                    blocks=blocks,
                    price=round(ask * blocks * (1.0 + self.ledger.margin(other)), 2),
                    delivery_round=t,
                    message=f"{blocks} spare block(s) for round {t}",
                )
            self.sold_out[(obs.round, t)] = list(obs.active_labs)
        return None

    def _own_bid(self, obs: Observation, plan: Plan) -> Bid:
        values = reduce_demand(shade(plan.bid_values, obs, self.values), obs, plan)
        if self.hedge:  # a block bought now survives to run only with probability 1 - p
            survive = 1.0 - failure_rate_at(obs, obs.round)
            values = [round(v * survive, 6) for v in values]
        cover = sorted(self._cover(obs) + self._job_cover(obs, plan), reverse=True)
        return schedule(values + cover[:MAX_COVER], obs)

    def _forward_blocks(self, obs: Observation, t: int, blocks: int, ask: float) -> int:
        """How many of ``blocks`` spare blocks for round ``t`` it sells forward at ``ask`` per
        block: those whose price beats the expected cost of being short on them
        (:func:`forward_sale_blocks`; a missing block costs the refund of ``ask`` and the
        withdrawal penalty), and, with a ``confidence``, no more than it delivers with that
        probability (:func:`deliverable`)."""
        ahead = t - obs.round
        holdings = obs.holdings or []
        held = holdings[ahead] if ahead < len(holdings) else 0
        already, p = owed(obs, t)[0], failure_rate_at(obs, t)
        loss = ask + obs.mechanism.withdrawal_penalty
        blocks = min(blocks, forward_sale_blocks(held, already, p, ask, loss, blocks))
        if self.confidence is not None:
            blocks = min(blocks, deliverable(held, already, p, self.confidence))
        return blocks

    def _job_cover(self, obs: Observation, plan: Plan) -> list[float]:
        """Bids for blocks beyond what its jobs due this round need, against owned blocks that
        fail at the close: for a job without partial credit, each extra block is worth the rise
        in the chance that all its blocks survive times the job's value (and the chance they
        all run, ``reliability ** need``; :func:`completion_cover_values`); for a job with
        partial credit, the drop in its expected missing blocks times its value per block
        (:func:`cover_values`). Jobs due later can replace a failed block in a later round."""
        p = failure_rate_at(obs, obs.round)
        if not self.hedge or p <= 0.0:
            return []
        rel = obs.reliability
        values: list[float] = []
        for jp in plan.jobs:
            job = jp.job
            need = job.size - job.progress
            if not jp.pursue or job.deadline != obs.round or job.min_reliability > rel or need < 1:
                continue
            if job.partial_credit:
                values += cover_values(need, need, p, jp.unit * rel, MAX_COVER)
            else:
                values += completion_cover_values(need, p, job.value * rel**need, MAX_COVER)
        return values

    def _cover(self, obs: Observation) -> list[float]:
        """Bids for blocks beyond its holdings that lower the expected cost of being short on
        what it owes this round (:func:`cover_values`)."""
        blocks, price = owed(obs, obs.round)
        if not self.hedge or not blocks:
            return []
        p = failure_rate_at(obs, obs.round)
        d = obs.delivery
        short_sold = any(
            c.short
            for c in obs.contracts or ()
            if c.seller == obs.seat and c.delivery_round == obs.round
        )
        comp = d.breach_compensation if d is not None and short_sold else 0.0
        loss = price / blocks * (1.0 + comp) + obs.mechanism.withdrawal_penalty
        return cover_values((obs.holdings or [0])[0], blocks, p, loss, MAX_COVER)

    def _propose(self, obs: Observation, plan: Plan) -> ActionModel | None:
        short = next(
            (p for p in plan.jobs if p.short and p.job.min_reliability <= obs.reliability), None
        )
        if short is None:
            return None
        others = [s for s in obs.active_labs if s != obs.seat and self.ledger.trusted(s)]
        leading = any(c.leader == obs.seat for c in obs.coalitions or ())
        if (
            not others
            or leading
            or obs.round in self.club_job
            or obs.mechanism.coalition_policy == "restrict"
        ):
            return None
        price = round(min(plan.price, short.unit * obs.reliability), 2)
        idle = credits_down((obs.budget or 0.0) - ordered_sum(self._own_bid(obs, plan).bids))
        if price <= 0 or idle < price:
            return None
        self.club_job[obs.round] = short.job.job_id
        return FormCoalition(
            members=others[:MAX_INVITEES],
            purpose=f"{self.PURPOSE}: blocks at {price:.2f} each",
            contribution=idle,
            split="proportional",
            term_rounds=1,
        )

    def _coalition_bid(self, obs: Observation, plan: Plan) -> Bid | None:
        led = next(
            (
                c
                for c in obs.coalitions or ()
                if c.leader == obs.seat
                and c.status == "active"
                and c.term_end >= obs.round
                and c.pool
            ),
            None,
        )
        if led is None or obs.mechanism.coalition_policy == "restrict":
            return None
        price = _club_price(led)
        if price is None:
            return None  # a block pool: the leader bids alone
        mine = list(plan.bid_values)
        job = plan.job(self.club_job.get(obs.round, ""))
        if job is not None:
            mine += [job.unit * obs.reliability] * (job.job.size - job.job.progress)
        funded = max(0.0, (led.pool or 0.0) - (led.my_balance or 0.0))
        club = [price] * (int(funded // price) if price > 0 else 0)
        own = reduce_demand(shade(mine, obs, self.values), obs, plan)
        if ordered_sum(own) > (led.pool or 0.0) - len(club) * price + 1e-9:
            return None  # the pool cannot carry its own bids: bid alone this round
        values = sorted([*own, *club], reverse=True)
        return Bid.trusted(affordable(values, led.pool or 0.0, unit_limit(obs)), led.coalition_id)

    # --- the turn -------------------------------------------------------------------------
    def act(self, obs: Observation) -> ActionModel:
        self.memory.observe(obs)
        self.values.observe(obs)
        self.ledger.observe(obs)
        if obs.phase not in ("negotiation", "bidding"):
            return WAIT
        plan = self.memory.plan(obs)
        if obs.phase == "negotiation":
            for rule in (
                self._accept,
                self._commit,
                self._keep_off,
                self._pitch,
                self._pool,
                self._sell,
                self._propose,
            ):
                action = rule(obs, plan)
                if action is not None:
                    return action
            return WAIT
        bid = self._coalition_bid(obs, plan)
        if bid is None:
            bid = self._own_bid(obs, plan)
        if not bid.bids:
            fix = self._keep_off(obs, plan)
            if fix is not None:
                return fix
        self.memory.bid_units[obs.round] = len(bid.bids)
        return bid


def _unsold(obs: Observation, t: int, pledged: dict[int, int] | None = None) -> int:
    """Blocks it owns for round ``t`` and has neither sold forward (what the market lets it
    offer) nor pledged to a pool."""
    held = obs.holdings or []
    own = held[t - obs.round] if 0 <= t - obs.round < len(held) else 0
    return own - owed(obs, t)[0] - (pledged or {}).get(t, 0)


def _club_price(coalition: CoalitionView) -> float | None:
    """The per-block price a rule expert's buying-club proposal states in its purpose."""
    text = coalition.purpose
    if not text.startswith(RuleExpert.PURPOSE):
        return None
    try:
        return float(text.split(" at ", 1)[1].split()[0])
    except (IndexError, ValueError):
        return None
