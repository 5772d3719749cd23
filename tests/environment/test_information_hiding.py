"""No observation shows what is private to another seat (docs/design.md, section 5.2).

After reset every lab's private state is overwritten with sentinel values that cannot occur by
chance (budgets 987654.321 + 111111.111 x lab, job values 123456.789 + ..., job ids
``job_SENTINEL_<lab>_<k>``). Scripted labs then talk in every way the market allows (private and
public messages, offers and counters, a coalition with a distinctive pool, pitches with job ids,
counter-pitches, coalition bids) while the others bid truthfully. After every step, every seat's
observation is rendered as JSON, prompt and vector and searched for the other seats' secrets as
they stand at that moment, and for the episode seed.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import NO_SHOCK_RATES, ScriptedAgent, TruthfulBidder, errors, population, run_episode

import market
from agents.scripted import FixedDesigner
from market.core.actions import (
    Bid,
    CommitToCoalition,
    CounterOffer,
    CounterPitch,
    FormCoalition,
    MakePitch,
    SendMessage,
    SendOffer,
)

SEED = 918273645
N_LABS = 4
CONTRIBUTIONS = (4321.123, 1234.567)
PRIVATE_TEXTS = {  # text -> (sender, recipients)
    "PRIVATE_2_TO_3 meet at dawn": (2, (3,)),
    "PRIVATE_0_TO_1 bid low": (0, (1,)),
    "PRIVATE_2_TO_3 again": (2, (3,)),
    "PRIVATE_3_TO_2 reply": (3, (2,)),
    "PRIVATE_1_TO_0 ok": (1, (0,)),
    "PRIVATE_0_TO_1 last round": (0, (1,)),
}
OFFER_SECRETS = {  # offer terms only the two parties may see
    "777.777": (2, 3),
    "OFFER_3_TO_2 quiet deal": (2, 3),
    "555.555": (2, 3),
    "COUNTER_2_TO_3 more please": (2, 3),
}
SHOCKS = [
    {"kind": "budget_cut", "round": 1, "target": 1, "magnitude": 0.5, "public": False},
    {"kind": "windfall", "round": 1, "target": 2, "magnitude": 50.0, "public": False},
    {"kind": "demand_surge", "round": 1, "target": 3, "magnitude": 2.0, "public": False},
    {
        "kind": "reliability_drop",
        "round": 1,
        "magnitude": 0.05,
        "public": False,
    },  # hidden, no target
    {"kind": "capacity_outage", "round": 2, "magnitude": 0.5, "public": True},
]


def sentinel_budget(lab: int) -> float:
    return round(987654.321 + 111111.111 * lab, 3)


def sentinel_value(lab: int, k: int) -> float:
    return round(123456.789 + 7919.131 * lab + 313.717 * k, 3)


def plant_sentinels(env) -> None:
    for lab in env.world.labs:
        lab.budget = sentinel_budget(lab.index)
        for k, job in enumerate(lab.jobs):  # including jobs that arrive later and surge jobs
            job.job_id = f"job_SENTINEL_{lab.index}_{k}"
            job.value = sentinel_value(lab.index, k)
    env.initial_credits = sum(lab.budget for lab in env.world.labs)


def live_job_id(obs):
    live = [j for j in obs.jobs or () if j.status == "active"]
    return live[0].job_id if live else None


def scripted_population() -> dict:
    def coalition_id(obs):
        return obs.coalitions[0].coalition_id

    def coalition_bid(obs):
        mine = [c for c in obs.coalitions or () if c.status == "active" and c.leader == obs.seat]
        return (
            Bid(bids=[1000.0], coalition_id=mine[0].coalition_id)
            if mine
            else TruthfulBidder().act(obs)
        )

    def counter_first(obs):
        offer = obs.offers_received[0]
        return CounterOffer(
            offer_id=offer.offer_id, blocks=1, price=555.555, message="COUNTER_2_TO_3 more please"
        )

    truthful = TruthfulBidder
    b0 = ScriptedAgent(
        {
            (0, "negotiation", 0): FormCoalition(
                members=["bidder_1"],
                contribution=CONTRIBUTIONS[0],
                term_rounds=2,
                purpose="joint bid",
            ),
            (0, "negotiation", 1): SendMessage(to="bidder_1", text="PRIVATE_0_TO_1 bid low"),
            (0, "bidding"): coalition_bid,
            (1, "negotiation", 0): lambda o: MakePitch(
                text="pitch from zero", blocks_requested=1, job_id=live_job_id(o)
            ),
            (1, "bidding"): coalition_bid,
            (2, "negotiation", 0): SendMessage(to=["bidder_1"], text="PRIVATE_0_TO_1 last round"),
        },
        fallback=truthful(),
    )
    b1 = ScriptedAgent(
        {
            (0, "negotiation", 0): lambda o: CommitToCoalition(
                coalition_id=coalition_id(o), contribution=CONTRIBUTIONS[1]
            ),
            (0, "negotiation", 1): lambda o: MakePitch(
                text="pitch from one", blocks_requested=1, job_id=live_job_id(o)
            ),
            (1, "negotiation", 0): CounterPitch(target="bidder_0", text="COUNTERPITCH_1 nonsense"),
            (1, "negotiation", 1): SendMessage(to="bidder_0", text="PRIVATE_1_TO_0 ok"),
        },
        fallback=truthful(),
    )
    b2 = ScriptedAgent(
        {
            (0, "negotiation", 0): SendMessage(to="bidder_3", text="PRIVATE_2_TO_3 meet at dawn"),
            (0, "negotiation", 1): counter_first,
            (1, "negotiation", 0): SendMessage(to=["bidder_3"], text="PRIVATE_2_TO_3 again"),
        },
        fallback=truthful(),
    )
    b3 = ScriptedAgent(
        {
            (0, "negotiation", 0): SendOffer(
                to="bidder_2",
                side="buy",
                blocks=1,
                price=777.777,
                message="OFFER_3_TO_2 quiet deal",
            ),
            (0, "negotiation", 1): SendMessage(to="all", text="public hello from three"),
            (1, "negotiation", 0): SendMessage(to="bidder_2", text="PRIVATE_3_TO_2 reply"),
        },
        fallback=truthful(),
    )
    return {
        "designer_0": FixedDesigner(),
        "bidder_0": b0,
        "bidder_1": b1,
        "bidder_2": b2,
        "bidder_3": b3,
    }


def secrets_of(env, lab: int) -> tuple[list[str], list[float]]:
    """Strings and numbers private to ``lab`` right now."""
    w = env.world.labs[lab]
    strings = [f"{sentinel_budget(lab):.2f}", repr(w.budget), f"{w.budget:.2f}"]
    numbers = [sentinel_budget(lab), w.budget, w.budget / 100.0]
    for job in w.jobs:
        strings += [job.job_id, repr(job.value), f"{job.value:.2f}"]
        numbers += [job.value, job.value / 100.0, job.unit_value, job.unit_value / 100.0]
    return strings, numbers


def hidden_from(env, me: int, seed: int) -> tuple[list[str], list[float]]:
    """Everything seat ``me`` (-1: the designer) must not see right now."""
    strings, numbers = [str(seed)], []
    for lab in range(len(env.world.labs)):
        if lab != me:
            s, n = secrets_of(env, lab)
            strings += s
            numbers += n
    for text, (sender, recipients) in PRIVATE_TEXTS.items():
        if me != sender and me not in recipients:
            strings.append(text)
    for text, parties in OFFER_SECRETS.items():
        if me not in parties:
            strings.append(text)
    for c in env.coalitions.coalitions.values():
        if me not in c.members:
            strings += [repr(x) for x in CONTRIBUTIONS]
            numbers += list(CONTRIBUTIONS)
            if c.status != "dissolved" and c.pool > 0:
                strings += [repr(c.pool), f"{c.pool:.2f}"]
                numbers += [c.pool, c.pool / 100.0]
    return strings, numbers


def check_all_seats(env, record: dict) -> None:
    """Search every seat's observation, in all three renderings, for what it must not see."""
    seen = record.setdefault("seen", [])
    for seat in env.agents:
        obs = env.observe(seat)
        me = -1 if seat == "designer_0" else int(seat[7:])
        strings, numbers = hidden_from(env, me, record["seed"])
        text = obs.model_dump_json() + "\n" + obs.to_prompt()
        leaked = [s for s in strings if s in text]
        assert not leaked, f"{seat} round {env.round} phase {env.phase} sees {leaked}"
        vec = obs.to_vector().astype(np.float64)
        for x in numbers:
            assert not np.isclose(vec, x, rtol=1e-6, atol=0.0).any(), (
                f"{seat} vector holds secret {x}"
            )
        seen.append((seat, env.round, obs))


