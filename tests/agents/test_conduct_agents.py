"""The dishonest population agents (agents/population/dishonest.py) against the pure conduct
judge (market/core/conduct): what ``liar`` says about itself is false by the judge's rules,
hand-checked against the seat's crafted truth, and every promise ``promise_breaker`` makes is
broken by what it then does."""

from __future__ import annotations

from typing import Any

import pytest
from support import craft, job, make_env

from agents.registry import REGISTRY, make_agent
from market.core.actions import (
    ActionModel,
    Bid,
    CommitToCoalition,
    FormCoalition,
    LeaveCoalition,
    MakePitch,
    SendMessage,
    Wait,
)
from market.core.conduct import (
    SeatRecord,
    SeatTruth,
    claims_from_action,
    judge_claim,
    judge_promise,
    promises_from_action,
)
from market.run.rollout import run_episode
from scenarios import load_scenario

ME = "bidder_0"


def _env(rounds: int = 3, turns: int = 2, **overrides: Any) -> Any:
    """bidder_0: budget 200, jobs of 4 blocks (value 120, due round 2) and 3 blocks (value 60,
    due round 1), none held: its live jobs need 7 blocks, earliest deadline round 1, biggest
    job 4 blocks, worth 180 in all. bidder_1: budget 500, no job. 4 blocks a round."""
    env = make_env(rounds=rounds, negotiation_turns=turns, **overrides)
    env.reset(seed=0)
    jobs = {0: [job(0, 4, 120.0, 2, "big"), job(0, 3, 60.0, 1, "small")]}
    craft(env, budgets=[200.0, 500.0], jobs=jobs, holdings={}, capacity=4)
    return env


def _truth(env: Any) -> SeatTruth:
    return SeatTruth.of(env.world.labs[0], int(env.world.holdings[0, env.round]))


def test_the_dishonest_agents_are_registered() -> None:
    for name in ("liar", "promise_breaker"):
        assert name in REGISTRY and make_agent(name, role="bidder").name == name


@pytest.mark.parametrize("seed", range(6))
def test_every_claim_the_liar_makes_is_false(seed: int) -> None:
    env = _env()
    liar = make_agent("liar")
    liar.reset(seed)
    action = liar.act(env.observe(ME))
    assert isinstance(action, SendMessage) and action.to == "all"
    claims = claims_from_action(ME, 0, action)
    got = {c.kind: c.value for c in claims}
    assert sorted(got) == ["budget", "deadline", "job_size", "need"]
    assert got["need"] in (9.0, 10.0, 11.0)  # 7 needed + 2, 3 or 4
    assert got["deadline"] == 0.0  # earliest deadline 1, claimed max(now, 1 - 1 - k') = 0
    assert got["job_size"] in (5.0, 6.0, 7.0)  # biggest job 4 + 1, 2 or 3
    assert 80.0 <= got["budget"] <= 120.0  # 40-60 % of 200
    verdicts = [judge_claim(c, _truth(env)) for c in claims]
    assert [v.label for v in verdicts] == ["false"] * 4, [v.reason for v in verdicts]
    # the rest of its turns are the rule expert's: it lies once per round
    assert not isinstance(liar.act(env.observe(ME)), SendMessage)


def test_the_liar_is_deterministic_given_its_seed() -> None:
    def texts(seed: int) -> list[str]:
        liar = make_agent("liar")
        out = []
        for r in range(3):
            liar.reset(seed)
            env = _env()
            obs = env.observe(ME).model_copy(update={"round": r})
            out.append(liar.act(obs).text)  # type: ignore[union-attr]
        return out

    assert texts(3) == texts(3)
    assert len({tuple(texts(s)) for s in range(8)}) > 1  # the seat seed moves the numbers


def test_the_liar_inflates_its_pitches() -> None:
    env = _env(mechanism__judge_pool_share=0.25)  # a judge pool of 1 block a round
    liar = make_agent("liar")
    liar.reset(0)
    obs = env.observe(ME)
    assert isinstance(liar.act(obs), SendMessage)  # first turn: the lie
    # then the rule expert's rules, one per turn: a job kept off the blocks, then the pitch
    turns = [liar.act(obs) for _ in range(3)]
    pitch = next(a for a in turns if isinstance(a, MakePitch))
    assert pitch.claimed_blocks is not None and pitch.claimed_blocks >= 9
    assert pitch.claimed_deadline == 0
    assert pitch.claimed_value == pytest.approx(1.5 * 180.0 + 10.0)
    verdicts = [judge_claim(c, _truth(env)) for c in claims_from_action(ME, 0, pitch)]
    labels = [(v.subject.kind, v.subject.source, v.label) for v in verdicts]
    # blocks_requested is the expert's own true request; every inflated field and the text lie
    assert labels[0] == ("need", "action", "true")
    assert all(label == "false" for _, _, label in labels[1:]) and len(labels) >= 5, labels


