"""Each built-in agent does what its name says, on crafted observations and short episodes, and
no agent of the population makes an invalid action in normal play."""

from __future__ import annotations

from typing import Any

import pytest

from agents.population import (
    ColluderBidder,
    DropoutBidder,
    ExploiterBidder,
    GreedyHoarder,
    NoNegotiationBidder,
    RuleDesigner,
    RuleExpert,
    ShaderBidder,
    equilibrium_bid,
)
from agents.registry import REGISTRY, make_agent
from agents.scripted import marginal_values
from market.core.actions import (
    AcceptOffer,
    AllocateToJob,
    Bid,
    CommitToCoalition,
    Finish,
    LeaveCoalition,
    MakePitch,
    SendMessage,
    SendOffer,
    SetMechanism,
    Wait,
)
from market.core.mechanisms import Mechanism, first_price_equilibrium_bid
from market.environment.aec import LEGAL, raw_env
from market.environment.observations import (
    CoalitionView,
    DeliveryView,
    DesignerStats,
    JobView,
    MarketResultView,
    MechanismView,
    MessageView,
    Observation,
    OfferView,
)
from market.run.rollout import run_episode
from scenarios import load_scenario

POPULATION = (
    "shader",
    "colluder",
    "dropout",
    "exploiter",
    "greedy_hoarder",
    "no_negotiation",
    "rule_expert",
)


# --- crafted observations ---------------------------------------------------------------------


def mechanism(**fields: Any) -> MechanismView:
    full = Mechanism(**fields).model_dump()
    if not full["reveal_reserve"]:
        full["reserve_price"] = None
    return MechanismView(**full)


def job(
    job_id: str,
    size: int,
    per_block: float,
    deadline: int,
    progress: int = 0,
    partial: bool = False,
    min_reliability: float = 0.0,
) -> JobView:
    return JobView(
        job_id=job_id,
        size=size,
        progress=progress,
        deadline=deadline,
        value=per_block * size,
        partial_credit=partial,
        min_reliability=min_reliability,
        status="active",
    )


def open_offer(
    offer_id: str, side: str, blocks: int, price: float, sender: str = "bidder_1"
) -> OfferView:
    """An open offer to bidder_0, delivered and expiring in round 0."""
    return OfferView(
        offer_id=offer_id,
        sender=sender,
        recipient="bidder_0",
        side=side,
        blocks=blocks,
        price=price,
        delivery_round=0,
        expires_round=0,
        status="open",
    )


def result(round_: int, **fields: Any) -> MarketResultView:
    return MarketResultView(
        **{"round": round_, "auction_type": "second_price", "blocks_sold": 0, **fields}
    )


def bidder_obs(
    *,
    phase: str = "bidding",
    round_: int = 0,
    rounds_total: int = 5,
    labs: int = 3,
    seat: str = "bidder_0",
    jobs: tuple[JobView, ...] = (),
    mech: MechanismView | None = None,
    capacity: int = 8,
    reliability: float = 1.0,
    energy_floor: float = 0.0,
    budget: float = 1000.0,
    holdings: list[int] | None = None,
    **fields: Any,
) -> Observation:
    active = [f"bidder_{i}" for i in range(labs)]
    return Observation(
        seat=seat,
        role="bidder",
        round=round_,
        rounds_total=rounds_total,
        value_unit=100.0,
        phase=phase,
        legal_actions=list(LEGAL[phase]),
        mechanism=mech or mechanism(auction_type="second_price", reserve_price=10.0),
        capacity=capacity,
        reliability=reliability,
        energy_floor=energy_floor,
        active_labs=active,
        reputations=dict.fromkeys(active, 0.8),
        public_coalitions=[],
        messages=fields.pop("messages", []),
        pitches=[],
        shocks=[],
        price_history=fields.pop("price_history", []),
        budget=budget,
        reputation=0.8,
        holdings=holdings if holdings is not None else [0] * (rounds_total - round_),
        jobs=list(jobs),
        offers_received=fields.pop("offers_received", []),
        offers_sent=[],
        contracts=[],
        coalitions=fields.pop("coalitions", []),
        **fields,
    )


def designer_obs(round_: int = 1, mech: MechanismView | None = None, **stats: Any) -> Observation:
    base: dict[str, Any] = {
        "welfare_ratio": [1.0],
        "fairness": [1.0],
        "participation": [1.0],
        "stability": [1.0],
        "revenue": [0.1],
        "prices": [20.0],
        "suspected_cartels": 0,
        "active_labs": 3,
    }
    base.update(stats)
    return Observation(
        seat="designer_0",
        role="designer",
        round=round_,
        rounds_total=5,
        value_unit=100.0,
        phase="design",
        legal_actions=list(LEGAL["design"]),
        mechanism=mech or mechanism(reserve_price=10.0),
        capacity=8,
        reliability=1.0,
        energy_floor=0.0,
        active_labs=[f"bidder_{i}" for i in range(base["active_labs"])],
        reputations={},
        public_coalitions=[],
        messages=[],
        pitches=[],
        shocks=[],
        price_history=list(base["prices"]),
        designer_stats=DesignerStats(**base),
    )


def fresh(agent: Any, seed: int = 0) -> Any:
    agent.reset(seed)
    return agent


# --- scripted baselines: truthful values and doing nothing --------------------------------------


