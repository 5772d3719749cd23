"""An OpenAI-compatible chat backend (OpenAI, vLLM, llama.cpp, Ollama...) on the official client.

``provider`` names a preset of :mod:`agents.llm.providers` (default base URL, key variable and
capabilities); a requested feature the provider lacks is not sent (or sent in its nearest
supported form) and listed in ``Completion.extra["degraded"]``. Request ``params`` may carry
``tools``, ``tool_choice`` and ``reasoning_effort``; with ``tools`` the backend also sends
``parallel_tool_calls=False`` (one action per reply). Replies are read by
:mod:`agents.llm.backends.openai_reply`: text, tool calls, reasoning (fields or ``<think>``) and
reasoning tokens. :meth:`OpenAIBackend.supports_tools` probes an endpoint once per process;
:meth:`OpenAIBackend.count_tokens` asks the server's tokenizer where the provider has one.

One :class:`OpenAIBackend` holds one sync ``OpenAI`` client and one ``AsyncOpenAI`` client per
event loop, so connections are reused across requests. The API key is read from the environment
variable named by ``api_key_env`` when a client is built and handed to that client only: the
backend does not keep it, print it, pickle it or put it in an error message.

Structured output (``response_format``):

- ``"json_schema"``: OpenAI's ``{"type": "json_schema", "json_schema": {"name": "action",
  "schema": ..., "strict": false}}`` (OpenAI, vLLM, Ollama; ``strict: true`` in OpenAI's dialect);
- ``"json_object"``: ``{"type": "json_object", "schema": ...}``, which llama.cpp's server
  constrains generation on (its ``json_schema`` form fails with HTTP 500);
- ``"none"``: free text; the agent extracts the JSON.

The schema is rewritten in the dialect the server honours (:mod:`agents.llm.server_grammar`).
When a server answers HTTP 400/422/500/501 with a message about the response format, the backend
retries that request once without one and keeps using none from then on.

Retries are the backend's own (the client's are turned off, so every retry is counted): HTTP 429,
5xx and connection failures are retried up to ``max_retries`` times with exponential backoff and
jitter drawn from a seeded numpy Generator, never sooner than the server's ``Retry-After``, and
within ``max_retry_wait`` seconds of backoff in total. Other 4xx statuses, timeouts and a server's
``x-should-retry: false`` are not retried. Each retry is reported to the caller's
:class:`~agents.llm.backends.base.CallReport` (the agent's ``retries_*`` stats).

Under a :class:`~agents.llm.backends.pool.ClientPool` (an agent whose ``limiter`` is a pool), async
requests use the pool's shared client for this endpoint and take a pool slot per HTTP attempt.
"""

from __future__ import annotations

import asyncio
import importlib.util
import ipaddress
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncGenerator
from functools import lru_cache
from typing import Any, Literal, cast
from urllib.parse import urlsplit

import numpy as np
import openai
from openai.types.chat import ChatCompletion

from agents.llm.backends.base import BackendError, Completion, current_report
from agents.llm.backends.openai_probe import aprobe_tools, probe_tools, server_token_count
from agents.llm.backends.openai_reply import (
    connection_failure,
    reasoning_of,
    reasoning_tokens_of,
    retry_after,
    retry_reason,
    server_error_text,
    tool_calls_of,
    wire_messages,
)
from agents.llm.backends.pool import ClientPool, active_pool, close_at_loop_shutdown
from agents.llm.providers import Provider, adapt_request, preset
from agents.llm.server_grammar import dialect_for, to_dialect, unwrap_strict

log = logging.getLogger(__name__)

ResponseFormat = Literal["json_schema", "json_object", "none"]
HttpClient = Literal["auto", "httpx", "aiohttp"]
RESPONSE_FORMATS: tuple[str, ...] = ("json_schema", "json_object", "none")
LOCAL_DUMMY_KEY = "sk-local"
# Requests go through the client's documented low-level ``post`` with the JSON body as is: the
# same request, retries, timeouts and errors as ``chat.completions.create``, without its typed-dict
# transform walking every message and the whole action schema (measured: ~35% less client CPU per
# request). Sampling parameters are copied into the body unchanged.
_PATH = "/chat/completions"
_FORMAT_STATUSES = frozenset({400, 422, 500, 501})
_FORMAT_WORDS = (
    "response_format",
    "response format",
    "json_schema",
    "json schema",
    "grammar",
    "schema",
)


class MissingAPIKeyError(BackendError, ValueError):
    """The API key environment variable is not set (a configuration error, raised at construction)."""


