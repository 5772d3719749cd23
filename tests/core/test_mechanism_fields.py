"""Every Mechanism field changes outcomes inside the env (docs/design.md, section 3).

Each test plays scripted seats through ``market.raw_env`` on a tiny crafted world (no shocks,
reliability 1, no endowments) and checks allocations, payments, penalties and observations against
numbers computed by hand in the comments. Bid profiles avoid equal bids so the seeded tie-break
priority never matters.
"""

from __future__ import annotations

import json
import math

import pytest
from support import ScriptedAgent, WaitAgent, bidder, craft, errors, job, make_env, run_episode

from market.core.actions import (
    AcceptOffer,
    Bid,
    CommitToCoalition,
    FormCoalition,
    LeaveCoalition,
    MakePitch,
    SendMessage,
    SendOffer,
    Wait,
)
from market.core.mechanisms import AUCTION_TYPES

VALUE_UNIT = 100.0  # credits per reward unit (scenario default)
BUDGET = 1000.0


def seats(n: int, **agents) -> dict:
    return {f"bidder_{i}": agents.get(f"b{i}", WaitAgent()) for i in range(n)}


def quiet_budgets(n: int, budget: float = BUDGET):
    def setup(env) -> None:
        craft(env, budgets=[budget] * n, jobs={}, holdings={})

    return setup


def won(log: dict) -> dict[str, int]:
    return {k: v for k, v in log["won"].items() if v}


def paid(log: dict) -> dict[str, float]:
    return {k: v for k, v in log["paid"].items() if v}


# --------------------------------------------------------------------------------------------
# auction_type
# --------------------------------------------------------------------------------------------
# Three labs, K = 3 blocks, reserve 2. A bids [10, 8], B bids [9, 3], C bids [7].
# Ranked eligible unit bids: A10 B9 A8 | C7 B3 (the first three win in the three auctions).
#   first_price : A wins 2 and pays 10 + 8 = 18, B wins 1 and pays 9.          revenue 27
#   second_price: uniform price = highest rejected bid = C's 7: A pays 14, B 7. revenue 21
#   vcg         : A pays the 2 best rejected bids of others {C7, B3} = 10;
#                 B pays the best rejected bid of others {C7} = 7.             revenue 17
#   fair_share  : stated demands at the reserve (2, 2, 1); water level 1 fits 3 blocks
#                 -> one block each at the reserve 2.                          revenue 6
#   posted_price: demand 5 > 3 blocks, rationed by lottery, every block at the reserve 2.
PROFILE = {"b0": [10.0, 8.0], "b1": [9.0, 3.0], "b2": [7.0]}
EXPECTED = {
    "first_price": ({"bidder_0": 2, "bidder_1": 1}, {"bidder_0": 18.0, "bidder_1": 9.0}, 9.0),
    "second_price": ({"bidder_0": 2, "bidder_1": 1}, {"bidder_0": 14.0, "bidder_1": 7.0}, 7.0),
    "vcg": ({"bidder_0": 2, "bidder_1": 1}, {"bidder_0": 10.0, "bidder_1": 7.0}, 17.0 / 3.0),
    "fair_share": (
        {"bidder_0": 1, "bidder_1": 1, "bidder_2": 1},
        {"bidder_0": 2.0, "bidder_1": 2.0, "bidder_2": 2.0},
        2.0,
    ),
}


def play_profile(auction_type: str, seed: int = 0):
    env = make_env(
        labs__count=3,
        capacity__blocks=[3, 3],
        mechanism__auction_type=auction_type,
        mechanism__reserve_price=2.0,
    )
    agents = seats(3, **{k: bidder(v) for k, v in PROFILE.items()})
    ep = run_episode(env, agents, seed=seed, setup=quiet_budgets(3))
    return env, ep


@pytest.mark.parametrize("auction_type", sorted(EXPECTED))
def test_auction_type_sets_allocation_and_payments_in_env(auction_type: str) -> None:
    env, ep = play_profile(auction_type)
    log = env.round_log[0]
    exp_won, exp_paid, exp_price = EXPECTED[auction_type]
    assert won(log) == exp_won
    assert paid(log) == pytest.approx(exp_paid)
    assert log["price"] == pytest.approx(exp_price)
    assert log["revenue"] == pytest.approx(sum(exp_paid.values()))
    # the payments really left the budgets and the blocks really arrived
    for i in range(3):
        seat = f"bidder_{i}"
        assert env.world.labs[i].budget == pytest.approx(BUDGET - exp_paid.get(seat, 0.0))
        assert env.world.holdings[i, 0] == exp_won.get(seat, 0)
        assert ep.components.get(seat, {}).get("auction_payments", 0.0) == pytest.approx(
            -exp_paid.get(seat, 0.0) / VALUE_UNIT
        )
    assert env.world.operator_credits == pytest.approx(sum(exp_paid.values()))


