"""The market's OpenEnv server never answers 5xx: every operation of its OpenAPI schema with
schemathesis-generated requests, random JSON bodies (hypothesis) for the HTTP
``/reset`` and ``/step`` endpoints get a 2xx or a 4xx, and random messages over a WebSocket
session get an observation, state or error reply; the session (or, after a message that is not a
JSON object, the next one) still plays afterwards."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("openenv")

import httpx  # noqa: E402
import schemathesis  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from market.serve.openenv_app import OpenEnvServer  # noqa: E402

pytestmark = pytest.mark.slow  # property tests: about 15 s
SERVER = OpenEnvServer(max_sessions=4)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
RESET_VALUES = {
    "scenario": st.sampled_from(["single_trade", "market_round", "nope", "", "../x.toml"]) | JSON,
    "seat": st.sampled_from(["bidder_0", "bidder_1", "designer_0", "bidder_9"]) | JSON,
    "seed": st.integers(-5, 2**64) | JSON,
    "lineup": st.dictionaries(
        st.sampled_from(["bidder_0", "bidder_1", "designer_0", "x"]),
        st.sampled_from(["truthful", "random_valid", "llm:openai?model=m", "nope?x=1"]) | JSON,
        max_size=3,
    )
    | JSON,
    "overrides": st.dictionaries(
        st.sampled_from(["rounds", "negotiation_turns", "labs__count", "bogus"]),
        st.integers(-3, 4) | JSON,
        max_size=3,
    )
    | JSON,
    "episode_id": JSON,
}
RESET_BODY = st.fixed_dictionaries({}, optional=RESET_VALUES) | JSON
ACTION = st.fixed_dictionaries(
    {"action_type": st.sampled_from(["wait", "bid", "send_offer", "accept_offer", "fly"])},
    optional={"bids": JSON, "offer_id": JSON, "to": JSON, "blocks": JSON, "price": JSON},
)
STEP_BODY = (
    st.fixed_dictionaries({"action": st.fixed_dictionaries({"action": ACTION | JSON})}) | JSON
)
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module", autouse=True)
def server() -> Any:
    with SERVER:
        yield SERVER


def test_no_request_from_the_openapi_schema_gets_a_5xx() -> None:
    """Every operation OpenEnv's app publishes, with schemathesis-generated requests."""
    schema = schemathesis.openapi.from_url(f"{SERVER.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/reset", "/step", "/state", "/health"}
    for op in operations:

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case: Any) -> None:
            response = case.call(timeout=60)
            case.validate_response(response, checks=[not_a_server_error])
            assert response.status_code < 500, (case.path, response.text)

        run()


@FUZZ
@given(body=RESET_BODY)
def test_http_reset_never_answers_5xx(body: Any) -> None:
    reply = httpx.post(SERVER.url + "/reset", json=body, timeout=60)
    assert reply.status_code < 500, (body, reply.text)
    if reply.status_code >= 400:
        assert "detail" in reply.json()


@FUZZ
@given(body=STEP_BODY)
def test_http_step_never_answers_5xx(body: Any) -> None:
    reply = httpx.post(SERVER.url + "/step", json=body, timeout=60)
    assert reply.status_code < 500, (body, reply.text)


@settings(max_examples=40, deadline=None)
@given(
    messages=st.lists(
        st.fixed_dictionaries({"type": st.just("step"), "data": JSON})
        | st.fixed_dictionaries({"type": st.just("reset"), "data": JSON})
        | JSON,
        min_size=1,
        max_size=4,
    )
)
def test_websocket_sessions_survive_any_message(messages: list[Any]) -> None:
    """Every message gets an observation, a state or an error reply. A message that is JSON but
    not an object (``null``, a list) ends the session after its error reply (OpenEnv's server
    does so); the server itself serves the next session."""
    ws_url = SERVER.url.replace("http://", "ws://") + "/ws"
    ended = False
    with connect(ws_url) as ws:
        for message in messages:
            ws.send(json.dumps(message))
            reply = json.loads(ws.recv(timeout=60))
            assert reply["type"] in ("observation", "error", "state"), reply
            if reply["type"] == "error" and reply["data"]["code"] == "SESSION_ERROR":
                assert not isinstance(message, dict)
                ended = True
                break
        if not ended:
            play_one_step(ws)
    with connect(ws_url) as ws:
        play_one_step(ws)


def play_one_step(ws: Any) -> None:
    ws.send(json.dumps({"type": "reset", "data": {"scenario": "single_trade", "seed": 1}}))
    assert json.loads(ws.recv(timeout=60))["type"] == "observation"
    ws.send(json.dumps({"type": "step", "data": {"action": {"action_type": "wait"}}}))
    reply = json.loads(ws.recv(timeout=60))
    assert reply["type"] == "observation" and reply["data"]["observation"]["error"] is None