def is_local_url(url: str | None) -> bool:
    """True for loopback, private-network and ``localhost`` hosts (a local model server)."""
    if not url:
        return False
    host = (urlsplit(url).hostname or "").lower()
    if (
        host == "localhost"
        or host.endswith((".localhost", ".local"))
        or host == "host.docker.internal"
    ):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return addr.is_loopback or addr.is_private or addr.is_unspecified


@lru_cache(maxsize=1)
def aiohttp_available() -> bool:
    """True when the openai client can use its aiohttp transport (the ``aiohttp`` package)."""
    if importlib.util.find_spec("aiohttp") is None:
        return False
    return hasattr(openai, "DefaultAioHttpClient")


class _GiveUp(Exception):  # noqa: N818 - internal: a final error plus why it was not retried
    def __init__(self, error: BaseException, note: str) -> None:
        super().__init__(note)
        self.error, self.note = error, note


def _status(exc: BaseException) -> int | None:
    return exc.status_code if isinstance(exc, openai.APIStatusError) else None


class OpenAIBackend:
    """Chat completions on an OpenAI-compatible server (see the module docstring).

    ``timeout`` is per request in seconds. ``max_retries``: retries of one call after HTTP 429,
    5xx or a connection failure (0 makes failures surface at once); the waits grow as
    ``backoff_base * 2**n`` capped at ``backoff_max``, jittered to [50%, 100%] by a Generator
    seeded with ``retry_seed``, never below the server's Retry-After, and a call gives up once
    its backoff would exceed ``max_retry_wait`` seconds in total. ``http_client``
    picks the async transport: ``"httpx"`` (the client's default), ``"aiohttp"`` (needs the
    ``aiohttp`` package) or ``"auto"`` (aiohttp when it is installed, since it costs less CPU per
    request; otherwise httpx; see ``docs/llm-seats.md`` for the measurement). The sync client
    always uses httpx.
    ``params`` are default sampling parameters merged under each call's ``params``.
    ``provider`` names a preset (:data:`agents.llm.providers.PRESETS`): it supplies ``base_url``,
    ``api_key_env`` and ``response_format`` when those are not given, and decides which request
    features are sent.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 4,
        response_format: ResponseFormat | None = None,
        http_client: HttpClient = "auto",
        params: dict[str, Any] | None = None,
        organization_env: str | None = None,
        max_retry_wait: float = 60.0,
        backoff_base: float = 0.5,
        backoff_max: float = 20.0,
        retry_seed: int = 0,
        provider: str = "openai",
    ) -> None:
        self.provider: Provider = preset(provider)
        if response_format is None:
            response_format = cast(
                "ResponseFormat",
                "json_schema" if provider == "openai" else self.provider.response_format,
            )
        if response_format not in RESPONSE_FORMATS:
            raise ValueError(
                f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, got {response_format!r}"
            )
        if http_client not in ("auto", "httpx", "aiohttp"):
            raise ValueError(f"http_client must be auto, httpx or aiohttp, got {http_client!r}")
        if not model:
            raise ValueError("model is required (e.g. model=gpt-4o-mini)")
        if (
            int(max_retries) < 0
            or float(max_retry_wait) < 0
            or float(backoff_base) < 0
            or float(backoff_max) < 0
        ):
            raise ValueError(
                "max_retries, max_retry_wait, backoff_base and backoff_max cannot be negative"
            )
        self.model = model
        if self.provider.name == "openai":
            self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        else:
            self.base_url = base_url or self.provider.base_url
        api_key_env = api_key_env or self.provider.api_key_env
        self.api_key_env = api_key_env
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.max_retry_wait = float(max_retry_wait)
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self._rng = np.random.default_rng(retry_seed)  # backoff jitter only: no global RNG
        self.response_format: ResponseFormat = response_format
        self.requested_format: ResponseFormat = response_format
        #: the tool-support probe's finding, for the caller to show (None: not probed yet)
        self.tool_probe: dict[str, Any] | None = None
        self.http_client = http_client
        self.params = dict(params or {})
        self.organization_env = organization_env
        self.format_fallbacks = 0
        self._lock = threading.Lock()
        self._client: openai.OpenAI | None = None
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncGenerator[None, None]
        ] = weakref.WeakKeyDictionary()
        if not os.environ.get(api_key_env) and not is_local_url(self.base_url):
            raise MissingAPIKeyError(
                f"the API key environment variable {api_key_env} is not set; export it, or pass "
                "api_key_env=NAME, or point base_url at a local server"
            )

    # --- clients ---------------------------------------------------------------------------
    def _api_key(self) -> str:
        key = os.environ.get(self.api_key_env)
        if key:
            return key
        if is_local_url(self.base_url):
            return LOCAL_DUMMY_KEY
        raise BackendError(f"the API key environment variable {self.api_key_env} is not set")

    def _client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "api_key": self._api_key(),
            "base_url": self.base_url,
            "timeout": self.timeout,
            "max_retries": 0,  # every retry is ours (counted, Retry-After honoured)
        }
        if self.organization_env and os.environ.get(self.organization_env):
            kwargs["organization"] = os.environ[self.organization_env]
        return kwargs

    def _sync_client(self) -> openai.OpenAI:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = openai.OpenAI(**self._client_kwargs())
                client = self._client
        return client

    def _uses_aiohttp(self) -> bool:
        # measured: aiohttp costs ~25% less client CPU per request than httpx at concurrency 32
        return self.http_client == "aiohttp" or (self.http_client == "auto" and aiohttp_available())

    def _new_async_client(self) -> openai.AsyncOpenAI:
        kwargs = self._client_kwargs()
        if self._uses_aiohttp():
            try:
                kwargs["http_client"] = openai.DefaultAioHttpClient()
            except (AttributeError, RuntimeError, ImportError):
                if self.http_client == "aiohttp":
                    raise BackendError(
                        "http_client=aiohttp needs the aiohttp package (pip install aiohttp)"
                    ) from None
        return openai.AsyncOpenAI(**kwargs)

    @property
    def endpoint(self) -> str:
        """The server this backend talks to (the unit of a pool's per-endpoint limit)."""
        return self.base_url or "https://api.openai.com/v1"

    async def _async_client(self, pool: ClientPool | None = None) -> openai.AsyncOpenAI:
        if pool is not None:  # one client per (server, key variable, transport), shared
            key = (self.endpoint, self.api_key_env, self.organization_env, self._uses_aiohttp())
            return await pool.client(key, self._new_async_client)
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:
            client = self._aclients[loop] = self._new_async_client()
            # close it when the loop shuts down (asyncio.run finalises async generators first)
            closer = close_at_loop_shutdown(client.close)
            await closer.__anext__()
            self._closers[loop] = closer
        return client

    def close(self) -> None:
        """Close the sync client (async clients close with their event loop, or via ``aclose``)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close the async client of the running event loop."""
        loop = asyncio.get_running_loop()
        client = self._aclients.pop(loop, None)
        closer = self._closers.pop(loop, None)
        if closer is not None:
            await closer.aclose()
        elif client is not None:
            await client.close()

    # --- requests --------------------------------------------------------------------------
    def _request(
        self,
        messages: list[dict[str, Any]],
        schema: dict[str, Any] | None,
        params: dict[str, Any],
        fmt: str,
        notes: list[str] | None = None,
    ) -> dict[str, Any]:
        """The JSON body of one chat.completions request, fitted to the provider; what was
        dropped or changed is appended to ``notes``."""
        body: dict[str, Any] = {"model": self.model, "messages": wire_messages(messages)}
        for key, value in {**self.params, **params}.items():
            if value is not None:
                body[key] = value
        if body.get("tools"):
            body.setdefault("parallel_tool_calls", False)  # one action per reply
        else:
            for key in ("tools", "tool_choice", "parallel_tool_calls"):
                body.pop(key, None)
        found = adapt_request(body, self.provider)
        supported = self.provider.capabilities.response_formats
        if schema is not None and not supported:
            found.append(f"response_format not supported by {self.provider.name}: not sent")
        elif schema is not None and fmt != "none" and fmt not in supported:
            was, fmt = fmt, next(iter(supported), "none")
            found.append(f"response_format={was} not supported by {self.provider.name}: sent {fmt}")
        if schema is not None and self.response_format != self.requested_format:
            found.append(
                f"response_format={self.requested_format} rejected by the server: sent "
                f"{self.response_format}"
            )
        dialect = self.schema_dialect(fmt)
        if schema is not None and fmt != "none":
            schema, rewritten = to_dialect(schema, dialect)  # what the server honours
            found.extend(rewritten)
        if notes is not None:
            notes.extend(found)
        if schema is not None and fmt == "json_schema":
            strict = dialect == "openai-strict"
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "action", "schema": schema, "strict": strict},
            }
        elif schema is not None and fmt == "json_object":
            body["response_format"] = {"type": "json_object", "schema": schema}
        return body

    def schema_dialect(self, fmt: str | None = None) -> str | None:
        """The JSON-schema dialect the server honours under ``fmt`` (default: the format in
        use), :func:`~agents.llm.server_grammar.dialect_for`; None: no decision grammar."""
        return dialect_for(self.provider, fmt or self.response_format, is_local_url(self.base_url))

    def _format_unsupported(
        self, exc: openai.APIStatusError, fmt: str, schema: dict[str, Any] | None
    ) -> bool:
        if fmt == "none" or schema is None or exc.status_code not in _FORMAT_STATUSES:
            return False
        text = f"{exc.message} {exc.body}".lower()
        return any(word in text for word in _FORMAT_WORDS)

    def _after_error(
        self,
        exc: Exception,
        fmt: ResponseFormat,
        schema: dict[str, Any] | None,
        retries: int,
        waited: float,
    ) -> tuple[ResponseFormat, float | None]:
        """After a failed attempt: (format for the next attempt, seconds of backoff before it).

        A rejected response format switches to "none" for good and is repeated at once; a
        retryable error waits its backoff; anything else raises (``_GiveUp`` with the reason).
        """
        if isinstance(exc, openai.APIStatusError) and self._format_unsupported(exc, fmt, schema):
            self._fall_back_to_none()
            return "none", None  # repeated at once, and not a retry
        reason = retry_reason(exc)
        if reason is None:
            raise _GiveUp(exc, f" (after {retries} retries)" if retries else "")
        if retries >= self.max_retries:
            raise _GiveUp(
                exc,
                f" (gave up after {retries} retries, {waited:.1f}s of backoff)" if retries else "",
            )
        backoff = min(self.backoff_max, self.backoff_base * 2.0**retries)
        delay = float(self._rng.uniform(0.5 * backoff, backoff)) if backoff > 0 else 0.0
        after = retry_after(exc)
        if after is not None:
            delay = max(delay, after)  # never sooner than the server asked
        if waited + delay > self.max_retry_wait:
            asked = (
                f"Retry-After {after:g}s"
                if after is not None and after >= delay
                else f"backoff {delay:.1f}s"
            )
            raise _GiveUp(
                exc,
                f" (not retried: {asked} would exceed max_retry_wait={self.max_retry_wait:g}s"
                f" after {retries} retries)",
            )
        report = current_report()
        if report is not None:
            report.retried(reason, delay)
        log.debug("model %s: %s, retry %d in %.2fs", self.model, reason, retries + 1, delay)
        return fmt, delay

    def _fall_back_to_none(self) -> None:
        self.response_format = "none"
        self.format_fallbacks += 1
        log.warning(
            "model server at %s rejected response_format=%s; using none from now on",
            self.base_url or "api.openai.com",
            self.requested_format,
        )

    def _describe(self, exc: BaseException) -> str:
        """One line with the cause: the HTTP status and the server's own error text, a timeout,
        a refused connection (never just the exception's type)."""
        where = self.base_url or "the OpenAI API"
        refused = connection_failure(exc) if isinstance(exc, openai.APIConnectionError) else None
        if refused is not None:
            text = f"cannot connect to {where}: {refused}"
        elif isinstance(exc, openai.APITimeoutError):
            text = f"request to {where} timed out after {self.timeout:g}s"
        elif isinstance(exc, openai.APIConnectionError):
            text = f"cannot connect to {where}: {exc.message}"
        elif isinstance(exc, openai.APIStatusError):
            said = server_error_text(exc.body, exc.message or "")
            limited = " (rate limited)" if exc.status_code == 429 else ""
            text = f"HTTP {exc.status_code}{limited} from {where}: {said}"
        elif isinstance(exc, openai.OpenAIError):
            text = f"{type(exc).__name__} from {where}: {exc}"
        else:
            text = f"unusable response from {where}: {type(exc).__name__}: {exc}"
        return f"model {self.model}: {self._scrub(text)}"

    def _scrub(self, text: str) -> str:
        """Remove the API key from a message, in case a server echoes it back."""
        key = os.environ.get(self.api_key_env)
        if key and len(key) >= 4:
            text = text.replace(key, "[redacted]")
        return text[:2000]

    def _completion(
        self, response: Any, latency: float, fmt: str, notes: list[str] | None = None
    ) -> Completion:
        choices = getattr(response, "choices", None)
        if not choices:
            raise BackendError(f"model {self.model}: the response has no choices")
        message = choices[0].message
        usage = getattr(response, "usage", None)
        text, reasoning = reasoning_of(message, message.content or "")
        if self.schema_dialect(fmt) == "openai-strict":
            text = unwrap_strict(text)  # {"action": ...} back to the action object
        extra: dict[str, Any] = {"finish_reason": choices[0].finish_reason, "response_format": fmt}
        if notes:
            extra["degraded"] = list(dict.fromkeys(notes))
        thinking = reasoning_tokens_of(usage)
        if thinking:
            extra["reasoning_tokens"] = thinking
        return Completion(
            text=text,
            model=getattr(response, "model", None) or self.model,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            latency_s=latency,
            extra=extra,
            reasoning=reasoning,
            tool_calls=tool_calls_of(message),
        )

    def complete(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        error, status = None, None
        try:
            client = self._sync_client()
            fmt, retries, waited = self.response_format, 0, 0.0
            notes: list[str]
            while True:
                start, notes = time.perf_counter(), []
                try:
                    response = client.post(
                        _PATH,
                        cast_to=ChatCompletion,
                        options=self._options(),
                        body=self._request(messages, schema, params, fmt, notes),
                    )
                    return self._completion(response, time.perf_counter() - start, fmt, notes)
                except (openai.APIStatusError, openai.APIConnectionError) as exc:
                    failed = exc
                fmt, delay = self._after_error(failed, fmt, schema, retries, waited)
                if delay is not None:
                    retries, waited = retries + 1, waited + delay
                    time.sleep(delay)
        except BackendError:
            raise
        except _GiveUp as stop:  # mapped outside the handler, so no chained context
            error, status = self._describe(stop.error) + stop.note, _status(stop.error)
        except Exception as exc:
            error, status = self._describe(exc), _status(exc)
        raise BackendError(error or f"model {self.model}: no response", status=status)

    async def acomplete(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        error, status = None, None
        pool = active_pool()
        report = current_report()
        try:
            client = await self._async_client(pool)
            fmt, retries, waited = self.response_format, 0, 0.0
            notes: list[str]
            while True:
                start, notes = time.perf_counter(), []
                try:
                    body = self._request(messages, schema, params, fmt, notes)
                    if pool is None:
                        response = await client.post(
                            _PATH, cast_to=ChatCompletion, body=body, options=self._options()
                        )
                    else:
                        async with pool.slot(self.endpoint) as queued:  # one slot per attempt
                            if report is not None:
                                report.queued_s += queued
                            start = time.perf_counter()
                            response = await client.post(
                                _PATH, cast_to=ChatCompletion, body=body, options=self._options()
                            )
                    return self._completion(response, time.perf_counter() - start, fmt, notes)
                except (openai.APIStatusError, openai.APIConnectionError) as exc:
                    failed = exc
                fmt, delay = self._after_error(failed, fmt, schema, retries, waited)
                if delay is not None:
                    retries, waited = retries + 1, waited + delay
                    await asyncio.sleep(delay)  # backoff holds no pool slot
        except BackendError:
            raise
        except _GiveUp as stop:
            error, status = self._describe(stop.error) + stop.note, _status(stop.error)
        except Exception as exc:
            error, status = self._describe(exc), _status(exc)
        raise BackendError(error or f"model {self.model}: no response", status=status)

    # --- what the endpoint can do -----------------------------------------------------------
    def supports_tools(self) -> bool:
        """Whether the endpoint returns tool calls: one probe per base URL and model and process
        (:func:`~agents.llm.backends.openai_probe.probe_tools`); ``tool_probe`` says why."""
        return probe_tools(self)

    async def asupports_tools(self) -> bool:
        """:meth:`supports_tools` without blocking the event loop."""
        return await aprobe_tools(self)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` by the server's tokenizer; ``NotImplementedError`` where the
        provider has no tokenize endpoint (the caller falls back to its own budget)."""
        return server_token_count(self, text)

    def post_json(self, url: str, body: dict[str, Any]) -> Any:
        """POST ``body`` to ``url`` (absolute, or relative to ``base_url``) on the sync client;
        the decoded JSON reply. Raises the client's errors."""
        return self._sync_client().post(url, cast_to=object, body=body, options=self._options())

    def _options(self) -> openai.RequestOptions:
        # per request: a shared pool client may have been built by a backend with another timeout
        return {"timeout": self.timeout, "max_retries": 0}

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r}, "
            f"api_key_env={self.api_key_env!r}, response_format={self.response_format!r})"
        )

    __str__ = __repr__

    def __getstate__(self) -> dict[str, Any]:
        # picklable for process pools: clients and locks are rebuilt on the other side
        state = self.__dict__.copy()
        state.update(_client=None, _aclients=None, _closers=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._aclients = weakref.WeakKeyDictionary()
        self._closers = weakref.WeakKeyDictionary()