def _play(env: Any, agent: Any, others: dict[str, Any]) -> list[tuple[int, ActionModel]]:
    """Play the whole episode with ``agent`` in bidder_0; return its (round, action) list and
    check that the market took every action it made."""
    agent.reset(0)
    mine: list[tuple[int, ActionModel]] = []
    for seat in env.agent_iter():
        _, _, done, trunc, info = env.last()
        if seat == ME and mine:
            assert "error" not in info, (mine[-1], info)
        if done or trunc:
            env.step(None)
            continue
        obs = env.observe(seat)
        if seat == ME:
            action = agent.act(obs)
            mine.append((env.round, action))
        else:
            other = others.get(seat)
            action = other.act(obs) if other is not None else Wait()
        env.step(action)
    return mine


def test_the_promise_breaker_breaks_its_messages_and_its_coalitions() -> None:
    """Round 0: it messages bidder_1 that it will deliver 2 blocks and not bid above half its
    top value; then it bids that value. Round 1 (it now knows a round has 2 negotiation turns):
    it forms a coalition promising to stay until round 2 (term 2: the episode ends then), and
    leaves it next turn."""
    env = _env(rounds=3, turns=2)
    mine = _play(env, make_agent("promise_breaker"), {})
    said = {r: a for r, a in mine if isinstance(a, SendMessage | FormCoalition)}
    assert isinstance(said[0], SendMessage) and said[0].to == "bidder_1"
    assert isinstance(said[1], FormCoalition) and said[1].term_rounds == 2
    left = [r for r, a in mine if isinstance(a, LeaveCoalition)]
    assert 1 in left
    record = SeatRecord(actions=tuple(mine))
    forms = [
        (r, a) for r, a in mine if isinstance(a, FormCoalition)
    ]  # the market names them c0, c1
    promises = [
        p
        for r, a in mine
        if not isinstance(a, FormCoalition)
        for p in promises_from_action(ME, r, a)
    ]
    promises += [
        p for n, (r, a) in enumerate(forms) for p in promises_from_action(ME, r, a, f"c{n}")
    ]
    kinds = sorted((p.round, p.kind, p.source) for p in promises)
    assert (0, "deliver", "message") in kinds and (0, "not_bid", "message") in kinds
    assert (1, "stay", "action") in kinds and (1, "stay", "coalition") in kinds
    bids = {r: max(a.bids) for r, a in mine if isinstance(a, Bid) and a.bids}
    limit = next(p.amount for p in promises if p.kind == "not_bid" and p.round == 0)
    assert limit is not None and bids[0] > limit  # it bid above what it promised not to
    verdicts = [judge_promise(p, record, now=3) for p in promises]
    assert {v.label for v in verdicts} == {"broken"}, [
        (v.subject, v.reason) for v in verdicts if v.label != "broken"
    ]


class _Inviter:
    """bidder_1: invites bidder_0 to a 3-round coalition in its first turn of every round."""

    def __init__(self) -> None:
        self.asked: set[int] = set()

    def act(self, obs: Any) -> ActionModel:
        if obs.phase == "negotiation" and obs.round not in self.asked:
            self.asked.add(obs.round)
            return FormCoalition(members=[ME], contribution=10.0, term_rounds=3)
        return Wait()


def test_the_promise_breaker_joins_only_to_leave() -> None:
    """With four negotiation turns, from round 1 on: turn 0 it forms its own coalition (bidder_1
    invites it after that), turn 1 it leaves its own, turn 2 it commits to the invitation and
    turn 3 it leaves that one too, before the term ends: each stay promise breaks at once."""
    env = _env(rounds=3, turns=4)
    mine = _play(env, make_agent("promise_breaker"), {"bidder_1": _Inviter()})
    joined = [(r, a) for r, a in mine if isinstance(a, CommitToCoalition)]
    assert joined and all(r >= 1 for r, _ in joined)  # not in round 0: it did not know the turns
    record = SeatRecord(actions=tuple(mine))
    for r, a in joined:
        (stay,) = promises_from_action(ME, r, a)
        assert judge_promise(stay, record, now=r).label == "broken"
    left = {a.coalition_id for _, a in mine if isinstance(a, LeaveCoalition)}
    assert {a.coalition_id for _, a in joined} <= left


@pytest.mark.parametrize("scenario", ["single_trade", "market_round", "coalition_market"])
def test_the_dishonest_agents_act_validly_and_deterministically(scenario: str) -> None:
    """Every seat a liar, every seat a promise breaker, or the two alternating: the market takes
    every action they make, and a seed replays bit for bit."""
    sc = load_scenario(scenario)
    seats = [f"bidder_{i}" for i in range(sc.n_seats)]
    casts = [
        dict.fromkeys(seats, "liar"),
        dict.fromkeys(seats, "promise_breaker"),
        {s: ("liar", "promise_breaker")[i % 2] for i, s in enumerate(seats)},
    ]
    for seed in range(2):
        for cast in casts:
            res = run_episode(scenario, seed, cast)
            assert sum(res.invalid_actions.values()) == 0, (seed, cast, res.invalid_actions)
            assert not any(res.agent_errors.values()), (seed, cast, res.first_error)
    again = run_episode(scenario, 1, casts[2]), run_episode(scenario, 1, casts[2])
    assert again[0].returns == again[1].returns and again[0].round_log == again[1].round_log
