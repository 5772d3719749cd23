"""The PettingZoo surface: api/seed/render tests on every built-in scenario (wrapped and raw),
deterministic infos, stable spaces, random Text actions, the dead-seat convention, and scenario
files (extends, errors that name the file and key)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
from pettingzoo.test import api_test, render_test, seed_test
from support import make_seats, new_env, play

import market
import scenarios
from agents.base import BaseAgent
from agents.registry import make_agent
from market.core.actions import Finish
from scenarios import ScenarioError

SCENARIOS = scenarios.builtin_names()
CONSTRUCTORS = {"env": market.env, "raw_env": market.raw_env}
MIX = [
    "random_valid",
    "truthful",
    "always_accept",
    "spam_offers",
    "spam_coalitions",
    "spam_pitches",
]


def test_builtins_present() -> None:
    assert {"single_trade", "market_round", "coalition_market"} <= set(SCENARIOS)


@pytest.mark.parametrize("kind", CONSTRUCTORS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pettingzoo_api(scenario: str, kind: str) -> None:
    make = CONSTRUCTORS[kind]
    api_test(make(scenario=scenario), num_cycles=300)


@pytest.mark.parametrize("kind", CONSTRUCTORS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pettingzoo_seed(scenario: str, kind: str) -> None:
    make = CONSTRUCTORS[kind]
    seed_test(lambda: make(scenario=scenario))


@pytest.mark.parametrize("kind", CONSTRUCTORS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pettingzoo_render(scenario: str, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    make = CONSTRUCTORS[kind]
    render_test(lambda render_mode=None: make(scenario=scenario, render_mode=render_mode))
    assert "round" in capsys.readouterr().out  # human mode printed the market


def test_render_ansi_text_and_bad_mode() -> None:
    env = market.env(scenario="market_round", render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert isinstance(text, str) and "bidder_0" in text and "round" in text
    with pytest.raises(ValueError, match="render_mode"):
        market.env(scenario="market_round", render_mode="rgb_array")


def _info_trace(scenario: str, seed: int, wrapped: bool = True) -> list:
    env = new_env(scenario, wrapped=wrapped)
    k = seed % len(MIX)
    seats = make_seats(env, MIX[k:] + MIX[:k], designer="random")
    trace: list = []
    play(
        env,
        seats,
        seed,
        after_step=lambda turn: trace.append(
            (turn["agent"], copy.deepcopy(env.unwrapped.infos), dict(env.unwrapped.rewards))
        ),
    )
    return trace


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_infos_are_deterministic(scenario: str) -> None:
    for seed in (0, 5):
        first, second = _info_trace(scenario, seed), _info_trace(scenario, seed, wrapped=False)
        assert len(first) == len(second) > 0
        for step, (a, b) in enumerate(zip(first, second, strict=True)):
            assert a == b, f"infos differ at step {step}"
    # not vacuous: another seed gives another trace
    assert _info_trace(scenario, 1) != _info_trace(scenario, 2)


@pytest.mark.parametrize("kind", CONSTRUCTORS)
def test_spaces_are_the_same_object(kind: str) -> None:
    env = CONSTRUCTORS[kind](scenario="coalition_market")
    before = {a: (env.observation_space(a), env.action_space(a)) for a in env.possible_agents}
    env.reset(seed=0)
    for _ in range(30):
        env.step(None if env.terminations[env.agent_selection] else '{"action_type": "wait"}')
    env.reset(seed=1)
    for a in env.possible_agents:
        assert env.observation_space(a) is env.observation_space(a) is before[a][0]
        assert env.action_space(a) is env.action_space(a) is before[a][1]
    obs = env.observe(env.agent_selection)
    assert env.observation_space(env.agent_selection).contains(obs)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_random_text_actions_are_handled(scenario: str) -> None:
    """Samples of the Text action space are (mostly invalid) actions: no exception, an error in
    the info, the invalid_action penalty, and credits stay conserved."""
    env = market.env(scenario=scenario)
    raw = env.unwrapped
    penalty = raw.scenario.rewards.invalid_action_penalty
    for seed in range(3):
        env.reset(seed=seed)
        for i, a in enumerate(env.possible_agents):
            env.action_space(a).seed(100 * seed + i)
        errors = 0
        for agent in env.agent_iter(5000):
            _, _, term, trunc, _ = env.last()
            action = None if term or trunc else env.action_space(agent).sample()
            assert action is None or isinstance(action, str) and len(action) <= 200
            env.step(action)
            if action is not None:
                info = raw.infos[agent]
                assert "error" in info and info["error"], info
                assert info["reward_components"]["invalid_action"] == -penalty
                errors += 1
            assert abs(raw.credit_balance()) <= 1e-6 * raw.initial_credits
        assert not env.agents and errors > 10


class FinishAt(BaseAgent):
    """Plays ``inner`` until round ``at``, then finishes on its first turn."""

    name = "finish_at"

    def __init__(self, at: int, inner: str = "truthful") -> None:
        super().__init__()
        self.at, self.inner = at, make_agent(inner)

    def act(self, obs: Any) -> Any:
        return Finish() if obs.round >= self.at else self.inner.act(obs)


@pytest.mark.parametrize("kind", CONSTRUCTORS)
def test_dead_seats_are_removed_and_never_return(kind: str) -> None:
    env = CONSTRUCTORS[kind](scenario="coalition_market")
    seats = make_seats(env, ["random_valid", "truthful"], designer="fixed")
    seats["bidder_1"] = FinishAt(1)
    seats["bidder_3"] = FinishAt(2, "random_valid")
    history: list[tuple[str, list[str], bool]] = []
    gone: set[str] = set()
    state = {"finished": None}

    def after(turn: dict) -> None:
        agents = list(env.agents)
        history.append((turn["agent"], agents, turn["dead"]))
        if turn["dead"]:
            # stepping a dead seat (with None) removes it; nothing else changes in the roster
            assert turn["agent"] not in agents
            gone.add(turn["agent"])
        assert not gone & set(agents), f"resurrected {gone & set(agents)}"
        if isinstance(turn["action"], Finish) and state["finished"] is None:
            state["finished"] = turn["agent"]
            # the finished seat is terminated and stepped next, per the dead-agent convention
            assert env.terminations[turn["agent"]] and env.agent_selection == turn["agent"]
            obs, reward, term, trunc, info = env.last()
            assert term and not trunc and math.isfinite(reward)

    play(env, seats, seed=3, after_step=after)
    assert state["finished"] == "bidder_1"
    assert {"bidder_1", "bidder_3"} <= gone
    raw = env.unwrapped
    assert raw.world.labs[1].exit_round == 1 and raw.world.labs[3].exit_round == 2
    # an entrant joined mid-episode (it is new, not a resurrection) and every seat is gone at the end
    entrants = [lab.seat for lab in raw.world.labs if raw.world.entry_round[lab.index] > 0]
    assert entrants and all(s in gone for s in entrants)
    assert any(s not in history[0][1] for s in entrants)
    assert not env.agents and gone == {a for _, agents, _ in history for a in agents} | {
        t for t, _, _ in history
    }


def test_dead_seat_action_is_ignored() -> None:
    env = market.raw_env(scenario="market_round")
    env.reset(seed=0)
    while env.agent_selection != "bidder_0":
        env.step('{"action_type": "wait"}')
    env.step('{"action_type": "finish"}')
    assert env.agent_selection == "bidder_0" and env.terminations["bidder_0"]
    budget = env.world.labs[0].budget
    env.step('{"action_type": "send_message", "text": "I am back"}')  # ignored, removed
    assert "bidder_0" not in env.agents and env.world.labs[0].budget == budget
    assert not env.book.messages
    assert env.agent_selection != "bidder_0"


# --- scenario files -------------------------------------------------------------------------


def test_scenario_file_extends_builtin(tmp_path: Path) -> None:
    path = tmp_path / "small.toml"
    path.write_text(
        'extends = "market_round"\nrounds = 3\n\n[labs]\ncount = 2\n\n[mechanism]\nauction_type = "first_price"\n',
        encoding="utf-8",
    )
    env = market.env(scenario=path)
    raw = env.unwrapped
    base = scenarios.load_scenario("market_round")
    assert raw.scenario.rounds == 3 and raw.scenario.labs.count == 2
    assert raw.scenario.mechanism.auction_type == "first_price"
    # everything not overridden comes from market_round
    assert (
        raw.scenario.jobs == base.jobs and raw.scenario.negotiation_turns == base.negotiation_turns
    )
    assert raw.scenario.mechanism.reserve_price == base.mechanism.reserve_price
    assert env.possible_agents == ["designer_0", "bidder_0", "bidder_1"]
    turns = play(env, make_seats(env, ["truthful"]), seed=0)
    assert {t["round"] for t in turns} == {0, 1, 2}
    assert market.env(scenario=str(path)).unwrapped.scenario == raw.scenario
    api_test(market.env(scenario=path), num_cycles=50)
    # a file can extend another file, by a path relative to itself
    child = _write(tmp_path, "child.toml", 'extends = "small.toml"\nnegotiation_turns = 0\n')
    sc = market.raw_env(scenario=child).scenario
    assert (
        sc.negotiation_turns == 0 and sc.rounds == 3 and sc.mechanism.auction_type == "first_price"
    )


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("neg_count.toml", 'extends = "market_round"\n[labs]\ncount = -1\n', ["labs.count"]),
        (
            "unknown.toml",
            'extends = "market_round"\n[labs]\ncuont = 4\n',
            ["labs.cuont", "unknown key"],
        ),
        ("top_unknown.toml", 'extends = "market_round"\nroundz = 4\n', ["roundz", "unknown key"]),
        (
            "late_shock.toml",
            'extends = "market_round"\nrounds = 3\n[[shocks]]\nkind = "windfall"\nround = 7\n',
            ["shocks[0].round", "past"],
        ),
        (
            "bad_kind.toml",
            'extends = "single_trade"\n[[shocks]]\nkind = "meteor"\nround = 1\n',
            ["shocks.0.kind"],
        ),
        ("syntax.toml", 'extends = "market_round"\nrounds = = 3\n', ["not valid TOML"]),
        ("wrong_type.toml", 'extends = "market_round"\nrounds = "many"\n', ["rounds"]),
        (
            "bad_range.toml",
            'extends = "market_round"\n[labs]\nbudget = [400.0, 100.0]\n',
            ["labs.budget"],
        ),
        ("bad_parent.toml", 'extends = "no_such_scenario"\n', ["no_such_scenario", "extends"]),
        (
            "bad_mech.toml",
            'extends = "market_round"\n[mechanism]\nauction_type = "dutch"\n',
            ["mechanism.auction_type"],
        ),
    ],
)
def test_broken_scenario_names_file_and_key(
    tmp_path: Path, name: str, text: str, words: list[str]
) -> None:
    path = _write(tmp_path, name, text)
    for make in (market.env, market.raw_env, scenarios.load_scenario):
        with pytest.raises(ScenarioError) as exc:
            make(path)
        message = str(exc.value)
        assert name in message, message
        for word in words:
            assert word in message, message


def test_unknown_scenario_name() -> None:
    with pytest.raises(ScenarioError, match="no_such_market") as exc:
        market.env(scenario="no_such_market")
    assert "market_round" in str(exc.value)  # lists the built-ins


def test_bad_override_names_the_key() -> None:
    with pytest.raises(ScenarioError, match=r"labs\.count"):
        market.raw_env(scenario="market_round", labs__count=0)


def test_seats_action_spaces_share_character_tables_and_sample_as_if_built_alone() -> None:
    """Each seat's ``Text`` space is a copy sharing one set of read-only character tables (they
    were two thirds of a live env's memory); it must still sample exactly like a ``Text`` space
    built on its own with the same seed, from a generator of its own."""
    from gymnasium.spaces import Text

    from market.environment.spaces import ACTION_CHARSET, text_action_spaces

    seats = ["designer_0", "bidder_0", "bidder_1"]
    shared = text_action_spaces(seats)
    alone = {
        a: Text(max_length=200, min_length=0, charset=ACTION_CHARSET, seed=k)
        for k, a in enumerate(seats)
    }
    for seat in seats:
        assert shared[seat] == alone[seat]
        assert [shared[seat].sample() for _ in range(4)] == [alone[seat].sample() for _ in range(4)]
    first, second = shared["bidder_0"], shared["bidder_1"]
    assert first._char_index is second._char_index  # one table, not one per seat
    assert first.np_random is not second.np_random
    first.seed(5)
    before = second.sample()
    second.seed(5)
    fresh = Text(max_length=200, min_length=0, charset=ACTION_CHARSET, seed=5)
    assert second.sample() == fresh.sample() != before


@pytest.mark.parametrize("wrapped", ["aec", "discrete"])
def test_reset_seeds_each_seats_action_space_as_if_seeded_at_reset(wrapped: str) -> None:
    """reset(seed=s) leaves each seat's action-space seed pending until the space first samples
    (a market of thousands of seats builds no generator per seat per reset); its samples are
    those of a space seeded at reset with the seat's seed, and an explicit seed() wins."""
    from gymnasium.spaces import Discrete, Text

    from market.environment.spaces import ACTION_CHARSET, seat_space_seed
    from market.environment.wrappers import rl_env

    env = market.raw_env("market_round") if wrapped == "aec" else rl_env("market_round")
    seats = list(env.possible_agents)

    def eager(seed: int) -> Any:
        if wrapped == "aec":
            return Text(max_length=200, min_length=0, charset=ACTION_CHARSET, seed=seed)
        return Discrete(env.action_space(seats[0]).n, seed=seed)

    env.reset(seed=11)
    for i, seat in enumerate(seats):  # each seat draws from its own seed, not its neighbour's
        expected = eager(seat_space_seed(11, i))
        assert [env.action_space(seat).sample() for _ in range(3)] == [
            expected.sample() for _ in range(3)
        ]
    env.reset(seed=11)  # a reset restarts every seat's stream, sampled before or not
    again = eager(seat_space_seed(11, 1))
    assert env.action_space(seats[1]).sample() == again.sample()
    env.reset(seed=12)
    env.action_space(seats[0]).seed(5)  # an explicit seed replaces the pending one
    assert env.action_space(seats[0]).sample() == eager(5).sample()
    env.reset(seed=12)
    env.action_space(seats[1]).seed()  # as does seed(): fresh entropy, as gymnasium's seed()
    fresh = [env.action_space(seats[1]).sample() for _ in range(8)]
    pending = eager(seat_space_seed(12, 1))
    assert fresh != [pending.sample() for _ in range(8)]
    assert seat_space_seed(11, 0) != seat_space_seed(12, 0) != seat_space_seed(12, 1)
