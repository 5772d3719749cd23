"""An agent service: any local agent spec behind the two requests of the ``remote`` agent
(``POST /reset``, ``POST /act``; see :mod:`agents.remote` and docs/remote-agents.md).

It is the reference implementation of the agent-service side of the protocol, and lets a run on
one machine seat an agent that lives on another: ``agent_app("rule_expert")`` served with uvicorn,
then ``--seat bidder_0=remote?url=http://HOST:PORT`` in the run.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from agents.registry import make_agent
from market.core.actions import parse_action
from market.environment import Observation


class ResetBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int | None = Field(default=None, ge=0)


class ActBody(BaseModel):
    model_config = ConfigDict(extra="ignore")  # prompt and legal_actions are for other agents
    observation: Observation


def agent_app(spec: str, role: str | None = None, token: str | None = None) -> FastAPI:
    """A FastAPI app playing one seat with the agent built from ``spec``; with ``token``, every
    request must carry ``Authorization: Bearer TOKEN`` (401 otherwise)."""
    agent = make_agent(spec, role)
    app = FastAPI(title=f"gpumarket agent service ({spec})")

    def check(authorization: str | None) -> None:
        if token is None:
            return
        given = (authorization or "").partition(" ")[2].strip()
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "missing or wrong bearer token")

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/reset")
    def reset(
        body: ResetBody, authorization: Annotated[str | None, Header(max_length=200)] = None
    ) -> dict[str, Any]:
        check(authorization)
        agent.reset(body.seed)
        return {"ok": True}

    @app.post("/act")
    def act(
        body: ActBody, authorization: Annotated[str | None, Header(max_length=200)] = None
    ) -> dict[str, Any]:
        check(authorization)
        action = agent.act(body.observation)
        if isinstance(action, dict):
            return {"action": action}
        return {"action": parse_action(action).model_dump(mode="json")}

    return app


def run(app: FastAPI, host: str = "127.0.0.1", port: int = 9000) -> None:
    """Serve ``app`` with uvicorn until interrupted (binds 127.0.0.1 unless told otherwise)."""
    uvicorn.run(app, host=host, port=port, log_level="warning")
