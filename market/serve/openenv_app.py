"""The OpenEnv server of the market: OpenEnv's own FastAPI app around
:class:`~market.serve.openenv_env.MarketEnvironment`, and uvicorn to run it.

Every WebSocket connection (``/ws``, what :class:`~market.serve.openenv_client.MarketEnvClient`
uses) is one session with its own environment: its own AEC env, agents and random streams, on its
own worker thread. OpenEnv's HTTP ``/reset`` and ``/step`` are stateless (a fresh env per
request), as OpenEnv defines them: a session needs the WebSocket. The protocol, its messages and
its errors are OpenEnv's. The ``/ws`` sessions are served by
:class:`~market.serve.openenv_sessions.Sessions` instead of OpenEnv's handler (the same protocol,
plus limits: ``max_sessions`` in all, ``max_sessions_per_client`` per remote address, idle
sessions closed after ``idle_timeout_s``, malformed frames answered without ending the session,
a leaving client's work stopped). OpenEnv's ``/mcp`` routes are not served: the market has no MCP
tools, and their ``openenv/session/create`` would hold sessions outside every limit.

Safety: the server binds 127.0.0.1 unless told otherwise; a WebSocket message and an HTTP request
body are each at most ``MAX_MESSAGE_BYTES`` (a larger body gets 413 before it is read); a bad
reset option is a 400 over HTTP and an ``EXECUTION_ERROR`` message over the WebSocket, with the
same one-line reason; a line-up names only the built-in agents unless the operator allowed more
(``policy``, :mod:`agents.spec_policy`): no spec from a client loads code or calls a URL. An HTTP
body nested deeper than ``MAX_JSON_DEPTH`` or holding a lone surrogate is a 422 before the app
reads it. On SIGTERM (or ``OpenEnvServer.stop``) the work of every session and request is
cancelled first, so the server exits promptly.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openenv.core.env_server.http_server import create_fastapi_app
from starlette.routing import BaseRoute

from agents.spec_policy import SpecPolicy
from market.serve.guards import STATE_CHANGING, BodyLimit, OriginGuard, Receive, Scope, Send
from market.serve.http_protocol import protocol_class
from market.serve.openenv_env import (
    MarketAction,
    MarketEnvironment,
    MarketObservation,
    MarketState,
    SessionCancelled,
    SessionError,
)
from market.serve.openenv_sessions import (
    DEFAULT_IDLE_TIMEOUT_S,
    MAX_JSON_DEPTH,
    Sessions,
    json_problem,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_SESSIONS = 128
DEFAULT_MAX_SESSIONS_PER_CLIENT = 64  # no one address takes the whole server
MAX_MESSAGE_BYTES = 1 << 20  # one WebSocket message (an action is a few hundred bytes)
SHUTDOWN_GRACE_S = 10  # after its work was cancelled, a request still running is cut off
NOT_SERVED = ("/ws", "/mcp")  # OpenEnv's routes replaced (/ws) or left out (/mcp)


def create_market_app(
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    policy: SpecPolicy | None = None,
    allow_origins: Sequence[str] = (),
    *,
    max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> FastAPI:
    """OpenEnv's FastAPI app serving the market (simulation mode: reset, step, state, schema,
    health, metadata and the ``/ws`` sessions). ``policy``: the agent specs a line-up may name
    (:mod:`agents.spec_policy`); ``allow_origins``: browser origins besides the server's own
    that may open sessions or post (:class:`~market.serve.guards.OriginGuard`);
    ``max_sessions_per_client`` and ``idle_timeout_s``: see
    :class:`~market.serve.openenv_sessions.Sessions`. ``app.state.sessions`` is the sessions."""
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
    sessions = Sessions(
        functools.partial(MarketEnvironment, policy=policy),
        max_sessions,
        max_sessions_per_client,
        idle_timeout_s,
    )
    app: FastAPI = create_fastapi_app(
        sessions.factory_for_requests,
        MarketAction,
        MarketObservation,
        max_concurrent_envs=max_sessions,
        env_name="gpumarket",
        state_cls=MarketState,
        mode="simulation",
    )

    app.router.routes[:] = [r for r in app.router.routes if _path(r) not in NOT_SERVED]
    app.add_api_websocket_route("/ws", sessions.serve)
    app.state.sessions = sessions

    async def session_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    async def cancelled(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": "the server is stopping"})

    app.add_exception_handler(SessionError, session_error)
    app.add_exception_handler(SessionCancelled, cancelled)
    app.add_middleware(JsonGate)
    app.add_middleware(BodyLimit, limit=MAX_MESSAGE_BYTES)
    app.add_middleware(OriginGuard, allowed_origins=tuple(allow_origins))  # outermost
    return app


def _path(route: BaseRoute) -> str | None:
    return getattr(route, "path", None)


class JsonGate:
    """A state-changing request's body is JSON this app can serve, or a 422 before the app
    reads it: nested at most ``MAX_JSON_DEPTH`` levels, no lone surrogate (FastAPI would answer
    500 when a validation error echoes one). A body that is not JSON at all is left to FastAPI's
    own 4xx. Sits inside :class:`BodyLimit`, which has read the whole body already."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in STATE_CHANGING:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        problem = _body_problem(body)
        if problem is not None:
            answer = JSONResponse(status_code=422, content={"detail": problem})
            await answer(scope, receive, send)
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)


