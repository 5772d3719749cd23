"""The backend protocol LLM seats talk to, the shared limit on requests in flight, and the
per-call report through which a backend tells its caller about retries and queueing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolCall:
    """One function call in a reply (OpenAI ``tool_calls``): ``arguments`` is JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Completion:
    """One model response with its accounting.

    ``reasoning``: the server's separate reasoning text (``reasoning_content``), if any;
    ``tool_calls``: the function calls of a reply to a request with ``tools``.
    """

    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


@runtime_checkable
class Backend(Protocol):
    """A chat model. ``schema`` is the action JSON schema for structured output (None: free text).

    ``params`` are sampling parameters (temperature, max_tokens, seed...). Backends raise
    :class:`BackendError` for failures the caller should count and recover from (timeouts,
    HTTP errors, malformed responses).
    """

    model: str

    def complete(
        self, messages: list[dict[str, str]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion: ...

    async def acomplete(
        self, messages: list[dict[str, str]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion: ...


class BackendError(RuntimeError):
    """A model call failed (timeout, connection, HTTP status, unusable response)."""


class RequestLimiter:
    """One limit on model requests in flight, shared by every LLM seat of every concurrent episode.

    Lazily binds to the running event loop, so one limiter can be created before ``asyncio.run``.
    """

    def __init__(self, max_in_flight: int = 8) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_flight = 0
        self.peak_in_flight = 0

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._loop is not loop:
            self._sem, self._loop = asyncio.Semaphore(self.max_in_flight), loop
        return self._sem

    async def __aenter__(self) -> RequestLimiter:
        await self._semaphore().acquire()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.in_flight -= 1
        self._semaphore().release()


#: why a request was retried (the agent stat is ``retries_<reason>``)
RETRY_REASONS: tuple[str, ...] = ("rate_limited", "server_error", "connection")


@dataclass(slots=True)
class CallReport:
    """What happened inside one backend call besides its result, filled in by the backend.

    ``queued_s``: time spent waiting for a request slot (global or per-endpoint limit);
    ``retry_wait_s``: time slept in backoff before retries; ``retries``: reason -> retries made.
    The agent opens one per call (:func:`reporting`) and copies it into its stats, whether the
    call succeeded or raised.
    """

    queued_s: float = 0.0
    retry_wait_s: float = 0.0
    retries: dict[str, int] = field(default_factory=dict)

    def retried(self, reason: str, wait: float) -> None:
        self.retries[reason] = self.retries.get(reason, 0) + 1
        self.retry_wait_s += wait


_REPORT: ContextVar[CallReport | None] = ContextVar("gpumarket_call_report", default=None)


def current_report() -> CallReport | None:
    """The report of the backend call in progress in this context, if the caller opened one."""
    return _REPORT.get()


@contextmanager
def reporting() -> Iterator[CallReport]:
    """Open a :class:`CallReport` for the backend call made inside the block (context-local, so
    concurrent calls on one event loop each get their own; tasks started inside share it)."""
    report = CallReport()
    token = _REPORT.set(report)
    try:
        yield report
    finally:
        _REPORT.reset(token)
