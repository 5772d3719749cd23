"""The market's audit (market/core/audit.py): at a round's close, each claim the conduct judge
found false and each promise in words it decided broken costs the speaker public reputation;
what the market already charged (a pitch the committee charged, a breach, an exit) is not
charged twice."""

from __future__ import annotations

from typing import Any

import pytest
from support import craft, job, make_env

from market.core.actions import Bid, SendMessage, Wait
from market.core.audit import AuditCharge, audit_charges
from market.core.penalties import BROKEN_PROMISE_REPUTATION_LOSS, FALSE_CLAIM_REPUTATION_LOSS


def test_the_documented_losses() -> None:
    assert FALSE_CLAIM_REPUTATION_LOSS == 0.05
    assert BROKEN_PROMISE_REPUTATION_LOSS == 0.05


def _play_round(env: Any, said: dict[str, str], bids: dict[str, list[float]]) -> None:
    """Round 0: each seat's first negotiation turn says ``said[seat]`` (to everyone), later
    turns wait; each seat bids ``bids[seat]`` (none by default)."""
    spoke: set[str] = set()
    while env.round == 0 and env.agents:
        seat = env.agent_selection
        if env.phase == "negotiation":
            if seat in said and seat not in spoke:
                spoke.add(seat)
                env.step(SendMessage(to="all", text=said[seat]))
            else:
                env.step(Wait())
        elif env.phase == "bidding":
            env.step(Bid(bids=bids.get(seat, [])))
        else:
            env.step(Wait())


def _env() -> Any:
    env = make_env(rounds=2, negotiation_turns=2, labs__count=3)
    env.reset(seed=0)
    jobs = {0: [job(0, 2, 20.0, 1, "a")], 1: [job(1, 2, 20.0, 1, "b")], 2: [job(2, 2, 20.0, 1)]}
    craft(
        env, budgets=[100.0] * 3, jobs=jobs, capacity=4, reputations=[0.6, 0.7, 0.8]
    )  # each lab's live jobs need 2 blocks
    return env


def test_a_liar_loses_reputation_at_the_close_and_an_honest_seat_does_not() -> None:
    env = _env()
    said = {
        "bidder_0": "We need 9 more blocks.",  # false: its jobs need 2
        "bidder_1": "We need 2 more blocks.",  # true
        "bidder_2": "We won't bid above 3.",  # a promise it breaks below
    }
    _play_round(env, said, {"bidder_2": [5.0]})
    reps = [lab.reputation for lab in env.world.labs]
    assert reps == pytest.approx([0.6 - 0.05, 0.7, 0.8 - 0.05])
    assert env.conduct.take_audit() == []  # the close took the round's verdicts


def test_the_observations_show_the_fall_and_nothing_else() -> None:
    env = _env()
    _play_round(env, {"bidder_0": "We need 9 more blocks."}, {})
    obs = env.observe("bidder_1")
    assert obs.reputations["bidder_0"] == pytest.approx(0.55)
    text = obs.model_dump_json()
    assert "live jobs need" not in text and "claimed" not in text  # no verdict, no truth


def _claim(seat: str, source: str, label: str = "false", span: str = "x") -> dict[str, Any]:
    return {"kind": "claim", "seat": seat, "source": source, "label": label, "span": span}


def _promise(seat: str, source: str, kind: str, label: str = "broken") -> dict[str, Any]:
    return {"kind": "promise", "seat": seat, "source": source, "promise": kind, "label": label}


def test_every_source_counts_once_per_claim() -> None:
    entries = [
        _claim("bidder_1", "message"),
        _claim("bidder_1", "offer"),
        _claim("bidder_1", "coalition"),
        _claim("bidder_1", "pitch"),
        _claim("bidder_1", "action", span="make_pitch"),
        _claim("bidder_1", "message", label="true"),
        _claim("designer_0", "message"),  # not a lab
    ]
    [charge] = audit_charges(entries, committee_charged=set())
    assert charge == AuditCharge(1, 5, 0, pytest.approx(0.25))


def test_a_pitch_the_committee_charged_is_not_charged_again() -> None:
    entries = [
        _claim("bidder_1", "pitch"),
        _claim("bidder_1", "action", span="make_pitch"),
        _claim("bidder_1", "message"),
    ]
    [charge] = audit_charges(entries, committee_charged={1})
    assert (charge.false_claims, charge.loss) == (1, pytest.approx(0.05))


def test_breaches_and_exits_the_market_charged_are_not_charged_again() -> None:
    entries = [
        _promise("bidder_2", "action", "deliver"),  # a contract delivered short: a breach
        _promise("bidder_2", "offer", "deliver"),  # the offer's note said the same
        _promise("bidder_2", "action", "stay"),  # left a coalition: an exit
        _promise("bidder_2", "coalition", "stay"),  # its purpose said it would stay
        _promise("bidder_2", "message", "not_bid"),  # a promise in words alone
        _promise("bidder_2", "message", "bid", label="kept"),
        _promise("bidder_3", "message", "deliver"),  # no breach of bidder_3's: charged
    ]
    charges = audit_charges(entries, committee_charged=set())
    assert [(c.lab, c.false_claims, c.broken_promises) for c in charges] == [(2, 0, 1), (3, 0, 1)]
    assert [c.loss for c in charges] == pytest.approx([0.05, 0.05])


class _DeafReader:
    """A conduct reader that reads nothing in any text."""

    name = "deaf"

    def read(self, *args: Any) -> Any:
        from market.core.conduct.reading import TextReading

        return TextReading()


def test_rejudging_with_another_reader_replays_the_audited_market(tmp_path: Any) -> None:
    from market.review.replay import replay
    from market.run.rollout import run_episode

    path = tmp_path / "liar.jsonl"
    run_episode("market_round", 0, {"bidder_0": "liar"}, transcript=str(path))
    same = replay(path)
    deaf = replay(path, conduct_reader=_DeafReader())
    assert same.ok and deaf.ok, (same.mismatch, deaf.mismatch)  # the market is the one played
    assert same.conduct_scores["bidder_0"]["claims_false"] > 0
    assert "bidder_0" not in deaf.conduct_scores  # the deaf reader found nothing to judge
