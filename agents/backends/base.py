"""The backend protocol LLM seats talk to, and the shared limit on requests in flight."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Completion:
    """One model response with its accounting."""

    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """A chat model. ``schema`` is the action JSON schema for structured output (None: free text).

    ``params`` are sampling parameters (temperature, max_tokens, seed...). Backends raise
    :class:`BackendError` for failures the caller should count and recover from (timeouts,
    HTTP errors, malformed responses).
    """

    model: str

    def complete(self, messages: list[dict[str, str]], schema: dict[str, Any] | None, params: dict[str, Any]) -> Completion: ...

    async def acomplete(self, messages: list[dict[str, str]], schema: dict[str, Any] | None, params: dict[str, Any]) -> Completion: ...


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