def test_marginal_values_follow_execution_order_and_never_rise() -> None:
    # execution runs blocks earliest deadline first: the first two blocks go to the 15-a-block
    # job due in round 1, so a unit is never worth more than the units before it
    early = job("early", 2, 15.0, 1, partial=True)
    late = job("late", 2, 45.0, 3, partial=True)
    assert marginal_values(bidder_obs(jobs=(late, early))) == [15.0, 15.0, 15.0, 15.0]
    # one block already held goes to the first unit; reliability scales every value
    held = bidder_obs(jobs=(late, early), holdings=[1, 0, 0, 0, 0], reliability=0.5)
    assert marginal_values(held) == [7.5, 7.5, 7.5]
    # without the early job the late job's blocks are worth their own value
    assert marginal_values(bidder_obs(jobs=(late,))) == [45.0, 45.0]


def risk(failure_rate: float) -> DeliveryView:
    """Delivery risk as a bidder sees it, with this round's failure probability."""
    return DeliveryView(
        failure_rate=failure_rate,
        base_failure_rate=failure_rate,
        outage_exposure=0.0,
        reliability_exposure=0.0,
        short_sales=True,
        collateral_fraction=0.5,
        collateral_per_block=0.0,
        breach_compensation=0.0,
        collateral_held=0.0,
    )


def test_marginal_values_count_a_block_at_its_chance_to_survive_the_close() -> None:
    # a block bought now fails at the close with the round's failure rate: at 0.25 it is worth
    # 3/4 of its value x reliability (45 x 0.8 x 0.75 = 27, 15 x 0.8 x 0.75 = 9)
    late = job("late", 2, 45.0, 3, partial=True)
    early = job("early", 1, 15.0, 1, partial=True)
    obs = bidder_obs(jobs=(late, early), reliability=0.8, delivery=risk(0.25))
    assert marginal_values(obs) == pytest.approx([9.0, 9.0, 9.0])
    assert marginal_values(bidder_obs(jobs=(late,), reliability=0.8, delivery=risk(0.25))) == (
        pytest.approx([27.0, 27.0])
    )
    # no risk, no discount: the same values as without a delivery view
    assert marginal_values(bidder_obs(jobs=(late,), delivery=risk(0.0))) == [45.0, 45.0]
    # a block certain to fail is worth nothing
    assert marginal_values(bidder_obs(jobs=(late,), delivery=risk(1.0))) == [0.0, 0.0]


def test_truthful_bids_net_of_failure_risk() -> None:
    """truthful's bid is its values times the survival chance, the same rule as the helper."""
    late = job("late", 2, 45.0, 3, partial=True)
    bid = make_agent("truthful").act(bidder_obs(jobs=(late,), delivery=risk(0.5)))
    assert isinstance(bid, Bid) and bid.bids == pytest.approx([22.5, 22.5])


def test_marginal_values_skip_all_or_nothing_jobs_that_cannot_finish() -> None:
    # 5 blocks due now; an equal share of 4 blocks among 2 labs is 2: it cannot finish, and
    # without partial credit its blocks are worth nothing
    hopeless = job("hopeless", 5, 40.0, 0)
    assert marginal_values(bidder_obs(jobs=(hopeless,), capacity=4, labs=2)) == []
    # with 3 more rounds (4 x 2 = 8 blocks' share) it can, and with partial credit it always pays
    assert (
        marginal_values(bidder_obs(jobs=(job("h", 5, 40.0, 3),), capacity=4, labs=2)) == [40.0] * 5
    )
    partial = job("p", 5, 40.0, 0, partial=True)
    assert marginal_values(bidder_obs(jobs=(partial,), capacity=4, labs=2)) == [40.0] * 5
    # failures count: a share of 2 x reliability 0.9 = 1.8 blocks cannot finish a 2-block job
    pair = job("pair", 2, 40.0, 0)
    assert marginal_values(bidder_obs(jobs=(pair,), capacity=4, labs=2)) == [40.0, 40.0]
    assert marginal_values(bidder_obs(jobs=(pair,), capacity=4, labs=2, reliability=0.9)) == []


def test_idle_does_nothing_and_earns_nothing_without_endowments() -> None:
    idle = make_agent("idle")
    for phase in ("negotiation", "bidding"):
        assert isinstance(idle.act(bidder_obs(phase=phase, jobs=(job("j", 2, 30.0, 0),))), Wait)
    # mechanism_stage_0 gives no endowment: no block, no payment, return exactly 0
    res = run_episode("mechanism_stage_0", 0, {"bidder_0": "idle"})
    assert res.returns["bidder_0"] == 0.0 and res.invalid_actions["bidder_0"] == 0


def test_rule_expert_counts_on_the_supply_rivals_left_over() -> None:
    # round 1 of 5, 6 blocks among 3 labs: an equal share (2) cannot finish a 4-block job due now
    four = job("four", 4, 40.0, 1)
    mech = mechanism(reserve_price=10.0)
    now = bidder_obs(round_=1, jobs=(four,), capacity=6, mech=mech, price_history=[10.0])
    assert fresh(RuleExpert()).act(now).bids == []
    # round 0 (6 blocks) cleared at the reserve and the rivals took 2: 4 were left over for a
    # bid at the floor, so the job is worth pursuing, its 4 blocks due now at value
    slack = result(0, blocks_sold=3, clearing_price=10.0, reserve=10.0, my_won=1, my_paid=10.0)
    expert = fresh(RuleExpert())
    expert.act(bidder_obs(capacity=6, mech=mech))  # round 0: it sees the 6 blocks auctioned
    assert expert.act(now.model_copy(update={"last_result": slack})).bids == [40.0] * 4
    # after a round that sold out above the reserve nothing was left over: back to a share of 2
    tight = result(0, blocks_sold=6, clearing_price=30.0, reserve=10.0, my_won=0)
    again = fresh(RuleExpert())
    again.act(bidder_obs(capacity=6, mech=mech))
    assert again.act(now.model_copy(update={"last_result": tight})).bids == []


