"""Fuzzing the served-matches API on the real server: every operation of its OpenAPI schema with
schemathesis-generated requests, hypothesis-generated action bodies (lone surrogates among their
text) sent with a valid seat token on an open turn, and generated match creations (seeds from none
to 2**128-1) that are then played, left or cancelled. No request may get a 5xx; every refusal is a
4xx JSON ``{"error": ...}``; and once the server has stopped, every match the fuzz created
replays exactly from its transcript."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from match_support import auth, create, served
from schemathesis.checks import not_a_server_error

from agents.registry import make_agent
from market.environment import Observation
from market.record.reader import read_transcript
from market.review.replay import replay

pytestmark = pytest.mark.slow


class Server:
    """The module's server; the last test stops it to replay what the fuzz left."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._running = served(out)
        self.base = self._running.__enter__()

    def stop(self) -> None:
        if self._running is not None:
            running, self._running = self._running, None
            running.__exit__(None, None, None)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    held = Server(tmp_path_factory.mktemp("served-fuzz") / "transcripts")
    try:
        yield held
    finally:
        held.stop()


@pytest.fixture
def server(fuzzed: Server) -> str:
    return fuzzed.base


def test_no_request_from_the_schema_gets_a_5xx(server: str) -> None:
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/matches", "/matches/{match_id}/seat/action"}
    for op in operations:

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case: Any) -> None:
            response = case.call(timeout=60)
            case.validate_response(response, checks=[not_a_server_error])
            assert response.status_code < 500, (case.path, response.text)
            if response.status_code >= 400:
                assert isinstance(response.json()["error"], str)

        run()


# text with lone surrogates too (json.dumps writes them as \\ud800 escapes)
TEXT = st.text(max_size=20) | st.text(
    st.characters(codec=None, categories=None, exclude_categories=()), max_size=6
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
ACTION_KEYS = st.sampled_from(
    ["action_type", "bids", "to", "text", "price", "quantity", "offer_id", "agent", "job_id"]
)
ACTIONS = st.dictionaries(
    ACTION_KEYS | TEXT,
    JSON | st.sampled_from(["wait", "bid", "send_offer", "send_message", "finish", "bidder_1"]),
    max_size=5,
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(action=ACTIONS, turn_shift=st.integers(-2, 2))
def test_fuzzed_actions_on_an_open_turn_get_no_5xx(
    server: str, action: dict[str, Any], turn_shift: int
) -> None:
    state = _match(server)
    url = f"{server}/matches/{state['id']}/seat"
    view = httpx.get(url, headers=auth(state["token"]), params={"wait": 10}).json()
    if view["status"] != "your_turn":  # the match ended: start another
        state.clear()
        return
    body = {"turn": view["turn"] + turn_shift, "action": action}
    reply = httpx.post(  # NaN and Infinity sent as Python writes them (not valid JSON)
        f"{url}/action",
        content=json.dumps(body),
        headers={**auth(state["token"]), "content-type": "application/json"},
    )
    assert reply.status_code in (200, 409, 422), reply.text
    if reply.status_code != 200:
        assert isinstance(reply.json()["error"], str)


_STATE: dict[str, str] = {}
#: the ids of the matches the fuzz created (each must replay once the server has stopped)
CREATED: list[str] = []


def _match(base: str) -> dict[str, str]:
    if not _STATE:
        made = create(base, "market_round", 0, {"bidder_0": "remote"}, turn_deadline=600)
        _STATE.update(id=made["match_id"], token=made["tokens"]["bidder_0"])
        CREATED.append(made["match_id"])
    return _STATE


JSON_TYPE = {"content-type": "application/json"}
# mostly matches that can be created (so that the fuzz plays and replays them), some that cannot
GOOD_SEATS = st.dictionaries(
    st.sampled_from(["bidder_1", "bidder_2"]),
    st.sampled_from(["remote", "truthful", "random_valid"]),
    max_size=2,
).map(lambda extra: {"bidder_0": "remote", **extra})
BAD_SEATS = st.dictionaries(
    st.sampled_from(["designer_0", "bidder_0", "bidder_9", "\ud800"]),
    st.sampled_from(["remote", "fixed", "py:os:system", "llm:openai?model=m", "remote?url=x"]),
    max_size=3,
)
CREATES = st.fixed_dictionaries(
    {
        "scenario": st.sampled_from(["single_trade", "market_round", "coalition_market", "nope"]),
        "seats": GOOD_SEATS | GOOD_SEATS | BAD_SEATS,
    },
    optional={
        "seed": st.none() | st.integers(0, 2**128 - 1) | st.sampled_from([2**128, -1, 1.5]),
        "turn_deadline": st.sampled_from([0.01, 0.05, 5.0, 600.0]) | st.sampled_from([0, -1, 1e9]),
        "digest_every": st.integers(1, 20) | st.sampled_from([0, 1001]),
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=CREATES, moves=st.integers(0, 4), cancel=st.booleans())
def test_fuzzed_matches_are_created_played_and_cancelled_without_a_5xx(
    server: str, body: dict[str, Any], moves: int, cancel: bool
) -> None:
    made = httpx.post(f"{server}/matches", content=json.dumps(body), headers=JSON_TYPE)
    assert made.status_code in (201, 422, 429), made.text
    if made.status_code != 201:
        assert isinstance(made.json()["error"], str)
        return
    answer = made.json()
    CREATED.append(answer["match_id"])
    url = f"{server}/matches/{answer['match_id']}"
    rng = random.Random(moves)
    for token in answer["tokens"].values():
        agent = make_agent("random_valid")
        for _ in range(moves):
            view = httpx.get(f"{url}/seat", headers=auth(token), params={"wait": 0.2}).json()
            if view["status"] != "your_turn":
                break
            agent.reset(view["seat_seed"] + view["turn"])
            if rng.random() < 0.7:  # a legal action, or a bare action type (often refused)
                obs = Observation.model_validate(view["observation"])
                action = agent.act(obs).model_dump(mode="json")
            else:
                action = {"action_type": rng.choice(view["legal_actions"])}
            reply = httpx.post(
                f"{url}/seat/action",
                json={"turn": view["turn"], "action": action},
                headers=auth(token),
            )
            assert reply.status_code in (200, 409, 422), reply.text
    if cancel or body.get("turn_deadline", 30.0) > 1:  # leave room under the per-client limit
        gone = httpx.delete(url, headers=auth(answer["owner_token"]))
        assert gone.status_code in (200, 409), gone.text


def test_every_match_the_fuzz_created_replays_exactly(fuzzed: Server) -> None:
    """Runs last: stops the server (every running match ends with the aborted footer), then
    replays every transcript the fuzz left."""
    seedless = {"scenario": "single_trade", "seats": {"bidder_0": "remote"}, "turn_deadline": 0.01}
    made = httpx.post(f"{fuzzed.base}/matches", json=seedless)
    assert made.status_code == 201
    CREATED.append(made.json()["match_id"])
    fuzzed.stop()
    paths = sorted(fuzzed.out.glob("*.jsonl"))
    assert {p.stem for p in paths} >= set(CREATED)
    for path in paths:
        t = read_transcript(path)
        assert t.footer is not None, path  # complete, or aborted by the stop
        report = replay(path, partial=not t.complete)
        assert report.ok, (path, report.mismatch)
        assert report.steps_checked == len(t.steps)