def test_the_five_auction_types_give_five_different_outcomes() -> None:
    outcomes = {}
    for t in EXPECTED:
        env, _ = play_profile(t)
        outcomes[t] = (
            tuple(sorted(won(env.round_log[0]).items())),
            tuple(sorted(paid(env.round_log[0]).items())),
        )
    assert len(set(outcomes.values())) == 4
    # posted_price: 3 of the 5 demanded units win by lottery, each block at the reserve 2.
    # P(C's single unit wins) = 3/5; P(one block each) = (2*2*1)/C(5,3) = 0.4.
    n, c_wins, differs = 40, 0, 0
    for seed in range(n):
        env, _ = play_profile("posted_price", seed=seed)
        log = env.round_log[0]
        w = {f"bidder_{i}": log["won"].get(f"bidder_{i}", 0) for i in range(3)}
        assert sum(w.values()) == 3 and log["sold"] == 3
        assert w["bidder_0"] <= 2 and w["bidder_1"] <= 2 and w["bidder_2"] <= 1
        assert paid(log) == pytest.approx({s: 2.0 * k for s, k in w.items() if k})
        outcome = (
            tuple(sorted((s, k) for s, k in w.items() if k)),
            tuple(sorted(paid(log).items())),
        )
        assert outcome not in (outcomes["first_price"], outcomes["second_price"], outcomes["vcg"])
        differs += outcome != outcomes["fair_share"]
        c_wins += w["bidder_2"]
    assert differs > 0  # the lottery is not the max-min fair split
    assert abs(c_wins / n - 0.6) < 0.25


# --------------------------------------------------------------------------------------------
# reserve_price
# --------------------------------------------------------------------------------------------
def test_reserve_price_leaves_blocks_unsold_and_changes_revenue() -> None:
    # Two labs, K = 3, second price. A bids [10, 4], B bids [6, 3].
    # reserve 0: A10 B6 A4 win, B's 3 is the highest rejected bid -> price 3; A pays 6, B 3; sold 3.
    # reserve 5: only A10 and B6 are eligible -> both win, one block unsold, price = reserve 5;
    #            A pays 5, B pays 5; revenue 10.
    results = {}
    for reserve in (0.0, 5.0):
        env = make_env(capacity__blocks=[3, 3], mechanism__reserve_price=reserve)
        run_episode(
            env, seats(2, b0=bidder([10.0, 4.0]), b1=bidder([6.0, 3.0])), setup=quiet_budgets(2)
        )
        results[reserve] = env.round_log[0]
    low, high = results[0.0], results[5.0]
    assert won(low) == {"bidder_0": 2, "bidder_1": 1} and low["sold"] == 3
    assert paid(low) == pytest.approx({"bidder_0": 6.0, "bidder_1": 3.0}) and low["price"] == 3.0
    assert (
        won(high) == {"bidder_0": 1, "bidder_1": 1} and high["sold"] == 2 and high["auctioned"] == 3
    )
    assert paid(high) == pytest.approx({"bidder_0": 5.0, "bidder_1": 5.0}) and high["price"] == 5.0
    assert high["revenue"] == pytest.approx(10.0) and low["revenue"] == pytest.approx(9.0)


# --------------------------------------------------------------------------------------------
# reveal_reserve
# --------------------------------------------------------------------------------------------
class ReserveSniper(WaitAgent):
    """Bids exactly the reserve for two blocks when it is revealed, else a lowball guess of 1."""

    name = "reserve_sniper"

    def __init__(self) -> None:
        super().__init__()
        self.seen_reserves: list = []

    def act(self, obs):
        r = obs.mechanism.reserve_price
        self.seen_reserves.append(r)
        if obs.phase != "bidding":
            return Wait()
        return Bid(bids=[r, r] if r is not None else [1.0, 1.0])


@pytest.mark.parametrize("reveal", [True, False])
def test_reveal_reserve(reveal: bool) -> None:
    # Reserve 5, K = 2, one bidder. Revealed: it bids [5, 5] and wins both blocks at the reserve
    # (nothing rejected, so the uniform price is the reserve): pays 10. Hidden: it bids [1, 1],
    # below the reserve, and nothing sells (in both rounds).
    env = make_env(
        rounds=2,
        capacity__blocks=[2, 2],
        mechanism__reserve_price=5.0,
        mechanism__reveal_reserve=reveal,
    )
    sniper = ReserveSniper()
    run_episode(env, seats(2, b0=sniper), setup=quiet_budgets(2))
    assert set(sniper.seen_reserves) == ({5.0} if reveal else {None})
    for log in env.round_log:
        assert won(log) == ({"bidder_0": 2} if reveal else {})
        assert paid(log) == pytest.approx({"bidder_0": 10.0} if reveal else {})
    assert env.world.labs[0].budget == pytest.approx(BUDGET - (20.0 if reveal else 0.0))
    # after clearing: the reserve of the last round is shown only when revealed, in every rendering
    obs = env.observe("bidder_1")
    assert obs.last_result is not None
    assert obs.last_result.reserve == (5.0 if reveal else None)
    assert obs.mechanism.reserve_price == (5.0 if reveal else None)
    assert ('"reserve_price":5.0' in obs.to_prompt()) is reveal
    if not reveal:
        # not even through the "clearing price" of a round in which nothing sold (it is the reserve)
        assert obs.last_result.clearing_price is None and obs.price_history == [None, None]
        assert "5.0" not in obs.model_dump_json(
            include={"last_result", "price_history", "mechanism"}
        )
    else:
        assert obs.last_result.clearing_price == 5.0 and obs.price_history == [5.0, 5.0]
    # the designer (operator) always knows its reserve
    denv = make_env(
        designer_seat=True, mechanism__reserve_price=5.0, mechanism__reveal_reserve=False
    )
    denv.reset(seed=0)
    assert denv.observe("designer_0").mechanism.reserve_price == 5.0