# --- registry ----------------------------------------------------------------------------------


def test_every_population_agent_is_registered_and_takes_its_parameters() -> None:
    for name in (*POPULATION, "rule_designer"):
        assert name in REGISTRY
        role = "designer" if name == "rule_designer" else "bidder"
        assert make_agent(name, role=role).name == name
    colluder = make_agent("colluder?partners=bidder_1,bidder_2&adapt=false")
    assert colluder.fixed_partners == ["bidder_1", "bidder_2"] and colluder.adapt is False
    assert make_agent("dropout?patience=3").patience == 3
    with pytest.raises(ValueError):
        make_agent("dropout?patience=zero")
    with pytest.raises(ValueError):
        make_agent("colluder?adapt=maybe")


# --- shader -----------------------------------------------------------------------------------


def test_shader_bids_the_first_price_equilibrium_below_value() -> None:
    # one job worth 40 a block: a single value sample, so low falls back to the revealed reserve
    obs = bidder_obs(
        jobs=(job("j", 1, 40.0, 2),), mech=mechanism(auction_type="first_price", reserve_price=10.0)
    )
    bid = fresh(ShaderBidder()).act(obs)
    assert bid.bids == [pytest.approx(first_price_equilibrium_bid(40.0, 3, 10.0, 40.0))]
    assert bid.bids == [pytest.approx(30.0)]  # 10 + (40 - 10) * 2/3
    assert bid.bids[0] < 40.0
    # five active labs: n = 5
    bid5 = fresh(ShaderBidder()).act(bidder_obs(labs=5, jobs=obs.jobs, mech=obs.mechanism))
    assert bid5.bids == [pytest.approx(10.0 + 30.0 * 4 / 5)]


def test_shader_estimates_the_value_range_from_what_it_sees() -> None:
    # values 20, 30, 40: span widened by one gap (10) on each side -> [10, 50]
    jobs = (job("a", 1, 40.0, 2), job("b", 1, 30.0, 2), job("c", 1, 20.0, 2))
    obs = bidder_obs(jobs=jobs, mech=mechanism(auction_type="first_price", reserve_price=5.0))
    bid = fresh(ShaderBidder()).act(obs)
    expected = [first_price_equilibrium_bid(v, 3, 10.0, 50.0) for v in (40.0, 30.0, 20.0)]
    assert bid.bids == pytest.approx(expected)
    assert all(b < v for b, v in zip(bid.bids, (40.0, 30.0, 20.0), strict=True))
    # revealed competing bids widen the sample: 8 becomes the minimum
    last = result(0, auction_type="first_price", competing_bids=[[8.0], [30.0]])
    bid = fresh(ShaderBidder()).act(
        bidder_obs(round_=1, jobs=jobs, mech=obs.mechanism, last_result=last)
    )
    samples = [40.0, 30.0, 20.0, 8.0, 30.0]
    gap = (max(samples) - min(samples)) / (len(samples) - 1)
    low = min(samples) - gap
    assert low < 5.0  # below the reserve: the reserve version of the equilibrium applies
    assert bid.bids == pytest.approx(
        [equilibrium_bid(v, 3, low, 48.0, 5.0) for v in (40.0, 30.0, 20.0)]
    )


@pytest.mark.parametrize("auction_type", ["second_price", "vcg", "posted_price", "fair_share"])
def test_shader_bids_its_values_where_shading_does_not_pay(auction_type: str) -> None:
    obs = bidder_obs(
        jobs=(job("j", 2, 40.0, 2), job("k", 1, 25.0, 2)),
        reliability=0.9,
        mech=mechanism(auction_type=auction_type, reserve_price=10.0),
    )
    assert fresh(ShaderBidder()).act(obs).bids == pytest.approx([36.0, 36.0, 22.5])


def test_equilibrium_bid_with_a_reserve_above_the_low_value() -> None:
    # at v = r the bid is r; it rises with v and stays below v; with r <= low it is the helper
    assert equilibrium_bid(20.0, 3, 10.0, 50.0, 20.0) == pytest.approx(20.0)
    bids = [equilibrium_bid(v, 3, 10.0, 50.0, 20.0) for v in (25.0, 30.0, 40.0, 50.0)]
    assert bids == sorted(bids) and all(
        b < v for b, v in zip(bids, (25.0, 30.0, 40.0, 50.0), strict=True)
    )
    # v - ((v-L)^n - (r-L)^n) / (n (v-L)^(n-1)) at v=40, L=10, r=20, n=3
    assert equilibrium_bid(40.0, 3, 10.0, 50.0, 20.0) == pytest.approx(
        40 - (30**3 - 10**3) / (3 * 30**2)
    )
    assert equilibrium_bid(40.0, 3, 10.0, 50.0, 5.0) == pytest.approx(
        first_price_equilibrium_bid(40.0, 3, 10.0, 50.0)
    )


