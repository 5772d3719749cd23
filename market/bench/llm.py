"""Throughput benchmark for LLM seats (a benchmark, not a test).

``run_llm_bench(base_url)`` measures LLM decisions per second through :meth:`LLMAgent.aact` at
several request-concurrency limits, with one :class:`RequestLimiter` shared by all agents (as the
runner shares one across concurrent episodes). Point it at any OpenAI-compatible server; for a
model-free figure, the test double ``python -m market.bench.fake_openai_server --latency-ms 50``
answers every request after a fixed latency, so the ideal speed-up at concurrency *c* is *c*.

``compare_transports(base_url)`` measures client CPU seconds per request for the ``openai``
client's async transports (httpx and, if installed, aiohttp) at concurrency 32.

Command line (``--spawn-fake`` starts the test double in a subprocess)::

    python -m market.bench.llm --spawn-fake --latency-ms 50 --concurrency 1 8 --decisions 200
    python -m market.bench.llm --base-url http://127.0.0.1:8080/v1 --model qwen2.5-0.5b
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from agents.llm.agent import LLMAgent
from agents.llm.backends.base import RequestLimiter
from agents.llm.backends.openai_backend import (
    HttpClient,
    OpenAIBackend,
    ResponseFormat,
    aiohttp_available,
)
from agents.scripted import TruthfulBidder
from market.bench.config import BenchConfig, SectionResult, SectionSkipped, metric
from market.environment.aec import raw_env
from market.environment.observations import Observation


def bench_observations(n: int = 64, seed: int = 0) -> list[Observation]:
    """``n`` observations from ``market_round`` episodes (designer and labs, every phase)."""
    out: list[Observation] = []
    env = raw_env("market_round")
    policy = TruthfulBidder()
    episode = seed
    while len(out) < n:
        env.reset(seed=episode)
        for _seat in env.agent_iter():
            obs, _, term, trunc, _ = env.last()
            if not (term or trunc) and obs.legal_actions:
                out.append(obs)
            env.step(None if term or trunc else policy.act(obs))
        episode += 1
    return out[:n]


async def decide_all(
    agents: Sequence[LLMAgent], observations: Sequence[Observation], decisions: int
) -> None:
    """``decisions`` decisions on ``observations`` (cycled), shared out among ``agents``: each
    agent takes the next one as soon as it is free."""
    counter = iter(range(decisions))

    async def worker(agent: LLMAgent) -> None:
        for i in counter:
            await agent.aact(observations[i % len(observations)])

    await asyncio.gather(*(worker(a) for a in agents))


async def _run_level(
    backend: OpenAIBackend, observations: Sequence[Observation], concurrency: int, decisions: int
) -> dict[str, Any]:
    limiter = RequestLimiter(concurrency)
    workers = 2 * concurrency  # more callers than slots: the limiter is what bounds in flight
    agents = [LLMAgent(backend, limiter=limiter, retries=0) for _ in range(workers)]
    for i, agent in enumerate(agents):
        agent.reset(i)

    # warm-up: open the connections
    await asyncio.gather(*(a.aact(observations[0]) for a in agents[:concurrency]))
    for agent in agents:
        agent.reset(0)
    limiter.peak_in_flight = 0
    cpu, wall = time.process_time(), time.perf_counter()
    await decide_all(agents, observations, decisions)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stats = {
        k: sum(a.stats[k] for a in agents)
        for k in ("decisions", "requests", "fallbacks", "backend_errors", "latency_s")
    }
    return {
        "concurrency": concurrency,
        "decisions": int(stats["decisions"]),
        "seconds": round(wall, 3),
        "decisions_per_s": round(stats["decisions"] / wall, 2),
        "cpu_ms_per_decision": round(1000 * cpu / decisions, 3),
        "mean_latency_ms": round(1000 * stats["latency_s"] / max(1, stats["requests"]), 2),
        "peak_in_flight": limiter.peak_in_flight,
        "fallbacks": int(stats["fallbacks"]),
        "backend_errors": int(stats["backend_errors"]),
        # requests the model actually answered, per second: timeouts and errors do not count, so
        # a serialising server cannot look faster at higher concurrency by timing out
        "answered_per_s": round(max(0, stats["requests"] - stats["backend_errors"]) / wall, 3),
    }


def run_llm_bench(
    base_url: str,
    concurrency: Sequence[int] = (1, 8),
    decisions: int = 200,
    model: str = "fake-model",
    http_client: HttpClient = "auto",
    api_key_env: str = "OPENAI_API_KEY",
    response_format: ResponseFormat = "json_schema",
) -> list[dict[str, Any]]:
    """Decisions/s through ``LLMAgent.aact`` at each concurrency limit; one row per limit, with
    ``speedup`` relative to the first. Read ``answered_speedup`` too: ``speedup`` counts decisions
    that fell back after a timeout, which a server that serialises requests produces."""
    observations = bench_observations()
    backend = OpenAIBackend(
        model,
        base_url=base_url,
        api_key_env=api_key_env,
        max_retries=0,
        http_client=http_client,
        response_format=response_format,
    )

    async def main() -> list[dict[str, Any]]:
        rows = [await _run_level(backend, observations, c, decisions) for c in concurrency]
        await backend.aclose()
        return rows

    rows = asyncio.run(main())
    for row in rows:
        row["speedup"] = round(row["decisions_per_s"] / rows[0]["decisions_per_s"], 2)
        base = rows[0]["answered_per_s"]
        row["answered_speedup"] = round(row["answered_per_s"] / base, 2) if base else None
    return rows


def compare_transports(
    base_url: str,
    concurrency: int = 32,
    requests: int = 2000,
    model: str = "fake-model",
    rounds: int = 2,
) -> dict[str, dict[str, float]]:
    """Client CPU ms per request (and requests/s) of each async transport at ``concurrency``.

    Each transport runs ``rounds`` times, interleaved; the best round counts (least noise).
    """
    obs = bench_observations(8)
    agent = LLMAgent(OpenAIBackend(model, base_url=base_url))
    messages = [
        {"role": "system", "content": "bench"},
        {"role": "user", "content": obs[1].to_prompt()},
    ]
    schema = agent._schema(obs[1])
    transports = ["httpx"] + (["aiohttp"] if aiohttp_available() else [])
    results: dict[str, dict[str, float]] = {}

    async def one(kind: str) -> dict[str, float]:
        backend = OpenAIBackend(model, base_url=base_url, max_retries=0, http_client=kind)  # type: ignore[arg-type]
        sem = asyncio.Semaphore(concurrency)

        async def call() -> None:
            async with sem:
                await backend.acomplete(messages, schema, {"max_tokens": 64})

        await asyncio.gather(*(call() for _ in range(2 * concurrency)))  # warm-up
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(call() for _ in range(requests)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        await backend.aclose()
        return {
            "cpu_ms_per_request": round(1000 * cpu / requests, 3),
            "requests_per_s": round(requests / wall, 1),
        }

    for _ in range(rounds):
        for kind in transports:
            row = asyncio.run(one(kind))
            best = results.get(kind)
            if best is None or row["cpu_ms_per_request"] < best["cpu_ms_per_request"]:
                results[kind] = row
    return results


@contextmanager
def spawn_fake_server(latency_ms: float = 0.0) -> Iterator[str]:
    """Start :mod:`market.bench.fake_openai_server` (the test double) in a subprocess; yields its base
    URL. Run as a module of this installed package, so a wheel install needs no source checkout."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "market.bench.fake_openai_server", "--latency-ms", str(latency_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("READY "):
            raise RuntimeError(f"fake server did not start: {line!r}")
        yield line.split(" ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- the suite's ``llm`` section ---------------------------------------------------------------
def section_llm(config: BenchConfig) -> SectionResult:
    """Decisions/s through ``LLMAgent.aact`` (see :mod:`market.bench.llm`) at each concurrency,
    against ``llm_base_url`` or, by default, the fake server answering after a fixed latency:
    that measures the client stack (agent, limiter, openai client, HTTP), not a model. (With
    ``llm_hf`` the suite runs :func:`market.bench.llm_local.section_local_llm` instead.)"""
    if config.llm_base_url:
        server: dict[str, Any] = {"server": config.llm_base_url, "model": config.llm_model}
        rows = _llm_levels(config, config.llm_base_url)
    else:
        server = {"server": "fake", "latency_ms": config.llm_latency_ms}
        try:
            with spawn_fake_server(config.llm_latency_ms) as url:
                rows = _llm_levels(config, url)
        except FileNotFoundError as exc:
            raise SectionSkipped(str(exc)) from None
    if not any(r["answered_per_s"] for r in rows):
        raise SectionSkipped(
            f"the server at {server['server']} answered no request "
            f"({rows[0]['backend_errors']} errors at concurrency {rows[0]['concurrency']})"
        )
    result = SectionResult(details={**server, "rows": rows})
    for r in rows:
        c = r["concurrency"]
        result.metrics.append(
            metric(
                f"llm.c{c}.decisions_per_s",
                r["decisions_per_s"],
                "decisions/s",
                "higher",
                "llm",
                server,
            )
        )
        result.metrics.append(
            metric(
                f"llm.c{c}.answered_per_s",
                r["answered_per_s"],
                "requests/s",
                "higher",
                "llm",
                server,
            )
        )
        result.metrics.append(
            metric(f"llm.c{c}.mean_latency_ms", r["mean_latency_ms"], "ms", "lower", "llm", server)
        )
        result.metrics.append(
            metric(
                f"llm.c{c}.cpu_ms_per_decision",
                r["cpu_ms_per_decision"],
                "ms",
                "lower",
                "llm",
                server,
            )
        )
    return result


def _llm_levels(config: BenchConfig, url: str) -> list[dict[str, Any]]:
    rows = []
    for c in config.llm_concurrency:
        # about the same wall time per level: more decisions where more run at once
        decisions = max(2 * config.llm_decisions_per_slot, config.llm_decisions_per_slot * c)
        rows.extend(run_llm_bench(url, (c,), decisions, model=config.llm_model))
    for r in rows:  # each level ran alone: relative to the first level, not to itself
        r["speedup"] = r["decisions_per_s"] / rows[0]["decisions_per_s"]
        base = rows[0]["answered_per_s"]
        r["answered_speedup"] = r["answered_per_s"] / base if base else None
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m market.bench.llm", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--base-url", help="an OpenAI-compatible server (…/v1)")
    parser.add_argument(
        "--spawn-fake", action="store_true", help="start the test double in a subprocess"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=50.0, help="the test double's fixed latency"
    )
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--http-client", default="auto", choices=["auto", "httpx", "aiohttp"])
    parser.add_argument(
        "--transports", action="store_true", help="also compare httpx/aiohttp CPU per request"
    )
    parser.add_argument("--transport-requests", type=int, default=2000)
    args = parser.parse_args(argv)
    if not (args.base_url or args.spawn_fake):
        parser.error("give --base-url or --spawn-fake")
    report: dict[str, Any] = {}
    if args.spawn_fake:
        with spawn_fake_server(args.latency_ms) as url:
            report["decisions"] = run_llm_bench(
                url, args.concurrency, args.decisions, args.model, args.http_client
            )
        if args.transports:
            with spawn_fake_server(0.0) as url:
                report["transports_c32"] = compare_transports(
                    url, 32, args.transport_requests, args.model
                )
    else:
        report["decisions"] = run_llm_bench(
            args.base_url, args.concurrency, args.decisions, args.model, args.http_client
        )
        if args.transports:
            report["transports_c32"] = compare_transports(
                args.base_url, 32, args.transport_requests, args.model
            )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