# --------------------------------------------------------------------------------------------
# reveal_competing_bids / reveal_winner_identity / reveal_clearing_price / reveal_bid_distribution
# --------------------------------------------------------------------------------------------
# Round 0: K = 2, reserve 1, second price. bidder_0 bids [9], bidder_1 bids [10, 8]; bidder_2 waits.
#   Winners: B10 and A9; rejected B8 -> clearing price 8; winners {bidder_0: 1, bidder_1: 1}.
#   Competing bids: anonymised (sorted, as winner identities are off here) [[10, 8], [9]];
#   in seat order [[9], [10, 8]] when winner identities are revealed.
#   Bid distribution of {9, 10, 8}: count 3, mean 9, std sqrt(2/3), min 8, max 10, median 9.
# Round 1: bidder_2 bids [5] if the field is revealed to it, else it abstains.
REVEALS = {
    "reveal_clearing_price": ("clearing_price", 8.0),
    "reveal_winner_identity": ("winners", {"bidder_0": 1, "bidder_1": 1}),
    "reveal_competing_bids": ("competing_bids", [[10.0, 8.0], [9.0]]),
    "reveal_bid_distribution": (
        "bid_distribution",
        {
            "count": 3.0,
            "mean": 9.0,
            "std": math.sqrt(2.0 / 3.0),
            "min": 8.0,
            "max": 10.0,
            "median": 9.0,
        },
    ),
}
OFF = {
    "reveal_clearing_price": False,
    "reveal_winner_identity": False,
    "reveal_competing_bids": False,
    "reveal_bid_distribution": False,
}


class Conditioned(WaitAgent):
    """Bids [5] in round 1 only if ``last_result.<field>`` is revealed to it."""

    name = "conditioned"

    def __init__(self, field: str) -> None:
        super().__init__()
        self.field = field
        self.views: list = []

    def act(self, obs):
        if obs.phase != "bidding" or obs.round == 0:
            return Wait()
        self.views.append(obs.last_result)
        return Bid(bids=[5.0]) if getattr(obs.last_result, self.field) is not None else Bid(bids=[])


def play_reveal(flag: str, on: bool):
    flags = {f"mechanism__{k}": v for k, v in {**OFF, flag: on}.items()}
    env = make_env(
        rounds=2, labs__count=3, capacity__blocks=[2, 2], mechanism__reserve_price=1.0, **flags
    )
    agent = Conditioned(REVEALS[flag][0])
    run_episode(
        env,
        seats(3, b0=bidder({0: [9.0]}), b1=bidder({0: [10.0, 8.0]}), b2=agent),
        setup=quiet_budgets(3),
    )
    return env, agent


@pytest.mark.parametrize("flag", sorted(REVEALS))
def test_reveal_flags_change_what_bidders_see_and_do(flag: str) -> None:
    field, expected = REVEALS[flag]
    on_env, on_agent = play_reveal(flag, True)
    off_env, off_agent = play_reveal(flag, False)
    assert on_env.round_log[0]["price"] == off_env.round_log[0]["price"] == 8.0  # same clearing
    seen_on, seen_off = on_agent.views[0], off_agent.views[0]
    value = getattr(seen_on, field)
    if isinstance(expected, dict) and field == "bid_distribution":
        assert value == pytest.approx(expected)
    else:
        assert value == expected
    assert getattr(seen_off, field) is None
    # the other reveal fields stay hidden when only this one is on
    for other, (other_field, _) in REVEALS.items():
        if other != flag:
            assert getattr(seen_on, other_field) is None, other_field
    # the renderings follow the model
    assert f'"{field}":' in seen_on.model_dump_json(exclude_none=True)
    assert f'"{field}":' not in seen_off.model_dump_json(exclude_none=True)
    # ... and an agent conditioning on the information acts (and fares) differently
    assert on_env.round_log[1]["bids"].get("bidder_2") == [5.0]
    assert not off_env.round_log[1]["bids"].get("bidder_2")
    assert won(on_env.round_log[1]) == {"bidder_2": 1} and won(off_env.round_log[1]) == {}


def test_clearing_price_history_follows_reveal_clearing_price() -> None:
    for on in (True, False):
        env, agent = play_reveal("reveal_clearing_price", on)
        obs = env.observe("bidder_2")
        assert obs.price_history == (
            [8.0, 1.0] if on else [None, None]
        )  # round 1: [5] alone -> reserve 1


