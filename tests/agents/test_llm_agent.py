"""LLM seats: JSON extraction, the legal-action schema, repair/fallback accounting, full episodes
through the real ``openai`` client against the FakeOpenAIServer test double, offline cache replay,
the shared request limiter, and API-key hygiene."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import market
from agents.base import BaseAgent
from agents.llm.agent import LLMAgent
from agents.llm.backends.base import BackendError, Completion, RequestLimiter
from agents.llm.backends.openai_backend import OpenAIBackend
from agents.llm.backends.pool import Budget
from agents.llm.cache import CachedBackend, cache_key
from agents.llm.parsing import extract_json
from agents.llm.prompts import action_formats, legal_action_schema
from agents.registry import AgentSpecError, make_agent
from agents.scripted import truthful_bid
from market.bench.fake_openai_server import FakeOpenAIServer, Reply
from market.cli import main as cli
from market.core.actions import ACTION_CLASSES, ActionParseError, Bid, SetMechanism, Wait
from market.environment.aec import LEGAL
from market.environment.observations import Observation
from market.run.rollout import run_episode

KEY_ENV = "GPUMARKET_TEST_LLM_KEY"
FAKE_KEY = "sk-test-OKAPI-41d7e0b5-never-store-me"
SEATS = ("designer_0", "bidder_0", "bidder_1", "bidder_2")


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, FAKE_KEY)
    return FAKE_KEY


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


def observations() -> dict[str, Observation]:
    """One observation per phase from market_round (design, negotiation, bidding)."""
    env = market.raw_env("market_round")
    env.reset(seed=3)
    out: dict[str, Observation] = {}
    for _seat in env.agent_iter():
        obs, *_ = env.last()
        out.setdefault(obs.phase, obs)
        if obs.phase == "bidding" and obs.role == "bidder" and (obs.jobs or []):
            out["bidding"] = obs
            break
        env.step({"action_type": "wait"})
    assert {"design", "negotiation", "bidding"} <= set(out)
    return out


OBS = observations()


class StubBackend:
    """An in-process backend replaying texts (or raising exceptions), for the agent's logic."""

    model = "stub-model"

    def __init__(
        self, *outputs: str | BaseException, default: str = '{"action_type": "wait"}'
    ) -> None:
        self.outputs = list(outputs)
        self.default = default
        self.calls: list[tuple[list[dict[str, str]], Any, dict[str, Any]]] = []

    def _next(
        self, messages: list[dict[str, str]], schema: Any, params: dict[str, Any]
    ) -> Completion:
        self.calls.append((messages, schema, params))
        out = self.outputs.pop(0) if self.outputs else self.default
        if isinstance(out, BaseException):
            raise out
        return Completion(text=out, model=self.model, prompt_tokens=100, completion_tokens=10)

    def complete(
        self, messages: list[dict[str, str]], schema: Any, params: dict[str, Any]
    ) -> Completion:
        return self._next(messages, schema, params)

    async def acomplete(
        self, messages: list[dict[str, str]], schema: Any, params: dict[str, Any]
    ) -> Completion:
        return self._next(messages, schema, params)


# --- JSON extraction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"action_type": "wait"}', {"action_type": "wait"}),
        (
            'Sure! Here is my move:\n```json\n{"action_type": "bid", "bids": [3, 2]}\n```\nGood luck.',
            {"action_type": "bid", "bids": [3, 2]},
        ),
        (
            'I will wait. {"action_type": "wait", "reasoning": "nothing {to} do"} -- done',
            {"action_type": "wait", "reasoning": "nothing {to} do"},
        ),
        ('{"action_type": "bid", "bids": [5, 4,],}', {"action_type": "bid", "bids": [5, 4]}),
        (
            "{'action_type': 'send_message', 'to': 'all', 'text': 'it\\'s \"fine\"'}",
            {"action_type": "send_message", "to": "all", "text": 'it\'s "fine"'},
        ),
        (
            '{"action_type": "send_message", "text": "line one\nline two"}',
            {"action_type": "send_message", "text": "line one\nline two"},
        ),
        (
            "{'auction_type': 'vcg', 'reveal_reserve': True, 'reserve_price': None}",
            {"auction_type": "vcg", "reveal_reserve": True, "reserve_price": None},
        ),
        ('{"action_type": "wait" // pass this turn\n}', {"action_type": "wait"}),
        ('Options: {"x": 1} or better {"action_type": "finish"}', {"action_type": "finish"}),
        ('[{"action_type": "wait"}]', {"action_type": "wait"}),
    ],
)
def test_extract_json(text: str, expected: dict[str, Any]) -> None:
    assert extract_json(text) == expected


