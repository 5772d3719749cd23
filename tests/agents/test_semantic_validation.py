"""Semantic validation (market.core.action_checks): ``validate_for`` on a seat's observation says
ok iff the env accepts the action, and its first reason is the env's own, word for word, except
the documented inexact cases (an address or offer id the observation cannot resolve).

The env is checked *without* its own pre-check (``check_action`` replaced by the bare turn check),
so the agreement is between validate_for and the handlers in market.core, not a tautology.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import market.environment.aec as aec
import market.environment.dispatch as dispatch
from agents.registry import make_agent
from market.core.action_checks import refusals, validate_for
from market.core.actions import ActionParseError, Bid, SendOffer, parse_action
from market.core.phases import LEGAL, check_turn
from market.core.seats import DESIGNER, lab_index
from market.environment.observations import Observation
from scenarios import builtin_names

MIX = ("rule_expert", "cooperative", "spam_coalitions", "short_seller", "random_valid")
SNAPSHOTS = 6  # env states kept per scenario (spread over the episode)


def _turn_only(act: Any, obs: Any, cap: int) -> None:
    check_turn(act, obs.seat, obs.phase)


@pytest.fixture(scope="module")
def snapshots() -> dict[str, list[Any]]:
    """Per built-in scenario, envs paused at a live seat's turn, after a mixed population played."""
    out: dict[str, list[Any]] = {}
    for name in builtin_names():
        env = aec.raw_env(name, judge="rule", conduct_judge="rule")
        env.reset(seed=3)
        agents = {}
        for seat in env.possible_agents:
            spec = "fixed" if seat == DESIGNER else MIX[lab_index(seat) % len(MIX)]
            agents[seat] = make_agent(spec, role="designer" if seat == DESIGNER else "bidder")
            agents[seat].reset(env.seat_seed(seat))
        kept: list[Any] = []
        step = 0
        every = 7 if name.startswith("large") else 3
        while env.agents and len(kept) < SNAPSHOTS and step < 3000:
            seat = env.agent_selection
            if not env.is_live(seat):
                env.step(None)
                continue
            obs = env.observe(seat)
            if step % every == every - 1 and obs.role == "bidder":
                kept.append(copy.deepcopy(env))
            env.step(agents[seat].act(obs))
            step += 1
        out[name] = kept
    return out


def _ids(obs: Observation) -> dict[str, list[str]]:
    offers = [
        o.offer_id
        for o in (obs.offers_received or []) + (obs.offers_sent or []) + (obs.closed_offers or [])
    ]
    coalitions = [c.coalition_id for c in obs.public_coalitions] + [
        c.coalition_id for c in obs.coalitions or []
    ]
    return {
        "seat": [*obs.active_labs, obs.seat, "bidder_97", "designer_0", "blocks_requested"],
        "offer": [*offers, "o999", "o0", "123456"],
        "coalition": [*coalitions, "c99", "c0"],
        "job": [j.job_id for j in obs.jobs or []] + ["j_none"],
        "pitcher": [p.lab for p in obs.pitches] + list(obs.active_labs),
    }


