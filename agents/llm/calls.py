"""One model call of an LLM seat, below the decision (``LLMAgent._decide``): sending it (inside
the response cache's occurrence scope; async, through the shared limiter or client pool and
within ``call_timeout``), a failure returned as a :class:`BackendError` instead of raised (a
backend failure never escapes a seat), and counting it in the seat's ``stats``
(:data:`STAT_KEYS`). The price and the run budget's charge stay with the agent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any, Union

from agents.llm.backends.base import (
    RETRY_REASONS,
    Backend,
    BackendError,
    CallReport,
    Completion,
    expected_call,
)
from agents.llm.backends.pool import ClientPool, Price, lookup_price
from agents.llm.cache import occurrence_scope
from agents.llm.prompts import Messages
from agents.llm.spec import describe_error

Outcome = Union[Completion, BaseException]  # noqa: UP007
STAT_KEYS: tuple[str, ...] = (
    "decisions",
    "requests",
    "retries",
    "parse_failures",
    "fallbacks",
    "backend_errors",
    "cache_hits",
    "prompt_tokens",
    "completion_tokens",
    "latency_s",
    "cost_usd",
    *(f"retries_{reason}" for reason in RETRY_REASONS),
    "retry_wait_s",
    "queue_wait_s",
    "reasoning_tokens",
    "degraded_features",
    "over_budget",
    "semantic_refusals",
    "repeated_replies",
    "cutoffs",
)


def as_backend_error(exc: Exception) -> BackendError:
    """A failure as the :class:`BackendError` the decision is sent."""
    return exc if isinstance(exc, BackendError) else BackendError(describe_error(exc))


def complete(
    backend: Backend,
    messages: Messages,
    schema: dict[str, Any] | None,
    params: dict[str, Any],
    occurrences: dict[str, int],
) -> Outcome:
    """One synchronous call: the completion, or the failure."""
    try:
        with occurrence_scope(occurrences):
            return backend.complete(messages, schema, params)
    except Exception as exc:  # a backend failure never escapes a seat
        return as_backend_error(exc)


async def acomplete(
    backend: Backend,
    messages: Messages,
    schema: dict[str, Any] | None,
    params: dict[str, Any],
    *,
    occurrences: dict[str, int],
    limiter: Any = None,
    timeout: float | None = None,
) -> tuple[Outcome, float]:
    """One async call: the completion or the failure, and its latency (without the wait for a
    slot of ``limiter``, a ``RequestLimiter`` or a ``ClientPool``)."""
    start = time.perf_counter()
    try:
        if isinstance(limiter, ClientPool):  # the backend takes the pool's slots itself
            with limiter.active():
                outcome = await _arequest(backend, messages, schema, params, occurrences, timeout)
                return outcome, time.perf_counter() - start
        if limiter is not None:
            if limiter.full() and (ticket := expected_call()) is not None:
                ticket.settle()  # a batch must not wait for a call that waits for a slot
            async with limiter:
                start = time.perf_counter()  # latency excludes the wait for a slot
                outcome = await _arequest(backend, messages, schema, params, occurrences, timeout)
                return outcome, time.perf_counter() - start
        outcome = await _arequest(backend, messages, schema, params, occurrences, timeout)
        return outcome, time.perf_counter() - start
    except Exception as exc:
        return as_backend_error(exc), time.perf_counter() - start


async def _arequest(
    backend: Backend,
    messages: Messages,
    schema: dict[str, Any] | None,
    params: dict[str, Any],
    occurrences: dict[str, int],
    timeout: float | None,
) -> Completion:
    with occurrence_scope(occurrences):  # wait_for's task copies this context
        call = backend.acomplete(messages, schema, params)
        if timeout is None:
            return await call
        try:
            return await asyncio.wait_for(call, timeout)
        except TimeoutError:
            pass
    model = getattr(backend, "model", "?")
    raise BackendError(f"model {model}: no reply within call_timeout={timeout:g}s")


def count_call(
    stats: dict[str, float], outcome: Outcome, latency: float, report: CallReport | None
) -> Completion | None:
    """Count one call in ``stats``: the transport's retries and queueing (``report``), the
    latency, a backend error, tokens, a reply cut off by the token limit, a cache hit. Returns
    the completion when it is to be paid for (not a failure, not a cache hit)."""
    stats["requests"] += 1
    if report is not None:  # transport retries and the wait for a slot, success or not
        for reason, count in report.retries.items():
            stats[f"retries_{reason}"] = stats.get(f"retries_{reason}", 0) + count
        stats["retry_wait_s"] += report.retry_wait_s
        stats["queue_wait_s"] += report.queued_s
        latency = max(0.0, latency - report.queued_s)  # latency excludes the queue
    stats["latency_s"] += latency
    if not isinstance(outcome, Completion):
        stats["backend_errors"] += 1
        return None
    stats["prompt_tokens"] += outcome.prompt_tokens
    stats["cutoffs"] += outcome.extra.get("finish_reason") == "length"  # the token limit
    stats["completion_tokens"] += outcome.completion_tokens
    if outcome.cached:
        stats["cache_hits"] += 1
        return None
    return outcome


def find_price(tables: Iterable[Mapping[str, Price]], names: list[str]) -> Price | None:
    """The first price of ``names`` in the first table that has one (None: unpriced)."""
    for table in tables:
        for name in names:
            price = lookup_price(table, name)
            if price is not None:
                return price
    return None