@pytest.mark.parametrize(
    "text", ["", "I would like to wait.", '{"action_type": "wait"', "{{{{", "[1, 2]"]
)
def test_extract_json_fails_with_a_hint(text: str) -> None:
    with pytest.raises(ActionParseError, match="JSON"):
        extract_json(text)


# --- the schema --------------------------------------------------------------------------------


def _variants(schema: dict[str, Any]) -> set[str]:
    """Names of the top-level alternatives (the $refs outside $defs)."""
    return {ref["$ref"].rsplit("/", 1)[1] for ref in _refs(schema)}


def _refs(node: Any) -> list[dict[str, str]]:
    if isinstance(node, dict):
        return ([node] if "$ref" in node else []) + [
            r for k, v in node.items() if k != "$defs" for r in _refs(v)
        ]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_schema_lists_only_legal_actions() -> None:
    bidding = legal_action_schema(LEGAL["bidding"])
    assert set(bidding["$defs"]) == {"Bid", "AllocateToJob", "Wait", "Finish"}
    assert _variants(bidding) == {"Bid", "AllocateToJob", "Wait", "Finish"}
    for sub in bidding["$defs"].values():
        assert sub["required"][0] == "action_type" and sub["additionalProperties"] is False
    text = json.dumps(bidding)
    assert "oneOf" not in text and '"title"' not in text and "discriminator" not in text
    design = legal_action_schema(LEGAL["design"], designer=True)
    assert _variants(design) == {
        "SetMechanism",
        "Wait",
        "MechanismUpdate",
    }  # + the flat DAEDALUS form
    negotiation = legal_action_schema(LEGAL["negotiation"])
    assert set(negotiation["$defs"]) >= {ACTION_CLASSES[k].__name__ for k in LEGAL["negotiation"]}
    assert "Bid" not in negotiation["$defs"] and "SetMechanism" not in negotiation["$defs"]
    single = legal_action_schema(["wait"])
    assert single["properties"]["action_type"]["const"] == "wait" and single["required"] == [
        "action_type"
    ]


# --- the agent's logic (stub backend) ------------------------------------------------------------


def _agent(backend: Any, **kw: Any) -> LLMAgent:
    agent = LLMAgent(backend, **kw)
    agent.reset(11)
    return agent


def test_prompt_and_request() -> None:
    stub = StubBackend()
    agent = _agent(stub, temperature=0.2, max_tokens=99)
    obs = OBS["bidding"]
    assert agent.act(obs) == Wait()
    messages, schema, params = stub.calls[0]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "ONE JSON action object" in messages[0]["content"]
    assert messages[1]["content"].startswith(obs.to_prompt())
    # the prompt shows the compact form of the legal actions; the full schema goes to the backend
    for line in action_formats(obs.legal_actions):
        assert line in messages[1]["content"]
    assert "bid: {" in messages[1]["content"] and "send_offer" not in messages[1]["content"]
    assert schema is legal_action_schema(obs.legal_actions)
    assert params == {"temperature": 0.2, "max_tokens": 99, "seed": 11}
    assert LLMAgent(stub, structured=False).act(obs) == Wait() and stub.calls[-1][1] is None