@st.composite
def action_for(draw: st.DrawFn, obs: Observation) -> dict[str, Any]:
    ids = _ids(obs)
    budget = float(obs.budget or 0.0)
    kinds = sorted({*LEGAL[obs.phase], "bid", "accept_offer", "send_offer"})
    kind = draw(st.sampled_from(kinds))
    price = draw(st.sampled_from([0.0, 1.0, budget / 3, budget, budget * 2 + 1]))
    blocks = draw(st.integers(1, 12))
    now, last = obs.round, obs.rounds_total - 1
    rnd = draw(st.integers(max(0, now - 1), last + 1))
    pick = lambda k: draw(st.sampled_from(ids[k]))  # noqa: E731
    act: dict[str, Any] = {"action_type": kind}
    if draw(st.integers(0, 19)) == 0:
        act["agent"] = pick("seat")
    match kind:
        case "send_offer":
            act |= {"to": pick("seat"), "side": draw(st.sampled_from(["buy", "sell"]))}
            act |= {"blocks": blocks, "price": price, "delivery_round": rnd}
            act["short"] = draw(st.booleans())
            if draw(st.booleans()):
                act |= {"give_blocks": draw(st.integers(1, 3)), "give_round": rnd}
        case "counter_offer":
            act |= {"offer_id": pick("offer"), "blocks": blocks, "price": price}
            if draw(st.booleans()):
                act |= {"give_blocks": draw(st.integers(1, 3))}
        case "accept_offer" | "reject_offer":
            act["offer_id"] = pick("offer")
        case "form_coalition":
            act["members"] = draw(st.lists(st.sampled_from(ids["seat"]), min_size=1, max_size=3))
            act["contribution"] = price
        case "commit_to_coalition":
            act |= {"coalition_id": pick("coalition"), "contribution": price}
        case "leave_coalition":
            act["coalition_id"] = pick("coalition")
        case "send_message":
            act["to"] = draw(st.one_of(st.just("all"), st.lists(st.sampled_from(ids["seat"]))))
            act["text"] = draw(st.sampled_from(["hello", " "]))
        case "make_pitch":
            act |= {"text": draw(st.sampled_from(["need blocks", ""])), "blocks_requested": 2}
            if draw(st.booleans()):
                act["job_id"] = pick("job")
        case "counter_pitch":
            act |= {"target": pick("pitcher"), "text": draw(st.sampled_from(["no", " "]))}
        case "reserve_capacity" | "release_capacity":
            act |= {"blocks": draw(st.integers(1, 4)), "round": rnd}
            if kind == "reserve_capacity" and draw(st.booleans()):
                act["job_id"] = pick("job")
        case "allocate_to_job":
            act |= {"job_id": pick("job"), "blocks": draw(st.integers(0, 6))}
        case "bid":
            n = draw(st.integers(0, obs.capacity + 2))
            top = draw(st.sampled_from([1.0, budget / max(n, 1), budget]))
            act["bids"] = [round(top * (1 - k / (n + 1)), 2) for k in range(n)]
            if draw(st.integers(0, 4)) == 0:
                act["coalition_id"] = pick("coalition")
    return act


@pytest.mark.parametrize("name", builtin_names())
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_validate_for_agrees_with_the_env(
    name: str, data: st.DataObject, snapshots: dict[str, list[Any]], monkeypatch: Any
) -> None:
    kept = snapshots[name]
    assert kept, f"{name}: no bidder turn was kept"
    env = copy.deepcopy(data.draw(st.sampled_from(kept)))
    seat = env.agent_selection
    obs = env.observe(seat)
    raw = data.draw(action_for(obs))
    try:
        act = parse_action(raw, designer=False)
    except ActionParseError:
        return  # syntax is parse_action's business
    found = refusals(act, obs)
    monkeypatch.setattr(dispatch, "check_action", _turn_only)  # the handlers alone
    env.step(raw)
    error = env.infos[seat].get("error")
    assert (error is None) == (not found), (raw, error, [r.text for r in found])
    if found and found[0].exact:
        assert error == found[0].text


def _seat_obs(name: str = "market_round") -> tuple[Any, Observation]:
    env = aec.raw_env(name)
    env.reset(seed=1)
    while env.agent_selection == DESIGNER or env.phase != "negotiation":
        env.step({"action_type": "wait"})
    return env, env.observe(env.agent_selection)


def test_refusals_name_the_numbers_a_repair_needs() -> None:
    """Hand-built cases: the unit cap is the round's capacity, the budget is the seat's."""
    env, obs = _seat_obs()
    cap = obs.capacity
    too_many = Bid(bids=[0.0] * (cap + 1))
    bid_obs = obs.model_copy(update={"phase": "bidding"})
    assert validate_for(too_many, bid_obs) == [
        f"{cap + 1} unit bids exceed the limit of {cap} this round; bid for at most {cap} blocks"
    ]
    over = Bid(bids=[float(obs.budget or 0) + 1.0])
    (text,) = validate_for(over, bid_obs)
    assert f"you have {obs.budget:.2f}" in text
    # an address the observation cannot resolve: refused, but not word for word
    far = SendOffer(to="bidder_97", side="buy", blocks=1, price=1.0)
    (refusal,) = refusals(far, obs)
    assert not refusal.exact and "not in the market now" in refusal.text
    # a bid in negotiation: the phase's legal actions, in the env's words
    (phase,) = validate_for(Bid(bids=[]), obs)
    assert phase.startswith("bid is not allowed in the negotiation phase; legal now: send_offer")