# --- dropout ----------------------------------------------------------------------------------


def test_dropout_finishes_after_patience_losing_rounds() -> None:
    jobs = (job("j", 4, 30.0, 4),)
    agent = fresh(DropoutBidder())
    assert agent.act(bidder_obs(jobs=jobs)).bids  # round 0: had demand
    assert isinstance(
        agent.act(
            bidder_obs(phase="negotiation", round_=1, jobs=jobs, last_result=result(0, my_won=0))
        ),
        Wait,
    )
    assert agent.act(bidder_obs(round_=1, jobs=jobs, last_result=result(0, my_won=0))).bids
    assert isinstance(
        agent.act(
            bidder_obs(phase="negotiation", round_=2, jobs=jobs, last_result=result(1, my_won=0))
        ),
        Finish,
    )


def test_dropout_streak_resets_on_a_win_and_ignores_rounds_without_demand() -> None:
    jobs = (job("j", 4, 30.0, 4),)
    agent = fresh(DropoutBidder(patience=2))
    agent.act(bidder_obs(jobs=jobs))
    agent.act(bidder_obs(round_=1, jobs=jobs, last_result=result(0, my_won=0)))  # 1 loss
    agent.act(
        bidder_obs(round_=2, jobs=(), last_result=result(1, my_won=1))
    )  # a win: reset; no demand
    assert not isinstance(
        agent.act(
            bidder_obs(phase="negotiation", round_=3, jobs=jobs, last_result=result(2, my_won=0))
        ),
        Finish,
    )
    agent3 = fresh(DropoutBidder(patience=3))
    agent3.act(bidder_obs(jobs=jobs))
    agent3.act(bidder_obs(round_=1, jobs=jobs, last_result=result(0, my_won=0)))
    assert not isinstance(
        agent3.act(
            bidder_obs(phase="negotiation", round_=2, jobs=jobs, last_result=result(1, my_won=0))
        ),
        Finish,
    )


def test_dropout_leaves_the_market_in_play_after_losing() -> None:
    """Outbid by two rich greedy hoarders for scarce blocks, the dropout leaves; before it
    leaves, its last two rounds with demand were lost, and it won nothing since."""
    market = load_scenario(
        "market_round", capacity={"blocks": [2, 3]}, labs={"count": 3, "budget": [1000.0, 1000.0]}
    )
    left = 0
    for seed in range(6):
        env = raw_env(market)
        seats = {
            "designer_0": "fixed",
            "bidder_0": "dropout",
            "bidder_1": "greedy_hoarder",
            "bidder_2": "greedy_hoarder",
        }
        run_episode(market, seed, seats, env=env)
        exit_round = env.world.labs[0].exit_round
        if exit_round is None or exit_round == market.rounds - 1:
            continue
        left += 1
        before = env.round_log[:exit_round]
        assert all(log["won"].get("bidder_0", 0) == 0 for log in before)
        assert sum(1 for log in before if log["bids"].get("bidder_0")) >= 2
        assert env.round_log[exit_round]["bids"].get("bidder_0") is None  # gone before bidding
    assert left >= 4


# --- greedy hoarder ---------------------------------------------------------------------------


def test_greedy_hoarder_bids_beyond_need_at_high_prices_and_never_sells() -> None:
    obs = bidder_obs(jobs=(job("j", 1, 30.0, 2),), capacity=8, budget=1000.0)
    bid = fresh(GreedyHoarder()).act(obs)
    assert len(bid.bids) == 8 > len(marginal_values(obs))  # needs one block, bids for all eight
    assert all(b == pytest.approx(45.0) for b in bid.bids)  # 1.5 x its value per block
    assert len(fresh(GreedyHoarder()).act(bidder_obs(jobs=obs.jobs, budget=100.0)).bids) == 2
    asked = open_offer("o1", "buy", 1, 500.0)
    sold = open_offer("o2", "sell", 1, 50.0)
    hoarder = fresh(GreedyHoarder())
    assert isinstance(
        hoarder.act(
            bidder_obs(
                phase="negotiation",
                jobs=obs.jobs,
                holdings=[3, 0, 0, 0, 0],
                offers_received=[asked],
            )
        ),
        Wait,
    )
    assert hoarder.act(
        bidder_obs(phase="negotiation", jobs=obs.jobs, offers_received=[asked, sold])
    ) == AcceptOffer(offer_id="o2")


# --- exploiter --------------------------------------------------------------------------------


def test_exploiter_bids_exactly_the_revealed_reserve() -> None:
    jobs = (job("j", 3, 30.0, 3),)
    for auction_type in ("second_price", "first_price", "vcg"):
        obs = bidder_obs(jobs=jobs, mech=mechanism(auction_type=auction_type, reserve_price=12.0))
        assert fresh(ExploiterBidder()).act(obs).bids == [12.0, 12.0, 12.0]
    # an energy spike above the reserve: the effective reserve is the floor
    obs = bidder_obs(jobs=jobs, energy_floor=15.0, mech=mechanism(reserve_price=12.0))
    assert fresh(ExploiterBidder()).act(obs).bids == [15.0, 15.0, 15.0]
    # nothing worth more than the reserve: no bid
    obs = bidder_obs(jobs=(job("k", 2, 8.0, 3),), mech=mechanism(reserve_price=12.0))
    assert fresh(ExploiterBidder()).act(obs).bids == []