def play():
    env = market.raw_env(
        "market_round",
        rounds=3,
        labs__count=N_LABS,
        negotiation_turns=2,
        shocks=SHOCKS,
        shock_rates=NO_SHOCK_RATES,
        mechanism__reveal_competing_bids=True,
        mechanism__reveal_bid_distribution=True,
        mechanism__judge_pool_share=0.25,
        capacity__blocks=[8, 8],
    )
    state: dict = {"seed": SEED}

    def setup(env):
        plant_sentinels(env)
        check_all_seats(env, state)

    ep = run_episode(
        env,
        scripted_population(),
        seed=SEED,
        setup=setup,
        on_step=lambda env, record: check_all_seats(env, state),
    )
    return env, ep, state["seen"]


@pytest.fixture(scope="module")
def episode():
    return play()


def test_scripted_talk_happened(episode) -> None:
    """Positive controls: the secrets were really there to leak, and their owners see them."""
    env, ep, seen = episode
    assert not errors(ep)
    kinds = {s["info"].get("action") for s in ep.steps if "info" in s}
    assert {
        "form_coalition",
        "commit_to_coalition",
        "send_message",
        "send_offer",
        "counter_offer",
        "make_pitch",
        "counter_pitch",
        "bid",
    } <= kinds
    assert any(c.members == [0, 1] for c in env.coalitions.coalitions.values())
    texts = {(seat, m.text) for seat, _, obs in seen for m in obs.messages}
    for text, (sender, recipients) in PRIVATE_TEXTS.items():
        for lab in (sender, *recipients):
            assert (f"bidder_{lab}", text) in texts
    own = {seat: obs for seat, _, obs in seen if seat == "bidder_0"}
    assert f"{own['bidder_0'].budget:.2f}" in own["bidder_0"].to_prompt()
    pools = [
        c.pool
        for seat, _, obs in seen
        if seat in ("bidder_0", "bidder_1")
        for c in obs.coalitions or ()
        if c.pool is not None
    ]
    assert pools and max(pools) == pytest.approx(sum(CONTRIBUTIONS))
    assert any(
        j.job_id.startswith("job_SENTINEL_0_")
        for _, _, obs in seen
        if obs.seat == "bidder_0"
        for j in obs.jobs
    )
    assert any(obs.pitches for _, _, obs in seen)
    assert (
        sum(
            len(obs.offers_received or ())
            for seat, _, obs in seen
            if seat in ("bidder_2", "bidder_3")
        )
        > 0
    )


