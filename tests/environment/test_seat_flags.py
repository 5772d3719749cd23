"""The O(1) dead-seat check (market/environment/seat_flags.py) picks exactly the seat PettingZoo's
full scan picks, on every step of episodes where labs exit mid-episode."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pettingzoo import AECEnv
from support import make_seats, new_env, play

from market.environment.seat_flags import SeatFlags, dead_step, first_dead_step


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


@settings(max_examples=300, deadline=None)
@given(
    flags=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=8),
    rewarded=st.sets(st.integers(0, 7)),
    selected=st.integers(0, 7),
    skip=st.one_of(st.none(), st.integers(0, 7)),
)
def test_dead_step_matches_pettingzoo(
    flags: list[tuple[bool, bool]], rewarded: set[int], selected: int, skip: int | None
) -> None:
    """dead_step leaves every table and the selection as PettingZoo's _was_dead_step does."""
    seats = [f"s{i}" for i in range(len(flags))]
    dead = [s for s, f in zip(seats, flags, strict=True) if any(f)]
    assume(dead)

    def state() -> SimpleNamespace:
        # the env's invariant: only seats in ``rewarded`` hold a nonzero reward
        chosen = {seats[i] for i in rewarded if i < len(seats)}
        env = SimpleNamespace(
            agents=list(seats),
            agent_selection=dead[selected % len(dead)],
            terminations={s: f[0] for s, f in zip(seats, flags, strict=True)},
            truncations={s: f[1] for s, f in zip(seats, flags, strict=True)},
            rewards={s: (1.5 + i if s in chosen else 0.0) for i, s in enumerate(seats)},
            _cumulative_rewards={s: float(i) for i, s in enumerate(seats)},
            infos={s: {"i": i} for i, s in enumerate(seats)},
            rewarded=chosen | {"gone"},  # a seat already removed is skipped
            _skip_agent_selection=None if skip is None else seats[skip % len(seats)],
        )
        env._clear_rewards = lambda: AECEnv._clear_rewards(env)
        return env

    ours, theirs = state(), state()
    dead_step(ours)
    AECEnv._was_dead_step(theirs, None)
    for name in ("agents", "agent_selection", "terminations", "truncations", "infos"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours._cumulative_rewards == theirs._cumulative_rewards
    assert ours.rewards == theirs.rewards and all(v == 0.0 for v in ours.rewards.values())
    assert ours._skip_agent_selection == theirs._skip_agent_selection
    assert ours.rewarded == set()  # every reward is zero now