def test_exploiter_bids_just_above_the_last_second_price() -> None:
    jobs = (job("a", 2, 30.0, 3), job("b", 1, 18.0, 3))
    obs = bidder_obs(
        round_=1,
        jobs=jobs,
        mech=mechanism(reserve_price=10.0),
        last_result=result(0, clearing_price=20.0, reserve=10.0, blocks_sold=5),
    )
    assert fresh(ExploiterBidder()).act(obs).bids == [21.0, 21.0, 10.0]
    # clearing price hidden, competing bids revealed: the price is rebuilt from them
    hidden = result(0, reserve=10.0, blocks_sold=2, competing_bids=[[40.0, 25.0], [22.0, 12.0]])
    obs = bidder_obs(
        round_=1,
        jobs=jobs,
        last_result=hidden,
        mech=mechanism(reserve_price=10.0, reveal_clearing_price=False),
    )
    assert fresh(ExploiterBidder()).act(obs).bids == [23.0, 23.0, 10.0]


def test_exploiter_probes_upward_when_the_reserve_is_hidden() -> None:
    jobs = (job("j", 2, 30.0, 4),)
    mech = mechanism(reserve_price=12.0, reveal_reserve=False)
    agent = fresh(ExploiterBidder())
    first = agent.act(bidder_obs(jobs=jobs, mech=mech, energy_floor=3.0))
    assert first.bids == [4.0, 4.0]  # one step (value_unit / 100) above the energy floor
    second = agent.act(
        bidder_obs(
            round_=1, jobs=jobs, mech=mech, energy_floor=3.0, last_result=result(0, my_won=0)
        )
    )
    assert second.bids == [pytest.approx(7.0)] * 2  # + max(1, 10% of 30)
    third = agent.act(
        bidder_obs(
            round_=2, jobs=jobs, mech=mech, energy_floor=3.0, last_result=result(1, my_won=2)
        )
    )
    assert third.bids == second.bids  # it won: keeps the level


def test_exploiter_reneges_when_it_pays_and_finishes_when_done() -> None:
    jobs = (job("j", 2, 30.0, 4),)
    invite = CoalitionView(
        coalition_id="c0",
        leader="bidder_1",
        members=["bidder_1"],
        invited=["bidder_0"],
        purpose="x",
        split="equal",
        term_end=3,
        status="proposed",
    )
    agent = fresh(ExploiterBidder())
    joined = agent.act(
        bidder_obs(
            phase="negotiation",
            jobs=jobs,
            coalitions=[invite],
            mech=mechanism(reserve_price=10.0, withdrawal_penalty=5.0),
        )
    )
    assert isinstance(joined, CommitToCoalition)
    member = invite.model_copy(
        update={
            "members": ["bidder_1", "bidder_0"],
            "invited": [],
            "status": "active",
            "pool": 80.0,
            "my_balance": 20.0,
        }
    )
    cheap = mechanism(reserve_price=10.0, withdrawal_penalty=5.0)
    dear = mechanism(reserve_price=10.0, withdrawal_penalty=50.0)
    assert agent.act(
        bidder_obs(phase="negotiation", round_=1, jobs=jobs, coalitions=[member], mech=cheap)
    ) == LeaveCoalition(coalition_id="c0")
    assert not isinstance(
        agent.act(
            bidder_obs(phase="negotiation", round_=1, jobs=jobs, coalitions=[member], mech=dear)
        ),
        LeaveCoalition,
    )
    done = (job("j", 2, 30.0, 4, progress=2).model_copy(update={"status": "done"}),)
    assert isinstance(
        fresh(ExploiterBidder()).act(bidder_obs(phase="negotiation", round_=2, jobs=done)), Finish
    )


# --- colluder ---------------------------------------------------------------------------------


def test_colluders_rotate_the_designated_winner_and_suppress_bids() -> None:
    jobs = (job("j", 3, 30.0, 4),)
    mech = mechanism(reserve_price=5.0)
    for seat in ("bidder_0", "bidder_1", "bidder_2"):
        partners = ",".join(s for s in ("bidder_0", "bidder_1", "bidder_2") if s != seat)
        for r in range(4):
            agent = fresh(ColluderBidder(partners=partners))
            bid = agent.act(bidder_obs(seat=seat, round_=r, jobs=jobs, mech=mech))
            winner = f"bidder_{r % 3}"
            assert bid.bids == ([6.0, 6.0, 6.0] if seat == winner else []), (seat, r)
            talk = agent.act(
                bidder_obs(seat=seat, phase="negotiation", round_=r, jobs=jobs, mech=mech)
            )
            assert isinstance(talk, SendMessage) and sorted(talk.to) == sorted(partners.split(","))
            assert winner in talk.text


def test_colluders_find_each_other_by_the_public_handshake() -> None:
    agent = fresh(ColluderBidder())
    hello = agent.act(bidder_obs(phase="negotiation", jobs=(job("j", 2, 30.0, 4),)))
    assert isinstance(hello, SendMessage) and hello.to == "all" and agent.token in hello.text
    seen = [
        MessageView(sender="bidder_2", to="all", text=hello.text, round=0),
        MessageView(sender="bidder_1", to="all", text="hello everyone", round=0),
    ]
    bid = agent.act(bidder_obs(round_=1, jobs=(job("j", 2, 30.0, 4),), messages=seen))
    assert agent.partners == {"bidder_2"}
    assert bid.bids == []  # round 1: bidder_2 (position 1 of [bidder_0, bidder_2]) takes it


