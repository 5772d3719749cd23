"""``gpumarket serve --compat daedalus``: the DAEDALUS designer env's HTTP contract, served by
this market's DAEDALUS family (scenarios ``daedalus_stage_0`` ... ``daedalus_stage_4``).

Routes (docs/compat.md has each request beside what happens here):

- ``POST /reset`` ``{session_id, n_agents, episode_length}`` (optional here: ``stage`` 0-4,
  default 0, and ``seed``; without one the server draws 63 fresh bits, recorded in the transcript
  and never returned) -> ``{"observation": ..., "session_id": ..., "reward": 0.0, "done":
  false}``: scenario ``daedalus_stage_<stage>`` with ``labs.count = n_agents`` (2-64) and
  ``rounds = episode_length x rounds_per_design`` (the family's five market rounds per design
  step; ``episode_length`` 1-20), the client in the designer seat, the bidders played by the
  stage's population;
- ``POST /step`` ``{session_id, action: <mechanism JSON>}`` -> ``{"observation", "reward",
  "done", "info"}``: the mechanism is the client's design for the next five market rounds (the
  AEC env reads it with :func:`market.core.actions.parse_action`, in the units the scenario
  family says); ``reward`` is what the designer seat earned over those rounds (the composite
  welfare x fairness x participation x stability of each), ``info.error`` why a mechanism was
  refused (the turn then passes with the previous mechanism and the invalid-action penalty);
- ``POST /api/design`` ``{round_number, episode_length, market_outcomes}`` ->
  ``{"mechanism": ...}``: no model is served here; the answer is the market's
  ``daedalus_robust`` designer's mechanism (the card's robust mechanism, in DAEDALUS units);
- ``GET /state?session_id=`` and ``GET /health``.

Observation (DAEDALUS's fields first): ``round_number`` (design steps played), ``episode_length``
(design steps in all), ``market_outcomes`` (one ``{welfare, fairness, participation, stability,
revenue, clearing_price}`` per market round cleared so far), then ``n_agents``, ``stage``,
``mechanism`` (the one in force, in credits) and ``suspected_cartels``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agents.population.designers import DAEDALUS_ROBUST
from market.core.seats import DESIGNER
from market.serve.compat_server import (
    build_app,
    client_of,
    in_session,
    json_body,
    requested_session,
)
from market.serve.compat_sessions import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_CLIENT,
    SESSION_COOKIE,
    CompatEpisode,
    CompatError,
    Session,
    SessionTable,
    Turn,
    check_seed,
)
from scenarios import load_scenario

STAGES = range(5)
N_AGENTS = (2, 64)
EPISODE_LENGTH = (1, 20)
RESET_KEYS = ("session_id", "n_agents", "episode_length", "stage", "seed")


def _int_in(body: dict[str, Any], key: str, default: int, bounds: tuple[int, int]) -> int:
    value = body.get(key, default)
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CompatError(f"{key} must be an integer in {low}..{high}, got {value!r}"[:160], 422)
    return value


def render(turn: Turn, stage: int, episode_length: int, per_design: int) -> dict[str, Any]:
    """The designer's observation in DAEDALUS's shape (see the module docstring)."""
    obs = turn.observation
    if obs is None:
        return {
            "round_number": episode_length,
            "episode_length": episode_length,
            "market_outcomes": [],
            "stage": stage,
            "done": True,
        }
    stats = obs.designer_stats
    outcomes = []
    if stats is not None:
        for k, welfare in enumerate(stats.welfare_ratio):

            def at(series: list[float], k: int = k) -> float | None:
                return series[k] if k < len(series) else None

            outcomes.append(
                {
                    "welfare": welfare,
                    "fairness": at(stats.fairness),
                    "participation": at(stats.participation),
                    "stability": at(stats.stability),
                    "revenue": at(stats.revenue),
                    "clearing_price": at(stats.prices),
                }
            )
    return {
        "round_number": min(obs.round // per_design, episode_length),
        "episode_length": episode_length,
        "market_outcomes": outcomes,
        "n_agents": len(obs.active_labs),
        "stage": stage,
        "mechanism": obs.mechanism.model_dump(mode="json"),
        "suspected_cartels": stats.suspected_cartels if stats is not None else 0,
        "done": turn.done,
    }


def create_daedalus_app(
    out_dir: Path,
    allow_origins: Sequence[str] = (),
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> FastAPI:
    """The DAEDALUS-compatible app; transcripts go to ``out_dir``."""
    table = SessionTable(out_dir, "daedalus", max_sessions, max_sessions_per_client, idle_timeout_s)
    app = build_app(table, allow_origins)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "env": "daedalus", "served_by": "gpumarket"}

    @app.post("/reset")
    async def reset(request: Request) -> JSONResponse:
        body = await json_body(request, required=False)
        unknown = sorted(set(body) - set(RESET_KEYS))
        if unknown:
            raise CompatError(
                f"unknown reset field(s) {', '.join(map(repr, unknown))}; send "
                f"{', '.join(RESET_KEYS)}",
                422,
            )
        n_agents = _int_in(body, "n_agents", 8, N_AGENTS)
        length = _int_in(body, "episode_length", 10, EPISODE_LENGTH)
        stage = _int_in(body, "stage", 0, (0, 4))
        seed = check_seed(body["seed"]) if "seed" in body else secrets.randbits(63)
        client = client_of(request)
        session_id = requested_session(request, body) or table.new_session_id()
        table.admit(client, session_id)
        base = load_scenario(f"daedalus_stage_{stage}")
        per_design = base.rounds_per_design
        scenario = load_scenario(
            f"daedalus_stage_{stage}", labs__count=n_agents, rounds=length * per_design
        )
        match_id, path = table.new_match()

        def start() -> CompatEpisode:
            return CompatEpisode(scenario, DESIGNER, seed, path, "daedalus_client")

        episode = await asyncio.to_thread(start)
        extra = {"stage": stage, "length": length, "per_design": per_design}
        table.put(Session(client, session_id, match_id, episode, extra))
        reply = JSONResponse(
            {
                "observation": render(episode.first, stage, length, per_design),
                "session_id": session_id,
                "match_id": match_id,
                "reward": 0.0,
                "done": episode.first.done,
            }
        )
        reply.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict")
        return reply

    @app.post("/step")
    async def step(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        unknown = sorted(set(body) - {"session_id", "action"})
        if unknown:
            raise CompatError(
                f"unknown step field(s) {', '.join(map(repr, unknown))}; send "
                '{"session_id": ..., "action": {<mechanism JSON>}}',
                422,
            )
        if not isinstance(body.get("action"), dict | str):
            raise CompatError(
                'step needs "action": a mechanism JSON object, e.g. {"auction_type": '
                '"second_price", "reserve_price": 0.18}',
                422,
            )
        session = table.get(client_of(request), requested_session(request, body))
        extra = session.extra

        def play() -> Turn:
            return session.episode.step(body["action"])

        turn = await in_session(session, play)
        return {
            "observation": render(turn, extra["stage"], extra["length"], extra["per_design"]),
            "reward": turn.reward,
            "done": turn.done,
            "info": {
                "error": turn.error,
                "components": turn.components,
                "episode_return": turn.episode_return,
                "match_id": session.match_id,
            },
        }

    @app.post("/api/design")
    async def design(request: Request) -> dict[str, Any]:
        await json_body(request, required=False)  # DAEDALUS's fields; the answer needs none
        return {
            "mechanism": dict(DAEDALUS_ROBUST),
            "designer": "daedalus_robust",
            "note": "no model is served here: the market's daedalus_robust designer answers",
        }

    @app.get("/state")
    async def state(request: Request) -> dict[str, Any]:
        session = table.get(client_of(request), requested_session(request, None))
        extra, turn = session.extra, session.episode.last
        return {
            "state": {
                "session_id": session.session_id,
                "match_id": session.match_id,
                "scenario": session.episode.env.scenario.name,
                "steps": session.episode.steps,
                "episode_return": turn.episode_return,
                "done": turn.done,
                **render(turn, extra["stage"], extra["length"], extra["per_design"]),
            }
        }

    return app


__all__ = ["create_daedalus_app", "render"]
