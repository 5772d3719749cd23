"""The HTTP API of served matches (FastAPI), and :func:`serve`, which runs it with uvicorn.

Endpoints (JSON; the protocol for agent authors is docs/remote-agents.md):

- ``POST /matches``: create a match from a scenario, a seed and a line-up; the answer holds one
  seat token per ``remote`` seat (shown once);
- ``GET /matches/{id}/seat?wait=S`` with ``Authorization: Bearer TOKEN``: the token's seat, and its
  observation (structured and ``to_prompt`` text) and legal-action JSON schema when it is its
  turn; waits up to ``S`` seconds (at most 30) for the turn;
- ``POST /matches/{id}/seat/action`` with the token: ``{"turn": N, "action": {...}}``;
- ``GET /matches/{id}``: the spectators' view (public only); ``GET /matches/{id}/live``: the live
  view page, fed by ``GET /matches/{id}/live/events`` (server-sent events; public only); ``GET /matches/{id}/transcript``
  with the owner token (the match's creator's): the transcript once the match has ended.

The rules every endpoint keeps: a token authorises exactly its own seat of its own match; no
endpoint shows a seat's observation to anyone but that seat's token holder; request bodies are
limited to ``max_body`` bytes and text fields in length; a malformed or refused request gets a 4xx
answer ``{"error": "..."}`` and changes nothing. The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from market.serve import human_page
from market.serve.live_view import live_router
from market.serve.matches import MatchConfig, MatchError, MatchRegistry

MAX_BODY = 64 * 1024
MatchId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{16}$", description="the match id")]
SeatName = Annotated[str, Field(min_length=1, max_length=64)]
SeatSpec = Annotated[str, Field(min_length=1, max_length=300)]

ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


class CreateMatch(BaseModel):
    """A match to create: a built-in scenario, a seed and the seats that differ from the
    scenario's defaults (``remote`` for a seat played by a client)."""

    model_config = ConfigDict(extra="forbid")
    scenario: str = Field(min_length=1, max_length=64)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    seats: dict[SeatName, SeatSpec] = Field(max_length=512)
    turn_deadline: float = Field(default=30.0, gt=0, le=3600)
    digest_every: int = Field(default=1, ge=1, le=1000)


class SeatAction(BaseModel):
    """A seat's action for one turn (the turn number the seat's view gave)."""

    model_config = ConfigDict(extra="forbid")
    turn: int = Field(ge=0, le=10**9)
    action: dict[str, Any]


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 before the app reads it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(send)
            return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = b'{"error":"request body too large (limit %d bytes)"}' % self.limit
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def _token(authorization: str | None) -> str | None:
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _validation_message(exc: RequestValidationError) -> tuple[str, list[dict[str, str]]]:
    details = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        kind = err.get("type", "")
        msg = "unknown field" if kind == "extra_forbidden" else str(err.get("msg", "invalid"))
        details.append({"at": loc[:200], "problem": msg[:300]})
    first = details[0] if details else {"at": "request", "problem": "invalid"}
    return f"invalid request: {first['at']}: {first['problem']}", details


def create_app(
    transcript_dir: str | Path = "runs/served",
    *,
    allow_any_spec: bool = False,
    keep_s: float = 3600.0,
    max_matches: int = 1000,
    max_body: int = MAX_BODY,
) -> FastAPI:
    """The served-matches app; transcripts go to ``<transcript_dir>/<match id>.jsonl``.

    ``allow_any_spec``: let a match seat any agent spec on the server (``py:``, ``llm:``, remote
    URLs); off, only ``remote`` and registered agent names. ``keep_s``: how long an ended match
    (and its tokens) stays reachable."""
    registry = MatchRegistry(Path(transcript_dir), allow_any_spec, keep_s, max_matches)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await registry.close()  # running matches end with the aborted footer

    app = FastAPI(
        title="gpumarket served matches",
        version="1",
        lifespan=lifespan,
        description=__doc__,
    )
    app.state.registry = registry

    @app.exception_handler(MatchError)
    async def match_error(request: Request, exc: MatchError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"error": exc.message}, exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, details = _validation_message(exc)
        return JSONResponse({"error": message, "details": details}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, exc.status_code)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """Liveness and the number of matches held."""
        return {"ok": True, "matches": len(registry.matches)}

    @app.post("/matches", status_code=201)
    async def create(body: CreateMatch) -> dict[str, Any]:
        """Create and start a match; answers its id and one secret token per remote seat."""
        config = MatchConfig(
            body.scenario, body.seed, dict(body.seats), body.turn_deadline, body.digest_every
        )
        match = registry.create(config)
        return {
            "match_id": match.id,
            "tokens": dict(match.tokens),
            "owner_token": match.owner_token,
            "seats": match.public_view()["seats"],
            "turn_deadline": config.turn_deadline,
            "live_url": f"/matches/{match.id}/live",  # the live view (market.serve.live_view)
        }

    @app.get("/matches/{match_id}")
    async def spectate(match_id: MatchId) -> dict[str, Any]:
        """The public view of a match: line-up, progress, timeouts, returns once done."""
        return registry.get(match_id).public_view()

    @app.get("/matches/{match_id}/seat")
    async def seat(
        match_id: MatchId,
        wait: Annotated[float, Query(ge=0, le=30)] = 0.0,
        authorization: Annotated[str | None, Header(max_length=200)] = None,
    ) -> JSONResponse:
        """The token's seat: its observation, prompt and legal-action schema on its turn."""
        match = registry.get(match_id)
        name = match.seat_of(_token(authorization))
        # already plain JSON data: a JSONResponse skips re-encoding the observation
        return JSONResponse(await match.wait_view(name, wait))

    @app.post("/matches/{match_id}/seat/action")
    async def act(
        match_id: MatchId,
        body: SeatAction,
        authorization: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        """The token's seat's action for its current turn."""
        match = registry.get(match_id)
        name = match.seat_of(_token(authorization))
        return match.submit(name, body.turn, body.action)

    @app.get("/matches/{match_id}/transcript")
    async def transcript(
        match_id: MatchId,
        authorization: Annotated[str | None, Header(max_length=200)] = None,
    ) -> Response:
        """The match's transcript (JSON lines), once it has ended; it holds every seat's actions
        and private state, so only the owner token (the creator's) reads it."""
        match = registry.get(match_id)
        match.check_owner(_token(authorization))
        if match.ended is None:
            raise MatchError(409, "the match is still running; the transcript comes when it ends")
        return Response(match.transcript.read_bytes(), media_type="application/x-ndjson")

    app.include_router(live_router(registry))  # the live match view: page and event stream
    app.include_router(human_page.router)  # the browser human seat: /matches/{id}/play
    app.add_middleware(BodyLimit, limit=max_body)
    return app


def serve(
    host: str = "127.0.0.1",
    port: int = 8765,
    transcript_dir: str | Path = "runs/served",
    *,
    allow_any_spec: bool = False,
    keep_s: float = 3600.0,
    log_level: str = "warning",
) -> None:
    """Run the served-matches app with uvicorn until interrupted (Ctrl-C or SIGTERM end every
    running match with the aborted footer)."""
    app = create_app(transcript_dir, allow_any_spec=allow_any_spec, keep_s=keep_s)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=2
    )
    uvicorn.Server(config).run()