def test_no_observation_leaks_another_seats_secrets(episode) -> None:
    # The checks run inside the episode after every step (check_all_seats); here we only make sure
    # they covered every seat in every round.
    env, ep, seen = episode
    assert {(seat, r) for seat, r, _ in seen} >= {
        (s, r) for s in env.possible_agents for r in range(3)
    }


def test_designer_sees_no_private_lab_state(episode) -> None:
    env, ep, seen = episode
    designer = [obs for seat, _, obs in seen if seat == "designer_0"]
    assert designer
    for obs in designer:
        assert (
            obs.budget is None
            and obs.jobs is None
            and obs.coalitions is None
            and obs.offers_received is None
        )
        dumped = obs.model_dump_json()
        assert "job_SENTINEL" not in dumped
        assert all(c.pool is None for c in obs.public_coalitions)


def test_hidden_shocks_are_seen_only_by_their_target(episode) -> None:
    env, ep, seen = episode
    hidden_target = {"budget_cut": "bidder_1", "windfall": "bidder_2", "demand_surge": "bidder_3"}
    saw: dict[str, set[str]] = {
        kind: set() for kind in [*hidden_target, "capacity_outage", "reliability_drop"]
    }
    for seat, r, obs in seen:
        for s in obs.shocks:
            saw[s.kind].add(seat)
            assert s.round <= r  # nothing from the future
    for kind, target in hidden_target.items():
        assert saw[kind] == {target}, kind
    assert saw["capacity_outage"] == set(env.possible_agents)  # the public one reaches everyone
    assert not {
        s for s in saw["reliability_drop"] if s.startswith("bidder_")
    }  # hidden, targets no lab


@pytest.mark.parametrize("seed", [918273645, 827364591])
def test_random_play_with_random_mechanisms_leaks_nothing(seed: int) -> None:
    """random_valid labs (offers, coalitions, messages, pitches, allocations) under a random
    designer (every reveal flag combination) with shocks and an entrant: the same search."""
    env = market.raw_env("coalition_market")
    state: dict = {"seed": seed}

    def setup(env):
        plant_sentinels(env)
        check_all_seats(env, state)

    agents = population(env, default="random_valid", designer="random")
    ep = run_episode(
        env, agents, seed=seed, setup=setup, on_step=lambda env, record: check_all_seats(env, state)
    )
    kinds = {s["info"].get("action") for s in ep.steps if "info" in s}
    assert {"send_offer", "form_coalition", "send_message", "make_pitch", "bid"} <= kinds
    assert len(state["seen"]) > 100
