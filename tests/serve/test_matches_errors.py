"""Every malformed or refused request to the real server gets a clear 4xx JSON error and
changes nothing: the seat's open turn, its observation and the match's progress stay as they were,
and the seat can still play its turn afterwards."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from match_support import auth, create, served, wait_done

from market.record.reader import read_transcript


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("served-errors") / "transcripts"
    with served(out) as base:
        yield base, out


def _open_turn(base: str, phase: str) -> tuple[str, str, dict[str, Any]]:
    """A fresh single_trade match with bidder_0 remote, played with waits up to its first turn
    in ``phase`` after its turn 0 (so that a stale turn exists)."""
    made = create(base, "single_trade", 4, {"bidder_0": "remote"}, turn_deadline=120)
    mid, token = made["match_id"], made["tokens"]["bidder_0"]
    while True:
        view = httpx.get(
            f"{base}/matches/{mid}/seat", headers=auth(token), params={"wait": 10}
        ).json()
        assert view["status"] == "your_turn"
        if view["observation"]["phase"] == phase and view["turn"] >= 1:
            return mid, token, view
        reply = httpx.post(
            f"{base}/matches/{mid}/seat/action",
            json={"turn": view["turn"], "action": {"action_type": "wait"}},
            headers=auth(token),
        )
        assert reply.status_code == 200


def _snapshot(base: str, mid: str, token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    seat = httpx.get(f"{base}/matches/{mid}/seat", headers=auth(token)).json()
    seat.pop("seconds_left", None)
    return seat, httpx.get(f"{base}/matches/{mid}").json()


def _post(base: str, mid: str, token: str, **kw: Any) -> httpx.Response:
    return httpx.post(f"{base}/matches/{mid}/seat/action", headers=auth(token), **kw)


BAD_ACTIONS: dict[str, tuple[int, Callable[[int], dict[str, Any]]]] = {
    "malformed JSON": (422, lambda turn: {"content": b'{"turn": 1, "action": {"action_ty'}),
    "not an object": (422, lambda turn: {"json": [1, 2]}),
    "unknown body field": (
        422,
        lambda turn: {"json": {"turn": turn, "action": {"action_type": "wait"}, "extra": 1}},
    ),
    "unknown action field": (
        422,
        lambda turn: {"json": {"turn": turn, "action": {"action_type": "wait", "pwn": True}}},
    ),
    "unknown action type": (
        422,
        lambda turn: {"json": {"turn": turn, "action": {"action_type": "steal"}}},
    ),
    "wrong phase (bid in negotiation)": (
        422,
        lambda turn: {"json": {"turn": turn, "action": {"action_type": "bid", "bids": [1.0]}}},
    ),
    "designer action for a bidder": (
        422,
        lambda turn: {"json": {"turn": turn, "action": {"action_type": "set_mechanism"}}},
    ),
    "addressed to another seat": (
        422,
        lambda turn: {
            "json": {"turn": turn, "action": {"action_type": "wait", "agent": "bidder_1"}}
        },
    ),
    "stale turn": (
        409,
        lambda turn: {"json": {"turn": turn - 1, "action": {"action_type": "wait"}}},
    ),
    "future turn": (
        409,
        lambda turn: {"json": {"turn": turn + 1, "action": {"action_type": "wait"}}},
    ),
    "negative turn": (422, lambda turn: {"json": {"turn": -1, "action": {"action_type": "wait"}}}),
    "missing turn": (422, lambda turn: {"json": {"action": {"action_type": "wait"}}}),
    "body too large": (
        413,
        lambda turn: {
            "json": {
                "turn": turn,
                "action": {"action_type": "send_message", "to": "bidder_1", "text": "x" * 70_000},
            }
        },
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ACTIONS))
def test_a_refused_action_changes_nothing(server: Any, case: str) -> None:
    base, out = server
    mid, token, view = _open_turn(base, "negotiation")
    before = _snapshot(base, mid, token)
    status, request = BAD_ACTIONS[case]
    reply = _post(base, mid, token, **request(view["turn"]))
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    assert isinstance(reply.json()["error"], str) and reply.json()["error"]
    assert _snapshot(base, mid, token) == before
    # the turn is still open and the seat can play it
    ok = _post(base, mid, token, json={"turn": view["turn"], "action": {"action_type": "wait"}})
    assert ok.status_code == 200


def test_a_replayed_action_is_refused(server: Any) -> None:
    base, out = server
    mid, token, view = _open_turn(base, "negotiation")
    body = {"turn": view["turn"], "action": {"action_type": "wait"}}
    assert _post(base, mid, token, json=body).status_code == 200
    nxt = httpx.get(f"{base}/matches/{mid}/seat", headers=auth(token), params={"wait": 10})
    before = _snapshot(base, mid, token)
    again = _post(base, mid, token, json=body)  # the same request sent twice
    assert again.status_code == 409 and "turn" in again.json()["error"]
    assert _snapshot(base, mid, token) == before
    assert nxt.json()["turn"] == view["turn"] + 1


def test_refused_requests_leave_the_transcript_as_a_clean_run(server: Any) -> None:
    """After refusals the match plays on and its transcript replays; no refused request
    appears in it."""
    base, out = server
    mid, token, view = _open_turn(base, "negotiation")
    for status, request in BAD_ACTIONS.values():
        assert _post(base, mid, token, **request(view["turn"])).status_code == status
    turn = view["turn"]
    while True:
        got = httpx.get(
            f"{base}/matches/{mid}/seat", headers=auth(token), params={"wait": 10}
        ).json()
        if got["status"] != "your_turn":
            break
        _post(base, mid, token, json={"turn": got["turn"], "action": {"action_type": "wait"}})
        turn = got["turn"]
    wait_done(base, mid)
    t = read_transcript(Path(out) / f"{mid}.jsonl")
    mine = [s for s in t.steps if s.seat == "bidder_0" and s.live]
    assert len(mine) == turn + 1
    assert all(s.agent_error is None and s.info.error is None for s in mine)


CREATE_CASES: dict[str, tuple[int, Any]] = {
    "unknown scenario": (422, {"scenario": "nope", "seats": {"bidder_0": "remote"}}),
    "a scenario path": (422, {"scenario": "../../etc/passwd", "seats": {"bidder_0": "remote"}}),
    "code on the server (py:)": (
        422,
        {"scenario": "single_trade", "seats": {"bidder_0": "remote", "bidder_1": "py:os:system"}},
    ),
    "an outgoing call (llm:)": (
        422,
        {
            "scenario": "single_trade",
            "seats": {"bidder_0": "remote", "bidder_1": "llm:openai?model=m"},
        },
    ),
    "an outgoing call (remote?url=)": (
        422,
        {
            "scenario": "single_trade",
            "seats": {"bidder_0": "remote", "bidder_1": "remote?url=http://10.0.0.1"},
        },
    ),
    "unknown seat": (422, {"scenario": "single_trade", "seats": {"bidder_9": "remote"}}),
    "no remote seat": (422, {"scenario": "single_trade", "seats": {"bidder_0": "truthful"}}),
    "a designer agent in a bidder seat": (
        422,
        {"scenario": "single_trade", "seats": {"bidder_0": "remote", "bidder_1": "fixed"}},
    ),
    "unknown field": (
        422,
        {"scenario": "single_trade", "seats": {"bidder_0": "remote"}, "admin": True},
    ),
    "negative seed": (
        422,
        {"scenario": "single_trade", "seed": -1, "seats": {"bidder_0": "remote"}},
    ),
    "zero deadline": (
        422,
        {"scenario": "single_trade", "seats": {"bidder_0": "remote"}, "turn_deadline": 0},
    ),
    "a long spec": (422, {"scenario": "single_trade", "seats": {"bidder_0": "r" * 301}}),
}


@pytest.mark.parametrize("case", sorted(CREATE_CASES))
def test_a_refused_match_is_not_created(server: Any, case: str) -> None:
    base, _ = server
    status, body = CREATE_CASES[case]
    before = httpx.get(f"{base}/healthz").json()["matches"]
    reply = httpx.post(f"{base}/matches", json=body)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]
    assert httpx.get(f"{base}/healthz").json()["matches"] == before


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("get", "/matches/0123456789abcdef", 404),
        ("get", "/matches/not-an-id", 422),
        ("get", "/matches/0123456789abcdef/seat", 404),
        ("get", "/matches/0123456789abcdef/transcript", 404),
        ("post", "/matches/0123456789abcdef/seat/action", 422),  # no body
        ("delete", "/matches", 405),
        ("get", "/nothing", 404),
    ],
)
def test_unknown_things_are_4xx_json(server: Any, method: str, path: str, status: int) -> None:
    base, _ = server
    reply = httpx.request(method.upper(), f"{base}{path}")
    assert reply.status_code == status
    assert reply.json()["error"]
