"""uvicorn's h11 HTTP protocol with a deadline on every request head.

uvicorn closes an idle keep-alive connection, but a connection that sends its request line and
headers a byte at a time (or nothing at all) is held for as long as the client likes: a few
hundred such connections hold a server's sockets and memory (slowloris). Here every request
head — from the connection's start, or from the first byte after the previous response — must
be complete within ``head_timeout_s`` seconds (:data:`HEAD_TIMEOUT_S`), or the connection is
closed. The body has its own deadline (:class:`market.serve.guards.BodyLimit`); a WebSocket, once
its handshake is in, is the WebSocket protocol's (pings and the servers' idle timeouts).

Every server of the market runs with it (``uvicorn.Config(http=protocol_class())``), whatever
HTTP parser is installed, so the deadline holds with or without ``httptools``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0  # an honest client sends a request head in one packet


class HeadDeadlineProtocol(H11Protocol):
    """:class:`H11Protocol`, closing a connection whose request head is late (module docstring)."""

    head_timeout_s = HEAD_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _late(self) -> None:
        self._head_timer = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._between_requests():
            self._arm()  # a new request head starts: it has head_timeout_s from now
        super().data_received(data)
        if not self._between_requests():
            self._disarm()  # the head is in; the body's deadline is BodyLimit's

    def handle_websocket_upgrade(self, event: Any) -> None:
        self._disarm()  # the connection now belongs to the WebSocket protocol
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_class(head_timeout_s: float = HEAD_TIMEOUT_S) -> type[HeadDeadlineProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, with its head deadline."""
    if not head_timeout_s > 0:
        raise ValueError(f"head_timeout_s must be seconds > 0, got {head_timeout_s!r}")
    if head_timeout_s == HEAD_TIMEOUT_S:
        return HeadDeadlineProtocol
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_timeout_s": head_timeout_s})


__all__ = ["HEAD_TIMEOUT_S", "HeadDeadlineProtocol", "protocol_class"]
