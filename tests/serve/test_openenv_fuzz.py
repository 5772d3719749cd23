"""The market's OpenEnv server never answers 5xx: every operation of its OpenAPI schema with
schemathesis-generated requests, random JSON bodies (hypothesis; strings with lone surrogates,
deep nesting) for the HTTP ``/reset`` and ``/step`` endpoints get a 2xx or a 4xx, and random
frames over a WebSocket session (JSON messages right and wrong, binary frames, bad JSON, deep
nesting, near-limit sizes, unicode with lone surrogates) get exactly one observation, state or
error reply each: no frame ends a session (a frame over the size limit closes it with 1009, as
documented), the server logs no error, and afterwards an honest session's whole episode is its
local run, bit for bit."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("openenv")

import httpx  # noqa: E402
import schemathesis  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from agents.registry import make_agent  # noqa: E402
from market.environment.observations import Observation as SeatObservation  # noqa: E402
from market.run.rollout import run_episode  # noqa: E402
from market.serve.openenv_app import MAX_MESSAGE_BYTES, OpenEnvServer  # noqa: E402

pytestmark = pytest.mark.slow  # property tests: about 40 s
SERVER = OpenEnvServer(max_sessions=4)
#: text with lone surrogates (category Cs) among letters, digits, spaces and symbols
TEXT = st.text(max_size=20) | st.text(
    st.characters(codec=None, categories=["Cs", "Ll", "Nd", "Zs", "So"]), max_size=12
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
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


def post(path: str, text: str) -> httpx.Response:
    """POST JSON ``text`` (lone surrogates as ``\\udXXX`` escapes, as JSON.stringify writes
    them)."""
    return httpx.post(
        SERVER.url + path,
        content=text,
        headers={"content-type": "application/json"},
        timeout=60,
    )


@FUZZ
@given(body=RESET_BODY)
def test_http_reset_never_answers_5xx(body: Any) -> None:
    reply = post("/reset", json.dumps(body))
    assert reply.status_code < 500, (body, reply.text)
    if reply.status_code >= 400:
        assert "detail" in reply.json()


@FUZZ
@given(body=STEP_BODY.map(json.dumps) | st.integers(1, 3000).map(lambda d: "[" * d + "]" * d))
def test_http_step_never_answers_5xx(body: str) -> None:
    reply = post("/step", body)
    assert reply.status_code < 500, (body, reply.text)


# --- the WebSocket -----------------------------------------------------------------------------
class Errors(logging.Handler):
    """The server's log records at WARNING and above (a traceback is logged at ERROR)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


@pytest.fixture
def server_log() -> Iterator[Errors]:
    handler = Errors()
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "uvicorn.asgi")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


MESSAGE = st.fixed_dictionaries(
    {"type": st.sampled_from(["reset", "step", "state", "mcp", "nope", ""]) | JSON},
    optional={"data": JSON | st.fixed_dictionaries({}, optional=RESET_VALUES)},
) | st.fixed_dictionaries(
    {"type": st.just("step"), "data": st.fixed_dictionaries({"action": ACTION | JSON})}
)
FRAME = st.one_of(
    MESSAGE.map(json.dumps),  # right and wrong messages; surrogates as JSON escapes
    JSON.map(json.dumps),  # JSON that is not a message (null, lists, numbers)
    st.text(max_size=40),  # mostly not JSON
    st.binary(max_size=64),  # binary frames
    st.integers(1, 4000).map(lambda d: "[" * d + "]" * d),  # nesting, past json's own limit
    st.integers(1, 200).map(
        lambda d: '{"type": "step", "data": ' + '{"a": ' * d + "1" + "}" * (d + 1)
    ),
    st.integers(900_000, MAX_MESSAGE_BYTES - 100).map(  # near the size limit
        lambda n: json.dumps({"type": "step", "data": {"action": "x" * n}})
    ),
)


def reset(ws: Any, seed: int = 1) -> dict[str, Any]:
    ws.send(json.dumps({"type": "reset", "data": {"scenario": "single_trade", "seed": seed}}))
    return dict(json.loads(ws.recv(timeout=60)))


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(FRAME, min_size=1, max_size=5))
def test_websocket_frames_never_end_a_session(
    frames: list[str | bytes], server_log: Errors
) -> None:
    """Every frame gets exactly one reply (observation, state or error) and the session plays
    on: no frame of the fuzz ends it, and the server logs no error."""
    with connect(ws_url()) as ws:
        assert reset(ws)["type"] == "observation"
        for frame in frames:
            ws.send(frame)
            reply = json.loads(ws.recv(timeout=60))
            assert reply["type"] in ("observation", "error", "state"), reply
            if reply["type"] == "error":
                assert reply["data"]["code"] != "SESSION_ERROR", reply
                assert "\n" not in reply["data"]["message"]
        play_one_step(ws)
    assert not server_log.records, server_log.records


def test_a_frame_over_the_size_limit_closes_with_1009_as_documented() -> None:
    with connect(ws_url(), max_size=None) as ws:
        assert reset(ws)["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"action": "x" * MAX_MESSAGE_BYTES}}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=60)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    with connect(ws_url()) as ws:  # the server serves on
        play_one_step(ws)


def test_after_the_fuzz_an_honest_episode_is_its_local_run(server_log: Errors) -> None:
    policy = make_agent("truthful", "bidder")
    policy.reset(0)
    with connect(ws_url()) as ws:
        reply = reset(ws, seed=17)
        total = reply["data"]["reward"]
        while not reply["data"]["done"]:
            obs = SeatObservation.model_validate(reply["data"]["observation"]["observation"])
            action = policy.act(obs).model_dump(mode="json", exclude_none=True)
            ws.send(json.dumps({"type": "step", "data": {"action": action}}))
            reply = json.loads(ws.recv(timeout=60))
            total += reply["data"]["reward"]
    assert total == run_episode("single_trade", 17, {"bidder_0": "truthful"}).returns["bidder_0"]
    assert not server_log.records, server_log.records


def ws_url() -> str:
    return SERVER.url.replace("http://", "ws://") + "/ws"


def play_one_step(ws: Any) -> None:
    assert reset(ws)["type"] == "observation"
    ws.send(json.dumps({"type": "step", "data": {"action": {"action_type": "wait"}}}))
    reply = json.loads(ws.recv(timeout=60))
    assert reply["type"] == "observation" and reply["data"]["observation"]["error"] is None
