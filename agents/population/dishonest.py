"""Two dishonest bidders for the conduct judge (docs/conduct.md): ``liar`` misstates its needs,
``promise_breaker`` makes promises and breaks them.

Both speak in forms the rule extractor reads (:mod:`market.core.conduct`), so every lie and every
broken promise they make is caught by the rule judge: they exist to show that it is. Their
trading and bidding are borrowed from the honest agents (``rule_expert`` and ``truthful``), so
their economic play is sensible and only their conduct differs. Each reads only its own
observation; the liar's only randomness is its seeded ``self.rng``.
"""

from __future__ import annotations

import math

from agents.population.common import StatefulAgent, credits_down, last_price, price_floor
from agents.population.expert import RuleExpert
from agents.scripted import MAX_INVITEES, WAIT, truthful_bid
from market.core.actions import (
    ActionModel,
    Bid,
    CommitToCoalition,
    FormCoalition,
    LeaveCoalition,
    MakePitch,
    SendMessage,
    SendOffer,
)
from market.core.seats import lab_index
from market.core.summation import ordered_sum
from market.environment import JobView, Observation, marginal_values

MIN_BUDGET_LIE = 20.0  # below this a halved budget is within the judge's 1-credit tolerance


def live_jobs(obs: Observation) -> list[JobView]:
    """The seat's jobs that are active and still need blocks (what the judge calls live)."""
    return [j for j in obs.jobs or () if j.status == "active" and j.size - j.progress > 0]


class LiarBidder(RuleExpert):
    """Plays like ``rule_expert`` but misstates its needs to get better offers.

    Rule: in the first negotiation turn of every round it tells every lab, in one public message,
    that it needs ``need + 2 + k`` more blocks (``need``: the blocks its live jobs still need;
    ``k`` drawn uniformly from {0, 1, 2}), that its deadline is round ``max(now, d - 1 - k')``
    (``d`` its earliest live deadline, ``k'`` from {0, 1}; said only when ``d > now``), that its
    biggest job is ``size + 1 + k`` blocks (with a live job) and that its budget is only 40-60 %
    of what it has (with at least :data:`MIN_BUDGET_LIE` credits). Every statement is false
    by the judge's rules: need, urgency and size exaggerated, budget understated. A pitch it makes
    (rule 4 of ``rule_expert``, where a judge pool exists) carries the same inflated need, and
    ``claimed_blocks``, ``claimed_deadline`` and ``claimed_value`` (1.5 x its live jobs' value
    plus 10) inflated the same way (its ``blocks_requested`` stays the expert's, a true need).
    Everything else, its trades and its bids, is ``rule_expert``'s.
    """

    name = "liar"

    def clear(self) -> None:
        super().clear()
        self.lied: set[int] = set()

    def lies(self, obs: Observation) -> tuple[str, int, int | None, float]:
        """The false statement for this turn: (text, need claimed, deadline claimed, value claimed)."""
        live = live_jobs(obs)
        k = int(self.rng.integers(0, 3))
        need = ordered_sum(j.size - j.progress for j in live) + 2 + k
        parts = [f"We need {need} more blocks."]
        deadline: int | None = None
        if live:
            earliest = min(j.deadline for j in live)
            if earliest > obs.round:
                deadline = max(obs.round, earliest - 1 - int(self.rng.integers(0, 2)))
                parts.append(f"Our deadline is round {deadline}.")
            parts.append(f"Our biggest job is a {max(j.size for j in live) + 1 + k}-block job.")
        budget = obs.budget or 0.0
        if budget >= MIN_BUDGET_LIE:
            share = float(self.rng.uniform(0.4, 0.6))
            parts.append(f"Our budget is only {math.floor(budget * share)} credits.")
        value = round(1.5 * math.fsum(j.value for j in live) + 10.0, 2)
        return " ".join(parts), need, deadline, value

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase == "negotiation" and obs.round not in self.lied:
            self.lied.add(obs.round)
            self.memory.observe(obs)
            self.values.observe(obs)
            return SendMessage(to="all", text=self.lies(obs)[0])
        action = super().act(obs)
        if isinstance(action, MakePitch):
            text, need, deadline, value = self.lies(obs)
            return action.model_copy(
                update={
                    "text": text,
                    "claimed_blocks": need,
                    "claimed_deadline": deadline,
                    "claimed_value": value,
                }
            )
        return action


