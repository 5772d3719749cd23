"""An OpenAI-compatible chat backend (OpenAI, vLLM, llama.cpp, Ollama) on the official client.

One :class:`OpenAIBackend` holds one sync ``OpenAI`` client and one ``AsyncOpenAI`` client per
event loop, so connections are reused across requests. The API key is read from the environment
variable named by ``api_key_env`` when a client is built and handed to that client only: the
backend does not keep it, print it, pickle it or put it in an error message.

Structured output (``response_format``):

- ``"json_schema"``: OpenAI's ``{"type": "json_schema", "json_schema": {"name": "action",
  "schema": ..., "strict": false}}`` (OpenAI, vLLM, Ollama);
- ``"json_object"``: ``{"type": "json_object", "schema": ...}``, which llama.cpp's server
  constrains generation on (its ``json_schema`` form fails with HTTP 500);
- ``"none"``: free text; the agent extracts the JSON.

When a server answers HTTP 400/422/500/501 with a message about the response format, the backend
retries that request once without one and keeps using none from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncGenerator
from functools import lru_cache
from typing import Any, Literal
from urllib.parse import urlsplit

import openai
from openai.types.chat import ChatCompletion

from agents.backends.base import BackendError, Completion

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
_FORMAT_WORDS = ("response_format", "response format", "json_schema", "json schema", "grammar", "schema")


class MissingAPIKeyError(BackendError, ValueError):
    """The API key environment variable is not set (a configuration error, raised at construction)."""


def is_local_url(url: str | None) -> bool:
    """True for loopback, private-network and ``localhost`` hosts (a local model server)."""
    if not url:
        return False
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith((".localhost", ".local")) or host == "host.docker.internal":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return addr.is_loopback or addr.is_private or addr.is_unspecified


@lru_cache(maxsize=1)
def aiohttp_available() -> bool:
    """True when the openai client can use its aiohttp transport (the ``aiohttp`` package)."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return False
    return hasattr(openai, "DefaultAioHttpClient")


async def _close_at_loop_shutdown(client: openai.AsyncOpenAI) -> AsyncGenerator[None, None]:
    """Suspended on its first ``yield``; the loop's async-generator shutdown closes the client."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await client.close()


def _connection_failure(exc: BaseException) -> str | None:
    """The refused/unreachable-connection cause behind an error, if any (aiohttp reports a
    refused connection as a connect *timeout*)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ConnectionError) or type(seen).__name__ == "ClientConnectorError":
            return str(seen) or type(seen).__name__
        seen = seen.__cause__ or seen.__context__
    return None


