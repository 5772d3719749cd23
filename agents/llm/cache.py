"""A response cache for LLM backends, so an LLM episode can be re-run offline.

:class:`CachedBackend` wraps any :class:`~agents.llm.backends.base.Backend`. Responses are stored in a
SQLite file under the sha256 of (model, messages, schema, params) and an *occurrence number*: the
n-th time one seat sends the same request in an episode (a seat often sees the same observation on
two negotiation turns). Failed calls are recorded too. So a replay serves every request exactly
what it got when recorded, errors included, and an episode replays action for action. Modes:

- ``"readwrite"``: answer from the cache when the entry is there, otherwise (or when the recorded
  outcome was an error) ask the backend and store the outcome;
- ``"read"``: answer only from the cache; a recorded error is raised again, and a miss raises
  :class:`BackendError` ("not in cache ..."), which an LLM agent turns into its fallback action.
  The wrapped backend is never called (it may be ``None``);
- ``"off"``: pass every call through, store nothing.

Occurrences are counted per :func:`occurrence_scope` (an :class:`~agents.llm.agent.LLMAgent` opens one per
seat and episode). Without a scope every call is occurrence 0, which is plain de-duplication.

Only the model's text, reasoning, tool calls, token counts, the degradation notes and error
messages are stored: no API key, no headers, no base URL. What a backend says about its endpoint
is recorded too, so a replay takes the same path: the tool-support probe (``supports_tools``),
token counts (``count_tokens``) and the grammar it decodes under (:meth:`CachedBackend.grammar`:
a cached seat sends the same decision grammar as the backend it wraps), under keys of their own. One connection per cache serves every thread and coroutine of the process (a lock serialises
it; each operation touches one indexed row).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agents.llm.backends.base import Backend, BackendError, Completion, ToolCall
from agents.llm.decision_grammar import backend_grammar

CacheMode = Literal["readwrite", "read", "off"]
CACHE_MODES: tuple[str, ...] = ("readwrite", "read", "off")
_TABLE = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT NOT NULL,
    occurrence INTEGER NOT NULL,
    model TEXT NOT NULL,
    text TEXT,
    error TEXT,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    latency_s REAL NOT NULL,
    created REAL NOT NULL,
    reasoning TEXT,
    tool_calls TEXT,
    extra TEXT,
    PRIMARY KEY (key, occurrence)
)
"""
#: columns added after the first release, added to an older cache file when it is opened
_ADDED = (("reasoning", "TEXT"), ("tool_calls", "TEXT"), ("extra", "TEXT"))
#: the ``Completion.extra`` entries a cache keeps (what a replayed episode counts)
KEPT_EXTRA = ("degraded", "reasoning_tokens", "finish_reason", "response_format")
_OCCURRENCES: ContextVar[dict[str, int] | None] = ContextVar(
    "gpumarket_cache_occurrences", default=None
)


@contextmanager
def occurrence_scope(counter: dict[str, int]) -> Iterator[None]:
    """Count repeated identical requests in ``counter`` (one dict per seat and episode)."""
    token = _OCCURRENCES.set(counter)
    try:
        yield
    finally:
        _OCCURRENCES.reset(token)


def _next_occurrence(key: str) -> int:
    counter = _OCCURRENCES.get()
    if counter is None:
        return 0
    n = counter.get(key, 0)
    counter[key] = n + 1
    return n


