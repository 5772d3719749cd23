"""The backend protocol LLM seats talk to, the shared limit on requests in flight, and the
per-call report through which a backend tells its caller about retries and queueing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for: ``arguments`` is the JSON text as the model wrote it
    (it may be malformed; the caller parses and validates it)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Completion:
    """One model response with its accounting.

    ``reasoning``: the model's reasoning text when the server returned one (a
    ``reasoning_content``/``reasoning`` field or a leading ``<think>`` block, which is then not
    part of ``text``). ``tool_calls``: the function calls of a tool-call reply, in order.
    ``extra["degraded"]`` (when present) lists the requested features the backend did not send,
    one short sentence each; ``extra["reasoning_tokens"]`` the reasoning tokens the server
    counted (they are part of ``completion_tokens``).
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
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion: ...

    async def acomplete(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion: ...


class BackendError(RuntimeError):
    """A model call failed (timeout, connection, HTTP status, unusable response).

    The message says why in one line: the HTTP status and the server's own error text, or the
    timeout or connection failure. ``status`` is the HTTP status when the server answered one.
    """

    def __init__(self, message: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across process pools, with the status
        return (type(self), (str(self), self.status))


def describe_error(exc: BaseException) -> str:
    """One line saying what failed: a BackendError's own message (it names the HTTP status and
    the server's text), else ``Type: message``; never just the type's name. 500 chars at most."""
    text = str(exc).strip()
    if type(exc).__name__ == "BackendError" and text:
        return text[:500]
    return (f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__} (no message)")[:500]


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

    def full(self) -> bool:
        """Whether a request entering now would wait for a slot."""
        return self.in_flight >= self.max_in_flight


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


_EXPECTED: ContextVar[Any] = ContextVar("gpumarket_expected_call", default=None)


def expected_call() -> Any:
    """The expectation :func:`announced` opened in this context (None: none), for the backend
    to settle when the call is queued."""
    return _EXPECTED.get()


@asynccontextmanager
async def announced(backend: Any) -> AsyncIterator[None]:
    """Tell a batching backend that this task is about to call it, before the prompt is built.

    A backend that gathers concurrent calls into batches (``expect()``, e.g. the in-process
    transformers engine) then waits for every announced call before it starts a batch, instead
    of starting with the first call while the others still build their prompts (a prompt takes
    milliseconds of the event loop each, so the calls of one step arrive spread out). After
    announcing, the task yields once, so the other tasks ready now announce theirs before any of
    them builds a prompt. The expectation is settled when the call is queued, or on leaving the
    block if no call was made; backends without ``expect`` are left alone."""
    expect = getattr(backend, "expect", None)
    ticket = expect() if callable(expect) else None
    if ticket is None:
        yield
        return
    token = _EXPECTED.set(ticket)
    try:
        await asyncio.sleep(0)
        yield
    finally:
        _EXPECTED.reset(token)
        ticket.settle()
