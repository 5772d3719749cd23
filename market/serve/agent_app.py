"""An agent service: any local agent spec behind the two requests of the ``remote`` agent
(``POST /reset``, ``POST /act``; see :mod:`agents.remote` and docs/remote-agents.md).

It is the reference implementation of the agent-service side of the protocol, and lets a run on
one machine seat an agent that lives on another: ``agent_app("rule_expert", token=T)`` served with
uvicorn, then ``--seat bidder_0=remote?url=http://HOST:PORT&token_env=VAR`` in the run.

The rules every request meets, in this order, before any of its body is read:

- with a ``token``, every request but ``GET /healthz`` must carry ``Authorization: Bearer TOKEN``;
  one without it (or with another) is answered 401 from its headers alone and the connection is
  closed, so an unauthenticated client never costs the service its body (:class:`~market.serve.guards.BearerGate`);
- a browser page of another origin may not post (:class:`~market.serve.guards.OriginGuard`);
- a body is read in full, at most :data:`MAX_BODY` bytes within
  :data:`~market.serve.guards.DEFAULT_BODY_TIMEOUT_S` seconds, before it is parsed: 413 for a
  larger one, chunked or not, 408 for one still arriving at the deadline
  (:class:`~market.serve.guards.BodyLimit`).

The service's title (shown by ``/docs``) names its spec with secrets masked.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from agents.registry import make_agent
from agents.specs_redact import redact_spec
from market.core.actions import parse_action
from market.environment import Observation
from market.serve.guards import DEFAULT_BODY_TIMEOUT_S, BearerGate, BodyLimit, OriginGuard, Scope
from market.serve.http_protocol import protocol_class

#: the largest request body the service reads (bytes): an ``/act`` request of the largest
#: built-in scenario is about 25 KB, so this leaves room for scenarios many times larger
MAX_BODY = 2 * 1024 * 1024
#: the routes that need no token (GET only): liveness, which says nothing about the agent
OPEN_ROUTES = frozenset({"/healthz"})


class ResetBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int | None = Field(default=None, ge=0)


class ActBody(BaseModel):
    model_config = ConfigDict(extra="ignore")  # prompt and legal_actions are for other agents
    observation: Observation


def _needs_token(scope: Scope) -> bool:
    return not (scope.get("method") == "GET" and scope.get("path") in OPEN_ROUTES)


def agent_app(
    spec: str,
    role: str | None = None,
    token: str | None = None,
    *,
    max_body: int = MAX_BODY,
    read_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> FastAPI:
    """A FastAPI app playing one seat with the agent built from ``spec``; with ``token``, every
    request but ``GET /healthz`` must carry ``Authorization: Bearer TOKEN`` (401 otherwise, before
    the body is read); bodies over ``max_body`` bytes get 413 (see the module docstring)."""
    agent = make_agent(spec, role)
    app = FastAPI(title=f"gpumarket agent service ({redact_spec(spec)})")

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/reset")
    def reset(body: ResetBody) -> dict[str, Any]:
        agent.reset(body.seed)
        return {"ok": True}

    @app.post("/act")
    def act(body: ActBody) -> dict[str, Any]:
        action = agent.act(body.observation)
        if isinstance(action, dict):
            return {"action": action}
        return {"action": parse_action(action).model_dump(mode="json")}

    # added last = outermost: the token first (headers only), then the origin, then the body
    app.add_middleware(BodyLimit, limit=max_body, read_timeout_s=read_timeout_s)
    app.add_middleware(OriginGuard)
    if token is not None:
        app.add_middleware(
            BearerGate,
            token=token,
            guarded=_needs_token,
            message="missing or wrong bearer token",
            key="detail",
        )
    return app


def run(app: FastAPI, host: str = "127.0.0.1", port: int = 9000) -> None:
    """Serve ``app`` with uvicorn until interrupted (binds 127.0.0.1 unless told otherwise)."""
    # a late request head closes the connection (market.serve.http_protocol)
    uvicorn.run(app, host=host, port=port, log_level="warning", http=protocol_class())