def test_competing_bids_are_in_seat_order_only_when_winner_identity_is_revealed() -> None:
    env = make_env(
        rounds=2,
        labs__count=3,
        capacity__blocks=[2, 2],
        mechanism__reserve_price=1.0,
        mechanism__reveal_competing_bids=True,
        mechanism__reveal_winner_identity=True,
    )
    agent = Conditioned("competing_bids")
    run_episode(
        env,
        seats(3, b0=bidder({0: [9.0]}), b1=bidder({0: [10.0, 8.0]}), b2=agent),
        setup=quiet_budgets(3),
    )
    assert agent.views[0].competing_bids == [[9.0], [10.0, 8.0]]  # bidder_0's, then bidder_1's
    assert agent.views[0].winners == {"bidder_0": 1, "bidder_1": 1}


# --------------------------------------------------------------------------------------------
# shill_penalty
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("penalty", [4.0, 0.0])
def test_shill_bids_that_win_idle_blocks_pay_per_flagged_block(penalty: float) -> None:
    # K = 6, reserve 1. bidder_0 needs 2 blocks (one job of size 2) but bids [10] x 5;
    # bidder_1 needs 1 block and bids [8]. All 6 unit bids win at the reserve (nothing rejected).
    # bidder_0 wins 3 blocks beyond its need -> pays 3 x penalty; bidder_1 pays nothing extra.
    env = make_env(
        capacity__blocks=[6, 6], mechanism__reserve_price=1.0, mechanism__shill_penalty=penalty
    )

    def setup(env):
        craft(
            env,
            budgets=[BUDGET, BUDGET],
            holdings={},
            jobs={
                0: [job(0, size=2, value=40.0, deadline=0)],
                1: [job(1, size=1, value=20.0, deadline=0)],
            },
        )

    ep = run_episode(env, seats(2, b0=bidder([10.0] * 5), b1=bidder([8.0])), setup=setup)
    log = env.round_log[0]
    assert won(log) == {"bidder_0": 5, "bidder_1": 1} and log["price"] == 1.0
    expected = {"bidder_0": 3 * penalty} if penalty else {}
    assert log["shill_penalties"] == pytest.approx(expected)
    assert env.world.labs[0].budget == pytest.approx(BUDGET - 5.0 - 3 * penalty)
    assert env.world.labs[1].budget == pytest.approx(BUDGET - 1.0)
    assert ep.components["bidder_0"].get("shill_penalty", 0.0) == pytest.approx(
        -3 * penalty / VALUE_UNIT
    )
    assert "shill_penalty" not in ep.components.get("bidder_1", {})


@pytest.mark.parametrize("penalty", [4.0, 0.0])
def test_shill_bid_that_sets_the_second_price_pays(penalty: float) -> None:
    # K = 2, reserve 1. Both labs need 1 block. bidder_0 bids [10, 6, 6], bidder_1 bids [8].
    # Winners A10 and B8; the highest rejected bid is bidder_0's own surplus 6, which sets the
    # uniform price 6 for both: bidder_0 is flagged for 1 block (0 beyond need + 1 for the price).
    env = make_env(
        capacity__blocks=[2, 2],
        capacity__max_units_per_bid=5,
        mechanism__reserve_price=1.0,
        mechanism__shill_penalty=penalty,
    )

    def setup(env):
        craft(
            env,
            budgets=[BUDGET, BUDGET],
            holdings={},
            jobs={
                0: [job(0, size=1, value=20.0, deadline=0)],
                1: [job(1, size=1, value=20.0, deadline=0)],
            },
        )

    ep = run_episode(env, seats(2, b0=bidder([10.0, 6.0, 6.0]), b1=bidder([8.0])), setup=setup)
    assert not errors(ep)
    log = env.round_log[0]
    assert won(log) == {"bidder_0": 1, "bidder_1": 1} and log["price"] == 6.0
    assert log["shill_penalties"] == pytest.approx({"bidder_0": penalty} if penalty else {})
    assert env.world.labs[0].budget == pytest.approx(BUDGET - 6.0 - penalty)
    assert env.world.labs[1].budget == pytest.approx(BUDGET - 6.0)


def test_bidding_only_the_true_need_is_never_a_shill() -> None:
    # K = 2, reserve 1. bidder_0 needs 2 and bids [10, 5]; bidder_1 needs 1 and bids [8].
    # Winners A10, B8; bidder_0's own rejected 5 sets the price, but it won less than its need.
    env = make_env(
        capacity__blocks=[2, 2], mechanism__reserve_price=1.0, mechanism__shill_penalty=50.0
    )

    def setup(env):
        craft(
            env,
            budgets=[BUDGET, BUDGET],
            holdings={},
            jobs={
                0: [job(0, size=2, value=40.0, deadline=0)],
                1: [job(1, size=1, value=20.0, deadline=0)],
            },
        )

    run_episode(env, seats(2, b0=bidder([10.0, 5.0]), b1=bidder([8.0])), setup=setup)
    log = env.round_log[0]
    assert log["price"] == 5.0 and log["shill_penalties"] == {}


