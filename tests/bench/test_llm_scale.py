"""LLM seats at scale: the shared client pool and its limits, our own retries with backoff, the
run budget, and the runner's async path, all against the real fake OpenAI server over HTTP."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

import market
from agents.llm.agent import LLMAgent
from agents.llm.backends.base import BackendError
from agents.llm.backends.openai_backend import OpenAIBackend
from agents.llm.backends.pool import Budget, ClientPool, parse_price
from market.bench.fake_openai_server import FakeOpenAIServer, Reply
from market.bench.llm import bench_observations
from market.run.async_runner import run_jobs_async
from market.run.jobs import play
from market.run.runner import RunConfigError, read_results, run_scenario

KEY_ENV = "GPUMARKET_SCALE_TEST_KEY"
TIMING_STATS = ("latency_s", "queue_wait_s", "retry_wait_s")


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-scale-test")


@pytest.fixture
def server() -> Any:
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def observations() -> list[Any]:
    return bench_observations(8)


def backend(srv: FakeOpenAIServer, **kw: Any) -> OpenAIBackend:
    kw.setdefault("api_key_env", KEY_ENV)
    kw.setdefault("backoff_base", 0.01)
    return OpenAIBackend("fake-model", base_url=srv.base_url, **kw)


def spec(srv: FakeOpenAIServer, extra: str = "") -> str:
    return f"llm:openai?model=fake-model&base_url={srv.base_url}&api_key_env={KEY_ENV}{extra}"


# --- the pool's limits -----------------------------------------------------------------------


def _load(
    pool: ClientPool, servers: list[FakeOpenAIServer], per_server: int, observations: list[Any]
) -> int:
    """``per_server`` agents per server, each with its own backend, deciding at once; returns
    how many distinct clients the pool built."""
    agents = [
        LLMAgent(backend(srv, max_retries=0), limiter=pool, retries=0)
        for srv in servers
        for _ in range(per_server)
    ]
    for i, agent in enumerate(agents):
        agent.reset(i)

    async def main() -> int:
        await asyncio.gather(
            *(a.aact(observations[i % len(observations)]) for i, a in enumerate(agents))
        )
        clients = len(next(iter(pool._clients.values())))
        await pool.aclose()
        return clients

    clients = asyncio.run(main())
    assert all(a.stats["decisions"] == 1 and a.stats["fallbacks"] == 0 for a in agents)
    return clients


def test_global_limit_holds_and_one_client_serves_every_backend(observations: list[Any]) -> None:
    pool = ClientPool(max_in_flight=3)
    with FakeOpenAIServer(latency=0.05) as srv:
        clients = _load(pool, [srv], 12, observations)
        assert len(srv.requests) == 12
    assert pool.peak_in_flight == 3  # reached under load, never exceeded
    assert pool.in_flight == 0 and pool.queued == 0 and pool.requests == 12
    assert clients == 1  # twelve backends, one shared client for the endpoint


def test_per_endpoint_limits_hold_for_two_endpoints(observations: list[Any]) -> None:
    pool = ClientPool(max_in_flight=10, per_endpoint=2)
    with FakeOpenAIServer(latency=0.05) as a, FakeOpenAIServer(latency=0.05) as b:
        clients = _load(pool, [a, b], 8, observations)
        eps = pool.endpoints
        assert (eps[a.base_url].peak_in_flight, eps[b.base_url].peak_in_flight) == (2, 2)
        assert (eps[a.base_url].requests, eps[b.base_url].requests) == (8, 8)
    assert pool.peak_in_flight == 4 and clients == 2


def test_the_global_limit_binds_across_endpoints(observations: list[Any]) -> None:
    pool = ClientPool(max_in_flight=3, per_endpoint=2)
    with FakeOpenAIServer(latency=0.05) as a, FakeOpenAIServer(latency=0.05) as b:
        _load(pool, [a, b], 6, observations)
        assert max(ep.peak_in_flight for ep in pool.endpoints.values()) == 2
    assert pool.peak_in_flight == 3


def test_pool_and_price_options_are_checked() -> None:
    with pytest.raises(ValueError, match="max_in_flight must be at least 1"):
        ClientPool(0)
    with pytest.raises(ValueError, match="per_endpoint must be at least 1"):
        ClientPool(4, per_endpoint=0)
    assert parse_price("gpt-4o-mini=0.15,0.6") == ("gpt-4o-mini", (0.15, 0.6))
    assert parse_price("org/model=a=1,2") == ("org/model=a", (1.0, 2.0))
    for bad in ("gpt-4o-mini", "m=1", "m=1,x", "=1,2", "m=-1,2"):
        with pytest.raises(ValueError, match="price"):
            parse_price(bad)


# --- retries ---------------------------------------------------------------------------------


def _decide(agent: LLMAgent, obs: Any, use_async: bool) -> Any:
    agent.reset(0)
    return asyncio.run(agent.aact(obs)) if use_async else agent.act(obs)


@pytest.mark.parametrize("use_async", [False, True])
def test_rate_limits_and_server_errors_are_retried_honouring_retry_after(
    server: FakeOpenAIServer, observations: list[Any], use_async: bool
) -> None:
    server.script(
        Reply(status=429, retry=True, headers={"Retry-After": "0.6"}),
        Reply(status=503, retry=True),
        Reply(status=500, retry=True),
    )
    agent = LLMAgent(backend(server), retries=0)
    _decide(agent, observations[1], use_async)
    assert [r.status for r in server.requests] == [429, 503, 500, 200]
    s = agent.stats
    assert (s["retries_rate_limited"], s["retries_server_error"], s["retries_connection"]) == (
        1,
        2,
        0,
    )
    assert (s["requests"], s["backend_errors"], s["fallbacks"]) == (1, 0, 0)  # one call, answered
    # the first retry came no sooner than Retry-After (loose: only a lower bound)
    assert server.requests[1].at - server.requests[0].at >= 0.55
    assert s["retry_wait_s"] >= 0.6
    assert s["prompt_tokens"] == server.requests[-1].prompt_tokens > 0  # only the answer counts


@pytest.mark.parametrize("use_async", [False, True])
def test_a_permanent_4xx_is_not_retried(
    server: FakeOpenAIServer, observations: list[Any], use_async: bool
) -> None:
    server.script(
        Reply(status=400, retry=True, error="bad request")
    )  # even if the header says retry
    agent = LLMAgent(backend(server), retries=0)
    _decide(agent, observations[1], use_async)
    assert [r.status for r in server.requests] == [400]
    s = agent.stats
    assert (s["backend_errors"], s["fallbacks"]) == (1, 1)
    assert s["retries_rate_limited"] + s["retries_server_error"] + s["retries_connection"] == 0
    assert "HTTP 400" in agent.last_exchange["error"]


def test_x_should_retry_false_is_final(server: FakeOpenAIServer) -> None:
    server.script(Reply(status=500, error="no"))  # the fake sends x-should-retry: false by default
    with pytest.raises(BackendError, match="HTTP 500"):
        backend(server).complete([{"role": "user", "content": "hi"}], None, {})
    assert len(server.requests) == 1


def test_attempts_and_total_wait_are_bounded(server: FakeOpenAIServer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    server.script(*[Reply(status=502, retry=True, error="down")] * 3)
    with pytest.raises(BackendError, match=r"HTTP 502.*gave up after 2 retries"):
        backend(server, max_retries=2).complete(messages, None, {})
    assert len(server.requests) == 3
    server.script(Reply(status=429, retry=True, headers={"Retry-After": "30"}))
    with pytest.raises(
        BackendError, match=r"rate limited.*Retry-After 30s would exceed max_retry_wait=1s"
    ):
        asyncio.run(backend(server, max_retry_wait=1).acomplete(messages, None, {}))
    assert len(server.requests) == 4  # gave up at once instead of sleeping 30 s
    with pytest.raises(ValueError, match="cannot be negative"):
        backend(server, max_retries=-1)


def test_connection_failures_are_retried_and_counted() -> None:
    with FakeOpenAIServer() as gone:
        dead_url = gone.base_url
    agent = LLMAgent(
        OpenAIBackend(
            "fake-model",
            base_url=dead_url,
            api_key_env=KEY_ENV,
            max_retries=2,
            backoff_base=0.01,
            timeout=2,
        ),
        retries=0,
    )
    agent.reset(0)
    asyncio.run(agent.aact(bench_observations(2)[1]))
    assert agent.stats["retries_connection"] == 2 and agent.stats["backend_errors"] == 1
    assert "cannot connect" in agent.last_exchange["error"]
    assert "gave up after 2 retries" in agent.last_exchange["error"]


def test_backoff_jitter_comes_from_the_seeded_generator(server: FakeOpenAIServer) -> None:
    def waited(seed: int) -> float:
        server.script(*[Reply(status=500, retry=True)] * 3)
        agent = LLMAgent(backend(server, backoff_base=0.02, retry_seed=seed), retries=0)
        agent.reset(0)
        agent.act(bench_observations(2)[1])
        assert agent.stats["retries_server_error"] == 3
        return agent.stats["retry_wait_s"]

    first, again, other = waited(1), waited(1), waited(2)
    assert first == again and first != other
    assert 0.5 * 0.02 * (1 + 2 + 4) <= first <= 0.02 * (1 + 2 + 4)  # jitter within [50%, 100%]


# --- the runner's async path -----------------------------------------------------------------


def _comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        row = {k: v for k, v in row.items() if k not in ("seconds", "transcript")}
        row["stats"] = {k: v for k, v in row["stats"].items() if k not in TIMING_STATS}
        out.append(row)
    return sorted(out, key=lambda r: (r["seed"], r["seat"]))


def test_async_path_gives_the_process_pool_rows(tmp_path: Path) -> None:
    seeds = list(range(6))
    with FakeOpenAIServer(latency=0.01) as srv:
        seats = {"designer_0": spec(srv), "bidder_0": spec(srv)}
        summary = run_scenario(
            "market_round",
            seeds,
            seats,
            tmp_path / "async",
            progress=False,
            llm={"max_in_flight": 4, "max_episodes": 6},
        )
        # the process pool's worker function, in real worker processes, on the same jobs
        jobs = [(summary.scenario, s, summary.seats, None, 1, summary.config_hash) for s in seeds]
        with multiprocessing.get_context().Pool(2) as procs:
            played = procs.map(play, jobs)
    assert all(error is None for _, _, _, error in played)
    pool_rows = [row for _, rows, _, _ in played for row in rows]
    assert summary.played == seeds and len(summary.rows) == 6 * len(summary.seats)
    assert _comparable(summary.rows) == _comparable(pool_rows)
    assert sum(r["tokens"]["total"] for r in summary.rows) > 0  # the LLM seats did talk
    assert all(Path(r["transcript"]).is_file() for r in summary.rows)
    assert _comparable(read_results(tmp_path / "async")) == _comparable(summary.rows)


def test_many_episodes_share_the_pool_concurrently(tmp_path: Path) -> None:
    with FakeOpenAIServer(latency=0.05) as srv:
        seats = {"designer_0": spec(srv), "bidder_0": spec(srv)}
        summary = run_scenario(
            "market_round", [0], seats, tmp_path / "probe", progress=False, transcripts=False
        )  # resolves seats and config for the jobs
        jobs = [
            (0, (summary.scenario, s, summary.seats, None, 1, summary.config_hash))
            for s in range(8)
        ]
        seen: list[int] = []
        outcome = run_jobs_async(
            jobs, lambda i, out: seen.append(out[0]), max_in_flight=4, max_episodes=8
        )
    assert sorted(seen) == list(range(8)) and outcome.finished == 8 and outcome.not_started == 0
    assert outcome.peak_episodes == 8
    assert outcome.pool["peak_in_flight"] == 4  # eight episodes kept four requests in flight
    assert outcome.pool["mean_in_flight"] > 1.5  # loose: the time average, on a shared machine


def test_budget_stops_starting_episodes_and_resume_plays_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "run"
    seeds = list(range(6))
    with FakeOpenAIServer() as srv:
        seats = {"bidder_0": spec(srv)}
        budget = Budget(max_tokens=1)  # spent by the first completion
        first = run_scenario(
            "market_round",
            seeds,
            seats,
            out,
            progress=False,
            transcripts=False,
            llm={"max_episodes": 2, "budget": budget},
        )
        # the two episodes in flight finished and were kept; nothing else started
        assert len(first.played) == 2 and not first.complete and not first.failed
        assert len(read_results(out)) == 2 * len(first.seats)
        assert budget.stopped and (budget.finished, budget.not_started) == (2, 4)
        assert budget.tokens == sum(r["tokens"]["total"] for r in first.rows) > 1
        message = budget.message()
        assert message.startswith(f"budget spent: {budget.tokens:,} tokens")
        assert "of the limit 1 tokens" in message
        assert "2 episode(s) finished, 4 not started" in message
        bigger = Budget(max_tokens=10**9)
        second = run_scenario(
            "market_round",
            seeds,
            seats,
            out,
            progress=False,
            transcripts=False,
            llm={"budget": bigger},
        )
    assert second.complete and sorted(second.played) == sorted(set(seeds) - set(first.played))
    assert not bigger.stopped and "not started" not in bigger.message()
    assert len(read_results(out)) == len(seeds) * len(first.seats)


def test_cost_budget_prices_tokens_and_needs_a_price(tmp_path: Path) -> None:
    with FakeOpenAIServer() as srv:
        seats = {"bidder_0": spec(srv)}
        with pytest.raises(
            RunConfigError, match="no price for fake-model.*--price fake-model=IN,OUT"
        ):
            run_scenario(
                "market_round",
                [0],
                seats,
                tmp_path / "a",
                progress=False,
                llm={"budget": Budget(max_cost_usd=1.0)},
            )
        budget = Budget(max_cost_usd=1e-9, prices={"fake": (2.0, 8.0)})  # a prefix of fake-model
        summary = run_scenario(
            "market_round",
            [0, 1, 2],
            seats,
            tmp_path / "b",
            progress=False,
            transcripts=False,
            llm={"max_episodes": 1, "budget": budget},
        )
    assert len(summary.played) == 1 and budget.stopped and budget.unpriced == set()
    expected = (budget.prompt_tokens * 2.0 + budget.completion_tokens * 8.0) / 1e6
    assert budget.cost_usd == pytest.approx(expected) and expected > 0
    assert f"${budget.cost_usd:.4f} of the limit $1e-09" in budget.message()


def test_cli_budget_message_and_bad_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from market.cli import main

    with FakeOpenAIServer() as srv:
        base = [
            "run",
            "market_round",
            "--seeds",
            "0:3",
            "--seat",
            f"bidder_0={spec(srv)}",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--no-transcripts",
        ]
        assert main([*base, "--budget-tokens", "1", "--episodes-in-flight", "1"]) == 0
        err = capsys.readouterr().err
        assert (
            "gpumarket run: budget spent:" in err and "1 episode(s) finished, 2 not started" in err
        )
        assert main(base) == 0  # resume without a budget
        assert "2 played now" in capsys.readouterr().out
        base[base.index(str(tmp_path))] = str(tmp_path / "other")  # a folder with seeds to play
        assert main([*base, "--budget-usd", "1"]) == 2
        err = capsys.readouterr().err
        assert "no price for fake-model" in err and "Traceback" not in err and err.count("\n") == 1
        assert main([*base, "--price", "fake-model"]) == 2
        assert "MODEL=IN,OUT" in capsys.readouterr().err
        assert main([*base, "--max-in-flight", "0"]) == 2
        assert "--max-in-flight 0: give at least 1" in capsys.readouterr().err


def test_ctrl_c_cancels_episodes_in_flight_and_keeps_finished_ones(tmp_path: Path) -> None:
    with FakeOpenAIServer(latency=0.02) as srv:
        seats = {"bidder_0": spec(srv)}
        summary = run_scenario(
            "market_round", [0], seats, tmp_path / "probe", progress=False, transcripts=False
        )
        tdir = tmp_path / "transcripts"
        jobs = [
            (0, (summary.scenario, s, summary.seats, str(tdir), 1, summary.config_hash))
            for s in range(6)
        ]
        kept: list[int] = []

        def finished(index: int, outcome: Any) -> None:
            kept.append(outcome[0])
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            run_jobs_async(jobs, finished, max_in_flight=2, max_episodes=3)
    assert len(kept) == 1
    files = {int(p.stem): '"aborted"' in p.read_text() for p in tdir.glob("*.jsonl")}
    assert sorted(files) == [0, 1, 2]  # the three episodes in flight; the other three never started
    assert not files[kept[0]]  # the finished episode's transcript is complete
    assert sum(files.values()) >= 1  # the others were cancelled and marked aborted (unless one
    # happened to finish in the same instant)


def test_eval_takes_the_pool_and_budget_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from market.cli import main

    with FakeOpenAIServer() as srv:
        code = main(
            [
                "eval",
                "--agents",
                spec(srv),
                "--scenarios",
                "single_trade",
                "--seeds",
                "0:3",
                "--budget-tokens",
                "1",
                "--episodes-in-flight",
                "1",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
    err = capsys.readouterr().err
    assert code == 0, err
    assert "gpumarket eval: budget spent:" in err and "1 episode(s) finished, 2 not started" in err
    rows = (tmp_path / "single_trade").glob("*/results.jsonl")
    assert sum(len(p.read_text().splitlines()) for p in rows) == 2  # one episode, two seats


# --- the benchmark's test double ships in the package ---------------------------------------


def test_the_llm_benchmark_spawns_the_packaged_test_double_from_any_folder(tmp_path: Path) -> None:
    """``--spawn-fake`` runs ``python -m market.bench.fake_openai_server``, so it needs no ``tests/``
    folder (a wheel install has none): here it runs from a folder outside the checkout."""
    import json
    import subprocess
    import sys

    import market.bench.fake_openai_server as double

    assert Path(market.__file__).parent in Path(double.__file__).parents  # inside the package
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "market.bench.llm",
            "--spawn-fake",
            "--latency-ms",
            "0",
            "--concurrency",
            "2",
            "--decisions",
            "6",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["decisions"]
    assert [r["concurrency"] for r in rows] == [2] and rows[0]["decisions"] == 6