def test_colluder_stops_when_the_penalty_exceeds_its_gain_unless_told_not_to() -> None:
    jobs = (job("j", 3, 30.0, 4),)
    harsh = mechanism(
        reserve_price=5.0, coalition_policy="penalize_suspected", collusion_penalty=500.0
    )
    mild = mechanism(
        reserve_price=5.0, coalition_policy="penalize_suspected", collusion_penalty=1.0
    )
    for seat_round in (0, 1):
        obs = bidder_obs(round_=seat_round, jobs=jobs, mech=harsh)
        adaptive = fresh(ColluderBidder(partners="bidder_1"))
        assert adaptive.act(obs).bids == marginal_values(obs)  # truthful
        assert isinstance(
            adaptive.act(bidder_obs(phase="negotiation", round_=seat_round, jobs=jobs, mech=harsh)),
            Wait,
        )
        stubborn = fresh(ColluderBidder(partners="bidder_1", adapt=False))
        assert stubborn.act(obs).bids == ([6.0] * 3 if seat_round == 0 else [])
    cheap = fresh(ColluderBidder(partners="bidder_1")).act(bidder_obs(jobs=jobs, mech=mild))
    assert cheap.bids == [6.0] * 3


def test_cartel_exchanges_private_messages_and_takes_turns_in_play() -> None:
    from test_population_ordering import CARTEL, daedalus_market

    market = daedalus_market("allow", 0.0)
    for seed in range(3):
        env = raw_env(market)
        seats = {
            **{f"bidder_{i}": "truthful" for i in range(6)},
            **dict.fromkeys(CARTEL, "colluder"),
        }
        res = run_episode(market, seed, seats, env=env)
        private = [m for m in env.book.messages if m.recipients is not None]
        for r in range(1, market.rounds):  # round 0 is the public handshake
            senders = {f"bidder_{m.sender}" for m in private if m.round == r}
            assert senders == set(CARTEL)
        for log in res.round_log:
            winners = [s for s in CARTEL if log["won"].get(s, 0) > 0]
            assert set(winners) <= {CARTEL[log["round"] % 3]}
            for s in CARTEL:
                if s != CARTEL[log["round"] % 3]:
                    assert not log["bids"].get(s)


# --- rule designer ----------------------------------------------------------------------------


def decide(obs: Observation, seen: int | None = None) -> dict[str, Any]:
    agent = fresh(RuleDesigner())
    agent.active_seen = seen
    action = agent.act(obs)
    if not isinstance(action, SetMechanism):
        return {}
    update = action.mechanism.model_dump(exclude_none=True)
    # its amounts are credits, said in so many words: a daedalus scenario reads DAEDALUS units
    assert update.pop("units") == "credits"
    return update


def test_rule_designer_waits_without_signals() -> None:
    assert isinstance(
        fresh(RuleDesigner()).act(
            designer_obs(
                round_=0,
                welfare_ratio=[],
                fairness=[],
                participation=[],
                stability=[],
                revenue=[],
                prices=[],
            )
        ),
        Wait,
    )
    assert decide(designer_obs()) == {}


def test_rule_designer_penalises_suspected_collusion() -> None:
    update = decide(designer_obs(suspected_cartels=1, prices=[20.0, 30.0]))
    assert update == {"coalition_policy": "penalize_suspected", "collusion_penalty": 50.0}


def test_rule_designer_lowers_the_reserve_on_dropouts_and_goes_fair_when_unfair() -> None:
    assert decide(designer_obs(active_labs=2), seen=3) == {"reserve_price": 5.0}
    assert decide(designer_obs(participation=[1.0, 0.9])) == {"reserve_price": 5.0}
    assert decide(designer_obs(participation=[0.5])) == {"reserve_price": 5.0}
    assert decide(designer_obs(participation=[0.5], fairness=[0.4])) == {
        "reserve_price": 5.0,
        "auction_type": "fair_share",
    }


def test_rule_designer_reveals_prices_and_goes_second_price_on_volatility() -> None:
    mech = mechanism(auction_type="first_price", reserve_price=10.0, reveal_clearing_price=False)
    assert decide(designer_obs(stability=[0.4], mech=mech)) == {
        "reveal_clearing_price": True,
        "auction_type": "second_price",
    }


def test_rule_designer_answers_a_welfare_shortfall_with_second_price_and_a_low_reserve() -> None:
    mech = mechanism(auction_type="first_price", reserve_price=10.0)
    assert decide(designer_obs(welfare_ratio=[0.5], prices=[20.0], mech=mech)) == {
        "auction_type": "second_price",
        "reserve_price": 2.0,
    }


def test_rule_designer_changes_the_mechanism_in_play() -> None:
    changed = 0
    for seed in range(4):
        res = run_episode("coalition_market", seed, {"designer_0": "rule_designer"})
        mechs = [log["mechanism"] for log in res.round_log]
        changed += any(m != mechs[0] for m in mechs)
        assert res.invalid_actions["designer_0"] == 0
    assert changed >= 1


@pytest.mark.parametrize("designer", ["rule_designer", "random"])
def test_designers_in_credits_play_validly_where_the_scenario_reads_daedalus_units(
    designer: str,
) -> None:
    """daedalus_stage_4 reads a mechanism without ``units`` in DAEDALUS units (reserve in
    [0, 1]); designers that compute credits say so, so none of their updates is refused (seed 1
    gave rule_designer 3 and random 5 refusals when they sent bare credits)."""
    res = run_episode("daedalus_stage_4", 1, {"designer_0": designer})
    assert res.invalid_actions["designer_0"] == 0
    changed = {str(log["mechanism"]) for log in res.round_log}
    assert len(changed) > 1  # and their updates took effect


