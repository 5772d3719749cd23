"""The FastAPI side of the seed-compatible servers (``gpumarket serve --compat arena|daedalus``):
the app shell with the market's usual guards, the request helpers, and uvicorn to run it.

Trust model (docs/security.md, as for the other servers): the server binds 127.0.0.1 unless told
otherwise; :class:`~market.serve.guards.OriginGuard` refuses a state-changing request from a
browser page of another origin (403); :class:`~market.serve.guards.BodyLimit` refuses a body over
:data:`~market.serve.compat_sessions.MAX_BODY_BYTES` (413) before the app reads it;
:class:`~market.serve.openenv_app.JsonGate` refuses JSON nested too deep or holding a lone
surrogate (422). A client chooses only what the seed's own requests carry (a task and
difficulty, a seed, a number of agents, an episode length, its actions): never a scenario file,
an agent spec, code or a URL. Every error is one line, ``{"detail": ...}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from market.serve.compat_sessions import (
    MAX_BODY_BYTES,
    CompatError,
    Session,
    SessionTable,
    session_id_of,
)
from market.serve.guards import BodyLimit, OriginGuard
from market.serve.http_protocol import protocol_class
from market.serve.openenv_app import JsonGate

SHUTDOWN_GRACE_S = 10


def build_app(table: SessionTable, allow_origins: Sequence[str] = ()) -> FastAPI:
    """An empty app for ``table``'s sessions, with the guards and the one-line error handler;
    the caller adds its routes. On shutdown every open episode is closed (aborted footers)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        table.close_all()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.sessions = table

    async def refused(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status if isinstance(exc, CompatError) else 400
        return JSONResponse(status_code=status, content={"detail": " ".join(str(exc).split())})

    app.add_exception_handler(CompatError, refused)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:  # the liveness probe of the market's other servers
        return {"status": "ok"}

    app.add_middleware(JsonGate)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(OriginGuard, allowed_origins=tuple(allow_origins))  # outermost
    return app


async def json_body(request: Request, required: bool = True) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}`` unless ``required``), or
    :class:`CompatError` (422) saying what to send."""
    raw = await request.body()
    if not raw.strip():
        if required:
            raise CompatError("the body is empty; send a JSON object", 422)
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise CompatError("the body is not JSON; send a JSON object", 422) from None
    if not isinstance(value, dict):
        raise CompatError(f"the body is JSON {type(value).__name__}; send a JSON object", 422)
    return value


def client_of(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def requested_session(request: Request, body: dict[str, Any] | None) -> str | None:
    return session_id_of(
        {k.lower(): v for k, v in request.headers.items()},
        dict(request.query_params),
        dict(request.cookies),
        body,
    )


async def in_session(session: Session, work: Callable[[], Any]) -> Any:
    """Run ``work`` for ``session`` on a worker thread, one request of a session at a time."""
    async with session.lock:
        result = await asyncio.to_thread(work)
        session.last_seen = time.monotonic()
        return result


def _config(app: FastAPI, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        http=protocol_class(),  # a late request head closes the connection
        log_level="warning",
        access_log=False,
    )


def serve(app: FastAPI, host: str, port: int) -> None:
    """Run ``app`` in the foreground until interrupted."""
    uvicorn.Server(_config(app, host, port)).run()


class CompatServer:
    """``app`` on a free port of 127.0.0.1, in a background thread (tests, benches):
    ``with CompatServer(app) as server: httpx.get(server.url + "/health")``."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1") -> None:
        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.host, self.port = self._socket.getsockname()[:2]
        self._server = uvicorn.Server(_config(app, self.host, self.port))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> CompatServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the compat server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._socket.close()


__all__ = [
    "CompatServer",
    "build_app",
    "client_of",
    "in_session",
    "json_body",
    "requested_session",
    "serve",
]