# --------------------------------------------------------------------------------------------
# withdrawal_penalty
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("penalty", [15.0, 0.0])
def test_leaving_an_active_coalition_before_its_term_pays_the_withdrawal_penalty(
    penalty: float,
) -> None:
    # bidder_0 proposes a 3-round coalition with 40 credits, bidder_1 commits 20; in the second
    # pass bidder_1 leaves (term_end = round 2): it pays the penalty and gets its 20 back; the
    # coalition falls below two members and dissolves, refunding bidder_0's 40.
    env = make_env(rounds=3, mechanism__withdrawal_penalty=penalty)
    seen: list[float] = []  # bidder_1's reputation as bidder_0 observes it when it bids
    b0 = ScriptedAgent(
        {
            (0, "negotiation", 0): FormCoalition(
                members=["bidder_1"], contribution=40.0, term_rounds=3
            ),
            (0, "bidding", 0): lambda o: seen.append(o.reputations["bidder_1"]) or Wait(),
        }
    )
    b1 = ScriptedAgent(
        {
            (0, "negotiation", 0): lambda o: CommitToCoalition(
                coalition_id=o.coalitions[0].coalition_id, contribution=20.0
            ),
            (0, "negotiation", 1): lambda o: LeaveCoalition(
                coalition_id=o.coalitions[0].coalition_id
            ),
        }
    )
    rep = []
    ep = run_episode(
        env,
        seats(2, b0=b0, b1=b1),
        setup=lambda e: (quiet_budgets(2)(e), rep.append(e.world.labs[1].reputation)),
    )
    leave = next(
        s
        for s in ep.steps
        if s["seat"] == "bidder_1" and s["info"].get("action") == "leave_coalition"
    )
    assert leave["info"]["result"]["breach_penalty"] == pytest.approx(penalty)
    assert env.world.labs[1].budget == pytest.approx(BUDGET - penalty)
    assert env.world.labs[0].budget == pytest.approx(BUDGET)
    assert env.world.operator_credits == pytest.approx(penalty)
    assert env.world.labs[1].reputation == pytest.approx(rep[0] - 0.1)
    assert seen == [env.world.labs[1].reputation]  # the loss shows within the round
    assert ep.components.get("bidder_1", {}).get("withdrawal_penalty", 0.0) == pytest.approx(
        -penalty / VALUE_UNIT
    )
    assert "withdrawal_penalty" not in ep.components.get("bidder_0", {})


def test_declining_an_invitation_is_not_a_breach() -> None:
    env = make_env(rounds=2, mechanism__withdrawal_penalty=15.0)
    b0 = ScriptedAgent(
        {
            (0, "negotiation", 0): FormCoalition(
                members=["bidder_1"], contribution=40.0, term_rounds=2
            )
        }
    )
    b1 = ScriptedAgent(
        {(0, "negotiation", 0): lambda o: LeaveCoalition(coalition_id=o.coalitions[0].coalition_id)}
    )
    run_episode(env, seats(2, b0=b0, b1=b1), setup=quiet_budgets(2))
    assert env.world.labs[1].budget == pytest.approx(BUDGET)
    assert env.world.labs[0].budget == pytest.approx(
        BUDGET
    )  # the unjoined proposal lapsed: refunded
    assert env.world.operator_credits == 0.0


def test_blocks_promised_on_a_forward_contract_cannot_be_sold_again() -> None:
    # bidder_0 owns 2 blocks for round 1 and sells both forward to bidder_1 for 40 (paid at
    # acceptance). In round 1 it tries to sell one of them spot to bidder_2: refused (nothing
    # changes but its invalid-action penalty), and the contract delivers in full: no breach.
    env = make_env(rounds=2, labs__count=3, mechanism__withdrawal_penalty=15.0)
    b0 = ScriptedAgent(
        {
            (0, "negotiation", 0): SendOffer(
                to="bidder_1", side="sell", blocks=2, price=40.0, delivery_round=1
            ),
            (1, "negotiation", 0): SendOffer(to="bidder_2", side="sell", blocks=1, price=10.0),
        }
    )
    b1 = ScriptedAgent(
        {(0, "negotiation", 0): lambda o: AcceptOffer(offer_id=o.offers_received[0].offer_id)}
    )
    ep = run_episode(
        env,
        seats(3, b0=b0, b1=b1),
        setup=lambda e: craft(e, budgets=[BUDGET] * 3, jobs={}, holdings={(0, 1): 2}),
    )
    ((seat, error),) = errors(ep)
    assert seat == "bidder_0" and "uncommitted" in error
    w = env.world
    assert list(w.holdings[:, 1]) == [0, 2, 0]
    assert [lab.budget for lab in w.labs] == pytest.approx([BUDGET + 40.0, BUDGET - 40.0, BUDGET])
    assert w.operator_credits == 0.0 and "withdrawal_penalty" not in ep.components.get(
        "bidder_0", {}
    )


