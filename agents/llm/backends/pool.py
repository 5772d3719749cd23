"""LLM seats at scale: one shared async client pool with request limits, and a run budget.

:class:`ClientPool` holds one ``AsyncOpenAI`` client per endpoint (base URL + API-key variable +
transport) per event loop, shared by every LLM seat of every concurrent episode, so all of them
reuse one connection pool per server. Every HTTP attempt takes a slot under two limits:

- ``max_in_flight``: requests in flight across all endpoints;
- ``per_endpoint``: requests in flight to one endpoint (default: ``max_in_flight``).

A request takes its endpoint's slot first and the global one second, so a request queued behind
a saturated endpoint never holds a global slot that another endpoint could use. Backoff sleeps
between retries hold no slot. Live counters: ``in_flight``, ``peak_in_flight``, ``queued``,
``requests``, per endpoint in ``endpoints``, and :meth:`ClientPool.mean_in_flight`.

An agent uses the pool when it is set as its ``limiter`` (``arun_episode(..., limiter=pool)``
does that); :class:`~agents.llm.backends.openai_backend.OpenAIBackend` then takes its client and its
slots from the pool. Other backends (a local transformers model, a cache hit) take no slot.

:class:`Budget` caps a run's tokens and cost: every completion's tokens are charged to it
(cache hits are free), priced by the seat's own price or else a user-given table, both in USD per
million tokens (:func:`lookup_price` is the one lookup). The async runner stops *starting*
episodes once it is spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

_ACTIVE: ContextVar[ClientPool | None] = ContextVar("gpumarket_client_pool", default=None)
_Client = TypeVar("_Client")  # whatever a pool's client factory builds


def active_pool() -> ClientPool | None:
    """The pool the backend call in progress should use (set by :meth:`ClientPool.active`)."""
    return _ACTIVE.get()


async def close_at_loop_shutdown(close: Callable[[], Any]) -> AsyncGenerator[None, None]:
    """Suspended on its first ``yield``; the loop's async-generator shutdown (``asyncio.run``
    finalises async generators before closing the loop) awaits ``close()``."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await close()


@dataclass
class EndpointStats:
    """Live counters of one endpoint."""

    limit: int
    in_flight: int = 0
    peak_in_flight: int = 0
    queued: int = 0
    requests: int = 0


