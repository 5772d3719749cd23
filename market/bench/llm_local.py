"""The ``llm`` section with a local model: the in-process transformers backend, batched and
grammar-constrained (:mod:`agents.llm.backends.hf_engine`). A benchmark, not a test.

``gpumarket bench --only llm --llm-hf MODEL [--llm-device cuda]`` measures, through
:meth:`LLMAgent.aact` on the bench's market observations (memory off, no retries):

- at each concurrency (1, 8, 32 requests in flight): decisions/s, generated tokens/s, the mean
  rows per decoded batch, parse failures, fallbacks and replies cut off by the token limit;
- one ``market_round`` episode with 8 labs (``llm_episode_labs``) played through the parallel view (a pass's seats
  decide at once) with 1 LLM seat and with 8 LLM seats (the rest ``truthful``): the wall time of
  each and their ratio.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agents.llm.agent import LLMAgent
from agents.llm.backends.base import Completion, RequestLimiter
from agents.llm.backends.hf_backend import HFBackend
from agents.scripted import TruthfulBidder
from market.bench.config import BenchConfig, SectionResult, SectionSkipped, metric
from market.bench.llm import bench_observations, decide_all
from market.environment.observations import Observation
from market.environment.parallel import ParallelMarketEnv
from scenarios import load_scenario

#: tokens per reply: room for any legal action of the bench's observations
MAX_TOKENS = 96


class _Tally:
    """Wraps a backend and counts what its completions were: tokens, finish reasons, batches."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.tokens = 0
        self.finish: Counter[str] = Counter()
        self.batch_rows = 0
        self.calls = 0

    def reset(self) -> None:
        self.tokens, self.batch_rows, self.calls = 0, 0, 0
        self.finish.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def _count(self, completion: Completion) -> Completion:
        self.calls += 1
        self.tokens += completion.completion_tokens
        self.finish[str(completion.extra.get("finish_reason", "?"))] += 1
        self.batch_rows += int(completion.extra.get("batch", 1))
        return completion

    def complete(self, messages: Any, schema: Any, params: Any) -> Completion:
        return self._count(self.backend.complete(messages, schema, params))

    async def acomplete(self, messages: Any, schema: Any, params: Any) -> Completion:
        return self._count(await self.backend.acomplete(messages, schema, params))


def _agent(backend: Any, limiter: RequestLimiter | None = None) -> LLMAgent:
    return LLMAgent(backend, limiter=limiter, retries=0, max_tokens=MAX_TOKENS, memory="none")


async def _level(
    tally: _Tally, observations: Sequence[Observation], concurrency: int, decisions: int
) -> dict[str, Any]:
    limiter = RequestLimiter(concurrency)
    agents = [_agent(tally, limiter) for _ in range(concurrency)]
    for i, agent in enumerate(agents):
        agent.reset(i)
    tally.reset()
    wall = time.perf_counter()
    await decide_all(agents, observations, decisions)
    wall = time.perf_counter() - wall
    stats = Counter[str]()
    for agent in agents:
        stats.update({k: int(agent.stats[k]) for k in ("decisions", "parse_failures", "fallbacks")})
    return {
        "concurrency": concurrency,
        "decisions": stats["decisions"],
        "seconds": round(wall, 2),
        "decisions_per_s": round(stats["decisions"] / wall, 3),
        "tokens_per_s": round(tally.tokens / wall, 1),
        "mean_batch": round(tally.batch_rows / max(1, tally.calls), 2),
        "parse_failures": stats["parse_failures"],
        "fallbacks": stats["fallbacks"],
        "length_cutoffs": tally.finish["length"],
    }


async def _episode(backend: Any, llm_seats: int, labs: int, seed: int) -> dict[str, Any]:
    """One ``market_round`` episode with ``labs`` labs through the parallel view; the first
    ``llm_seats`` labs are LLM seats, the rest and the designer scripted."""
    env = ParallelMarketEnv(
        load_scenario(
            "market_round", labs={"count": labs}, rounds=2, negotiation_turns=1, shocks=[]
        )
    )
    observations, _ = env.reset(seed=seed)
    bidders = sorted(a for a in env.possible_agents if a.startswith("bidder_"))
    llm = {seat: _agent(backend) for seat in bidders[:llm_seats]}
    for agent in llm.values():
        agent.reset(seed)
    scripted = TruthfulBidder()
    decisions = 0
    wall = time.perf_counter()
    while env.agents:
        acting = [a for a in env.agents if observations[a].legal_actions]
        asked = [a for a in acting if a in llm]
        answers = await asyncio.gather(*(llm[a].aact(observations[a]) for a in asked))
        actions = dict(zip(asked, answers, strict=True))
        for seat in acting:
            if seat not in actions:
                actions[seat] = scripted.act(observations[seat])
        decisions += len(asked)
        observations, *_ = env.step(actions)
    return {
        "llm_seats": llm_seats,
        "decisions": decisions,
        "seconds": round(time.perf_counter() - wall, 2),
    }


