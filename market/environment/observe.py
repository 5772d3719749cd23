"""Builds each seat's :class:`~market.environment.observations.Observation` from the env's state.

A seat sees its own private state, the public market view, what is addressed to it and what the
mechanism reveals (see :mod:`market.environment.observations`). Views that cannot change before the
round ends are built once per round and seat; the mechanism's view once per mechanism.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

from market.core.coalitions import Coalition, CoalitionBook
from market.core.collusion import SUSPECTED
from market.core.delivery import failure_rate
from market.core.mechanisms import Mechanism
from market.core.negotiation import Book, Message, Offer
from market.core.phases import LEGAL
from market.core.rewards import bid_distribution
from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER, lab_index
from market.core.settlement import RoundResult
from market.core.shocks import Shock
from market.core.summation import ordered_sum
from market.core.world import World
from market.environment.observations import (
    CoalitionView,
    ContractView,
    DeliveryView,
    DesignerStats,
    JobView,
    LastActionView,
    MarketResultView,
    MechanismView,
    MessageView,
    Observation,
    OfferView,
    PitchView,
    ShockView,
    fast_model,
)

T = TypeVar("T")

#: message views kept before the cache starts afresh (a view is rebuilt on its next use)
MESSAGE_VIEWS_KEPT = 4096


class MarketState(Protocol):
    """The env state an observation is built from (``raw_env`` provides it)."""

    world: World
    round: int
    phase: str
    scenario: Scenario
    mechanism: Mechanism
    book: Book
    coalitions: CoalitionBook
    shocks: list[Shock]
    prices: list[float]
    results: list[RoundResult]
    designer_history: dict[str, list[float]]
    infos: dict[str, dict[str, object]]  # each seat's last step info (its last action's verdict)


@dataclass(slots=True)
class RoundViews:
    """The parts of one seat's observation that cannot change before the round ends."""

    me: int  # lab index; -1 for the designer
    active_labs: list[str]
    shocks: list[ShockView]
    price_history: list[float | None]
    last_result: MarketResultView | None
    jobs: list[JobView] | None = None  # bidders
    designer_stats: DesignerStats | None = None  # the designer


