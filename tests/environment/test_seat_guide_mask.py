"""seat_guide.valid_actions against the env and the RL action mask, over random market states.

Random states come from seeded episodes of several scenarios in which every bidder seat plays a
mix of agents that make offers, coalitions, reservations, pitches and short sales (``random_valid``
among them). At every live turn the guide's menu must:

* offer only legal types, and every type the RL mask has a masked-in entry for;
* agree with the mask exactly where the mask's rule is the whole rule (accepting an offer,
  joining a coalition, allocating to a job, bidding, waiting, finishing, setting the mechanism);
* be right: an action built from each offered type's listed choices is accepted by a copy of
  the env (every listed offer, for accept_offer), and the offers, reservations and free blocks it
  leaves out are refused.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.registry import make_agent
from market.core.seats import DESIGNER
from market.environment.aec import raw_env
from market.environment.observations import Observation
from market.environment.seat_guide import ActionChoice, free_blocks, valid_actions
from market.environment.wrappers import MENU, action_mask

SCENARIOS = ("market_round", "coalition_market", "single_trade", "shock_storm")
BIDDERS = ("random_valid", "rule_expert", "cooperative", "short_seller", "spam_coalitions")
# the action types whose mask rule is the whole validity rule
EXACT = {
    "accept_offer",
    "commit_to_coalition",
    "allocate_to_job",
    "bid",
    "wait",
    "finish",
    "set_mechanism",
}
TRIES = 4
TRIVIAL = {"wait", "finish", "bid", "set_mechanism", "send_message"}  # always accepted


def example(choice: ActionChoice, obs: Observation, pick: int = 0) -> dict[str, Any]:
    """An action of ``choice`` from its listed choices and defaults (``pick``: which choice of
    its first choice field), with the smallest amounts."""
    out: dict[str, Any] = {"action_type": choice.action_type}
    for k, f in enumerate(choice.fields):
        if f.name.startswith("mechanism."):
            continue
        if f.choices:
            value: Any = f.choices[pick if k == 0 else 0].value if f.default is None else f.default
            out[f.name] = [value] if f.kind == "choices" and value != "all" else value
        elif f.default not in (None, ""):
            out[f.name] = f.default
        else:
            out[f.name] = {"int": 1, "number": 0.0, "numbers": [], "text": "we need blocks"}[f.kind]
    if choice.action_type == "allocate_to_job":
        out["blocks"] = 0
    if choice.action_type == "send_offer" and out["side"] == "sell":  # a round with a free block
        out["delivery_round"] = next(
            obs.round + k for k in range(len(obs.holdings or [])) if free_blocks(obs, k) > 0
        )
    return out


def refused(env: raw_env, action: dict[str, Any]) -> bool:
    trial = copy.deepcopy(env)
    seat = trial.agent_selection
    trial.step(action)
    return "error" in trial.infos[seat]


def check_turn(env: raw_env, obs: Observation, limit: int, tried: Counter[str]) -> None:
    """The checks above for one turn; each action type is tried on a copy of the env at most
    ``TRIES`` times an episode (a copy of a mid-episode env is the slow part)."""
    menu = {c.action_type: c for c in valid_actions(obs)}
    assert set(menu) <= set(obs.legal_actions)
    mask = action_mask(obs, limit)
    masked_in = {MENU[i].kind for i in range(len(MENU)) if mask[i]}
    assert masked_in <= set(menu), (masked_in - set(menu), obs.seat, obs.round, obs.phase)
    for kind in EXACT & set(obs.legal_actions):
        assert (kind in masked_in) == (kind in menu), (kind, obs.seat, obs.round)
    for kind, choice in menu.items():
        if kind in TRIVIAL or tried[kind] >= TRIES:
            continue
        tried[kind] += 1
        picks = range(len(choice.fields[0].choices)) if kind == "accept_offer" else [0]
        for pick in picks:
            action = example(choice, obs, pick)
            assert not refused(env, action), (action, obs.seat, obs.round)
    # what the menu leaves out is refused
    listed = (
        {c.value for c in menu["accept_offer"].fields[0].choices}
        if "accept_offer" in menu
        else set()
    )
    if "accept_offer" in obs.legal_actions and tried["not accept_offer"] < TRIES:
        tried["not accept_offer"] += 1
        for o in obs.offers_received or ():
            if o.offer_id not in listed:
                assert refused(env, {"action_type": "accept_offer", "offer_id": o.offer_id})
    if "release_capacity" in obs.legal_actions and "release_capacity" not in menu:
        tried["not release_capacity"] += 1
        if tried["not release_capacity"] <= TRIES:
            assert refused(env, {"action_type": "release_capacity", "blocks": 1})
    if "reserve_capacity" in obs.legal_actions and tried["not reserve_capacity"] < TRIES:
        tried["not reserve_capacity"] += 1
        for k in range(len(obs.holdings or [])):
            if free_blocks(obs, k) <= 0:
                reserve = {"action_type": "reserve_capacity", "blocks": 1, "round": obs.round + k}
                assert refused(env, reserve)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(scenario=st.sampled_from(SCENARIOS), seed=st.integers(0, 10_000), shift=st.integers(0, 4))
def test_the_menu_is_what_the_env_accepts_and_covers_the_mask(
    scenario: str, seed: int, shift: int
) -> None:
    env = raw_env(scenario)
    env.reset(seed=seed)
    limit = env.scenario.capacity.max_units_per_bid
    agents = {
        seat: make_agent(
            "random" if seat == DESIGNER else BIDDERS[(k + shift) % len(BIDDERS)],
            "designer" if seat == DESIGNER else "bidder",
        )
        for k, seat in enumerate(env.possible_agents)
    }
    for seat, agent in agents.items():
        agent.reset(env.seat_seed(seat))
    tried: Counter[str] = Counter()
    for seat in env.agent_iter(max_iter=2000):
        obs, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        check_turn(env, obs, limit, tried)
        env.step(agents[seat].act(obs))
