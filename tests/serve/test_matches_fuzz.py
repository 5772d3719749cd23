"""Fuzzing the served-matches API on the real server: every operation of its OpenAPI schema with
schemathesis-generated requests, and hypothesis-generated action bodies sent with a valid seat
token on an open turn. No request may get a 5xx; every refusal is a 4xx JSON ``{"error": ...}``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from match_support import auth, create, served
from schemathesis.checks import not_a_server_error

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("served-fuzz") / "transcripts"
    with served(out) as base:
        yield base


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


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
ACTION_KEYS = st.sampled_from(
    ["action_type", "bids", "to", "text", "price", "quantity", "offer_id", "agent", "job_id"]
)
ACTIONS = st.dictionaries(
    ACTION_KEYS | st.text(max_size=8),
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


def _match(base: str) -> dict[str, str]:
    if not _STATE:
        made = create(base, "market_round", 0, {"bidder_0": "remote"}, turn_deadline=600)
        _STATE.update(id=made["match_id"], token=made["tokens"]["bidder_0"])
    return _STATE