class SeatViews:
    """The observation builder of one env, with its per-round and per-mechanism caches."""

    def __init__(self) -> None:
        self._round_cache: dict[Hashable, object] = {}
        self._mech_views: dict[bool, tuple[Mechanism, MechanismView]] = {}
        self._seat_cache: dict[
            str, tuple[tuple[int, str, bool], LastActionView | None, Observation]
        ] = {}
        # each seat's last-action view, kept with the info dict it was read from (see last_action)
        self._last: dict[str, tuple[object, LastActionView | None]] = {}
        # a message's view is the same for every seat that may see it: built once per message
        # (keyed by id, the message kept alongside so its id cannot be reused while cached)
        self._message_views: dict[int, tuple[Message, MessageView]] = {}
        # per round: each seat's fixed views, and each lab's delivery view with its collateral
        self._seat_round: dict[str, RoundViews] = {}
        self._deliveries: dict[int, tuple[float, DeliveryView]] = {}
        # the reputations every seat sees (active labs), keyed on the world's reputation version
        self._shared: tuple[int, dict[str, float]] | None = None

    def observe(self, env: MarketState, agent: str, version: int, acting: bool) -> Observation:
        """``agent``'s observation, rebuilt only when the state it can see may have changed: after
        a valid action other than wait (the env's state ``version``) and at round boundaries."""
        key = (version, env.phase, acting)
        last = self.last_action(env, agent)
        cached = self._seat_cache.get(agent)
        # a refused action or a wait leaves the version alone: the verdict must still show
        if cached is not None and cached[0] == key and cached[1] is last:
            return cached[2]
        world = env.world
        if self._shared is None or self._shared[0] != world.reputation_version:
            # the active labs change only where new_round() drops this; reputations only
            # through lose_reputation(), which moves the version
            self._shared = (
                world.reputation_version,
                {lab.seat: lab.reputation for lab in world.labs if lab.active},
            )
        legal = list(LEGAL[env.phase]) if acting else []
        obs = self.observation(env, agent, legal, dict(self._shared[1]))
        self._seat_cache[agent] = (key, last, obs)
        return obs

    def last_action(self, env: MarketState, agent: str) -> LastActionView | None:
        """The verdict on ``agent``'s previous step (:func:`last_action_view`), built once per
        step: the env gives each step a new info dict, kept here so its id is not reused."""
        info = env.infos.get(agent)
        cached = self._last.get(agent)
        if cached is not None and cached[0] is info:
            return cached[1]
        view = None if info is None else last_action_view(info, env.scenario)
        self._last[agent] = (info, view)
        return view

    def new_round(self) -> None:
        """Forget the per-round views (a round started, or a lab left)."""
        self._round_cache = {}
        self._seat_round = {}
        self._deliveries = {}
        self._shared = None

    def _per_round(self, key: Hashable, build: Callable[[], T]) -> T:
        """A view that cannot change before the round ends, built once per round and seat."""
        cache = self._round_cache
        if key not in cache:
            cache[key] = build()
        return cache[key]  # type: ignore[return-value]

    def observation(
        self,
        env: MarketState,
        agent: str,
        legal: list[str],
        reputations: dict[str, float] | None = None,
    ) -> Observation:
        """``agent``'s observation of ``env`` now, with ``legal`` as its legal actions;
        ``reputations`` (every active lab's, by seat) when the caller has them for this state."""
        world, now = env.world, env.round
        is_designer = agent == DESIGNER
        fixed = self._seat_round.get(agent)
        if fixed is None:  # what the seat sees that cannot change before the round ends
            fixed = self._seat_round[agent] = self._round_views(env, agent)
        me = fixed.me
        seat_of = world.labs
        messages = [
            self._message_view(world, m)
            for m in env.book.messages[-20:]
            if m.recipients is None or m.sender == me or me in m.recipients
        ]
        pitches = [
            fast_model(
                PitchView,
                lab=seat_of[p.lab].seat,
                text=p.text,
                blocks_requested=p.blocks_requested,
                counters=[f"{seat_of[c].seat}: {t}" for c, t in p.counters],
            )
            for p in env.book.pitches.values()
        ]
        public_coalitions = [
            coalition_view(world, c, me, private=False)
            for c in env.coalitions.coalitions.values()
            if c.status != "dissolved"
        ]
        fields: dict[str, object] = dict(
            seat=agent,
            role="designer" if is_designer else "bidder",
            round=now,
            rounds_total=env.scenario.rounds,
            value_unit=env.scenario.rewards.value_unit,
            phase=env.phase,
            legal_actions=legal,
            mechanism=self._mechanism_view(env.mechanism, is_designer),
            capacity=int(world.capacity[now]),
            reliability=float(world.reliability[now]),
            energy_floor=float(world.energy_floor[now]),
            active_labs=fixed.active_labs,
            reputations=(
                {lab.seat: lab.reputation for lab in seat_of if lab.active}
                if reputations is None
                else reputations
            ),
            public_coalitions=public_coalitions,
            messages=messages,
            pitches=pitches,
            shocks=fixed.shocks,
            price_history=fixed.price_history,
            last_result=fixed.last_result,
        )
        if is_designer:
            fields["designer_stats"] = fixed.designer_stats
        else:
            lab = seat_of[me]
            book = env.book
            received: list[OfferView] = []
            sent: list[OfferView] = []
            closed: list[OfferView] = []  # this round's: the book forgets them at its end
            for o in book.offers.values():  # one pass for all lists, each in book order
                if o.recipient == me or o.sender == me:
                    view = offer_view(world, o)
                    if o.status != "open":
                        closed.append(view)
                    elif o.recipient == me:
                        received.append(view)
                    else:
                        sent.append(view)
            fields.update(
                budget=lab.budget,
                reputation=lab.reputation,
                holdings=world.holdings[me, now:].tolist(),
                reserved=book.reserved.of(me, now, int(world.holdings.shape[1])),
                jobs=fixed.jobs,
                offers_received=received,
                offers_sent=sent,
                closed_offers=closed,
                contracts=[
                    fast_model(
                        ContractView,
                        contract_id=c.contract_id,
                        seller=seat_of[c.seller].seat,
                        buyer=seat_of[c.buyer].seat,
                        blocks=c.blocks,
                        price=c.price,
                        delivery_round=c.delivery_round,
                        short=c.short,
                        collateral=c.collateral,
                    )
                    for c in book.contracts
                    if c.delivered < 0 and me in (c.seller, c.buyer)
                ],
                coalitions=[
                    coalition_view(world, c, me, private=True) for c in env.coalitions.of(me)
                ],
                delivery=self._delivery_view(env, me),
            )
        fields["last_action"] = self.last_action(env, agent)
        return fast_model(Observation, **fields)

    def _round_views(self, env: MarketState, agent: str) -> RoundViews:
        """The parts of ``agent``'s observation that cannot change before the round ends (its
        lab index, the active labs, the shocks it knows of, the price history and last result
        as revealed to it, its jobs or the designer's statistics), built once per round."""
        world, now, results, prices = env.world, env.round, env.results, env.prices
        is_designer = agent == DESIGNER
        me = -1 if is_designer else lab_index(agent)
        seat_of = world.labs
        active = self._per_round("active", lambda: [lab.seat for lab in seat_of if lab.active])
        views = RoundViews(
            me=me,
            active_labs=active,
            shocks=shock_views(world, env.shocks, now, me),
            price_history=self._per_round(
                ("prices", is_designer),
                lambda: [
                    p
                    if (
                        r.mechanism.reveal_clearing_price
                        and (r.sold or r.mechanism.reveal_reserve)
                        or is_designer
                    )
                    else None
                    for p, r in zip(prices, results, strict=True)
                ],
            ),
            last_result=result_view(
                world,
                results,
                me,
                is_designer,
                self._per_round("winners", lambda: winners_of(world, results)),
            ),
        )
        if is_designer:
            h = env.designer_history
            views.designer_stats = fast_model(
                DesignerStats,
                welfare_ratio=list(h["welfare_ratio"]),
                fairness=list(h["fairness"]),
                participation=list(h["participation"]),
                stability=list(h["stability"]),
                revenue=[r.revenue for r in results],
                prices=list(prices),
                suspected_cartels=ordered_sum(
                    1 for _, score in results[-1].suspected if score >= SUSPECTED
                )
                if results
                else 0,
                active_labs=len(active),
            )
        else:
            views.jobs = [
                fast_model(
                    JobView,
                    job_id=j.job_id,
                    size=j.size,
                    progress=j.progress,
                    deadline=j.deadline,
                    value=j.value,
                    partial_credit=j.partial_credit,
                    min_reliability=j.min_reliability,
                    status=j.status,
                )
                for j in seat_of[me].jobs
                if j.status != "pending"
            ]
        return views

    def _message_view(self, world: World, m: Message) -> MessageView:
        """The view of message ``m`` (the same for every seat that sees it), built once."""
        cached = self._message_views.get(id(m))
        if cached is not None and cached[0] is m:
            return cached[1]
        seat_of = world.labs
        view = fast_model(
            MessageView,
            sender=seat_of[m.sender].seat,
            to="all" if m.recipients is None else [seat_of[i].seat for i in m.recipients],
            text=m.text,
            round=m.round,
        )
        if len(self._message_views) >= MESSAGE_VIEWS_KEPT:  # old messages scroll out of view
            self._message_views = {}
        self._message_views[id(m)] = (m, view)
        return view

    def _delivery_view(self, env: MarketState, me: int) -> DeliveryView:
        """:func:`delivery_view`, reused within the round while lab ``me``'s collateral on open
        short sales (the one part that moves between rounds) is unchanged."""
        held = collateral_held(env, me)
        cached = self._deliveries.get(me)
        if cached is not None and cached[0] == held:
            return cached[1]
        rate = self._per_round("failure_rate", lambda: round_failure_rate(env))
        view = delivery_view(env, me, rate)
        self._deliveries[me] = (held, view)
        return view

    def _mechanism_view(self, mech: Mechanism, is_designer: bool) -> MechanismView:
        """The mechanism as a seat sees it (the reserve hidden unless revealed); cached per mechanism."""
        cached = self._mech_views.get(is_designer)
        if cached is not None and cached[0] is mech:
            return cached[1]
        fields = mech.model_dump()
        if not (mech.reveal_reserve or is_designer):
            fields["reserve_price"] = None
        view = fast_model(MechanismView, **fields)
        self._mech_views[is_designer] = (mech, view)
        return view


