"""The HTTP API of served matches (FastAPI), and :func:`serve`, which runs it with uvicorn.

Endpoints (JSON; the protocol for agent authors is docs/remote-agents.md):

- ``POST /matches``: create a match from a scenario, a seed (optional: 128 bits from the OS when
  none is given) and a line-up; the answer holds one seat token per ``remote`` seat and the owner
  token (shown once). With a creator token configured (:func:`create_app`'s ``create_token``),
  only ``Authorization: Bearer CREATE_TOKEN`` may create, checked before the body is read;
- ``DELETE /matches/{id}`` with the owner token: cancel the match (its transcript ends with the
  ``aborted`` footer, its seats see ``aborted``);
- ``GET /matches/{id}/seat?wait=S`` with ``Authorization: Bearer TOKEN``: the token's seat, and its
  observation (structured and ``to_prompt`` text), legal-action JSON schema and ``guide`` (the
  verdict on its last action, the story since, the actions valid now:
  :mod:`~market.serve.seat_guide_view`) when it is its turn; waits up to ``S`` seconds (at most
  30) for the turn;
- ``POST /matches/{id}/seat/action`` with the token: ``{"turn": N, "action": {...}}``, answered
  ``received`` (the env's verdict comes in the seat's next view);
- ``GET /matches/{id}``: the spectators' view (public only); ``GET /matches/{id}/live``: the live
  view page, fed by ``GET /matches/{id}/live/events`` (server-sent events; public only); ``GET /matches/{id}/transcript``
  with the owner token (the match's creator's): the transcript once the match has ended.

The rules every endpoint keeps: a token authorises exactly its own seat of its own match; no
endpoint shows a seat's observation to anyone but that seat's token holder; request bodies are
limited to ``max_body`` bytes and text fields in length, and a body holding a lone UTF-16
surrogate (``"\\ud800"``, which no transcript can store) is refused; a malformed or refused
request gets a 4xx answer ``{"error": "..."}`` and changes nothing. Matches running at once are
limited in all and per client address, and each in wall time and silence
(:class:`~market.serve.matches.MatchRegistry`). Matches live in memory: a restart ends them
(SIGTERM and Ctrl-C write each running one's ``aborted`` footer), and their ids are then unknown.
The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from agents.spec_policy import SpecPolicy
from market.core.trust import lone_surrogate
from market.serve import human_page
from market.serve.guards import DEFAULT_BODY_TIMEOUT_S, BearerGate, BodyLimit, OriginGuard, Scope
from market.serve.http_protocol import protocol_class
from market.serve.live_view import live_router
from market.serve.matches import (
    IDLE_S,
    MAX_MATCH_S,
    MAX_MATCHES,
    MAX_MATCHES_PER_CLIENT,
    SEED_BITS,
    MatchConfig,
    MatchError,
    MatchRegistry,
)

MAX_BODY = 64 * 1024
MatchId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{16}$", description="the match id")]
SeatName = Annotated[str, Field(min_length=1, max_length=64)]
SeatSpec = Annotated[str, Field(min_length=1, max_length=300)]


class NoSurrogates(BaseModel):
    """A request body that refuses lone surrogates anywhere (422 before any field is read)."""

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogate(cls, data: Any) -> Any:
        if lone_surrogate(data) is not None:
            raise ValueError(
                "the body holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape); "
                "send valid Unicode text"
            )
        return data


class CreateMatch(NoSurrogates):
    """A match to create: a built-in scenario, a seed and the seats that differ from the
    scenario's defaults (``remote`` for a seat played by a client)."""

    model_config = ConfigDict(extra="forbid")
    scenario: str = Field(min_length=1, max_length=64)
    seed: int | None = Field(
        default=None,
        ge=0,
        le=2**SEED_BITS - 1,
        description="the episode seed; none: the server draws 128 bits from the OS",
    )
    seats: dict[SeatName, SeatSpec] = Field(max_length=512)
    turn_deadline: float = Field(default=30.0, gt=0, le=3600)
    digest_every: int = Field(default=1, ge=1, le=1000)


class SeatAction(NoSurrogates):
    """A seat's action for one turn (the turn number the seat's view gave)."""

    model_config = ConfigDict(extra="forbid")
    turn: int = Field(ge=0, le=10**9)
    action: dict[str, Any]