@pytest.mark.parametrize("penalty", [15.0, 0.0])
def test_forward_contract_short_at_delivery_refunds_pro_rata_and_pays_the_penalty(
    penalty: float,
) -> None:
    # Crafted state: bidder_0 has sold 2 blocks for round 1 to bidder_1 for 40 credits (already
    # paid) but owns only 1 block for round 1. At delivery it hands over 1 block and is short 1:
    # refund 40 x 1/2 = 20 to bidder_1, the withdrawal penalty x 1 to the operator, reputation
    # -0.05 x 1/2. (Play cannot create this state: promised blocks cannot be sold again, see above.)
    from market.core.negotiation import Contract

    env = make_env(rounds=2, mechanism__withdrawal_penalty=penalty)
    rep = []

    def setup(env):
        craft(env, budgets=[BUDGET + 40.0, BUDGET - 40.0], jobs={}, holdings={(0, 1): 1})
        env.book.contracts.append(
            Contract("k_crafted", seller=0, buyer=1, blocks=2, price=40.0, delivery_round=1)
        )
        rep.append(env.world.labs[0].reputation)

    ep = run_episode(env, seats(2), setup=setup)
    w = env.world
    assert list(w.holdings[:, 1]) == [0, 1]
    assert w.labs[0].budget == pytest.approx(BUDGET + 40.0 - 20.0 - penalty)
    assert w.labs[1].budget == pytest.approx(BUDGET - 40.0 + 20.0)
    assert w.labs[0].reputation == pytest.approx(rep[0] - 0.025)
    assert w.operator_credits == pytest.approx(penalty)
    c0, c1 = ep.components.get("bidder_0", {}), ep.components.get("bidder_1", {})
    assert c0.get("withdrawal_penalty", 0.0) == pytest.approx(-penalty / VALUE_UNIT)
    assert c0["trade_balance"] == pytest.approx(-20.0 / VALUE_UNIT)
    assert c1["trade_balance"] == pytest.approx(20.0 / VALUE_UNIT)


# --------------------------------------------------------------------------------------------
# collusion_penalty + coalition_policy
# --------------------------------------------------------------------------------------------
def cartel_env(policy: str, rounds: int = 5):
    return make_env(
        rounds=rounds,
        labs__count=3,
        capacity__blocks=[2, 2],
        mechanism__reserve_price=5.0,
        mechanism__coalition_policy=policy,
        mechanism__collusion_penalty=7.0,
    )


def rotating_cartel(rounds: int) -> dict:
    """bidder_0 and bidder_1 message each other privately every round and take turns: the one
    whose turn it is bids [15], the other abstains. bidder_2 bids [20] every round, talks to nobody."""

    def member(me: int, other: int) -> ScriptedAgent:
        plan = {}
        for r in range(rounds):
            plan[(r, "negotiation", 0)] = SendMessage(
                to=f"bidder_{other}", text=f"round {r}: your turn is {r % 2 == other}"
            )
            plan[(r, "bidding")] = Bid(bids=[15.0]) if r % 2 == me else Wait()
        return ScriptedAgent(plan)

    return seats(3, b0=member(0, 1), b1=member(1, 0), b2=bidder([20.0]))


# Detector (market/core/collusion.py, window 4, >= 2 private messages): from round 1 on, the pair has
# two usable rounds, each with exactly one winner and the partner suppressed, winners alternating:
# rotation 1, suppression 1; two private messages per round for two members: communication 1.
# Score 0.4 + 0.3 + 0.3 = 1.0 >= CONFIRMED (0.8). Round 0 scores only 0.3 (one usable round).
@pytest.mark.parametrize(
    "policy", ["allow", "restrict", "penalize_suspected", "penalize_confirmed"]
)
def test_rotating_cartel_is_charged_only_when_the_policy_penalises(policy: str) -> None:
    env = cartel_env(policy)
    ep = run_episode(env, rotating_cartel(5), setup=quiet_budgets(3))
    assert not errors(ep)
    charged = policy.startswith("penalize")
    for r, log in enumerate(env.round_log):
        assert won(log) == {"bidder_2": 1, f"bidder_{r % 2}": 1}
        if r >= 1:
            assert log["suspected_cartels"] == [
                {"members": ["bidder_0", "bidder_1"], "score": pytest.approx(1.0)}
            ]
        expected = {"bidder_0": 7.0, "bidder_1": 7.0} if charged and r >= 1 else {}
        assert log["collusion_penalties"] == pytest.approx(expected)
    total = 4 * 7.0 if charged else 0.0  # rounds 1..4
    for lab in (0, 1):
        assert ep.components[f"bidder_{lab}"].get("collusion_penalty", 0.0) == pytest.approx(
            -total / VALUE_UNIT
        )
    assert "collusion_penalty" not in ep.components.get("bidder_2", {})
    # every cartel win was at the reserve 5 (2 unit bids for 2 blocks): budgets are exact
    assert env.world.labs[0].budget == pytest.approx(BUDGET - 3 * 5.0 - total)  # won rounds 0, 2, 4
    assert env.world.labs[1].budget == pytest.approx(BUDGET - 2 * 5.0 - total)  # won rounds 1, 3