class PromiseBreaker(StatefulAgent):
    """Makes promises to other labs and breaks every one of them; bids like ``truthful``.

    Rule, each negotiation turn, the first that applies:

    1. *leave* every coalition it is a member of before the coalition's term ends (breaking the
       promise to stay that forming or joining it made);
    2. when invited to a coalition and another negotiation turn follows in this round:
       *join* it (contributing nothing), to leave it next turn;
    3. once per round, from its second round on, when another negotiation turn follows in
       this round and the coalition policy is not ``restrict``: *form* a coalition with every
       other active lab (contributing nothing, term up to 3 rounds) whose purpose promises "We
       will stay in this coalition until round <term end>. We will deliver 2 blocks by round
       <now>. We won't bid above <X>.";
    4. otherwise, once per round: *message* the next active lab "We will deliver 2 blocks to
       you by round <now>. We won't bid above <X>.";
    5. where short sales are allowed (the default of ``[delivery]``), once per round: *sell
       short* 2 blocks to the next active lab for the first of the next two rounds in which it
       holds no block and owes none yet, at the last revealed clearing price per block (the
       floor before any, at least 1 credit), noting "We will deliver 2 blocks to you by round
       <t>.", when its budget plus the price covers the collateral and leaves its top bid
       (``2 X``) to bid. In round ``t`` it then bids nothing and promises no bid limit, so it
       holds no block to deliver and the sale falls short;
    6. otherwise wait.

    ``X`` is half its top truthful bid this round, rounded down to the cent, and is promised
    only when that is at least one cent. It then bids its values (``truthful``), above ``X``
    (when a penalty for leaving has since cut its budget below all of them, one block at what
    it can pay, up to its top value, if that is above ``X``);
    it never pledges a block and sells only short, so the promised deliveries do not come. It
    learns how many negotiation turns a round has by counting them in the rounds it has played,
    which is why it forms and joins coalitions only from its second round on (a proposal nobody
    joined lapses at the round's end and could no longer be left).
    """

    name = "promise_breaker"
    BLOCKS = 2
    TERM = 3

    def clear(self) -> None:
        self.turn: dict[int, int] = {}  # round -> negotiation turns it has had in it
        self.promised: set[int] = set()
        self.sold: set[int] = set()
        self.due: set[int] = set()  # rounds it has sold short for
        self.limits: dict[int, float] = {}  # round -> the bid limit it promised

    def _limit(self, obs: Observation) -> float | None:
        bids = truthful_bid(obs).bids
        limit = credits_down(max(bids) / 2) if bids else 0.0
        return limit if limit >= 0.01 else None

    def _promises(self, obs: Observation, to_you: bool) -> str:
        whom = " to you" if to_you else ""
        text = f"We will deliver {self.BLOCKS} blocks{whom} by round {obs.round}."
        limit = None if obs.round in self.due else self._limit(obs)
        if limit is None:
            return text
        self.limits[obs.round] = limit
        return f"{text} We won't bid above {limit:g}."

    def _bid(self, obs: Observation) -> Bid:
        """No bid in a round it owes short-sold blocks; otherwise its truthful bid, and when no
        unit of it is above the limit it promised this round (its budget fell since), one block
        at what it can pay, up to its top value, if that is above the limit."""
        if obs.round in self.due:
            return Bid(bids=[])  # it owes blocks this round: it holds none and wins none
        bid, limit = truthful_bid(obs), self.limits.get(obs.round)
        if limit is None or any(b > limit for b in bid.bids):
            return bid
        values = marginal_values(obs)
        top = credits_down(min(values[0], obs.budget or 0.0)) if values else 0.0
        return Bid(bids=[top]) if top > limit else bid

    def _short_sale(self, obs: Observation, to: str) -> SendOffer | None:
        d, now, held = obs.delivery, obs.round, obs.holdings or []
        if d is None or not d.short_sales or now in self.sold:
            return None
        empty = [
            t
            for t in range(now + 1, min(now + 3, obs.rounds_total))
            if (held[t - now] if t - now < len(held) else 0) == 0 and t not in self.due
        ]
        if not empty:
            return None
        price = round(max(price_floor(obs), last_price(obs) or 0.0, 1.0) * self.BLOCKS, 2)
        collateral = d.collateral_fraction * price + d.collateral_per_block * self.BLOCKS
        keep = 2 * self.limits.get(now, 0.0)  # its top bid: the promise not to bid must break
        if (obs.budget or 0.0) + price < collateral + keep + 1e-6:
            return None
        self.sold.add(now)
        self.due.add(empty[0])
        return SendOffer(
            to=to,
            side="sell",
            blocks=self.BLOCKS,
            price=price,
            delivery_round=empty[0],
            short=True,
            message=f"We will deliver {self.BLOCKS} blocks to you by round {empty[0]}.",
        )

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase == "bidding":
            return self._bid(obs)
        if obs.phase != "negotiation":
            return WAIT
        now = obs.round
        k = self.turn[now] = self.turn.get(now, -1) + 1
        seen = [n + 1 for r, n in self.turn.items() if r < now]  # turns in the rounds it played
        more = bool(seen) and k < max(seen) - 1
        mine = [
            c
            for c in obs.coalitions or ()
            if obs.seat in c.members and c.status != "dissolved" and c.term_end >= now
        ]
        if mine:
            return LeaveCoalition(coalition_id=mine[0].coalition_id)
        if more and obs.mechanism.coalition_policy != "restrict":
            for c in obs.coalitions or ():
                if obs.seat in c.invited and c.status != "dissolved":
                    return CommitToCoalition(coalition_id=c.coalition_id)
        others = sorted((s for s in obs.active_labs if s != obs.seat), key=lab_index)
        if not others:
            return WAIT
        after = [s for s in others if lab_index(s) > lab_index(obs.seat)]
        if now in self.promised:
            return self._short_sale(obs, (after or others)[0]) or WAIT
        self.promised.add(now)
        if more and obs.mechanism.coalition_policy != "restrict":
            term = max(1, min(self.TERM, obs.rounds_total - now))
            purpose = (
                f"We will stay in this coalition until round {now + term - 1}. "
                + self._promises(obs, to_you=False)
            )
            return FormCoalition(members=others[:MAX_INVITEES], purpose=purpose, term_rounds=term)
        return SendMessage(to=(after or others)[0], text=self._promises(obs, to_you=True))