def test_the_env_runs_the_shared_checks() -> None:
    """The env refuses with validate_for's words before any handler runs (the handler would
    refuse the same; here its check is replaced, so only the pre-check can refuse)."""
    env, obs = _seat_obs()
    seat = env.agent_selection
    bad = {"action_type": "allocate_to_job", "job_id": "nope", "blocks": 1}
    (expected,) = validate_for(parse_action(bad), obs)
    real = aec.raw_env.__dict__["_apply"]
    try:
        aec.raw_env._apply = lambda self, agent, act: {}  # type: ignore[method-assign]
        env.step(bad)
    finally:
        aec.raw_env._apply = real  # type: ignore[method-assign]
    assert env.infos[seat]["error"] == expected


# --- the LLM seat: semantic repair, no identical repeat, memory of the refusal ------------------
BAD = json.dumps({"action_type": "allocate_to_job", "job_id": "nope", "blocks": 1})
WAIT = json.dumps({"action_type": "wait"})


def _llm(server: Any, **kw: Any) -> Any:
    from agents.llm.agent import LLMAgent

    return LLMAgent.from_spec(
        f"llm:openai?model=fake&base_url={server.base_url}&max_retries=0"
        + "".join(f"&{k}={v}" for k, v in kw.items())
    )


def _last_user(body: dict[str, Any]) -> str:
    return str([m for m in body["messages"] if m["role"] == "user"][-1]["content"])


def test_a_refusal_goes_to_the_repair_loop_with_the_valid_choices() -> None:
    from market.bench.fake_openai_server import FakeOpenAIServer

    def policy(body: dict[str, Any]) -> str:  # a fixed reply until told what is valid
        return WAIT if "Valid now:" in _last_user(body) else BAD

    env, obs = _seat_obs()
    with FakeOpenAIServer(policy=policy) as server:
        agent = _llm(server, memory="none")
        agent.reset(0)
        action = agent.act(obs)
        bodies = [r.body for r in server.requests]
    assert action.action_type == "wait"
    assert (agent.stats["semantic_refusals"], agent.stats["fallbacks"]) == (1, 0)
    repair = _last_user(bodies[1])
    env_words = "job_id 'nope' is not one of your jobs; use a job_id from your jobs"
    assert env_words in repair  # the env's own reason, word for word
    jobs = [j.job_id for j in obs.jobs or [] if j.status == "active"]
    assert jobs and all(j in repair for j in jobs)  # the valid ids
    assert f"your budget: {obs.budget:.2f} credits" in repair


def test_a_repeated_reply_changes_the_next_request_and_the_budget_holds() -> None:
    from market.bench.fake_openai_server import FakeOpenAIServer

    env, obs = _seat_obs()
    with FakeOpenAIServer(policy=lambda body: BAD) as server:
        agent = _llm(server, memory="none", retries=2)
        agent.reset(0)
        action = agent.act(obs)
        bodies = [r.body for r in server.requests]
    assert len(bodies) == 3  # 1 + retries, never more
    assert action.action_type == "wait" and agent.stats["fallbacks"] == 1
    assert agent.stats["repeated_replies"] == 2
    assert bodies[1]["temperature"] == 0.0  # the first repair: the reply was new
    assert bodies[2]["temperature"] >= 0.7 and bodies[2]["seed"] != bodies[1]["seed"]
    assert "repeated an earlier reply word for word" in _last_user(bodies[2])
    assert bodies[2]["messages"] != bodies[1]["messages"]


def test_memory_says_the_last_action_was_refused() -> None:
    from market.bench.fake_openai_server import FakeOpenAIServer

    env, obs = _seat_obs()
    seat = env.agent_selection
    with FakeOpenAIServer(policy=lambda body: WAIT) as server:
        agent = _llm(server, memory="window:4")
        agent.reset(0)
        agent.act(obs)
        env.step(json.loads(BAD))  # the env refuses what was played
        error = env.infos[seat]["error"]
        while env.agent_selection != seat:
            env.step({"action_type": "wait"})
        agent.act(env.observe(seat))
        second = _last_user(server.requests[-1].body)
    assert f"was refused by the market: {error}" in second
    assert "was played" not in second.split("What changed")[0]
