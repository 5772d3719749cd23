"""The pure functions the AEC env delegates to (issue 35: the env as a thin adapter): reward
crediting (market/environment/seat_rewards.py) and the designer's action
(market/environment/dispatch.py)."""

from __future__ import annotations

from market.core.actions import SetMechanism, Wait, parse_action
from market.core.world import Lab
from market.environment.dispatch import apply_designer_action
from market.environment.seat_rewards import credit, seat_events
from scenarios import load_scenario


def test_credit_skips_zeros_and_seats_without_a_slot_and_keeps_component_order() -> None:
    rewards = {"bidder_0": 0.0, "bidder_1": 0.0}
    rewarded: set[str] = set()
    pending: dict[str, dict[str, float]] = {"bidder_0": {}, "bidder_1": {}}
    events = [
        ("bidder_0", "trade_balance", 1.5),
        ("bidder_1", "job_value", 0.0),  # a zero is no reward
        ("bidder_9", "job_value", 3.0),  # no slot: the seat left
        ("bidder_0", "job_value", 2.0),
        ("bidder_0", "trade_balance", -0.5),
    ]
    credit(rewards, rewarded, pending, events)  # type: ignore[arg-type]
    assert rewards == {"bidder_0": 3.0, "bidder_1": 0.0}
    assert rewarded == {"bidder_0"}
    assert list(pending["bidder_0"].items()) == [("trade_balance", 1.0), ("job_value", 2.0)]
    assert pending["bidder_1"] == {}


def test_seat_events_are_the_labs_credits_in_reward_units() -> None:
    labs = [Lab(0, "bidder_0", 10.0, 1.0), Lab(1, "bidder_1", 10.0, 1.0)]
    events = [(1, "job_value", 50.0), (0, "auction_payments", -25.0)]
    assert list(seat_events(labs, 100.0, events)) == [  # type: ignore[arg-type]
        ("bidder_1", "job_value", 0.5),
        ("bidder_0", "auction_payments", -0.25),
    ]


def test_the_designer_action_sets_the_mechanism_or_leaves_it() -> None:
    sc = load_scenario("market_round")
    same, result = apply_designer_action(sc.mechanism, Wait(), sc)
    assert same is sc.mechanism and result == {}
    act = parse_action(
        '{"action_type": "set_mechanism", "mechanism": {"reserve_price": 7.0}}', designer=True
    )
    assert isinstance(act, SetMechanism)
    new, result = apply_designer_action(sc.mechanism, act, sc)
    assert new.reserve_price == 7.0 and result == {"mechanism": new.model_dump()}