class OpenAIBackend:
    """Chat completions on an OpenAI-compatible server (see the module docstring).

    ``timeout`` is per request in seconds; ``max_retries`` is the client's own retry budget for
    timeouts, connection errors, 429 and 5xx (0 makes failures surface at once). ``http_client``
    picks the async transport: ``"httpx"`` (the client's default), ``"aiohttp"`` (needs the
    ``aiohttp`` package) or ``"auto"`` (aiohttp when it is installed, since it costs less CPU per
    request; otherwise httpx; see ``docs/llm-seats.md`` for the measurement). The sync client
    always uses httpx.
    ``params`` are default sampling parameters merged under each call's ``params``.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 30.0,
        max_retries: int = 2,
        response_format: ResponseFormat = "json_schema",
        http_client: HttpClient = "auto",
        params: dict[str, Any] | None = None,
        organization_env: str | None = None,
    ) -> None:
        if response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, got {response_format!r}")
        if http_client not in ("auto", "httpx", "aiohttp"):
            raise ValueError(f"http_client must be auto, httpx or aiohttp, got {http_client!r}")
        if not model:
            raise ValueError("model is required (e.g. model=gpt-4o-mini)")
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.api_key_env = api_key_env
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.response_format: ResponseFormat = response_format
        self.requested_format: ResponseFormat = response_format
        self.http_client = http_client
        self.params = dict(params or {})
        self.organization_env = organization_env
        self.format_fallbacks = 0
        self._lock = threading.Lock()
        self._client: openai.OpenAI | None = None
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = (
            weakref.WeakKeyDictionary()
        )
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
            "max_retries": self.max_retries,
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

    async def _async_client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:
            kwargs = self._client_kwargs()
            if self._uses_aiohttp():
                try:
                    kwargs["http_client"] = openai.DefaultAioHttpClient()
                except (AttributeError, RuntimeError, ImportError):
                    if self.http_client == "aiohttp":
                        raise BackendError("http_client=aiohttp needs the aiohttp package (pip install aiohttp)") from None
            client = self._aclients[loop] = openai.AsyncOpenAI(**kwargs)
            # close it when the loop shuts down (asyncio.run finalises async generators first)
            closer = _close_at_loop_shutdown(client)
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
        self, messages: list[dict[str, str]], schema: dict[str, Any] | None, params: dict[str, Any], fmt: str
    ) -> dict[str, Any]:
        """The JSON body of one chat.completions request."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        for key, value in {**self.params, **params}.items():
            if value is not None:
                body[key] = value
        if schema is not None and fmt == "json_schema":
            body["response_format"] = {
                "type": "json_schema", "json_schema": {"name": "action", "schema": schema, "strict": False},
            }
        elif schema is not None and fmt == "json_object":
            body["response_format"] = {"type": "json_object", "schema": schema}
        return body

    def _format_unsupported(self, exc: openai.APIStatusError, fmt: str, schema: dict[str, Any] | None) -> bool:
        if fmt == "none" or schema is None or exc.status_code not in _FORMAT_STATUSES:
            return False
        text = f"{exc.message} {exc.body}".lower()
        return any(word in text for word in _FORMAT_WORDS)

    def _downgrade(self, exc: openai.APIStatusError, fmt: str, schema: dict[str, Any] | None) -> str:
        """After a rejected response_format, switch to "none" for good; other errors re-raise."""
        if not self._format_unsupported(exc, fmt, schema):
            raise exc
        self._fall_back_to_none()
        return "none"

    def _fall_back_to_none(self) -> None:
        self.response_format = "none"
        self.format_fallbacks += 1
        log.warning("model server at %s rejected response_format=%s; using none from now on",
                    self.base_url or "api.openai.com", self.requested_format)

    def _describe(self, exc: BaseException) -> str:
        where = self.base_url or "the OpenAI API"
        refused = _connection_failure(exc) if isinstance(exc, openai.APIConnectionError) else None
        if refused is not None:
            text = f"cannot connect to {where}: {refused}"
        elif isinstance(exc, openai.APITimeoutError):
            text = f"request to {where} timed out after {self.timeout:g}s"
        elif isinstance(exc, openai.APIConnectionError):
            text = f"cannot connect to {where}: {exc.message}"
        elif isinstance(exc, openai.RateLimitError):
            text = f"rate limited by {where} (HTTP 429): {exc.message}"
        elif isinstance(exc, openai.APIStatusError):
            text = f"HTTP {exc.status_code} from {where}: {exc.message}"
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

    def _completion(self, response: Any, latency: float, fmt: str) -> Completion:
        choices = getattr(response, "choices", None)
        if not choices:
            raise BackendError(f"model {self.model}: the response has no choices")
        message = choices[0].message
        usage = getattr(response, "usage", None)
        return Completion(
            text=message.content or "",
            model=getattr(response, "model", None) or self.model,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            latency_s=latency,
            extra={"finish_reason": choices[0].finish_reason, "response_format": fmt},
        )

    def complete(
        self, messages: list[dict[str, str]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        error: str | None = None
        try:
            client = self._sync_client()
            fmt = self.response_format
            for _ in range(2):
                start = time.perf_counter()
                try:
                    response = client.post(_PATH, cast_to=ChatCompletion, body=self._request(messages, schema, params, fmt))
                except openai.APIStatusError as exc:
                    fmt = self._downgrade(exc, fmt, schema)  # re-raises unless the format was refused
                    continue
                return self._completion(response, time.perf_counter() - start, fmt)
        except BackendError:
            raise
        except Exception as exc:  # mapped below, outside the handler, so no chained context
            error = self._describe(exc)
        raise BackendError(error or f"model {self.model}: no response")

    async def acomplete(
        self, messages: list[dict[str, str]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        error: str | None = None
        try:
            client = await self._async_client()
            fmt = self.response_format
            for _ in range(2):
                start = time.perf_counter()
                try:
                    response = await client.post(_PATH, cast_to=ChatCompletion,
                                                 body=self._request(messages, schema, params, fmt))
                except openai.APIStatusError as exc:
                    fmt = self._downgrade(exc, fmt, schema)  # re-raises unless the format was refused
                    continue
                return self._completion(response, time.perf_counter() - start, fmt)
        except BackendError:
            raise
        except Exception as exc:
            error = self._describe(exc)
        raise BackendError(error or f"model {self.model}: no response")

    def __repr__(self) -> str:
        return (f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r}, "
                f"api_key_env={self.api_key_env!r}, response_format={self.response_format!r})")

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