def _body_problem(body: bytes) -> str | None:
    if not body:
        return None
    try:
        value = json.loads(body)
    except RecursionError:
        return f"the body nests deeper than {MAX_JSON_DEPTH} levels; send flatter JSON"
    except ValueError:  # not JSON (or not UTF-8): FastAPI's own error says so
        return None
    return json_problem(value)


class _Server(uvicorn.Server):
    """uvicorn's server, cancelling every session's and request's work as shutdown begins
    (uvicorn would otherwise wait for a long reset or step to finish)."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        sessions = getattr(getattr(self.config.app, "state", None), "sessions", None)
        if isinstance(sessions, Sessions):
            sessions.stop()
        await super().shutdown(sockets)


def _config(app: FastAPI, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ws_max_size=MAX_MESSAGE_BYTES,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        http=protocol_class(),  # a late request head closes the connection
        log_level="warning",
        access_log=False,
    )


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    policy: SpecPolicy | None = None,
    allow_origins: Sequence[str] = (),
    *,
    max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> None:
    """Run the server in the foreground until interrupted (``gpumarket openenv``)."""
    app = create_market_app(
        max_sessions,
        policy,
        allow_origins,
        max_sessions_per_client=max_sessions_per_client,
        idle_timeout_s=idle_timeout_s,
    )
    _Server(_config(app, host, port)).run()


class OpenEnvServer:
    """The server on a free port of 127.0.0.1, in a background thread (tests, notebooks):

    ``with OpenEnvServer() as server: MarketEnvClient(base_url=server.url)``.
    """

    def __init__(
        self,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        policy: SpecPolicy | None = None,
        host: str = DEFAULT_HOST,
        allow_origins: Sequence[str] = (),
        *,
        max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        self.app = create_market_app(
            max_sessions,
            policy,
            allow_origins,
            max_sessions_per_client=max_sessions_per_client,
            idle_timeout_s=idle_timeout_s,
        )
        self.sessions: Sessions = self.app.state.sessions
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.host, self.port = self._socket.getsockname()[:2]
        self._server = _Server(_config(self.app, self.host, self.port))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> OpenEnvServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenEnv server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._socket.close()

    def __enter__(self) -> OpenEnvServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_SESSIONS_PER_CLIENT",
    "DEFAULT_PORT",
    "JsonGate",
    "MAX_MESSAGE_BYTES",
    "OpenEnvServer",
    "create_market_app",
    "serve",
]