def test_repair_then_success_is_counted() -> None:
    stub = StubBackend(
        "not json at all",
        '{"action_type": "bid", "bids": [1, 2]}',
        '{"action_type": "bid", "bids": [2, 1]}',
    )
    agent = _agent(stub, retries=2)
    action = agent.act(OBS["bidding"])
    assert action == Bid(bids=[2.0, 1.0])
    s = agent.stats
    assert (s["decisions"], s["requests"], s["retries"], s["parse_failures"], s["fallbacks"]) == (
        1,
        3,
        2,
        2,
        0,
    )
    assert (s["prompt_tokens"], s["completion_tokens"]) == (300, 30)
    # the repair message carries the previous reply and the error
    last_messages = stub.calls[-1][0]
    assert [m["role"] for m in last_messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert last_messages[4]["content"] == '{"action_type": "bid", "bids": [1, 2]}'
    assert "non-increasing" in last_messages[5]["content"]
    ex = agent.last_exchange
    assert (
        ex is not None
        and ex["action"] == {"action_type": "bid", "bids": [2.0, 1.0]}
        and ex["error"] is None
    )
    assert ex["attempts"] == 3 and ex["raw_replies"][0] == "not json at all" and not ex["fallback"]
    assert ex["messages"] == last_messages


@pytest.mark.parametrize(
    "phase, fallback, expected",
    [
        ("design", "safe", Wait()),
        ("negotiation", "safe", Wait()),
        ("bidding", "safe", Bid(bids=[])),
        ("bidding", "truthful", None),
    ],
)
def test_fallback_after_retries(phase: str, fallback: str, expected: Any) -> None:
    wrong = (
        '{"action_type": "accept_offer", "offer_id": "o1"}'
        if phase != "negotiation"
        else '{"action_type": "bid"}'
    )
    stub = StubBackend(wrong, "garbage", default=wrong)
    agent = _agent(stub, retries=1, fallback=fallback)
    obs = OBS[phase]
    action = agent.act(obs)
    assert action == (expected if expected is not None else truthful_bid(obs))
    assert expected is not None or action.bids  # the truthful fallback bids
    s = agent.stats
    assert (
        s["requests"],
        s["retries"],
        s["parse_failures"],
        s["fallbacks"],
        s["backend_errors"],
    ) == (2, 1, 2, 1, 0)
    assert (
        agent.last_exchange
        and agent.last_exchange["fallback"]
        and "JSON" in agent.last_exchange["error"]
    )


def test_designer_flat_form_and_wrong_seat() -> None:
    obs = OBS["negotiation"]
    other = next(s for s in obs.active_labs if s != obs.seat)
    stub = StubBackend(
        '{"auction_type": "vcg", "reserve_price": 8}',
        f'{{"action_type": "wait", "agent": "{other}"}}',
        f'{{"action_type": "wait", "agent": "{obs.seat}"}}',
    )
    agent = _agent(stub)
    action = agent.act(OBS["design"])
    assert isinstance(action, SetMechanism) and action.mechanism.auction_type == "vcg"
    assert agent.act(obs) == Wait(agent=obs.seat)
    assert (agent.stats["parse_failures"], agent.stats["retries"]) == (1, 1)


@pytest.mark.parametrize("use_async", [False, True])
def test_backend_errors_fall_back_without_retry(use_async: bool) -> None:
    stub = StubBackend(BackendError("HTTP 503 from server"), RuntimeError("socket exploded"))
    agent = _agent(stub, retries=2)
    run = (lambda o: asyncio.run(agent.aact(o))) if use_async else agent.act
    assert run(OBS["bidding"]) == Bid(bids=[])
    assert run(OBS["negotiation"]) == Wait()
    s = agent.stats
    assert (
        s["requests"],
        s["backend_errors"],
        s["fallbacks"],
        s["retries"],
        s["parse_failures"],
    ) == (2, 2, 2, 0, 0)
    assert "socket exploded" in agent.last_exchange["error"]


def test_call_timeout_and_costs() -> None:
    class Slow(StubBackend):
        async def acomplete(self, messages: Any, schema: Any, params: dict[str, Any]) -> Completion:
            await asyncio.sleep(5)
            raise AssertionError("not reached")

    agent = _agent(Slow(), call_timeout=0.05)
    assert asyncio.run(agent.aact(OBS["bidding"])) == Bid(bids=[])
    assert agent.stats["backend_errors"] == 1 and "call_timeout" in agent.last_exchange["error"]
    # USD per million tokens; a key prefixing the model name prices it
    priced = _agent(StubBackend(), prices={"stub": (1.0, 2.0)})
    priced.act(OBS["negotiation"])
    assert priced.stats["cost_usd"] == pytest.approx(0.00012)  # 100 x $1/M + 10 x $2/M


def test_a_seat_without_its_own_price_is_priced_by_the_run_table() -> None:
    """One price lookup: the seat's own price first, else the run budget's (--price) table, and
    the budget is charged at whichever priced the seat, so its total is the seats' sum."""
    budget = Budget(prices={"stub-model": (2.0, 8.0)})
    table_priced = _agent(StubBackend(), budget=budget)
    own_priced = _agent(StubBackend(), budget=budget, prices={"stub-model": (10.0, 10.0)})
    table_priced.act(OBS["negotiation"])
    own_priced.act(OBS["negotiation"])
    assert table_priced.stats["cost_usd"] == pytest.approx(0.00028)  # 100 x $2/M + 10 x $8/M
    assert own_priced.stats["cost_usd"] == pytest.approx(0.0011)  # 110 x $10/M
    assert budget.cost_usd == pytest.approx(0.00028 + 0.0011) and budget.tokens == 220
    assert not budget.unpriced
    unpriced = _agent(StubBackend(), budget=Budget())
    unpriced.act(OBS["negotiation"])
    assert unpriced.stats["cost_usd"] == 0 and unpriced.budget.unpriced == {"stub-model"}


def test_reset_zeroes_stats() -> None:
    agent = _agent(StubBackend())
    agent.act(OBS["negotiation"])
    assert agent.stats["requests"] == 1
    agent.reset(5)
    assert all(v == 0 for v in agent.stats.values()) and agent.last_exchange is None


# --- full episodes through the real openai client ------------------------------------------------


def _llm_seats(url: str, **backend_kw: Any) -> dict[str, LLMAgent]:
    backend_kw.setdefault("max_retries", 0)
    return {
        seat: LLMAgent(
            OpenAIBackend("fake-model", base_url=url, api_key_env=KEY_ENV, **backend_kw), retries=2
        )
        for seat in SEATS
    }


def _requests_of(server: FakeOpenAIServer, seat: str) -> list[Any]:
    return [r for r in server.requests if f"You play seat {seat} " in r.messages_text]


def test_episode_with_llm_seats_and_exact_accounting(server: FakeOpenAIServer, key: str) -> None:
    server.script(
        Reply(
            match="You play seat bidder_0 ",
            content='Let me think.\n```json\n{"action_type": "wait"}\n```',
        ),
        Reply(
            match="You play seat bidder_1 ", content='{"action_type": "wait",'
        ),  # malformed -> repaired
        Reply(
            match="You play seat bidder_2 ", content='{"action_type": "bid", "bids": [5]}'
        ),  # wrong kind x3
        Reply(match="You play seat bidder_2 ", content='{"action_type": "bid", "bids": [5]}'),
        Reply(match="You play seat bidder_2 ", content='{"action_type": "bid", "bids": [5]}'),
        Reply(match="You play seat designer_0 ", status=500, error="scripted crash"),  # -> fallback
        Reply(match="You play seat bidder_0 ", delay=1.0),  # timeout -> fallback
    )
    seats = _llm_seats(server.base_url, timeout=0.4)
    result = run_episode("market_round", seed=0, seats=seats)
    assert server.pending == 0
    assert all(n == 0 for n in result.invalid_actions.values())  # fallbacks are legal actions
    expected = {  # (retries, parse_failures, fallbacks, backend_errors)
        "designer_0": (0, 0, 1, 1),
        "bidder_0": (0, 0, 1, 1),
        "bidder_1": (1, 1, 0, 0),
        "bidder_2": (2, 3, 1, 0),
    }
    steps = {seat: 0 for seat in SEATS}
    for seat, agent in seats.items():
        s = agent.stats
        assert (s["retries"], s["parse_failures"], s["fallbacks"], s["backend_errors"]) == expected[
            seat
        ], seat
        mine = _requests_of(server, seat)
        assert s["requests"] == len(mine)
        assert s["requests"] == s["decisions"] + s["retries"]
        answered = [r for r in mine if r.status == 200 and r.delay < 0.4]
        assert len(answered) == s["requests"] - s["backend_errors"]
        assert s["prompt_tokens"] == sum(r.prompt_tokens for r in answered) > 0
        assert s["completion_tokens"] == sum(r.completion_tokens for r in answered) > 0
        assert s["latency_s"] > 0 and s["cost_usd"] == 0
        steps[seat] = int(s["decisions"])
    # every live turn was an LLM decision: per round one design turn, 2 negotiation turns + 1 bid per lab
    assert steps == {"designer_0": 5, "bidder_0": 15, "bidder_1": 15, "bidder_2": 15}
    assert sum(a.stats["requests"] for a in seats.values()) == len(server.requests)
    assert server.usage_totals(timeout=0.4) == (
        sum(a.stats["prompt_tokens"] for a in seats.values()),
        sum(a.stats["completion_tokens"] for a in seats.values()),
    )
    assert seats["designer_0"].stats["decisions"] == 5  # one design turn per round
    # the designer's default replies changed the mechanism (nested and flat DAEDALUS forms)
    auctions = [r["mechanism"]["auction_type"] for r in result.round_log]
    assert "vcg" in auctions and "first_price" in auctions
    # every request asked for structured output with only the legal actions
    for r in server.requests:
        schema = r.body["response_format"]["json_schema"]["schema"]
        assert (
            "Bid" not in schema["$defs"]
            or "negotiation phase" not in r.body["messages"][0]["content"]
        )


def test_json_schema_rejected_episode_falls_back_to_free_text(key: str) -> None:
    with FakeOpenAIServer(reject_json_schema=500) as srv:
        seats = _llm_seats(srv.base_url)
        result = run_episode("market_round", seed=1, seats=seats)
    assert all(n == 0 for n in result.invalid_actions.values())
    for agent in seats.values():
        backend = agent.backend
        assert isinstance(backend, OpenAIBackend)
        assert backend.response_format == "none" and backend.format_fallbacks == 1
        assert agent.stats["fallbacks"] == 0 and agent.stats["backend_errors"] == 0
    assert sum(r.status == 500 for r in srv.requests) == len(SEATS)


class Recorder(BaseAgent):
    """Wraps an agent and records every action it returns."""

    roles = frozenset({"designer", "bidder"})

    def __init__(self, inner: LLMAgent) -> None:
        super().__init__()
        self.inner, self.actions, self.exchanges = inner, [], []

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed)

    def act(self, observation: Observation) -> Any:
        action = self.inner.act(observation)
        self.actions.append(action.model_dump(exclude_none=True))
        self.exchanges.append(self.inner.last_exchange)
        return action