def cache_key(
    model: str,
    messages: list[dict[str, Any]],
    schema: dict[str, Any] | None,
    params: dict[str, Any],
) -> str:
    """sha256 of the canonical JSON of (model, messages, schema, params)."""
    blob = json.dumps(
        {"model": model, "messages": messages, "schema": schema, "params": params},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Entry:
    """One recorded outcome: a completion, or the error message of a failed call."""

    completion: Completion | None
    error: str | None


class ResponseCache:
    """The SQLite store behind :class:`CachedBackend` (usable on its own)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(_TABLE)
            have = {row[1] for row in self._db.execute("PRAGMA table_info(responses)")}
            for name, kind in _ADDED:
                if name not in have:
                    self._db.execute(f"ALTER TABLE responses ADD COLUMN {name} {kind}")

    def get(self, key: str, occurrence: int = 0, any_success: bool = False) -> Entry | None:
        """The entry for (key, occurrence); with ``any_success``, else the first successful one."""
        columns = (
            "model, text, error, prompt_tokens, completion_tokens, latency_s, occurrence, "
            "reasoning, tool_calls, extra"
        )
        with self._lock:
            row = self._db.execute(
                f"SELECT {columns} FROM responses WHERE key = ? AND occurrence = ?",
                (key, occurrence),
            ).fetchone()
            if row is None and any_success:
                row = self._db.execute(
                    f"SELECT {columns} FROM responses WHERE key = ? AND error IS NULL "
                    "ORDER BY occurrence LIMIT 1",
                    (key,),
                ).fetchone()
        if row is None:
            return None
        model, text, error, prompt_tokens, completion_tokens, latency, n, thought, calls, kept = row
        if error is not None:
            return Entry(None, error)
        extra = json.loads(kept) if kept else {}
        extra.update(cache_key=key, occurrence=n, recorded_latency_s=latency)
        return Entry(
            Completion(
                text=text,
                model=model,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                latency_s=0.0,
                cached=True,
                extra=extra,
                reasoning=thought,
                tool_calls=[ToolCall(**c) for c in json.loads(calls)] if calls else [],
            ),
            None,
        )

    def put(
        self,
        key: str,
        occurrence: int,
        completion: Completion | None,
        error: str | None = None,
        model: str = "",
    ) -> None:
        c = completion
        calls = (
            json.dumps(
                [{"id": t.id, "name": t.name, "arguments": t.arguments} for t in c.tool_calls]
            )
            if c is not None and c.tool_calls
            else None
        )
        kept = {k: c.extra[k] for k in KEPT_EXTRA if c is not None and k in c.extra}
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (key, occurrence, model, text, error, "
                "prompt_tokens, completion_tokens, latency_s, created, reasoning, tool_calls, "
                "extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    occurrence,
                    c.model if c else model,
                    c.text if c else None,
                    error,
                    c.prompt_tokens if c else 0,
                    c.completion_tokens if c else 0,
                    c.latency_s if c else 0.0,
                    time.time(),
                    c.reasoning if c else None,
                    calls,
                    json.dumps(kept, sort_keys=True, default=str) if kept else None,
                ),
            )

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]


class CachedBackend:
    """A :class:`Backend` that answers from (and fills) a :class:`ResponseCache` first.

    ``model`` (part of the key) defaults to the wrapped backend's; it is required in ``read`` mode
    without a backend.
    """

    def __init__(
        self,
        backend: Backend | None,
        path: str | Path,
        mode: CacheMode = "readwrite",
        model: str | None = None,
    ) -> None:
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode must be one of {', '.join(CACHE_MODES)}, got {mode!r}")
        if backend is None and mode != "read":
            raise ValueError("a backend is required unless mode='read'")
        if backend is None and model is None:
            raise ValueError(
                "mode='read' without a backend needs model=... (part of the cache key)"
            )
        self.backend = backend
        self.mode: CacheMode = mode
        self.model = model if model is not None else backend.model  # type: ignore[union-attr]
        self.cache = ResponseCache(path)
        self.hits = 0
        self.misses = 0
        self._grammar: tuple[str | None] | None = None  # resolved once (asked every decision)

    def _lookup(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> tuple[str, int, Completion | None]:
        key = cache_key(self.model, messages, schema, params)
        n = _next_occurrence(key)
        if self.mode == "off":
            return key, n, None
        entry = self.cache.get(key, n, any_success=self.mode == "read")
        if entry is not None and entry.completion is not None:
            self.hits += 1
            return key, n, entry.completion
        self.misses += 1
        if self.mode == "read":
            if entry is not None:
                raise BackendError(f"recorded error (replayed from cache): {entry.error}")
            raise BackendError(
                f"not in cache {self.cache.path.name} (model {self.model}, key {key[:12]}, "
                f"occurrence {n}); run once with cache_mode=readwrite to record it"
            )
        return key, n, None

    def _record(
        self, key: str, n: int, completion: Completion | None, exc: BaseException | None
    ) -> None:
        if self.mode != "readwrite":
            return
        error = None if exc is None else (str(exc) or type(exc).__name__)
        self.cache.put(key, n, completion, error, self.model)

    def complete(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        key, n, hit = self._lookup(messages, schema, params)
        if hit is not None:
            return hit
        assert self.backend is not None
        try:
            completion = self.backend.complete(messages, schema, params)
        except Exception as exc:
            self._record(key, n, None, exc)
            raise
        self._record(key, n, completion, None)
        return completion

    async def acomplete(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        key, n, hit = self._lookup(messages, schema, params)
        if hit is not None:
            return hit
        assert self.backend is not None
        try:
            completion = await self.backend.acomplete(messages, schema, params)
        except Exception as exc:
            self._record(key, n, None, exc)
            raise
        self._record(key, n, completion, None)
        return completion

    # --- what the backend says about its endpoint, recorded for replay ------------------------
    def _fact(self, kind: str, subject: str, ask: Any) -> int:
        """An integer fact about the endpoint (``ask()``), recorded under its own key; in
        ``read`` mode the recorded value (``NotImplementedError`` when it was not recorded)."""
        key = cache_key(self.model, [{"role": kind, "content": subject}], None, {})
        if self.mode != "off":
            entry = self.cache.get(key, 0)
            if entry is not None and entry.completion is not None:
                return int(entry.completion.text)
        if self.mode == "read" or self.backend is None:
            raise NotImplementedError(f"{kind} was not recorded in {self.cache.path.name}")
        value = int(ask())
        if self.mode == "readwrite":
            self.cache.put(key, 0, Completion(text=str(value), model=self.model))
        return value

    def _recorded_probe(self) -> tuple[str, bool | None]:
        key = cache_key(self.model, [{"role": "tool-probe", "content": ""}], None, {})
        entry = None if self.mode == "off" else self.cache.get(key, 0)
        if entry is not None and entry.completion is not None:
            return key, bool(int(entry.completion.text))
        return key, None

    def _record_probe(self, key: str, value: bool) -> bool:
        probe = getattr(self.backend, "tool_probe", None)
        transient = isinstance(probe, dict) and str(probe.get("reason", "")).startswith(
            "probe failed"
        )
        if self.mode == "readwrite" and not transient:  # a timeout is not a finding
            self.cache.put(key, 0, Completion(text=str(int(value)), model=self.model))
        return value

    def supports_tools(self) -> bool:
        """The wrapped backend's answer (False if it has no probe), recorded; replayed as
        recorded (False if it was never recorded). A probe that failed in transport is not
        recorded."""
        key, recorded = self._recorded_probe()
        if recorded is not None:
            return recorded
        probe = getattr(self.backend, "supports_tools", None)
        if self.mode == "read" or probe is None:
            return False
        return self._record_probe(key, bool(probe()))

    async def asupports_tools(self) -> bool:
        """:meth:`supports_tools` with the wrapped backend's async probe."""
        key, recorded = self._recorded_probe()
        if recorded is not None:
            return recorded
        probe = getattr(self.backend, "asupports_tools", None)
        if self.mode == "read" or probe is None:
            return self.supports_tools()
        return self._record_probe(key, bool(await probe()))

    def count_tokens(self, text: str) -> int:
        """The wrapped backend's count, recorded. A backend that cannot count (no hook, or
        ``NotImplementedError``) is recorded as such too (-1), so a replay raises the same
        ``NotImplementedError`` and its caller falls back the same way."""
        count = getattr(self.backend, "count_tokens", None)

        def ask() -> int:
            if count is None:
                return -1
            try:
                return int(count(text))
            except NotImplementedError:
                return -1

        value = self._fact("count-tokens", text, ask)
        if value < 0:
            raise NotImplementedError("the wrapped backend cannot count tokens")
        return value

    def grammar(self) -> str | None:
        """The grammar the wrapped backend decodes under (``"local"``: its own, the hf backend;
        else a server's schema dialect, :func:`agents.llm.decision_grammar.backend_grammar`),
        recorded, so a replay without the backend sends the same schemas (part of the key)."""
        if self._grammar is None:
            self._grammar = (self._read_grammar(),)
        return self._grammar[0]

    def _read_grammar(self) -> str | None:
        key = cache_key(self.model, [{"role": "grammar", "content": ""}], None, {})
        entry = None if self.mode == "off" else self.cache.get(key, 0)
        if entry is not None and entry.completion is not None:
            return entry.completion.text or None
        if self.backend is None:
            return None
        value = backend_grammar(self.backend)
        if self.mode == "readwrite":
            self.cache.put(key, 0, Completion(text=value or "", model=self.model))
        return value

    def close(self) -> None:
        self.cache.close()
        close = getattr(self.backend, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        return f"CachedBackend({self.backend!r}, path={str(self.cache.path)!r}, mode={self.mode!r})"