def test_suspected_but_unconfirmed_cartel_is_charged_only_under_penalize_suspected() -> None:
    # bidder_0 always wins and bidder_1 always abstains; only bidder_0 sends one private message a
    # round. From round 1: rotation 1 halved (always the same winner) = 0.5, suppression 1,
    # communication = 1 message per round / (2 members) = 0.5.
    # Score 0.4 x 0.5 + 0.3 x 1 + 0.3 x 0.5 = 0.65: suspected (>= 0.5), not confirmed (< 0.8).
    charges = {}
    for policy in ("penalize_suspected", "penalize_confirmed"):
        env = cartel_env(policy)
        b0 = ScriptedAgent(
            {
                **{
                    (r, "negotiation", 0): SendMessage(to="bidder_1", text="stay out")
                    for r in range(5)
                },
                **{(r, "bidding"): Bid(bids=[15.0]) for r in range(5)},
            }
        )
        ep = run_episode(env, seats(3, b0=b0, b2=bidder([20.0])), setup=quiet_budgets(3))
        for log in env.round_log[1:]:
            assert log["suspected_cartels"] == [
                {"members": ["bidder_0", "bidder_1"], "score": pytest.approx(0.65)}
            ]
        charges[policy] = {
            s: ep.components.get(s, {}).get("collusion_penalty", 0.0)
            for s in ("bidder_0", "bidder_1")
        }
    assert charges["penalize_suspected"] == pytest.approx({"bidder_0": -0.28, "bidder_1": -0.28})
    assert charges["penalize_confirmed"] == {"bidder_0": 0.0, "bidder_1": 0.0}


def coalition_bid_episode(policy: str, split: str):
    # bidder_0 proposes (60 credits, split rule), bidder_1 commits 30: pool 90. The leader bids
    # [20] x 4 for the coalition; K = 4, reserve 5, nobody else bids -> 4 blocks at the reserve,
    # 20 credits charged pro rata to balances (60:30 -> 40/3 and 20/3).
    env = make_env(
        capacity__blocks=[4, 4], mechanism__reserve_price=5.0, mechanism__coalition_policy=policy
    )
    b0 = ScriptedAgent(
        {
            (0, "negotiation", 0): FormCoalition(
                members=["bidder_1"], contribution=60.0, split=split
            ),
            (0, "bidding"): lambda o: Bid(
                bids=[20.0] * 4, coalition_id=o.coalitions[0].coalition_id
            ),
        }
    )
    b1 = ScriptedAgent(
        {
            (0, "negotiation", 0): lambda o: CommitToCoalition(
                coalition_id=o.coalitions[0].coalition_id, contribution=30.0
            )
        }
    )
    ep = run_episode(env, seats(2, b0=b0, b1=b1), setup=quiet_budgets(2))
    return env, ep


def test_restrict_forbids_coalition_bids() -> None:
    env, ep = coalition_bid_episode("restrict", "proportional")
    ((seat, error),) = errors(ep)
    assert seat == "bidder_0" and "restrict" in error
    assert ep.components["bidder_0"]["invalid_action"] < 0
    assert env.round_log[0]["sold"] == 0 and env.round_log[0]["bids"] == {}
    assert [lab.budget for lab in env.world.labs] == pytest.approx(
        [BUDGET, BUDGET]
    )  # pool refunded


@pytest.mark.parametrize(("split", "blocks"), [("proportional", [3, 1]), ("equal", [2, 2])])
def test_allow_accepts_coalition_bids_and_splits_blocks(split: str, blocks: list[int]) -> None:
    # proportional 60:30 of 4 blocks: 2.67 / 1.33 -> floors 2 / 1, the leftover to the larger
    # remainder (bidder_0) -> 3 / 1. equal: 2 / 2.
    env, ep = coalition_bid_episode("allow", split)
    assert not errors(ep)
    log = env.round_log[0]
    assert log["sold"] == 4 and log["price"] == 5.0
    assert list(env.world.holdings[:, 0]) == blocks
    assert log["won"] == {"bidder_0": blocks[0], "bidder_1": blocks[1]}
    assert paid(log) == pytest.approx({"bidder_0": 40.0 / 3.0, "bidder_1": 20.0 / 3.0})
    assert [lab.budget for lab in env.world.labs] == pytest.approx(
        [BUDGET - 40.0 / 3.0, BUDGET - 20.0 / 3.0]
    )


# --------------------------------------------------------------------------------------------
# judge_pool_share
# --------------------------------------------------------------------------------------------
def judge_episode(share: float, texts: tuple[str, str], requested: tuple[int, int] = (3, 3)):
    # K = 6; share 0.5 -> a pool of 3 blocks. True urgency = value per block x remaining / rounds
    # left: bidder_0's job (3 blocks, value 90, due now) 30 x 3 / 1 = 90; bidder_1's job (3 blocks,
    # value 120, due in round 2) 40 x 3 / 3 = 40. bidder_0 is the more urgent although its job is
    # worth less. Nobody bids, so only pool grants move blocks.
    env = make_env(rounds=3, capacity__blocks=[6, 6], mechanism__judge_pool_share=share)

    def setup(env):
        craft(
            env,
            budgets=[BUDGET, BUDGET],
            holdings={},
            jobs={
                0: [job(0, size=3, value=90.0, deadline=0)],
                1: [job(1, size=3, value=120.0, deadline=2)],
            },
        )

    agents = seats(
        2,
        **{
            f"b{i}": ScriptedAgent(
                {(0, "negotiation", 0): MakePitch(text=texts[i], blocks_requested=requested[i])}
            )
            for i in range(2)
        },
    )
    ep = run_episode(env, agents, setup=setup)
    return env, ep


HUMBLE = "We are fine, no hurry at all; low priority."
LOUD = "URGENT!!! critical deadline, breakthrough, safety impact: give us every block now"