# --- rule expert ------------------------------------------------------------------------------


def test_rule_expert_bids_only_for_jobs_it_can_complete() -> None:
    big = job("big", 10, 40.0, deadline=0)  # needs 10 blocks this round; only 3 are released
    small = job("small", 2, 30.0, deadline=0)
    partial = job("part", 10, 35.0, deadline=0, partial=True)
    expert = fresh(RuleExpert())
    # two labs: an equal share of 3 blocks is ceil(1.5) = 2, enough for small, not for big
    two = bidder_obs(jobs=(big, small), capacity=3, labs=2, mech=mechanism(reserve_price=0.0))
    assert expert.act(two).bids == [30.0, 30.0]  # small's two blocks, due now: both at value
    # three labs: a share of 1 block completes neither job, so it bids for nothing
    three = two.model_copy(update={"active_labs": ["bidder_0", "bidder_1", "bidder_2"]})
    assert fresh(RuleExpert()).act(three).bids == []
    bid = fresh(RuleExpert()).act(
        bidder_obs(
            jobs=(big, partial), capacity=3, mech=mechanism(auction_type="vcg", reserve_price=0.0)
        )
    )
    assert bid.bids == [35.0, 35.0, 35.0]  # partial credit: every block pays


def test_rule_expert_shades_under_first_price_like_the_shader() -> None:
    obs = bidder_obs(
        jobs=(job("j", 1, 40.0, 2),), mech=mechanism(auction_type="first_price", reserve_price=10.0)
    )
    assert (
        fresh(RuleExpert()).act(obs).bids
        == fresh(ShaderBidder()).act(obs).bids
        == [pytest.approx(30.0)]
    )


def test_rule_expert_reduces_demand_under_second_price() -> None:
    patient = 5.0 + 3.0  # reserve + PATIENT_MARGIN (0.03) x value_unit (100)
    flexible = job("j", 6, 30.0, 4, partial=True)  # partial credit, due in round 4: no hurry
    obs = bidder_obs(jobs=(flexible,), capacity=6, labs=3, mech=mechanism(reserve_price=5.0))
    assert fresh(RuleExpert()).act(obs).bids == [patient] * 6
    # a job without partial credit due now needs its 3 blocks this round: those at value
    due = job("due", 3, 40.0, 0)
    obs = bidder_obs(jobs=(due, flexible), capacity=6, labs=2, mech=mechanism(reserve_price=5.0))
    assert fresh(RuleExpert()).act(obs).bids == [40.0, 40.0, 40.0] + [patient] * 3


def test_a_patient_unit_is_bid_at_the_price_later_rounds_have_shown() -> None:
    """Blocks kept selling above the floor: a unit it can buy later is worth the lower quartile
    of the revealed prices to it, not the floor plus margin (which would lose every block)."""
    flexible = job("j", 6, 30.0, 4, partial=True)
    mech = mechanism(reserve_price=5.0)
    # five revealed prices (one hidden): sorted 12, 14, 20, 22, 25; lower quartile = index 1
    history = [20.0, None, 12.0, 25.0, 14.0, 22.0]
    obs = bidder_obs(jobs=(flexible,), capacity=6, labs=3, mech=mech, price_history=history)
    assert fresh(RuleExpert()).act(obs).bids == [14.0] * 6
    # prices at the floor: the patient bid stays at reserve + margin (5 + 3)
    cheap = bidder_obs(jobs=(flexible,), capacity=6, labs=3, mech=mech, price_history=[5.0, 6.0])
    assert fresh(RuleExpert()).act(cheap).bids == [8.0] * 6
    # a going price above the unit's value: never bid above value (30)
    dear = bidder_obs(jobs=(flexible,), capacity=6, labs=3, mech=mech, price_history=[40.0])
    assert fresh(RuleExpert()).act(dear).bids == [30.0] * 6


def test_rule_expert_adapts_to_shocks() -> None:
    fussy = job("fussy", 2, 40.0, 3, min_reliability=0.9)
    plain = job("plain", 2, 20.0, 3, partial=True)
    mech = mechanism(auction_type="vcg", reserve_price=0.0)
    # a reliability drop: the fussy job cannot run, the other is worth value x 0.6
    assert (
        fresh(RuleExpert()).act(bidder_obs(jobs=(fussy, plain), reliability=0.6, mech=mech)).bids
        == [pytest.approx(12.0)] * 2
    )
    # an energy spike above a job's value: nothing worth bidding for it
    assert (
        fresh(RuleExpert()).act(bidder_obs(jobs=(plain,), energy_floor=25.0, mech=mech)).bids == []
    )