def last_action_view(info: dict[str, object], scenario: Scenario) -> LastActionView | None:
    """The verdict in a seat's last step ``info`` (None if it has not acted yet): the action
    type, whether the env accepted it, the env's reason and the penalty when it did not, and the
    result it reported. Results are small dicts of ids and counts, copied as JSON."""
    action, error = info.get("action"), info.get("error")
    if action is None and error is None:
        return None
    result = info.get("result")
    return fast_model(
        LastActionView,
        round=int(cast(int, info.get("round", 0))),
        phase=str(info.get("phase", "")),
        action_type=None if action is None else str(action),
        accepted=error is None,
        error=None if error is None else str(error),
        penalty=0.0 if error is None else scenario.rewards.invalid_action_penalty,
        result=json.loads(json.dumps(result, default=str)) if isinstance(result, dict) else None,
    )


def shock_views(world: World, shocks: list[Shock], now: int, me: int) -> list[ShockView]:
    """The shocks lab ``me`` knows of by round ``now``: public ones and those that hit it."""
    labs = world.labs
    return [
        fast_model(
            ShockView,
            kind=s.kind,
            round=s.round,
            duration=s.duration,
            magnitude=s.magnitude,
            target=None if s.target is None else labs[s.target].seat,
            public=s.public,
        )
        for s in shocks
        if s.round <= now and (s.public or (s.target == me and me >= 0))
    ]