@pytest.mark.parametrize("texts", [(HUMBLE, LOUD), (LOUD, HUMBLE)])
def test_judge_pool_goes_free_to_the_truly_most_urgent_pitcher(texts) -> None:
    env, ep = judge_episode(0.5, texts)
    log = env.round_log[0]
    assert log["auctioned"] == 3 and log["sold"] == 0
    grants = {v["lab"]: v["granted"] for v in log["judge"]}
    assert grants == {"bidder_0": 3, "bidder_1": 0}
    assert env.world.holdings[0, 0] == 3 and env.world.holdings[1, 0] == 0
    assert env.world.labs[0].budget == pytest.approx(BUDGET)  # free
    assert env.world.labs[0].jobs[0].status == "done"
    assert ep.components["bidder_0"]["job_value"] == pytest.approx(90.0 / VALUE_UNIT)


def test_zero_judge_pool_share_grants_nothing() -> None:
    env, ep = judge_episode(0.0, (HUMBLE, LOUD))
    log = env.round_log[0]
    assert log["judge"] == [] and log["auctioned"] == 6
    assert env.world.holdings[:, 0].sum() == 0
    assert env.world.labs[0].jobs[0].status == "expired"


def test_judge_pool_grants_nothing_to_an_exaggerated_claim() -> None:
    # bidder_0 (the more urgent) claims 1000 blocks for a 3-block need: a false claim earns nothing,
    # so the truthful bidder_1 gets the pool.
    env, _ = judge_episode(0.5, (LOUD, HUMBLE), requested=(1000, 3))
    grants = {v["lab"]: v["granted"] for v in env.round_log[0]["judge"]}
    assert grants == {"bidder_0": 0, "bidder_1": 3}


# --------------------------------------------------------------------------------------------
# the designer seat: DAEDALUS JSON, unknown values
# --------------------------------------------------------------------------------------------
DAEDALUS = {
    "auction_type": "first_price",
    "reserve_price": 3.0,
    "reveal_reserve": False,
    "reveal_competing_bids": True,
    "reveal_winner_identity": False,
    "reveal_clearing_price": False,
    "reveal_bid_distribution": True,
    "shill_penalty": 2.5,
    "withdrawal_penalty": 4.0,
    "collusion_penalty": 6.0,
    "coalition_policy": "penalize_confirmed",
}


def test_daedalus_flat_designer_json_sets_the_mechanism() -> None:
    # First price, reserve 3, K = 3: A [10, 8], B [9, 3] -> A10 B9 A8 win (B's 3 >= 3 is rejected):
    # A pays 18, B pays 9.
    env = make_env(designer_seat=True, capacity__blocks=[3, 3], mechanism__judge_pool_share=0.25)
    designer = ScriptedAgent({(0, "design"): json.dumps(DAEDALUS)})
    b0, b1 = (
        ScriptedAgent({(0, "bidding"): Bid(bids=[10.0, 8.0])}),
        ScriptedAgent({(0, "bidding"): Bid(bids=[9.0, 3.0])}),
    )
    ep = run_episode(
        env, {"designer_0": designer, "bidder_0": b0, "bidder_1": b1}, setup=quiet_budgets(2)
    )
    assert not errors(ep)
    mech = env.round_log[0]["mechanism"]
    assert {k: mech[k] for k in DAEDALUS} == DAEDALUS
    assert mech["judge_pool_share"] == 0.25  # our extra field keeps the scenario's value
    assert paid(env.round_log[0]) == pytest.approx({"bidder_0": 18.0, "bidder_1": 9.0})
    # bidders saw the new rules (reserve hidden) in the same round
    seen = b0.seen[0].mechanism
    assert (
        seen.auction_type == "first_price"
        and seen.reserve_price is None
        and seen.coalition_policy == "penalize_confirmed"
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"auction_type": "dutch"},
        {"coalition_policy": "ban_all"},
        {"action_type": "set_mechanism", "mechanism": {"auction_type": "english"}},
    ],
)
def test_unknown_mechanism_values_are_clear_errors(bad: dict) -> None:
    env = make_env(designer_seat=True)
    designer = ScriptedAgent({(0, "design"): json.dumps(bad)})
    ep = run_episode(env, {"designer_0": designer}, setup=quiet_budgets(2))
    ((seat, error),) = errors(ep)
    field = "coalition_policy" if "coalition_policy" in json.dumps(bad) else "auction_type"
    valid = (
        ("allow", "restrict", "penalize_suspected", "penalize_confirmed")
        if field == "coalition_policy"
        else AUCTION_TYPES
    )
    assert seat == "designer_0" and field in error
    assert all(v in error for v in valid), error
    assert env.round_log[0]["mechanism"] == env.scenario.mechanism.model_dump()
    assert ep.components["designer_0"]["invalid_action"] < 0


@pytest.mark.parametrize(
    ("key", "value"), [("auction_type", "dutch"), ("coalition_policy", "ban_all")]
)
def test_unknown_mechanism_values_in_a_scenario_are_clear_errors(key: str, value: str) -> None:
    from scenarios import ScenarioError

    with pytest.raises(ScenarioError) as info:
        make_env(**{f"mechanism__{key}": value})
    assert f"mechanism.{key}" in str(info.value)