class ClientPool:
    """Shared async clients and request limits for the LLM seats of concurrent episodes.

    Args:
        max_in_flight: requests in flight across every endpoint (at least 1).
        per_endpoint: requests in flight to any one endpoint; None means ``max_in_flight``.

    Use one pool for a whole run; it binds lazily to the running event loop (semaphores and
    clients are per loop), so it can be built before ``asyncio.run``. ``await pool.aclose()``
    closes the clients; otherwise they close when their loop shuts down.
    """

    def __init__(self, max_in_flight: int = 16, per_endpoint: int | None = None) -> None:
        if int(max_in_flight) < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        if per_endpoint is not None and int(per_endpoint) < 1:
            raise ValueError(f"per_endpoint must be at least 1, got {per_endpoint}")
        self.max_in_flight = int(max_in_flight)
        self.per_endpoint = int(per_endpoint) if per_endpoint is not None else self.max_in_flight
        self.in_flight = 0
        self.peak_in_flight = 0
        self.queued = 0
        self.requests = 0
        self.endpoints: dict[str, EndpointStats] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._global: asyncio.Semaphore | None = None
        self._sems: dict[str, asyncio.Semaphore] = {}
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncGenerator[None, None]
        ] = weakref.WeakKeyDictionary()
        self._since = time.perf_counter()
        self._last = self._since
        self._area = 0.0  # integral of in_flight over time since reset_counters()

    # --- use ---------------------------------------------------------------------------------
    @contextmanager
    def active(self) -> Iterator[ClientPool]:
        """Make this the pool of the backend calls made inside the block (context-local)."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    async def client(self, key: Hashable, factory: Callable[[], _Client]) -> _Client:
        """The shared client for ``key`` on the running loop, built by ``factory()`` once."""
        loop = asyncio.get_running_loop()
        clients = self._clients.get(loop)
        if clients is None:
            clients = self._clients[loop] = {}
            closer = close_at_loop_shutdown(lambda: self._close_all(clients))
            await closer.__anext__()
            self._closers[loop] = closer
        client: _Client | None = clients.get(key)
        if client is None:
            client = clients[key] = factory()
        return client

    @staticmethod
    async def _close_all(clients: dict[Hashable, Any]) -> None:
        items = list(clients.values())
        clients.clear()
        for client in items:
            with contextlib.suppress(Exception):
                await client.close()

    async def aclose(self) -> None:
        """Close the clients of the running loop."""
        loop = asyncio.get_running_loop()
        closer = self._closers.pop(loop, None)
        clients = self._clients.pop(loop, None)
        if closer is not None:
            await closer.aclose()  # runs _close_all
        elif clients:
            await self._close_all(clients)

    def _semaphores(self, endpoint: str) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._global is None:
            self._loop, self._global, self._sems = loop, asyncio.Semaphore(self.max_in_flight), {}
        sem = self._sems.get(endpoint)
        if sem is None:
            sem = self._sems[endpoint] = asyncio.Semaphore(self.per_endpoint)
        return sem, self._global

    def endpoint(self, name: str) -> EndpointStats:
        stats = self.endpoints.get(name)
        if stats is None:
            stats = self.endpoints[name] = EndpointStats(limit=self.per_endpoint)
        return stats

    @asynccontextmanager
    async def slot(self, endpoint: str) -> AsyncIterator[float]:
        """Hold one request slot of ``endpoint`` (and a global one); yields the seconds queued."""
        ep = self.endpoint(endpoint)
        ep_sem, global_sem = self._semaphores(endpoint)
        began = time.perf_counter()
        self.queued += 1
        ep.queued += 1
        try:
            await ep_sem.acquire()
            try:
                await global_sem.acquire()
            except BaseException:
                ep_sem.release()
                raise
        finally:
            self.queued -= 1
            ep.queued -= 1
        waited = time.perf_counter() - began
        self._change(+1, ep)
        try:
            yield waited
        finally:
            self._change(-1, ep)
            global_sem.release()
            ep_sem.release()

    def _change(self, delta: int, ep: EndpointStats) -> None:
        now = time.perf_counter()
        self._area += self.in_flight * (now - self._last)
        self._last = now
        self.in_flight += delta
        ep.in_flight += delta
        if delta > 0:
            self.requests += 1
            ep.requests += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            ep.peak_in_flight = max(ep.peak_in_flight, ep.in_flight)

    # --- counters ----------------------------------------------------------------------------
    def mean_in_flight(self) -> float:
        """Time-averaged requests in flight since the pool was built or the counters reset."""
        now = time.perf_counter()
        area = self._area + self.in_flight * (now - self._last)
        return area / (now - self._since) if now > self._since else 0.0

    def reset_counters(self) -> None:
        """Zero the peaks, request counts and the in-flight average (not the live levels)."""
        self.peak_in_flight = self.in_flight
        self.requests = 0
        for ep in self.endpoints.values():
            ep.peak_in_flight, ep.requests = ep.in_flight, 0
        self._since = self._last = time.perf_counter()
        self._area = 0.0

    def snapshot(self) -> dict[str, Any]:
        """The counters as plain data (for logs and benchmarks)."""
        return {
            "max_in_flight": self.max_in_flight,
            "per_endpoint": self.per_endpoint,
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak_in_flight,
            "queued": self.queued,
            "requests": self.requests,
            "mean_in_flight": round(self.mean_in_flight(), 3),
            "endpoints": {name: vars(ep).copy() for name, ep in self.endpoints.items()},
        }

    def __repr__(self) -> str:
        return (
            f"ClientPool(max_in_flight={self.max_in_flight}, per_endpoint={self.per_endpoint}, "
            f"in_flight={self.in_flight}, peak={self.peak_in_flight}, queued={self.queued})"
        )

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a ClientPool belongs to one process; build one per process")


# ------------------------------------------------------------------------------------- budget


Price = tuple[float, float]  # USD per million prompt tokens, USD per million completion tokens


def lookup_price(table: Mapping[str, Price], model: str) -> Price | None:
    """``model``'s price in ``table`` (USD per million prompt and completion tokens): its own
    entry, else the longest key that prefixes it (``gpt-4o-mini`` prices
    ``gpt-4o-mini-2024-07-18``), else None. The one price lookup of seats and budgets."""
    if model in table:
        return table[model]
    prefixes = [k for k in table if model.startswith(k)]
    return table[max(prefixes, key=len)] if prefixes else None


def cost_usd(price: Price, prompt_tokens: int, completion_tokens: int) -> float:
    """The USD cost of one completion at ``price`` (USD per million tokens)."""
    return (prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6


def parse_price(text: str) -> tuple[str, tuple[float, float]]:
    """``MODEL=IN,OUT`` (USD per million prompt and completion tokens) -> (model, (in, out))."""
    model, sep, rest = str(text).rpartition("=")
    parts = rest.split(",")
    try:
        if not sep or not model.strip() or len(parts) != 2:
            raise ValueError
        prices = (float(parts[0]), float(parts[1]))
    except ValueError:
        raise ValueError(
            f"price {text!r}: write MODEL=IN,OUT in USD per million prompt and "
            "completion tokens, e.g. gpt-4o-mini=0.15,0.60"
        ) from None
    if min(prices) < 0:
        raise ValueError(f"price {text!r}: prices cannot be negative")
    return model.strip(), prices


@dataclass
class Budget:
    """A cap on a run's model tokens and cost; spent once either limit is reached.

    ``prices``: model -> (USD per million prompt tokens, USD per million completion tokens).
    There are no built-in prices: only models in this table, or LLM seats with their own
    ``price_prompt``/``price_completion``, are costed (a key also matches the model names it
    prefixes, e.g. ``gpt-4o-mini`` covers ``gpt-4o-mini-2024-07-18``); tokens of other models
    count towards ``max_tokens`` only and are listed in ``unpriced``. Cache hits
    cost nothing and count no tokens. After a run, ``stopped`` says whether the budget stopped
    it, and :meth:`message` says what was spent and what was not played.
    """

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    prices: dict[str, Price] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced: set[str] = field(default_factory=set)
    stopped: bool = False
    finished: int = 0
    not_started: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.max_cost_usd is not None and not self.max_cost_usd > 0:
            raise ValueError(f"max_cost_usd must be above 0, got {self.max_cost_usd}")
        self.prices = {str(k): (float(v[0]), float(v[1])) for k, v in dict(self.prices).items()}
        self._lock = threading.Lock()

    @classmethod
    def from_options(
        cls,
        max_tokens: int | None = None,
        max_cost_usd: float | None = None,
        prices: Mapping[str, tuple[float, float]] | list[str] | None = None,
    ) -> Budget | None:
        """A budget from CLI-style options (``prices`` may be ``MODEL=IN,OUT`` strings), or None
        when neither limit is set and no price is given."""
        table = (
            dict(parse_price(p) for p in prices) if isinstance(prices, list) else dict(prices or {})
        )
        if max_tokens is None and max_cost_usd is None and not table:
            return None
        return cls(max_tokens, max_cost_usd, table)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def price(self, model: str) -> Price | None:
        return lookup_price(self.prices, model)

    def charge(
        self, model: str, prompt_tokens: int, completion_tokens: int, price: Price | None = None
    ) -> None:
        """Count one completion's tokens, and its cost at ``price`` (an LLM seat passes the price
        it costed the completion at, its own or this table's), else at this table's price of
        ``model``; a completion with neither is counted as unpriced."""
        price = price if price is not None else self.price(model)
        with self._lock:
            self.prompt_tokens += int(prompt_tokens)
            self.completion_tokens += int(completion_tokens)
            if price is None:
                self.unpriced.add(model)
            else:
                self.cost_usd += cost_usd(price, prompt_tokens, completion_tokens)

    @property
    def exhausted(self) -> bool:
        """True once the tokens or the cost reached their limit."""
        return (self.max_tokens is not None and self.tokens >= self.max_tokens) or (
            self.max_cost_usd is not None and self.cost_usd >= self.max_cost_usd
        )

    def spent_text(self) -> str:
        text = f"{self.tokens:,} tokens ({self.prompt_tokens:,} prompt, {self.completion_tokens:,} completion)"
        if self.prices:
            text += f", ${self.cost_usd:.4f}"
        return text

    def limits_text(self) -> str:
        parts = []
        if self.max_tokens is not None:
            parts.append(f"{self.max_tokens:,} tokens")
        if self.max_cost_usd is not None:
            parts.append(f"${self.max_cost_usd:g}")
        return " / ".join(parts) or "none"

    def message(self) -> str:
        """One line: whether the budget stopped the run, what was spent, what was not played."""
        head = "budget spent" if self.stopped else "budget"
        text = (
            f"{head}: {self.spent_text()} of the limit {self.limits_text()}; "
            f"{self.finished} episode(s) finished"
        )
        if self.stopped:
            text += (
                f", {self.not_started} not started (episodes in flight were finished and "
                "kept); run again, with a bigger budget, to play the rest"
            )
        if self.unpriced and self.max_cost_usd is not None:
            text += f"; no price for {', '.join(sorted(self.unpriced))}: not costed"
        return text