def _token(authorization: str | None) -> str | None:
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _printable(text: str) -> str:
    """``text`` safe to send as UTF-8: a lone surrogate becomes its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


NEEDS_CREATE_TOKEN = (
    "creating a match on this server needs its creator token: send "
    "'Authorization: Bearer TOKEN' (the server's operator has it)"
)


def _creating(scope: Scope) -> bool:
    return scope.get("method") == "POST" and scope.get("path", "").rstrip("/") == "/matches"


def _validation_message(exc: RequestValidationError) -> tuple[str, list[dict[str, str]]]:
    details = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        kind = err.get("type", "")
        msg = "unknown field" if kind == "extra_forbidden" else str(err.get("msg", "invalid"))
        details.append({"at": _printable(loc[:200]), "problem": _printable(msg[:300])})
    first = details[0] if details else {"at": "request", "problem": "invalid"}
    return f"invalid request: {first['at']}: {first['problem']}", details


def create_app(
    transcript_dir: str | Path = "runs/served",
    *,
    policy: SpecPolicy | None = None,
    keep_s: float = 3600.0,
    max_matches: int = MAX_MATCHES,
    max_body: int = MAX_BODY,
    allow_origins: Sequence[str] = (),
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    create_token: str | None = None,
    max_matches_per_client: int = MAX_MATCHES_PER_CLIENT,
    max_match_s: float = MAX_MATCH_S,
    idle_s: float = IDLE_S,
) -> FastAPI:
    """The served-matches app; transcripts go to ``<transcript_dir>/<match id>.jsonl``.

    ``policy``: which agent specs a client may seat on the server (default: ``remote`` and the
    built-in agents; :mod:`agents.spec_policy`). ``allow_origins``: browser origins besides the
    server's own that may drive it (:class:`~market.serve.guards.OriginGuard`). A request body
    is at most ``max_body`` bytes, all there within ``body_timeout_s`` (413 / 408 otherwise).
    ``keep_s``: how long an ended match (and its tokens) stays reachable.

    ``create_token``: if set, creating a match needs it as a bearer token. Limits
    (:class:`~market.serve.matches.MatchRegistry`): ``max_matches`` running in all,
    ``max_matches_per_client`` per client address (0: none), ``max_match_s`` seconds of wall
    time per match, and ``idle_s`` seconds of silence from all of a match's remote seats."""
    registry = MatchRegistry(
        Path(transcript_dir),
        policy,
        keep_s,
        max_matches,
        max_per_client=max_matches_per_client,
        max_match_s=max_match_s,
        idle_s=idle_s,
    )

    gate = create_token.encode() if create_token else None

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
        return JSONResponse({"error": _printable(exc.message)}, exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, details = _validation_message(exc)
        return JSONResponse({"error": _printable(message), "details": details}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": _printable(str(exc.detail))}, exc.status_code)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """Liveness and the number of matches held."""
        return {"ok": True, "matches": len(registry.matches)}

    @app.post("/matches", status_code=201)
    async def create(
        body: CreateMatch,
        request: Request,
        authorization: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        """Create and start a match; answers its id and one secret token per remote seat. With
        a creator token set on the server, send it as ``Authorization: Bearer TOKEN``."""
        given = (_token(authorization) or "").encode()
        if gate is not None and not secrets.compare_digest(given, gate):  # BearerGate did too
            raise MatchError(401, NEEDS_CREATE_TOKEN)
        config = MatchConfig(
            body.scenario, body.seed, dict(body.seats), body.turn_deadline, body.digest_every
        )
        client = request.client.host if request.client is not None else ""
        match = await registry.acreate(config, client)
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

    @app.delete("/matches/{match_id}")
    async def cancel(
        match_id: MatchId,
        authorization: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        """Cancel a running match (owner token): its transcript ends with the aborted footer."""
        match = registry.get(match_id)
        match.check_owner(_token(authorization))
        if match.ended is not None:
            raise MatchError(409, f"the match has already ended ({match.status})")
        await match.cancel("cancelled by its creator")
        return match.public_view()

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
    app.add_middleware(BodyLimit, limit=max_body, read_timeout_s=body_timeout_s)
    if create_token:  # checked before the body is read
        app.add_middleware(
            BearerGate, token=create_token, guarded=_creating, message=NEEDS_CREATE_TOKEN
        )
    app.add_middleware(OriginGuard, allowed_origins=tuple(allow_origins))  # outermost
    return app


def serve(
    host: str = "127.0.0.1",
    port: int = 8765,
    transcript_dir: str | Path = "runs/served",
    *,
    policy: SpecPolicy | None = None,
    keep_s: float = 3600.0,
    allow_origins: Sequence[str] = (),
    log_level: str = "warning",
    **limits: Any,
) -> None:
    """Run the served-matches app with uvicorn until interrupted (Ctrl-C or SIGTERM end every
    running match with the aborted footer). ``limits``: :func:`create_app`'s ``create_token``,
    ``max_matches``, ``max_matches_per_client``, ``max_match_s`` and ``idle_s``."""
    app = create_app(
        transcript_dir, policy=policy, keep_s=keep_s, allow_origins=allow_origins, **limits
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=2,
        http=protocol_class(),  # a late request head closes the connection
    )
    uvicorn.Server(config).run()