def test_cache_replays_an_episode_offline(
    tmp_path: Path, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "llm-cache.sqlite"
    prices = {"fake-model": (500.0, 1500.0)}
    with FakeOpenAIServer() as srv:
        srv.script(
            Reply(
                match="You play seat bidder_1 ", content="{'action_type': 'wait',,"
            ),  # repaired, cached
            Reply(match="You play seat bidder_2 ", status=500),
        )  # recorded error
        live = {
            seat: Recorder(
                LLMAgent(
                    CachedBackend(
                        OpenAIBackend(
                            "fake-model", base_url=srv.base_url, api_key_env=KEY_ENV, max_retries=0
                        ),
                        path,
                    ),
                    prices=prices,
                )
            )
            for seat in SEATS
        }
        first = run_episode("market_round", seed=4, seats=live)
        served = len(srv.requests)
    # the server is gone and there is no key: replay from the cache only, agents built from a spec
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    spec = f"llm:openai?model=fake-model&cache={path}&cache_mode=read&price_prompt=500&price_completion=1500"
    replay = {seat: Recorder(LLMAgent.from_spec(spec)) for seat in SEATS}
    assert all(
        isinstance(r.inner.backend, CachedBackend) and r.inner.backend.backend is None
        for r in replay.values()
    )
    second = run_episode("market_round", seed=4, seats=replay)
    assert {s: r.actions for s, r in replay.items()} == {s: r.actions for s, r in live.items()}
    assert second.returns == first.returns and second.components == first.components
    assert second.round_log == first.round_log
    # identical prompts (same seat, observation and seed) hit the cache already while recording
    live_requests = sum(r.inner.stats["requests"] for r in live.values())
    assert live_requests == served + sum(r.inner.stats["cache_hits"] for r in live.values())
    for seat in SEATS:
        a, b = live[seat].inner.stats, replay[seat].inner.stats
        assert b["requests"] == a["requests"]
        assert (b["prompt_tokens"], b["completion_tokens"]) == (
            a["prompt_tokens"],
            a["completion_tokens"],
        )
        assert b["cache_hits"] == b["requests"] - b["backend_errors"]
        assert b["cost_usd"] == 0 and a["cost_usd"] > 0
        assert b["backend_errors"] == a["backend_errors"]  # the recorded 500 replays: same fallback
        assert b["fallbacks"] == a["fallbacks"] and b["retries"] == a["retries"]
    assert replay["bidder_2"].inner.stats["backend_errors"] == 1
    replayed = [e for ex in replay["bidder_2"].exchanges for e in ex["errors"]]
    assert len(replayed) == 1 and "recorded error" in replayed[0] and "HTTP 500" in replayed[0]
    # another seed was never recorded: every decision misses and falls back, nothing escapes
    for r in replay.values():
        r.inner.reset(0)
    third = run_episode("market_round", seed=5, seats=replay)
    assert all(n == 0 for n in third.invalid_actions.values())
    assert all(r.inner.stats["fallbacks"] == r.inner.stats["decisions"] for r in replay.values())
    assert "not in cache" in replay["bidder_0"].exchanges[-1]["error"]


def test_cache_modes_and_key(tmp_path: Path) -> None:
    stub = StubBackend('{"action_type": "wait"}')
    msgs = [{"role": "user", "content": "x"}]
    cached = CachedBackend(stub, tmp_path / "c.sqlite")
    first = cached.complete(msgs, None, {"temperature": 0})
    again = cached.complete(msgs, None, {"temperature": 0})
    assert not first.cached and again.cached and again.text == first.text and len(stub.calls) == 1
    cached.complete(msgs, None, {"temperature": 1})  # params are part of the key
    assert len(stub.calls) == 2 and len(cached.cache) == 2
    assert cache_key("m", msgs, None, {"a": 1, "b": 2}) == cache_key(
        "m", msgs, None, {"b": 2, "a": 1}
    )
    reader = CachedBackend(None, tmp_path / "c.sqlite", mode="read", model="stub-model")
    assert asyncio.run(reader.acomplete(msgs, None, {"temperature": 0})).cached
    with pytest.raises(BackendError, match="not in cache"):
        reader.complete(msgs, None, {"temperature": 2})
    off = CachedBackend(StubBackend(), tmp_path / "c.sqlite", mode="off")
    assert not off.complete(msgs, None, {"temperature": 0}).cached


# --- async, the shared limiter -------------------------------------------------------------------


def test_limiter_peak_equals_limit_under_load(key: str) -> None:
    obs = OBS["bidding"]
    with FakeOpenAIServer(latency=0.05) as srv:
        backend = OpenAIBackend(
            "fake-model", base_url=srv.base_url, api_key_env=KEY_ENV, max_retries=0
        )
        limiter = RequestLimiter(3)
        agents = [LLMAgent(backend, limiter=limiter) for _ in range(12)]

        async def main() -> list[Any]:
            actions = await asyncio.gather(*(a.aact(obs) for a in agents))
            await backend.aclose()
            return actions

        actions = asyncio.run(main())
    assert limiter.peak_in_flight == 3 and limiter.in_flight == 0
    assert all(isinstance(a, Bid) and a.bids for a in actions)
    assert sum(a.stats["requests"] for a in agents) == len(srv.requests) == 12
    assert all(a.stats["fallbacks"] == 0 for a in agents)


def test_async_episode_with_timeout(server: FakeOpenAIServer, key: str) -> None:
    server.script(Reply(match="You play seat bidder_1 ", delay=1.0))
    seats = _llm_seats(server.base_url, timeout=0.3)
    limiter = RequestLimiter(2)
    for agent in seats.values():
        agent.limiter = limiter
    env = market.raw_env("market_round")

    async def play() -> dict[str, float]:
        env.reset(seed=2)
        for seat, agent in seats.items():
            agent.reset(env.seat_seed(seat))
        returns = dict.fromkeys(SEATS, 0.0)
        for seat in env.agent_iter():
            obs, reward, term, trunc, info = env.last()
            returns[seat] += reward
            assert "error" not in info or info.get("round") is None
            env.step(None if term or trunc else await seats[seat].aact(obs))
        return returns

    asyncio.run(play())
    assert (
        seats["bidder_1"].stats["backend_errors"] == 1 and seats["bidder_1"].stats["fallbacks"] == 1
    )
    assert sum(a.stats["requests"] for a in seats.values()) == len(server.requests)


# --- specs and key hygiene --------------------------------------------------------------------------


def test_from_spec(server: FakeOpenAIServer, key: str, tmp_path: Path) -> None:
    spec = (
        f"llm:openai?model=fake-model&base_url={server.base_url}&api_key_env={KEY_ENV}&retries=1"
        "&timeout=5&max_retries=0&response_format=json_object&temperature=0.3&max_tokens=64"
        f"&fallback=truthful&price_prompt=0.5&price_completion=1.5&cache={tmp_path / 'c.sqlite'}"
    )
    agent = LLMAgent.from_spec(spec)
    assert (
        agent.retries == 1
        and agent.fallback == "truthful"
        and agent.params == {"temperature": 0.3, "max_tokens": 64}
    )
    assert isinstance(agent.backend, CachedBackend)
    inner = agent.backend.backend
    assert isinstance(inner, OpenAIBackend)
    assert (inner.timeout, inner.max_retries, inner.response_format) == (5.0, 0, "json_object")
    assert agent.prices == {"fake-model": (0.5, 1.5)}
    agent.reset(1)
    assert agent.act(OBS["negotiation"]) == Wait()
    assert server.requests[-1].body["response_format"]["type"] == "json_object"
    assert agent.stats["cost_usd"] > 0
    same = LLMAgent.from_params(
        "openai", model="fake-model", base_url=server.base_url, api_key_env=KEY_ENV
    )
    assert isinstance(same.backend, OpenAIBackend) and same.spec.startswith(
        "llm:openai?model=fake-model"
    )
    with pytest.raises(TypeError, match="unknown parameter 'modle'"):
        LLMAgent.from_params("openai", modle="x", base_url=server.base_url)
    with pytest.raises(TypeError, match="unknown LLM provider"):
        LLMAgent.from_params("nope", model="x")


def test_backends_resolve_by_name_and_the_spec_module_keeps_its_names() -> None:
    """``agents.llm.backends.registry``: every preset and alias is the OpenAI-compatible backend,
    ``module:Class`` imports what it names, an unknown name lists the known ones; the names moved
    out of ``agents.llm.spec`` are still importable from it, as the very same objects."""
    from agents.base import unknown_parameter_message
    from agents.llm import spec
    from agents.llm.backends.registry import PROVIDERS, backend_class
    from agents.llm.providers import ALIASES, PRESETS

    assert spec.PROVIDERS is PROVIDERS and spec.backend_class is backend_class
    assert spec.unknown_parameter_message is unknown_parameter_message
    assert set(PROVIDERS) == {"openai", "hf", *PRESETS, *ALIASES}
    for name in ("openai", "vllm", "llama.cpp", *ALIASES):
        assert backend_class(name) is OpenAIBackend, name
    assert backend_class("agents.llm.cache:CachedBackend") is CachedBackend
    with pytest.raises(TypeError, match=r"unknown LLM provider 'nope'; known: openai, hf, "):
        backend_class("nope")
    with pytest.raises(TypeError, match="agents.llm.cache has no backend class Nope"):
        backend_class("agents.llm.cache:Nope")


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("retrys", "retries"),
        ("falback", "fallback"),
        ("bse_url", "base_url"),
        ("max_retry", "max_retries"),
    ],
)
def test_a_misspelt_parameter_names_every_parameter_of_the_spec(typo: str, meant: str) -> None:
    """The agent's parameters and the backend's, with the nearest as a suggestion."""
    with pytest.raises(AgentSpecError) as info:
        make_agent(f"llm:openai?model=x&base_url=http://127.0.0.1:9/v1&{typo}=3")
    message = str(info.value)
    assert f"unknown parameter {typo!r}" in message and f"did you mean {meant!r}?" in message
    agent_part, backend_part = message.split("agent parameters: ")[1].split(
        "; OpenAIBackend parameters: "
    )
    assert {
        "retries",
        "fallback",
        "call_timeout",
        "price_prompt",
        "price_completion",
        "cache",
        "cache_mode",
    } <= set(agent_part.split(", "))
    assert {"model", "base_url", "timeout", "max_retries", "response_format"} <= set(
        backend_part.split(", ")
    )


