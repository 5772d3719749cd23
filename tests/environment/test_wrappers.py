"""The RL view (market.environment.wrappers): PettingZoo API and seeding, RLlib-shaped spaces, exact masks."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.test import api_test, seed_test

import scenarios
from agents.registry import make_agent
from market.core.actions import Bid, FormCoalition, SendOffer, SetMechanism, Wait
from market.environment.observations import vector_size
from market.environment.wrappers import MENU, MENU_NAMES, DiscreteActionWrapper, rl_env

SCENARIOS = scenarios.builtin_names()
N = len(MENU)
IDX = {name: i for i, name in enumerate(MENU_NAMES)}
# api_test's advice for plain-array envs; a dict observation with a mask is what it expects here
EXPECTED_WARNINGS = (
    "Observation is not a NumPy array",
    "Observation space for each agent probably",
)


def _no_surprise_warnings(caught: list[warnings.WarningMessage]) -> None:
    surprises = {str(w.message) for w in caught if not str(w.message).startswith(EXPECTED_WARNINGS)}
    assert not surprises, surprises


def _play(
    env: DiscreteActionWrapper,
    seed: int,
    pick: Any,
    natives: dict[str, Any] | None = None,
    max_steps: int = 20_000,
) -> list[tuple[str, int | None, dict[str, Any], np.ndarray]]:
    """A seeded episode: ``pick(agent, mask)`` chooses menu entries; ``natives`` seats act natively.

    Returns (agent, index or None for native, info after the step, mask) for every live turn.
    """
    env.reset(seed=seed)
    for agent, policy in (natives or {}).items():
        policy.reset(env.unwrapped.seat_seed(agent))
    turns = []
    for agent in env.agent_iter(max_steps):
        obs, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        if natives and agent in natives:
            env.step(natives[agent].act(env.unwrapped.observe(agent)))
            index = None
        else:
            index = pick(agent, obs["action_mask"])
            env.step(index)
        turns.append((agent, index, dict(env.infos.get(agent, {})), obs["action_mask"]))
    assert not env.agents, "episode did not end"
    return turns


def _random_picker(seed: int, finish_weight: float = 1.0) -> Any:
    rng = np.random.default_rng(seed)

    def pick(agent: str, mask: np.ndarray) -> int:
        legal = np.flatnonzero(mask)
        weights = np.where(legal == IDX["finish"], finish_weight, 1.0)
        return int(rng.choice(legal, p=weights / weights.sum()))

    return pick


def _mixed_natives(env: DiscreteActionWrapper) -> dict[str, Any]:
    """Odd bidder seats play random_valid natively: they send offers of both sides and invite."""
    return {
        a: make_agent("random_valid")
        for a in env.possible_agents
        if a.startswith("bidder_") and int(a[7:]) % 2 == 1
    }


# --- PettingZoo conformance ---------------------------------------------------------------
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_api_test(scenario: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        api_test(rl_env(scenario), num_cycles=1000)
    _no_surprise_warnings(caught)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_seed_test(scenario: str) -> None:
    seed_test(lambda: rl_env(scenario), num_cycles=500)


def test_same_seed_same_episode_with_entrants() -> None:
    """Two envs, one seed, masked sampling from the action spaces: identical to the last step."""

    def run() -> list[Any]:
        env = rl_env("coalition_market")
        env.reset(seed=3)
        out = []
        for agent in env.agent_iter():
            obs, reward, term, trunc, info = env.last()
            out.append((agent, obs["observation"].tobytes(), reward, repr(info)))
            env.step(None if term or trunc else env.action_space(agent).sample(obs["action_mask"]))
        return out

    first = run()
    assert first == run()
    assert any(agent == "bidder_5" for agent, *_ in first), "the entrant should have played"


# --- RLlib's expectations (without ray) --------------------------------------------------
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_spaces_are_rllib_shaped(scenario: str) -> None:
    env = rl_env(scenario)
    env.reset(seed=0)
    first = env.possible_agents[0]
    for agent in env.possible_agents:
        obs_space, act_space = env.observation_space(agent), env.action_space(agent)
        assert obs_space is env.observation_space(agent) and act_space is env.action_space(agent)
        assert obs_space == env.observation_space(first) and act_space == env.action_space(first)
        assert isinstance(obs_space, spaces.Dict) and set(obs_space.spaces) == {
            "observation",
            "action_mask",
        }
        assert obs_space["observation"].dtype == np.float32
        assert obs_space["observation"].shape == (vector_size(),)
        assert obs_space["action_mask"].dtype == np.int8 and obs_space["action_mask"].shape == (N,)
        assert isinstance(act_space, spaces.Discrete) and act_space.n == N
        assert obs_space.contains(obs_space.sample())  # RLlib builds dummy batches from samples
    seen_roles = set()
    for agent in env.agent_iter(400):
        obs, _, term, trunc, _ = env.last()
        assert isinstance(obs, dict) and obs["observation"].dtype == np.float32
        assert (
            obs["observation"].shape == (vector_size(),) and np.isfinite(obs["observation"]).all()
        )
        assert obs["action_mask"].dtype == np.int8 and obs["action_mask"].shape == (N,)
        assert env.observation_space(agent).contains(obs)
        seen_roles.add(agent.split("_")[0])
        env.step(None if term or trunc else env.action_space(agent).sample(obs["action_mask"]))
    assert "bidder" in seen_roles


# --- masks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_masked_random_play_never_errors(scenario: str) -> None:
    """Masked-in entries are always accepted, alongside natively played random_valid seats."""
    used = set()
    for seed in range(6):
        env = rl_env(scenario)
        turns = _play(env, seed, _random_picker(seed, finish_weight=0.02), _mixed_natives(env))
        for agent, index, info, _ in turns:
            if index is None:
                continue
            assert "error" not in info, (agent, MENU_NAMES[index], info)
            assert info["macro_action"] == MENU_NAMES[index]
            used.add(MENU_NAMES[index])
    # pitches are negotiation-phase actions: a scenario without negotiation turns has none
    talks = scenarios.load_scenario(scenario).negotiation_turns > 0
    assert {"wait", "bid_value_100", "allocate_greedy"} | (
        {"pitch_most_urgent"} if talks else set()
    ) <= used
    assert len(used) >= 8, sorted(used)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_uniform_masked_policy_completes_episodes(scenario: str) -> None:
    for seed in range(3):
        turns = _play(rl_env(scenario), seed, _random_picker(100 + seed))
        assert turns and all("error" not in info for _, _, info, _ in turns)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_mask_is_exact(scenario: str) -> None:
    """At sampled states, entry i is masked in iff stepping i leaves no error (on env copies)."""
    env = rl_env(scenario)
    natives = _mixed_natives(env)
    env.reset(seed=1)
    for agent, policy in natives.items():
        policy.reset(env.unwrapped.seat_seed(agent))
    pick, checked = _random_picker(1, finish_weight=0.02), 0
    for k, agent in enumerate(env.agent_iter()):
        obs, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        if agent in natives:
            env.step(natives[agent].act(env.unwrapped.observe(agent)))
            continue
        answerable = obs["action_mask"][IDX["reject_first_offer"]]
        if checked < 40 and (answerable or (k % 2 == 0 and checked < 30)):
            for i in range(N):
                probe = copy.deepcopy(env)
                probe.step(i)
                error = probe.infos[agent].get("error")
                assert (error is None) == bool(obs["action_mask"][i]), (MENU_NAMES[i], error)
            checked += 1
        env.step(pick(agent, obs["action_mask"]))
    assert checked >= 3


def _phase_masks(
    scenario: str = "market_round", seed: int = 0
) -> dict[tuple[str, str], np.ndarray]:
    """The first mask of each (role, phase) in a waiting episode."""
    env = rl_env(scenario)
    env.reset(seed=seed)
    masks: dict[tuple[str, str], np.ndarray] = {}
    for agent in env.agent_iter():
        obs, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        masks.setdefault((agent.split("_")[0], env.unwrapped.phase), obs["action_mask"])
        env.step(IDX["wait"])
    return masks


def test_known_illegal_entries_are_masked_out_in_each_phase() -> None:
    masks = _phase_masks()
    assert set(masks) == {("designer", "design"), ("bidder", "negotiation"), ("bidder", "bidding")}
    design = masks[("designer", "design")]
    negotiation = masks[("bidder", "negotiation")]
    bidding = masks[("bidder", "bidding")]
    # designer: mechanisms and wait only; never a bid or finish
    assert design[IDX["wait"]] and design[IDX["set_auction_vcg"]] and design[IDX["raise_reserve"]]
    assert not design[IDX["finish"]] and not design[IDX["bid_value_100"]]
    # negotiation: no bids, no mechanism changes; nothing to accept or reject without offers
    assert negotiation[IDX["wait"]] and negotiation[IDX["finish"]]
    assert not negotiation[IDX["bid_value_100"]] and not negotiation[IDX["set_auction_vcg"]]
    # bidding: bids yes; offers and pitches are negotiation moves
    assert bidding[IDX["bid_value_100"]] and bidding[IDX["bid_reserve"]]
    assert not bidding[IDX["pitch_most_urgent"]] and not bidding[IDX["sell_spare_block"]]
    assert not bidding[IDX["raise_reserve"]]


def test_masked_out_entries_step_as_invalid_actions_without_raising() -> None:
    env = rl_env("market_round")
    env.reset(seed=0)
    assert env.agent_selection == "designer_0"
    env.step(IDX["bid_value_100"])  # a bid in the design phase
    info = env.infos["designer_0"]
    assert "not allowed in the design phase" in info["error"]
    assert info["reward_components"] == {
        "invalid_action": -env.scenario.rewards.invalid_action_penalty
    }
    bidder = env.agent_selection
    assert (
        bidder.startswith("bidder_")
        and not env.observe(bidder)["action_mask"][IDX["accept_cheapest_sell_offer"]]
    )
    env.step(IDX["accept_cheapest_sell_offer"])  # no offer to accept
    assert "does not exist" in env.infos[bidder]["error"]
    for garbage in (N, -1, 10**9, "not json", 2.5, np.array([1.0]), True):
        agent = env.agent_selection
        env.step(garbage)
        assert "error" in env.infos[agent], garbage
    agent = env.agent_selection
    env.step(np.int64(IDX["wait"]))
    assert "error" not in env.infos[agent] and env.infos[agent]["macro_action"] == "wait"
    agent = env.agent_selection
    env.step(np.array(IDX["wait"], dtype=np.int32))
    assert "error" not in env.infos[agent]


def test_mask_tracks_offers_and_invitations() -> None:
    """Answering entries appear exactly while there is something the seat can honour."""
    env = rl_env("market_round")
    env.reset(seed=0)  # this round bidder_0 holds 2 blocks, bidder_1 holds 1, bidder_2 none
    env.step(IDX["wait"])  # designer
    b0, b1, b2 = "bidder_0", "bidder_1", "bidder_2"
    assert (
        env.agent_selection == b0 and not env.observe(b0)["action_mask"][IDX["reject_first_offer"]]
    )
    env.step(SendOffer(to=b1, side="sell", blocks=1, price=10.0))  # native actions pass through
    mask = env.observe(b1)["action_mask"]
    assert mask[IDX["accept_cheapest_sell_offer"]] and mask[IDX["reject_first_offer"]]
    assert not mask[IDX["accept_best_buy_offer"]]  # nobody offers to buy from bidder_1
    env.step(IDX["accept_cheapest_sell_offer"])
    assert env.infos[b1]["result"]["status"] == "accepted"
    env.step(IDX["wait"])  # bidder_2
    env.step(SendOffer(to=b2, side="buy", blocks=1, price=5.0))  # second pass
    env.step(FormCoalition(members=[b2], purpose="pool"))
    mask = env.observe(b2)["action_mask"]
    assert mask[IDX["commit_first_invitation"]] and mask[IDX["reject_first_offer"]]
    assert not mask[IDX["accept_best_buy_offer"]]  # bidder_2 has no block to deliver
    env.step(IDX["accept_best_buy_offer"])  # masked out, sent anyway: the env's usual error
    assert "uncommitted block" in env.infos[b2]["error"]
    assert not env.observe(b2)["action_mask"].any(), "not its turn: nothing is masked in"


def test_native_action_translation() -> None:
    env = rl_env("market_round", mechanism__reserve_price=4.0)
    env.reset(seed=0)
    d = "designer_0"
    vcg = env.native_action(d, IDX["set_auction_vcg"])
    assert isinstance(vcg, SetMechanism) and vcg.mechanism.auction_type == "vcg"
    assert vcg.mechanism.model_dump(exclude_none=True) == {"auction_type": "vcg"}  # keeps the rest
    assert env.native_action(d, IDX["raise_reserve"]).mechanism.reserve_price == pytest.approx(6.0)
    assert env.native_action(d, IDX["lower_reserve"]).mechanism.reserve_price == pytest.approx(2.4)
    assert env.native_action(d, IDX["toggle_coalition_policy"]).mechanism.coalition_policy in (
        "allow",
        "penalize_suspected",
    )
    assert env.native_action(d, IDX["wait"]) == Wait()
    with pytest.raises(ValueError, match="outside the menu"):
        env.native_action(d, N)
    env.step(IDX["raise_reserve"])
    assert env.unwrapped.mechanism.reserve_price == pytest.approx(6.0)
    # bids: scaled expected marginal values, non-increasing and affordable
    raw = env.unwrapped
    while raw.phase != "bidding":
        env.step(IDX["wait"])
    agent = env.agent_selection
    full, half = (env.native_action(agent, IDX[n]) for n in ("bid_value_100", "bid_value_50"))
    assert isinstance(full, Bid) and isinstance(half, Bid)
    assert full.bids == sorted(full.bids, reverse=True)
    assert sum(full.bids) <= raw.observe(agent).budget + 1e-9
    n = min(len(full.bids), len(half.bids))
    assert half.bids[:n] == pytest.approx([b / 2 for b in full.bids[:n]], abs=1e-6)
    floor = max(6.0, raw.observe(agent).energy_floor)  # the revealed reserve or the energy floor
    assert set(env.native_action(agent, IDX["bid_reserve"]).bids) <= {floor}