def offer_view(world: World, o: Offer) -> OfferView:
    labs = world.labs
    return fast_model(
        OfferView,
        offer_id=o.offer_id,
        sender=labs[o.sender].seat,
        recipient=labs[o.recipient].seat,
        side=o.side,
        blocks=o.blocks,
        price=o.price,
        delivery_round=o.delivery_round,
        expires_round=o.expires_round,
        status=o.status,
        message=o.message,
        short=o.short,
        # every field, in declared order (fast_model keeps it: the JSON bytes stay the same)
        give_blocks=o.give_blocks or None,
        give_round=o.give_round if o.give_blocks else None,
    )


def coalition_view(world: World, c: Coalition, me: int, private: bool) -> CoalitionView:
    """A coalition as lab ``me`` sees it: the pool and balance only for members (``private``)."""
    labs = world.labs
    member = private and me in c.members
    return fast_model(
        CoalitionView,
        coalition_id=c.coalition_id,
        leader=labs[c.leader].seat,
        members=[labs[m].seat for m in c.members],
        invited=[labs[m].seat for m in sorted(c.invited)],
        purpose=c.purpose,
        split=c.split,
        term_end=c.term_end,
        status=c.status,
        pool=c.pool if member else None,
        my_balance=c.balances.get(me) if member else None,
    )


def winners_of(world: World, results: list[RoundResult]) -> dict[str, int]:
    """Last round's blocks won per seat (seats that won any, by lab index); built once a round
    and copied into every seat's :func:`result_view` instead of rebuilt per seat."""
    won = results[-1].won if results else {}
    return {world.labs[k].seat: v for k, v in sorted(won.items()) if v}


def result_view(
    world: World,
    results: list[RoundResult],
    me: int,
    is_designer: bool,
    winners: dict[str, int] | None = None,
) -> MarketResultView | None:
    """Last round's clearing as far as the mechanism reveals it to lab ``me`` (or the designer).
    ``winners`` is :func:`winners_of`'s dict when the caller shares it between seats."""
    if not results:
        return None
    r = results[-1]
    m = r.mechanism
    labs = world.labs
    show_ids = m.reveal_winner_identity or is_designer
    view: dict[str, object] = dict(
        round=r.round,
        auction_type=m.auction_type,
        blocks_sold=r.sold,
        my_won=r.won.get(me, 0),
        my_paid=r.paid.get(me, 0.0),
    )
    # with nothing sold the 'price' is the reserve: shown only where the reserve is
    if m.reveal_clearing_price and (r.sold or m.reveal_reserve) or is_designer:
        view["clearing_price"] = r.price
    if m.reveal_reserve or is_designer:
        view["reserve"] = r.reserve
    if show_ids:
        view["winners"] = dict(winners if winners is not None else winners_of(world, results))
        view["judge_grants"] = {labs[v.lab].seat: v.granted for v in r.verdicts if v.granted}
    if m.reveal_competing_bids:
        schedules = [list(e.bids) for e in r.bids]
        view["competing_bids"] = schedules if show_ids else sorted(schedules, reverse=True)
    if m.reveal_bid_distribution:
        flat = sorted(b for e in r.bids for b in e.bids)
        view["bid_distribution"] = bid_distribution(flat) if flat else {"count": 0.0}
    return fast_model(MarketResultView, **view)


def round_failure_rate(env: MarketState) -> float:
    """This round's probability that an owned block fails: the same for every lab (it reads
    the round's capacity and reliability, fixed at reset)."""
    sc = env.scenario
    return failure_rate(
        env.world, sc.delivery, sc.capacity.reliability, min(env.round, sc.rounds - 1)
    )


def delivery_view(env: MarketState, me: int, rate: float | None = None) -> DeliveryView:
    """Lab ``me``'s view of delivery risk: the rules, this round's failure probability
    (``rate``, when the caller has :func:`round_failure_rate`), its collateral on open short
    sales and its blocks that failed at the last close."""
    spec = env.scenario.delivery
    last = env.results[-1].failures if env.results else []
    mine = next((f for f in last if f.lab == me), None)
    return fast_model(
        DeliveryView,
        failure_rate=round_failure_rate(env) if rate is None else rate,
        base_failure_rate=spec.owned_failure_rate,
        outage_exposure=spec.outage_exposure,
        reliability_exposure=spec.reliability_exposure,
        short_sales=spec.short_sales,
        collateral_fraction=spec.collateral_fraction,
        collateral_per_block=spec.collateral_per_block,
        breach_compensation=spec.breach_compensation,
        collateral_held=collateral_held(env, me),
        failed_last_round=0 if mine is None else len(mine.slots),
        failed_block_ids=[] if mine is None else mine.block_ids(),
    )


def collateral_held(env: MarketState, me: int) -> float:
    """The collateral lab ``me`` has posted on its open (undelivered) sales."""
    return ordered_sum(
        c.collateral for c in env.book.contracts if c.seller == me and c.delivered < 0
    )