def test_a_misspelt_parameter_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli(
        [
            "run",
            "single_trade",
            "--seeds",
            "0",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--seat",
            "bidder_0=llm:openai?model=x&base_url=http://127.0.0.1:9/v1&retrys=3",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "did you mean 'retries'?" in err and "Traceback" not in err


def test_the_old_per_1k_price_parameters_are_refused_with_the_conversion() -> None:
    with pytest.raises(AgentSpecError) as info:
        make_agent("llm:openai?model=x&base_url=http://127.0.0.1:9/v1&cost_prompt=0.00015")
    assert "price_prompt" in str(info.value) and "per million" in str(info.value)
    with pytest.raises(AgentSpecError, match="cannot be negative"):
        make_agent("llm:openai?model=x&base_url=http://127.0.0.1:9/v1&price_prompt=-1")


def test_api_key_never_leaks(server: FakeOpenAIServer, key: str, tmp_path: Path) -> None:
    server.script(
        Reply(
            match="You play seat bidder_0 ",
            status=401,
            error=f"Incorrect API key provided: {FAKE_KEY}",
        ),
        Reply(match="You play seat bidder_1 ", delay=1.0),
        Reply(match="You play seat bidder_2 ", content="not json"),
    )
    path = tmp_path / "cache.sqlite"
    seats = {
        seat: LLMAgent(
            CachedBackend(
                OpenAIBackend(
                    "fake-model",
                    base_url=server.base_url,
                    api_key_env=KEY_ENV,
                    max_retries=0,
                    timeout=0.3,
                ),
                path,
            )
        )
        for seat in SEATS
    }
    taps = {s: Recorder(a) for s, a in seats.items()}
    run_episode("market_round", seed=0, seats=taps)
    exchanges = [ex for tap in taps.values() for ex in tap.exchanges]
    assert (
        seats["bidder_0"].stats["backend_errors"] >= 1
        and seats["bidder_1"].stats["backend_errors"] >= 1
    )
    texts = [json.dumps(exchanges, default=str)]
    for agent in seats.values():
        texts += [
            repr(agent),
            str(agent),
            repr(agent.backend),
            repr(agent.stats),
            json.dumps(agent.last_exchange),
            repr(vars(agent)),
            str(agent.spec),
        ]
    errors = [e for ex in exchanges for e in ex["errors"]]
    assert any("HTTP 401" in e and "[redacted]" in e for e in errors)
    assert any("timed out" in e for e in errors)
    texts += errors
    for text in texts:
        assert FAKE_KEY not in text
    seats["bidder_0"].backend.cache.close()
    assert FAKE_KEY.encode() not in path.read_bytes()
    for extra in path.parent.glob("cache.sqlite*"):
        assert FAKE_KEY.encode() not in extra.read_bytes()