def test_rule_expert_trades_at_prices_that_pay() -> None:
    jobs = (job("j", 2, 30.0, 0),)
    cheap = open_offer("o1", "sell", 1, 25.0)
    dear = cheap.model_copy(update={"offer_id": "o2", "price": 45.0})
    expert = fresh(RuleExpert())
    assert isinstance(
        expert.act(bidder_obs(phase="negotiation", jobs=jobs, offers_received=[dear])), Wait
    )
    assert expert.act(
        bidder_obs(phase="negotiation", jobs=jobs, offers_received=[dear, cheap])
    ) == AcceptOffer(offer_id="o1")
    # spare held blocks of this round: pledged to a block pool of its own first (paid the
    # clearing price per block drawn); where coalitions are restricted, sold to others; and a
    # request to buy them is accepted
    spare = bidder_obs(phase="negotiation", jobs=(job("k", 1, 30.0, 0),), holdings=[3, 0, 0, 0, 0])
    pool = fresh(RuleExpert()).act(spare)
    assert pool.action_type == "form_coalition" and pool.pledge_blocks == 2  # type: ignore[union-attr]
    restricted = spare.model_copy(update={"mechanism": mechanism(coalition_policy="restrict")})
    offer = fresh(RuleExpert()).act(restricted)
    assert isinstance(offer, SendOffer) and offer.side == "sell" and offer.blocks == 2
    assert offer.delivery_round == 0 and offer.price >= 2 * 10.0
    wants = open_offer("o3", "buy", 2, 30.0, sender="bidder_2")
    accept = fresh(RuleExpert()).act(spare.model_copy(update={"offers_received": [wants]}))
    assert accept == AcceptOffer(offer_id="o3")
    too_many = wants.model_copy(update={"blocks": 3})
    assert fresh(RuleExpert()).act(
        spare.model_copy(update={"offers_received": [too_many]})
    ) != AcceptOffer(offer_id="o3")


def test_rule_expert_keeps_hopeless_jobs_off_its_blocks_and_pitches() -> None:
    hopeless = job("hopeless", 8, 40.0, 0)  # due now, needs 8 of 3 blocks
    later = job("later", 2, 30.0, 2)
    obs = bidder_obs(
        phase="negotiation", jobs=(hopeless, later), capacity=3, holdings=[2, 0, 0, 0, 0]
    )
    expert = fresh(RuleExpert())
    assert expert.act(obs) == AllocateToJob(job_id="hopeless", blocks=0)
    assert isinstance(expert.act(obs), Wait)  # once per round
    pool = mechanism(reserve_price=10.0, judge_pool_share=0.5)  # 4 of 8 blocks to the judge
    pitch = fresh(RuleExpert()).act(
        bidder_obs(phase="negotiation", jobs=(job("j", 4, 30.0, 1),), capacity=8, mech=pool)
    )
    assert isinstance(pitch, MakePitch) and pitch.blocks_requested == 4 and pitch.job_id == "j"


def test_rule_expert_proposes_and_joins_buying_clubs() -> None:
    pricey = job("pricey", 4, 40.0, 0)  # completable with 4 of 8 blocks, not with 50 credits
    obs = bidder_obs(  # two labs: an equal share of the 8 blocks is the 4 it needs
        phase="negotiation", jobs=(pricey,), budget=50.0, labs=2, mech=mechanism(reserve_price=20.0)
    )
    club = fresh(RuleExpert()).act(obs)
    assert club.action_type == "form_coalition" and club.contribution == 50.0
    assert club.split == "proportional" and club.term_rounds == 1
    invite = CoalitionView(
        coalition_id="c0",
        leader="bidder_1",
        members=["bidder_1"],
        invited=["bidder_0"],
        purpose=club.purpose,
        split="proportional",
        term_end=0,
        status="proposed",
    )
    joiner = fresh(RuleExpert()).act(
        bidder_obs(phase="negotiation", jobs=(job("j", 2, 30.0, 0),), coalitions=[invite])
    )
    assert joiner == CommitToCoalition(coalition_id="c0", contribution=40.0)  # 2 blocks at 20


def test_no_negotiation_never_negotiates() -> None:
    jobs = (job("j", 2, 30.0, 0),)
    offer = open_offer("o1", "sell", 1, 1.0)
    agent = fresh(NoNegotiationBidder())
    assert isinstance(
        agent.act(bidder_obs(phase="negotiation", jobs=jobs, offers_received=[offer])), Wait
    )
    assert agent.act(bidder_obs(jobs=jobs, mech=mechanism(reserve_price=10.0))).bids == [30.0, 30.0]


# --- validity in normal play ------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["single_trade", "market_round", "coalition_market"])
def test_no_agent_makes_an_invalid_action_in_normal_play(scenario: str) -> None:
    sc = load_scenario(scenario)
    seats = [f"bidder_{i}" for i in range(sc.n_seats)]
    designer = {"designer_0": "rule_designer"} if sc.designer_seat else {}
    for seed in range(4):
        mixed = {s: POPULATION[(i + seed) % len(POPULATION)] for i, s in enumerate(seats)}
        runs = [run_episode(scenario, seed, {**mixed, **designer})]
        runs += [
            run_episode(scenario, seed, {**dict.fromkeys(seats, spec), **designer})
            for spec in POPULATION
        ]
        for res in runs:
            assert sum(res.invalid_actions.values()) == 0, (seed, res.seats, res.invalid_actions)
            assert not any(getattr(res, "agent_errors", {}).values()), (seed, res.seats)


def test_population_episodes_are_deterministic() -> None:
    seats = {f"bidder_{i}": spec for i, spec in enumerate(("rule_expert", "exploiter", "shader"))}
    seats["designer_0"] = "rule_designer"
    a = run_episode("market_round", 3, seats)
    b = run_episode("market_round", 3, seats)
    assert a.returns == b.returns and a.round_log == b.round_log
