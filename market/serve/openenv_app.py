"""The OpenEnv server of the market: OpenEnv's own FastAPI app around
:class:`~market.serve.openenv_env.MarketEnvironment`, and uvicorn to run it.

Every WebSocket connection (``/ws``, what :class:`~market.serve.openenv_client.MarketEnvClient`
uses) is one session with its own environment: its own AEC env, agents and random streams, on its
own worker thread, up to ``max_sessions`` at once (one more is refused with OpenEnv's
``CAPACITY_REACHED`` error). OpenEnv's HTTP ``/reset`` and ``/step`` are stateless (a fresh env per
request), as OpenEnv defines them: a session needs the WebSocket. The protocol, its messages and
its errors are OpenEnv's; this module only configures them.

Safety: the server binds 127.0.0.1 unless told otherwise; a WebSocket message and an HTTP request
body are each at most ``MAX_MESSAGE_BYTES`` (a larger body gets 413 before it is read); a bad reset option is a 400 over HTTP and an ``EXECUTION_ERROR`` message
over the WebSocket, with the same one-line reason; the line-up may not name LLM seats unless the
server allows it (they would make the server call the URLs they name).
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openenv.core.env_server.http_server import create_fastapi_app

from market.serve.match_app import BodyLimit
from market.serve.openenv_env import (
    MarketAction,
    MarketEnvironment,
    MarketObservation,
    MarketState,
    SessionError,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_SESSIONS = 64
MAX_MESSAGE_BYTES = 1 << 20  # one WebSocket message (an action is a few hundred bytes)


def create_market_app(
    max_sessions: int = DEFAULT_MAX_SESSIONS, allow_llm_lineup: bool = False
) -> FastAPI:
    """OpenEnv's FastAPI app serving the market (simulation mode: reset, step, state, schema,
    health, metadata and the ``/ws`` sessions)."""
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
    factory = functools.partial(MarketEnvironment, allow_llm_lineup=allow_llm_lineup)
    app = create_fastapi_app(
        factory,
        MarketAction,
        MarketObservation,
        max_concurrent_envs=max_sessions,
        env_name="gpumarket",
        state_cls=MarketState,
        mode="simulation",
    )

    async def session_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    app.add_exception_handler(SessionError, session_error)
    app.add_middleware(BodyLimit, limit=MAX_MESSAGE_BYTES)
    return app


def _config(app: FastAPI, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ws_max_size=MAX_MESSAGE_BYTES,
        log_level="warning",
        access_log=False,
    )


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    allow_llm_lineup: bool = False,
) -> None:
    """Run the server in the foreground until interrupted (``gpumarket openenv``)."""
    app = create_market_app(max_sessions, allow_llm_lineup)
    uvicorn.Server(_config(app, host, port)).run()


class OpenEnvServer:
    """The server on a free port of 127.0.0.1, in a background thread (tests, notebooks):

    ``with OpenEnvServer() as server: MarketEnvClient(base_url=server.url)``.
    """

    def __init__(
        self,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        allow_llm_lineup: bool = False,
        host: str = DEFAULT_HOST,
    ) -> None:
        self.app = create_market_app(max_sessions, allow_llm_lineup)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.host, self.port = self._socket.getsockname()[:2]
        self._server = uvicorn.Server(_config(self.app, self.host, self.port))
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
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_PORT",
    "MAX_MESSAGE_BYTES",
    "OpenEnvServer",
    "create_market_app",
    "serve",
]
