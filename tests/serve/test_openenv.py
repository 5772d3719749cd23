"""The market's OpenEnv server, tested through the real server (uvicorn on a free 127.0.0.1 port)
and the real client (OpenEnv's WebSocket ``EnvClient`` under ``MarketEnvClient``):

* a whole episode played through the server by a scripted learner returns, bit for bit, the
  learner seat's return (and its reward components) of the same episode run locally by
  ``market.run.rollout.run_episode`` with the same scenario, seed and line-up;
* two sessions played at the same time on one server, with different seeds, each match their own
  local run (isolation);
* a rejected action changes nothing but the documented penalty: the session that sent it sees
  exactly the observation of a twin session that sent ``wait``, and a reward lower by exactly
  ``invalid_action_penalty``; a malformed message is refused with a clear error and changes
  nothing at all; bad reset options get a one-line reason (and a 400 over HTTP);
* no observation or state shows another lab's private state or the seed.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv")

import httpx  # noqa: E402
from match_support import without_feedback  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from agents.registry import make_agent  # noqa: E402
from market.environment.aec import raw_env  # noqa: E402
from market.run.rollout import run_episode  # noqa: E402
from market.serve.openenv_app import MAX_MESSAGE_BYTES, OpenEnvServer  # noqa: E402
from market.serve.openenv_client import MarketEnvClient  # noqa: E402
from market.serve.openenv_env import MarketAction, MarketEnvironment  # noqa: E402
from scenarios import load_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SECRET_SEED = 918273645


@pytest.fixture(scope="module")
def server() -> Any:
    with OpenEnvServer(max_sessions=4) as srv:
        yield srv


def play(env: Any, policy_spec: str, **reset: Any) -> dict[str, Any]:
    """One whole episode through a sync client with a scripted learner; what the client saw."""
    policy = make_agent(
        policy_spec, "designer" if reset["seat"].startswith("designer") else "bidder"
    )
    policy.reset(0)
    result = env.reset(**reset)
    rewards = [result.reward]
    components: dict[str, float] = defaultdict(float)
    seen = [result.observation]
    while not result.done:
        action = policy.act(result.observation.seat_observation())
        result = env.step(action)
        assert result.observation.error is None, result.observation.error
        rewards.append(result.reward)
        seen.append(result.observation)
    total = 0.0
    for r in rewards:  # in turn order, as the local tally adds them
        total += r
    for obs in seen:
        for name, value in obs.reward_components.items():
            components[name] += value
    return {"return": total, "components": dict(components), "seen": seen, "steps": len(rewards)}


@pytest.mark.parametrize(
    ("scenario", "seed", "learner", "lineup"),
    [
        ("single_trade", 3, "truthful", {}),
        ("single_trade", 11, "truthful", {"bidder_1": "rule_expert"}),
        ("market_round", 5, "rule_expert", {"bidder_1": "truthful", "bidder_2": "shader"}),
    ],
)
def test_a_whole_episode_returns_what_a_local_run_returns(
    server: OpenEnvServer, scenario: str, seed: int, learner: str, lineup: dict[str, str]
) -> None:
    with MarketEnvClient(base_url=server.url).sync() as env:
        got = play(env, learner, scenario=scenario, seat="bidder_0", seed=seed, lineup=lineup)
        state = env.state()
    local = run_episode(scenario, seed, {"bidder_0": learner, **lineup})
    assert got["return"] == local.returns["bidder_0"]  # bit for bit
    assert got["seen"][-1].episode_return == local.returns["bidder_0"]
    assert local.returns["bidder_0"] != 0.0  # the episode paid something to compare
    assert set(got["components"]) == set(local.components["bidder_0"])
    for name, value in local.components["bidder_0"].items():
        assert math.isclose(got["components"][name], value, rel_tol=1e-12, abs_tol=1e-12)
    assert got["steps"] - 1 == local.decisions["bidder_0"]  # one step per decision
    assert state.done and state.scenario == scenario and state.seat == "bidder_0"
    assert state.step_count == local.decisions["bidder_0"]
    assert state.lineup == {s: v for s, v in local.seats.items() if s != "bidder_0"}
    assert state.degraded == {}  # no server seat failed


def test_scenario_overrides_shape_the_episode(server: OpenEnvServer) -> None:
    overrides = {"rounds": 1, "negotiation_turns": 1}
    with MarketEnvClient(base_url=server.url).sync() as env:
        got = play(
            env, "truthful", scenario="single_trade", seat="bidder_0", seed=6, overrides=overrides
        )
        state = env.state()
    local = run_episode(load_scenario("single_trade", **overrides), 6, {"bidder_0": "truthful"})
    assert got["return"] == local.returns["bidder_0"]
    assert got["steps"] - 1 == local.decisions["bidder_0"] == 2  # one negotiation turn, a bid
    assert state.overrides == overrides and state.round == 0


class Broken:
    """A server-side seat whose agent raises at every decision."""

    name = "broken"

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, observation: Any) -> Any:
        raise RuntimeError("broken on purpose")


def test_failing_server_seats_are_counted_in_the_state(monkeypatch: pytest.MonkeyPatch) -> None:
    import agents.registry

    real = agents.registry.make_agent
    monkeypatch.setattr(
        "market.run.rollout.make_agent",
        lambda spec, role: (
            Broken() if spec == "truthful" and role == "bidder" else real(spec, role)
        ),
    )
    env = MarketEnvironment()
    obs = env.reset(
        scenario="single_trade", seat="bidder_0", seed=1, lineup={"bidder_1": "truthful"}
    )
    while not obs.done:
        obs = env.step(MarketAction(action={"action_type": "wait"}))
    degraded = env.state.degraded
    assert set(degraded) == {"bidder_1"} and degraded["bidder_1"]["errors"] > 0
    assert degraded["bidder_1"]["timeouts"] == 0


def test_the_designer_seat_can_learn_too(server: OpenEnvServer) -> None:
    with MarketEnvClient(base_url=server.url).sync() as env:
        got = play(env, "fixed", scenario="market_round", seat="designer_0", seed=2)
    local = run_episode("market_round", 2, {"designer_0": "fixed"})
    assert got["return"] == local.returns["designer_0"] != 0.0


def test_concurrent_sessions_with_different_seeds_are_isolated(server: OpenEnvServer) -> None:
    async def episode(seed: int) -> tuple[float, list[str]]:
        policy = make_agent("truthful", "bidder")
        policy.reset(0)
        async with MarketEnvClient(base_url=server.url) as env:
            result = await env.reset(scenario="market_round", seat="bidder_0", seed=seed)
            total, prompts = result.reward, [result.observation.prompt]
            while not result.done:
                result = await env.step(policy.act(result.observation.seat_observation()))
                total += result.reward
                prompts.append(result.observation.prompt)
                await asyncio.sleep(0)  # let the other session take its turn
        return total, prompts

    async def both() -> list[tuple[float, list[str]]]:
        return list(await asyncio.gather(episode(21), episode(22)))

    (a, prompts_a), (b, prompts_b) = asyncio.run(both())
    assert a == run_episode("market_round", 21, {"bidder_0": "truthful"}).returns["bidder_0"]
    assert b == run_episode("market_round", 22, {"bidder_0": "truthful"}).returns["bidder_0"]
    assert prompts_a[0] != prompts_b[0]  # different worlds, each session its own


def test_sessions_beyond_the_limit_are_refused() -> None:
    with OpenEnvServer(max_sessions=1) as srv, MarketEnvClient(base_url=srv.url).sync() as first:
        first.reset(scenario="single_trade", seat="bidder_0", seed=0)
        with (
            pytest.raises(Exception, match="CAPACITY_REACHED"),
            MarketEnvClient(base_url=srv.url).sync() as second,
        ):
            second.reset(scenario="single_trade", seat="bidder_0", seed=0)
        assert first.step({"action_type": "wait"}).observation.error is None  # unharmed


def _twins(url: str) -> tuple[Any, Any]:
    a, b = MarketEnvClient(base_url=url).sync(), MarketEnvClient(base_url=url).sync()
    a.connect()
    b.connect()
    for env in (a, b):
        env.reset(scenario="single_trade", seat="bidder_0", seed=4)
    return a, b


@pytest.mark.parametrize(
    "bad",
    [
        {"action_type": "bid", "bids": [5.0]},  # not legal in negotiation
        {"action_type": "fly"},
        {"action_type": "accept_offer", "offer_id": "no-such-offer"},
        "{not json",
        {"action_type": "send_offer", "to": "bidder_1", "blocks": -3, "price": 1.0},
    ],
)
def test_a_rejected_action_costs_the_penalty_and_changes_nothing_else(
    server: OpenEnvServer, bad: Any
) -> None:
    penalty = load_scenario("single_trade").rewards.invalid_action_penalty
    a, b = _twins(server.url)
    try:
        ra = a.step(MarketAction(action=bad))
        rb = b.step({"action_type": "wait"})
        assert ra.observation.error and "\n" not in ra.observation.error
        assert rb.observation.error is None
        assert ra.reward == rb.reward - penalty
        assert ra.observation.reward_components == {"invalid_action": -penalty}
        # the same market; only the seat's feedback on its own last action differs
        assert without_feedback(ra.observation.observation) == without_feedback(
            rb.observation.observation
        )
        assert ra.observation.observation["last_action"]["accepted"] is False
        assert rb.observation.observation["last_action"]["accepted"] is True
        assert a.state().invalid_actions == 1 and b.state().invalid_actions == 0
    finally:
        a.close()
        b.close()


def test_rejected_action_errors_say_what_to_send(server: OpenEnvServer) -> None:
    with MarketEnvClient(base_url=server.url).sync() as env:
        env.reset(scenario="single_trade", seat="bidder_0", seed=4)
        assert "unknown action_type" in env.step({"action_type": "fly"}).observation.error
        assert "not valid JSON" in env.step(MarketAction(action="{oops")).observation.error


def test_malformed_messages_are_refused_and_change_nothing(server: OpenEnvServer) -> None:
    ws_url = server.url.replace("http://", "ws://") + "/ws"
    with connect(ws_url) as ws, connect(ws_url) as twin:

        def ask(sock: Any, message: Any) -> dict[str, Any]:
            sock.send(message if isinstance(message, str) else json.dumps(message))
            return json.loads(sock.recv(timeout=30))

        reset = {"type": "reset", "data": {"scenario": "single_trade", "seed": 8}}
        assert ask(ws, reset)["type"] == ask(twin, reset)["type"] == "observation"
        for message, code in [
            ("{not json", "INVALID_JSON"),
            (
                {"type": "step", "data": {"action": {"action_type": "wait"}, "bogus": 1}},
                "VALIDATION_ERROR",
            ),
            ({"type": "step", "data": {}}, "VALIDATION_ERROR"),
            ({"type": "step", "data": {"action": 42}}, "VALIDATION_ERROR"),
            ({"type": "teleport"}, "UNKNOWN_TYPE"),
        ]:
            reply = ask(ws, message)
            assert reply["type"] == "error" and reply["data"]["code"] == code, reply
        wait = {"type": "step", "data": {"action": {"action_type": "wait"}}}
        after, twin_after = ask(ws, wait), ask(twin, wait)
        assert after == twin_after  # the refused messages left the session as it was
        assert ask(ws, {"type": "state"})["data"]["step_count"] == 1


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"scenario": "nope"}, "not a built-in scenario name"),
        ({"scenario": "/etc/passwd"}, "not a built-in scenario name"),
        ({"overrides": {"labs__count": 5000}}, "labs.count = 5000 is above"),
        ({"seat": "bidder_9"}, "not a seat of 'market_round'"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"colour": "red"}, "unknown reset option(s) 'colour'"),
        ({"lineup": {"bidder_0": "truthful"}}, "names the learner's seat"),
        ({"lineup": {"bidder_1": "no_such_agent"}}, "lineup['bidder_1']"),
        ({"lineup": {"bidder_1": "llm:openai?model=m"}}, "not allowed from the network"),
        ({"lineup": ["truthful"]}, "lineup must be an object"),
        ({"overrides": {"rounds": -1}}, "rounds"),
        ({"overrides": {"no_such_key": 1}}, "no_such_key"),
        ({"overrides": [1]}, "overrides must be an object"),
    ],
)
def test_bad_reset_options_get_a_one_line_reason(
    server: OpenEnvServer, options: dict[str, Any], reason: str
) -> None:
    with MarketEnvClient(base_url=server.url).sync() as env:
        with pytest.raises(RuntimeError) as err:
            env.reset(**options)
        assert reason in str(err.value) and "\n" not in str(err.value)
        assert env.reset(scenario="single_trade", seed=0).observation.seat == "bidder_0"
    reply = httpx.post(server.url + "/reset", json=options, timeout=30)
    if "seed" in options:  # OpenEnv's own request model checks the seed first
        assert reply.status_code == 422
    else:
        assert reply.status_code == 400 and reason in reply.json()["detail"]


def test_an_oversized_http_body_is_refused_before_it_is_read(server: OpenEnvServer) -> None:
    big = {"scenario": "single_trade", "pad": "x" * MAX_MESSAGE_BYTES}
    reply = httpx.post(server.url + "/reset", json=big, timeout=30)
    assert reply.status_code == 413 and "too large" in reply.json()["error"]
    assert httpx.get(server.url + "/health").json()["status"] == "healthy"


def test_http_step_without_a_session_says_to_use_the_websocket(server: OpenEnvServer) -> None:
    reply = httpx.post(server.url + "/step", json={"action": {"action": {"action_type": "wait"}}})
    assert reply.status_code == 200
    body = reply.json()
    assert body["done"] is True and "reset first" in body["observation"]["error"]
    assert httpx.get(server.url + "/health").json()["status"] == "healthy"
    schema = httpx.get(server.url + "/schema").json()
    assert "action" in schema["action"]["properties"]


def _private_texts(env: raw_env, learner: int) -> list[str]:
    """Numbers private to the other labs, as JSON would write them."""
    out = []
    for lab in env.world.labs:
        if lab.index == learner:
            continue
        out.append(json.dumps(float(lab.budget)))
        out += [json.dumps(float(job.value)) for job in lab.jobs]
    return out


def test_no_observation_shows_other_labs_private_state_or_the_seed(server: OpenEnvServer) -> None:
    local = raw_env("market_round")
    local.reset(seed=SECRET_SEED)
    secrets = _private_texts(local, 0)
    mine = {json.dumps(float(local.world.labs[0].budget))}
    assert not mine & set(secrets)  # the check below can tell them apart
    with MarketEnvClient(base_url=server.url).sync() as env:
        got = play(env, "truthful", scenario="market_round", seat="bidder_0", seed=SECRET_SEED)
        state = env.state().model_dump_json()
    first = json.dumps(got["seen"][0].model_dump(mode="json"))
    for text in secrets:
        assert text not in first, text
    for obs in got["seen"]:
        blob = json.dumps(obs.model_dump(mode="json")) + obs.prompt
        assert str(SECRET_SEED) not in blob
        if obs.observation is not None:
            assert obs.observation["seat"] == "bidder_0"
    assert str(SECRET_SEED) not in state


def test_planted_secrets_of_other_labs_never_reach_the_learner() -> None:
    """In process: after reset, the other labs' budgets, job values and job ids are overwritten
    with sentinels that cannot occur by chance; no later observation shows one."""
    env = MarketEnvironment()
    obs = env.reset(scenario="market_round", seat="bidder_1", seed=SECRET_SEED)
    assert env.market is not None
    sentinels = []
    for lab in env.market.world.labs:
        if lab.index == 1:
            continue
        lab.budget = 987654.321 + 111111.111 * lab.index
        sentinels.append(f"{lab.budget:.3f}"[:9])
        for k, job in enumerate(lab.jobs):
            job.job_id = f"job_SENTINEL_{lab.index}_{k}"
            job.value = 123456.789 + 7919.131 * lab.index + 313.717 * k
            sentinels += [job.job_id, f"{job.value:.3f}"[:9]]
    env.market.initial_credits = sum(lab.budget for lab in env.market.world.labs)
    steps = 0
    while not obs.done:
        blob = json.dumps(obs.model_dump(mode="json")) + obs.prompt
        for s in sentinels:
            assert s not in blob, s
        assert str(SECRET_SEED) not in blob
        kind = "bid" if obs.observation["phase"] == "bidding" else "wait"
        action = {"action_type": "bid", "bids": [1.0]} if kind == "bid" else {"action_type": kind}
        obs = env.step(MarketAction(action=action))
        steps += 1
    assert steps > 5
    assert str(SECRET_SEED) not in env.state.model_dump_json()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_the_cli_serves_on_loopback(tmp_path: Path) -> None:
    port = _free_port()
    env_vars = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "market", "openenv", "--port", str(port), "--max-sessions", "2"],
        cwd=tmp_path,
        env=env_vars,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        with MarketEnvClient(base_url=url).sync() as env:
            result = env.reset(scenario="single_trade", seat="bidder_1", seed=1)
            assert result.observation.seat == "bidder_1" and not result.done
        with socket.socket() as s:  # bound to loopback only
            assert s.connect_ex(("127.0.0.1", port)) == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_no_seed_draws_a_fresh_world_each_reset() -> None:
    env = MarketEnvironment()
    prompts = {env.reset(scenario="single_trade").prompt for _ in range(3)}
    assert len(prompts) == 3  # fresh entropy each time (not the global RNG, never revealed)
    assert "seed" not in env.state.model_dump()
