"""The O(1) dead-seat check (market/environment/seat_flags.py) picks exactly the seat PettingZoo's
full scan picks, on every step of episodes where labs exit mid-episode."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from support import make_seats, new_env, play

from market.environment.seat_flags import SeatFlags, first_dead_step


def test_flags_remember_a_true_value_until_a_scan_finds_none() -> None:
    flags = SeatFlags()
    flags["bidder_0"] = False
    assert not flags.maybe_set
    flags["bidder_1"] = True
    assert flags.maybe_set
    alive = SeatFlags()
    alive["bidder_0"] = alive["bidder_1"] = False
    assert not alive.maybe_set
    env = SimpleNamespace(
        agents=["bidder_0", "bidder_1"],
        agent_selection="bidder_0",
        terminations=flags,
        truncations=alive,
        _skip_agent_selection=None,
    )
    assert first_dead_step(env) == "bidder_1"  # the dead seat steps next
    assert env._skip_agent_selection == "bidder_0"
    del flags["bidder_1"], alive["bidder_1"]  # PettingZoo's dead step removes it
    env.agents.remove("bidder_1")
    env.agent_selection = "bidder_0"
    assert first_dead_step(env) == "bidder_0"
    assert not flags.maybe_set  # the scan found nobody dead: the next check is O(1)


def test_plain_dicts_are_always_scanned() -> None:
    env = SimpleNamespace(
        agents=["a", "b"],
        agent_selection="a",
        terminations={"a": False, "b": False},
        truncations={"a": False, "b": True},
        _skip_agent_selection=None,
    )
    assert first_dead_step(env) == "b"


def turns(seed: int, full_scan: bool) -> list[tuple[Any, ...]]:
    env = new_env("shock_storm", wrapped=True)
    raw = env.unwrapped

    def plain_dicts(turn: dict[str, Any]) -> None:
        # plain dicts: first_dead_step scans every seat every step, PettingZoo's own rule
        raw.terminations = dict(raw.terminations)
        raw.truncations = dict(raw.truncations)

    seats = make_seats(env, ["rule_expert"])
    out = play(env, seats, seed, before_step=plain_dicts if full_scan else None)
    return [(t["agent"], t["dead"], t["reward"], t["round"], t["phase"]) for t in out]


def test_same_turn_order_as_a_full_scan_with_mid_episode_exits() -> None:
    mid_episode_deaths = 0
    for seed in (0, 1, 2):
        fast, reference = turns(seed, False), turns(seed, True)
        assert fast == reference
        last_round = max(t[3] for t in fast)
        mid_episode_deaths += sum(1 for t in fast if t[1] and t[3] < last_round)
    assert mid_episode_deaths > 0  # the seeds exercise a lab exit before the last round