def run_local_llm_bench(
    path: str,
    device: str = "cpu",
    concurrency: Sequence[int] = (1, 8, 32),
    decisions_per_slot: int = 8,
    episode_labs: int = 8,
    dtype: str | None = None,
    static_cache: bool = False,
    fused_kernels: bool | None = None,
    quantize: str | None = None,
    mask_threads: int | None = None,
) -> dict[str, Any]:
    """The figures of this module's docstring for the model at ``path`` on ``device``."""
    load = time.perf_counter()
    backend = HFBackend(
        path,
        device=device,
        dtype=dtype,
        max_new_tokens=MAX_TOKENS,
        max_batch=max(concurrency),
        static_cache=static_cache,
        fused_kernels=fused_kernels,
        quantize=quantize,
        mask_threads=mask_threads,
    )
    loaded = backend.loaded
    load = time.perf_counter() - load
    tally = _Tally(backend)
    observations = bench_observations()

    async def main() -> dict[str, Any]:
        await _agent(tally).aact(observations[0])  # compiles the first grammar, warms kernels
        rows = []
        for c in concurrency:
            n = max(2 * decisions_per_slot, decisions_per_slot * c)
            rows.append(await _level(tally, observations, c, n))
            print(f"llm bench: {rows[-1]}", file=sys.stderr, flush=True)
        one = await _episode(backend, 1, episode_labs, seed=0)
        many = await _episode(backend, episode_labs, episode_labs, seed=0)
        return {"rows": rows, "episode": [one, many]}

    out = asyncio.run(main())
    one, many = out["episode"]
    engine = loaded.state.get("engine")
    return {
        "model": backend.model,
        "device": device,
        "dtype": dtype or "model's",
        "static_cache": static_cache,
        "fused": device.startswith("cuda") if fused_kernels is None else fused_kernels,
        "quantize": loaded.quantize,
        "mask_threads": engine.mask_threads if engine is not None else None,
        "load_s": round(load, 1),
        **out,
        "episode_ratio": round(many["seconds"] / max(1e-9, one["seconds"]), 2),
    }


def section_local_llm(config: BenchConfig) -> SectionResult:
    """``llm`` with ``--llm-hf``: the local model's figures (see the module docstring)."""
    assert config.llm_hf is not None
    try:
        report = run_local_llm_bench(
            config.llm_hf,
            config.llm_device,
            config.llm_concurrency,
            max(1, config.llm_decisions_per_slot // 2),
            episode_labs=config.llm_episode_labs,
            dtype=config.llm_dtype,
            static_cache=config.llm_static_cache,
            fused_kernels=False if config.llm_unfused else None,
            quantize=config.llm_quantize,
            mask_threads=config.llm_mask_threads,
        )
    except (ImportError, ValueError, OSError) as exc:
        raise SectionSkipped(f"--llm-hf {config.llm_hf}: {exc}") from None
    context = {
        "model": report["model"],
        "device": report["device"],
        "dtype": report["dtype"],
        "static_cache": report["static_cache"],
        "fused": report["fused"],
        "quantize": report["quantize"],
        "mask_threads": report["mask_threads"],
    }
    result = SectionResult(details=report)
    for r in report["rows"]:
        c = r["concurrency"]
        for name, unit in (("decisions_per_s", "decisions/s"), ("tokens_per_s", "tokens/s")):
            result.metrics.append(
                metric(f"llm.c{c}.{name}", r[name], unit, "higher", "llm", context)
            )
        result.metrics.append(
            metric(
                f"llm.c{c}.parse_failures", r["parse_failures"], "count", "lower", "llm", context
            )
        )
    result.metrics.append(
        metric(
            f"llm.episode_{report['episode'][1]['llm_seats']}_vs_1_seat",
            report["episode_ratio"],
            "x",
            "lower",
            "llm",
            context,
        )
    )
    return result
