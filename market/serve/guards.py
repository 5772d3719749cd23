"""ASGI middleware that every server of the market puts in front of its app.

- :class:`OriginGuard`: a browser page of another origin may not drive the server. A WebSocket
  handshake, or an HTTP request that changes state (``POST``, ``PUT``, ``PATCH``, ``DELETE``),
  whose ``Origin`` header is present is refused (HTTP 403; a WebSocket handshake is closed with
  1008, which the server answers as 403) unless that origin is the server's own or the operator
  listed it (``--allow-origin``). The server's own origin is ``http://HOST`` of the request's
  ``Host`` header, and only where HOST is an IP address or ``localhost``: a page of a domain name
  that resolves to this machine (DNS rebinding) has an ``Origin`` and a ``Host`` that agree, so a
  domain name is the server's own only when listed. Requests without ``Origin`` (curl, httpx,
  the project's clients) are not browsers' cross-origin requests and pass.
- :class:`BearerGate`: a route that needs a bearer token (the agent service's, a server's creator
  token) answers 401 from the headers alone, before any byte of the body is read.
- :class:`BodyLimit`: a request body is read in full, at most ``limit`` bytes within
  ``read_timeout_s`` seconds, before the app sees any of it: a larger body (declared by
  ``Content-Length`` or sent chunked) is answered 413, a body still arriving at the deadline 408,
  and neither reaches the app.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any
from urllib.parse import urlsplit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_BODY_TIMEOUT_S = 10.0  # a whole request body; an honest client sends KBs in milliseconds


def normalise_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, the default port dropped; ValueError if
    ``origin`` is not such an origin (``--allow-origin`` values are checked with it)."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"{origin!r} is not an origin; write it as http://HOST:PORT")
    if parts.query or parts.fragment or parts.username is not None:
        raise ValueError(f"{origin!r} is not an origin; write it as http://HOST:PORT")
    port = parts.port
    host = parts.hostname.lower()
    if ":" in host:  # an IPv6 literal keeps its brackets in an origin
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + ("" if port in (None, default) else f":{port}")


def _literal_or_localhost(host: str) -> bool:
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _answer(
    send: Send,
    status: int,
    message: str,
    key: str = "error",
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """A JSON answer ``{key: message}`` that closes the connection (any unread body with it)."""
    body = json.dumps({key: message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class OriginGuard:
    """Refuse cross-origin browser requests that could change state (see the module docstring)."""

    def __init__(self, app: ASGIApp, allowed_origins: Sequence[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(normalise_origin(o) for o in allowed_origins)

    def allows(self, scope: Scope) -> bool:
        """Whether the request's ``Origin`` (if any) may drive this server."""
        origin = _header(scope, b"origin")
        if origin is None:
            return True
        try:
            origin = normalise_origin(origin)
        except ValueError:  # "null" (sandboxed frames, file: pages) and anything malformed
            return False
        if origin in self.allowed:
            return True
        host = _header(scope, b"host")
        if not host:
            return False
        scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
        try:
            own = normalise_origin(f"{scheme}://{host}")
        except ValueError:
            return False
        return origin == own and _literal_or_localhost(urlsplit(own).hostname or "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket" and not self.allows(scope):
            await send({"type": "websocket.close", "code": 1008})
            return
        if kind == "http" and scope.get("method") in STATE_CHANGING and not self.allows(scope):
            await _answer(
                send,
                403,
                "cross-origin request refused: this server accepts state-changing requests from "
                "its own origin only (its operator can allow others with --allow-origin)",
            )
            return
        await self.app(scope, receive, send)


def bearer_token_matches(scope: Scope, token: bytes) -> bool:
    """Whether the request's ``Authorization: Bearer ...`` is ``token`` (constant time)."""
    given = _header(scope, b"authorization")
    if given is None:
        return False
    scheme, _, value = given.encode("latin-1").partition(b" ")
    return scheme.lower() == b"bearer" and secrets.compare_digest(value.strip(), token)


class BearerGate:
    """401 for an HTTP request that ``guarded(scope)`` selects and that lacks
    ``Authorization: Bearer TOKEN``, decided from the headers alone: the body is never read
    (the connection is closed with it), so a client without the token costs the server nothing.
    The answer is ``{key: message}`` with ``WWW-Authenticate: Bearer``."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        guarded: Callable[[Scope], bool],
        message: str,
        key: str = "error",
    ) -> None:
        if not token:
            raise ValueError("BearerGate needs a non-empty token")
        self.app, self.token, self.guarded = app, token.encode(), guarded
        self.message, self.key = message, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and self.guarded(scope)
            and not bearer_token_matches(scope, self.token)
        ):
            await _answer(
                send, 401, self.message, self.key, headers=[(b"www-authenticate", b"Bearer")]
            )
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Read the whole request body (at most ``limit`` bytes, within ``read_timeout_s``) before
    the app runs; 413 / 408 otherwise (see the module docstring)."""

    def __init__(
        self, app: ASGIApp, limit: int, read_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    ) -> None:
        if limit < 1 or not read_timeout_s > 0:
            raise ValueError("BodyLimit needs a limit >= 1 byte and a read timeout > 0 s")
        self.app, self.limit, self.read_timeout_s = app, limit, read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None and (not length.strip().isdigit() or int(length) > self.limit):
            await self._too_large(send)
            return
        try:
            chunks = await asyncio.wait_for(self._read(receive), self.read_timeout_s)
        except TimeoutError:
            await _answer(
                send,
                408,
                f"the request body did not arrive within {self.read_timeout_s:g} s",
            )
            return
        if chunks is None:
            await self._too_large(send)
            return
        if chunks is _GONE:
            return  # the client left before its body arrived: nothing to answer
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> Any:
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _GONE
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks

    async def _too_large(self, send: Send) -> None:
        await _answer(send, 413, f"request body too large (limit {self.limit} bytes)")


_GONE: Any = object()


__all__ = [
    "BearerGate",
    "BodyLimit",
    "DEFAULT_BODY_TIMEOUT_S",
    "OriginGuard",
    "bearer_token_matches",
    "normalise_origin",
]
