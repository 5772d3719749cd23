"""``gpumarket serve --compat arena``: the GPU-arena's HTTP contract, served by this market.

Routes, as the arena serves them (docs/compat.md has each request beside what happens here):

- ``GET /health`` -> ``{"status": "ok", "benchmark_id": "gpu_budget_negotiation", ...}``;
- ``GET /tasks`` -> the arena's three task types, each at its three difficulties, with the
  scenario that plays it here (``{task_type}_{difficulty}``);
- ``POST /reset`` ``{task_type, difficulty, seed, judge_mode}`` -> ``{"observation": ...,
  "session_id": ...}``: a fresh episode of scenario ``{task_type}_{difficulty}`` (difficulty
  left out: the arena's default for the task, easy / medium / hard), seed ``seed`` (default 42,
  as the arena's), the client in ``bidder_0`` (the arena's ``lab_0``), every other seat played
  by the scenario's agents. ``judge_mode: "off"`` sets the judge pool's share to 0 (no pitch is
  judged), ``"rule"`` keeps the scenario's rule judge;
- ``POST /step`` with one arena action payload -> ``{"observation": ...}``;
- ``GET /state`` -> ``{"state": ...}``, the public part only (``include_private=true`` is 403:
  another lab's private state is never served).

Sessions: see :mod:`market.serve.compat_sessions` (never one global env: each client's reset
opens its own session, named by the ``gpumarket_session`` cookie the reply sets, the
``session_id`` it returns, or the client's own id).

**Observations in the arena's shape** (its ``GpuNegotiationObservation``; every field the arena
has, extra fields only where noted): ``reward`` is what the seat earned since its previous
turn, ``cumulative_reward`` its return so far, ``done`` whether its episode is over, all three
inside the observation as the arena puts them; ``reward_breakdown.normalized_reward`` is the
reward, ``invalid_action_penalty`` the invalid-action component, and the extra
``reward_breakdown.components`` every component of this market. Labs are ``lab_<i>`` for seat
``bidder_<i>``.

**Block ids** are the market's (:mod:`market.core.arena_payloads`), so a step's payload reaches
the parser unchanged (only ``session_id``, which names the session, is taken out): the client's
own blocks are ``b_0_<k>``, its ``k``-th block counting from the current round on in round
order (``owned_blocks``: one per block it holds for each coming round, ``reserved`` for the
reserved ones); a counterparty's blocks that an offer would move are the market's slot ids
``r<round>/lab_<j>/<k>`` (in the offer's ``offered_blocks`` / ``requested_blocks`` and in
``public_market.available_blocks``). Other labs' holdings are private in this market, so
``visible_labs[].owned_block_ids`` is empty.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from market.core.seats import is_bidder_seat, lab_index
from market.environment.observations import Observation, OfferView
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

BENCHMARK_ID = "gpu_budget_negotiation"
TASK_TYPES = ("single_trade", "market_round", "coalition_market")
DIFFICULTIES = ("easy", "medium", "hard")
#: the arena's difficulty when a reset names none
DEFAULT_DIFFICULTY = {"single_trade": "easy", "market_round": "medium", "coalition_market": "hard"}
JUDGE_MODES = ("off", "rule")
DEFAULT_SEED = 42  # the arena's ResetConfig default
CLIENT_SEAT = "bidder_0"  # the arena's lab_0
ACTION_KEYS = (
    "action_type",
    "target_lab_id",
    "offer_id",
    "coalition_id",
    "block_ids",
    "requested_block_ids",
    "job_id",
    "payment",
    "message",
    "conditions",
)
_OPEN = ("open", "active", "pending")


def lab_of(seat: str) -> str:
    """The arena's lab id of a bidder seat (``bidder_3`` -> ``lab_3``); other names as they are."""
    return f"lab_{lab_index(seat)}" if is_bidder_seat(seat) else seat


def _lab_index(seat: str) -> int:
    return lab_index(seat) if is_bidder_seat(seat) else -1


class ArenaView:
    """Renders the client's market observation in the arena's observation shape."""

    def __init__(self, task_type: str, difficulty: str, seed: int) -> None:
        self.task_type, self.difficulty, self.seed = task_type, difficulty, seed

    @property
    def task_id(self) -> str:
        return f"{self.task_type}-{self.seed}"

    def _block(
        self, block_id: str, rnd: int, owner: str, obs: Observation, status: str = "available"
    ) -> dict[str, Any]:
        return {
            "block_id": block_id,
            "start_round": rnd,
            "duration": 1,
            "gpu_count": 1,
            "reliability": obs.reliability,
            "energy_cost": obs.energy_floor,
            "owner_lab_id": owner,
            "reserved_by": "lab_0" if status == "reserved" else None,
            "allocated_to_job_id": None,
            "status": status,
        }

    def _own_blocks(self, obs: Observation) -> list[dict[str, Any]]:
        blocks, k = [], 0
        reserved = obs.reserved or []
        for offset, count in enumerate(obs.holdings or []):
            held = reserved[offset] if offset < len(reserved) else 0
            for j in range(count):
                status = "reserved" if j < held else "available"
                blocks.append(self._block(f"b_0_{k}", obs.round + offset, "lab_0", obs, status))
                k += 1
        return blocks

    @staticmethod
    def _ids(lab: int, rnd: int, n: int, obs: Observation) -> list[str]:
        """Ids of ``n`` of ``lab``'s blocks of round ``rnd``: the client's own as ``b_0_<k>``
        (slots it does not hold as ``r<round>/lab_0/<k>``), another lab's as slot ids."""
        if lab != 0:
            return [f"r{rnd}/lab_{lab}/{k}" for k in range(n)]
        holdings = obs.holdings or []
        offset = rnd - obs.round
        if not 0 <= offset < len(holdings):
            return [f"r{rnd}/lab_0/{k}" for k in range(n)]
        first, held = sum(holdings[:offset]), holdings[offset]
        return [f"b_0_{first + k}" if k < held else f"r{rnd}/lab_0/{k}" for k in range(n)]

    def _offer(
        self, offer: OfferView, obs: Observation, extra_blocks: list[dict[str, Any]]
    ) -> dict[str, Any]:
        sender, recipient = _lab_index(offer.sender), _lab_index(offer.recipient)
        if offer.side == "sell":
            offered = self._ids(sender, offer.delivery_round, offer.blocks, obs)
            requested: list[str] = []
            moved = [(sender, offer.delivery_round, offered)]
        else:
            requested = self._ids(recipient, offer.delivery_round, offer.blocks, obs)
            give_round = offer.give_round if offer.give_round is not None else obs.round
            offered = self._ids(sender, give_round, offer.give_blocks or 0, obs)
            moved = [(recipient, offer.delivery_round, requested), (sender, give_round, offered)]
        for lab, rnd, ids in moved:
            if lab != 0:
                extra_blocks += [self._block(b, rnd, f"lab_{lab}", obs) for b in ids]
        return {
            "offer_id": offer.offer_id,
            "from_lab_id": lab_of(offer.sender),
            "to_lab_id": lab_of(offer.recipient),
            "round_created": obs.round,
            "expires_round": offer.expires_round,
            "offered_blocks": offered,
            "requested_blocks": requested,
            "payment": offer.price,
            "message": offer.message,
            "conditions": {},
            "status": "active",
            "linked_offer_id": None,
            "side": offer.side,  # extra: the market's side of the sender
            "blocks": offer.blocks,  # extra: how many blocks
            "delivery_round": offer.delivery_round,  # extra
        }

    def render(self, turn: Turn) -> dict[str, Any]:
        obs = turn.observation
        if obs is None:  # the seat had no turn (left the market before its first)
            raise CompatError("the episode has no turn for lab_0; reset again", 500)
        owned = self._own_blocks(obs)
        extra: list[dict[str, Any]] = []
        offers = [
            self._offer(o, obs, extra)
            for o in [*(obs.offers_received or []), *(obs.offers_sent or [])]
            if o.status in _OPEN
        ]
        seen = {b["block_id"] for b in owned}
        available = owned + [b for b in extra if b["block_id"] not in seen]
        coalitions = {c.coalition_id: c for c in obs.public_coalitions}
        coalitions.update({c.coalition_id: c for c in obs.coalitions or []})
        active_coalitions: list[dict[str, Any]] = [
            {
                "coalition_id": c.coalition_id,
                "members": [lab_of(m) for m in c.members],
                "purpose": c.purpose,
                "commitments": {},
                "trust_score": 0.5,
                "round_created": obs.round,
                "expires_round": c.term_end,
                "breach_status": "none",
                "status": c.status,  # extra: the market's status of the coalition
                "invited": [lab_of(m) for m in c.invited],  # extra
            }
            for c in coalitions.values()
            if c.status in ("active", "open", "forming", "proposed")
        ]
        offer_count = Counter(
            lab for o in offers for lab in (o["from_lab_id"], o["to_lab_id"]) if lab != "lab_0"
        )
        visible = [
            {
                "lab_id": lab_of(seat),
                "public_name": lab_of(seat),
                "reputation": round(obs.reputations.get(seat, 0.5), 3),
                "public_budget_band": "medium",  # budgets are private here
                "public_demand": "medium",  # demand is private here
                "owned_block_ids": [],  # holdings are private here
                "active_offer_count": offer_count[lab_of(seat)],
                "coalition_ids": [
                    c["coalition_id"] for c in active_coalitions if lab_of(seat) in c["members"]
                ],
            }
            for seat in obs.active_labs
            if seat != obs.seat
        ]
        per_lab = obs.capacity / max(1, len(obs.active_labs))
        pressure = "low" if per_lab >= 2 else "medium" if per_lab >= 1 else "high"
        messages = [
            {
                "from_lab_id": lab_of(m.sender),
                "to_lab_id": (
                    None
                    if m.to == "all"
                    else lab_of(m.to if isinstance(m.to, str) else (m.to[0] if m.to else "all"))
                ),
                "round_index": m.round,
                "message": m.text[:500],
                "signal": "neutral",
            }
            for m in obs.messages[-20:]
        ]
        last = obs.last_action
        result = None
        if last is not None:
            code = (
                str((last.result or {}).get("code") or f"{last.action_type}_accepted")
                if last.accepted
                else "invalid_action"
            )
            result = {
                "ok": last.accepted,
                "code": code,
                "message": last.error or "accepted",
            }
        return {
            "task_id": self.task_id,
            "difficulty": self.difficulty,
            "round_index": obs.round,
            "max_rounds": obs.rounds_total,
            "controlled_lab_id": "lab_0",
            "controlled_lab_budget": round(obs.budget or 0.0, 2),
            "controlled_lab_reputation": round(obs.reputation or 0.0, 3),
            "private_jobs": [
                {
                    "job_id": j.job_id,
                    "gpu_hours_required": float(j.size - j.progress),
                    "deadline_round": j.deadline,
                    "base_value": j.value,
                    "urgency_multiplier": 1.0,
                    "min_reliability": j.min_reliability,
                    "partial_credit_allowed": j.partial_credit,
                    "private_notes": "",
                    "completed": j.status not in ("active", "open", "pending"),
                    "allocated_block_ids": [],
                    "status": j.status,  # extra: the market's job status
                }
                for j in obs.jobs or []
            ],
            "owned_blocks": owned,
            "public_market": {
                "available_blocks": available,
                "market_pressure": pressure,
                "shock_history": [f"{s.kind}@round{s.round}" for s in obs.shocks],
            },
            "visible_labs": visible,
            "active_offers": offers,
            "active_coalitions": active_coalitions,
            "message_history": messages,
            "last_action_result": result,
            "reward": turn.reward,
            "cumulative_reward": turn.episode_return,
            "reward_breakdown": {
                "job_utility_score": 0.0,
                "deal_quality_score": 0.0,
                "coalition_reliability_score": 0.0,
                "judge_argument_score": 0.0,
                "budget_efficiency_score": 0.0,
                "negotiation_efficiency_score": 0.0,
                "market_adaptation_score": 0.0,
                "invalid_action_penalty": turn.components.get("invalid_action", 0.0),
                "spam_penalty": 0.0,
                "breach_penalty": 0.0,
                "normalized_reward": turn.reward,
                "components": turn.components,  # extra: this market's reward components
            },
            "done": turn.done,
            "phase": obs.phase,  # extra: the market's phase (negotiation, bidding, ...)
            "legal_actions": obs.legal_actions,  # extra: the action types legal now
            "error": turn.error,  # extra: why the last action was refused, if it was
        }

    def public_state(self, session: Session) -> dict[str, Any]:
        turn = session.episode.last
        obs = turn.observation
        return {
            "task_id": self.task_id,
            "task_type": self.task_type,
            "difficulty": self.difficulty,
            "seed": self.seed,
            "round_index": obs.round if obs is not None else 0,
            "max_rounds": obs.rounds_total if obs is not None else 0,
            "controlled_lab_id": "lab_0",
            "cumulative_reward": turn.episode_return,
            "done": turn.done,
            "session_id": session.session_id,
            "match_id": session.match_id,
            "scenario": session.episode.env.scenario.name,
            "steps": session.episode.steps,
        }


def arena_action(body: dict[str, Any]) -> dict[str, Any]:
    """The step's arena payload as the parser gets it: unchanged but for ``session_id``, which
    names the session and is not part of the action."""
    return {k: v for k, v in body.items() if k != "session_id"}


def reset_config(body: dict[str, Any]) -> tuple[str, str, int, str]:
    """(task_type, difficulty, seed, judge_mode) of an arena reset, or :class:`CompatError`."""
    unknown = sorted(set(body) - {"task_type", "difficulty", "seed", "judge_mode", "session_id"})
    if unknown:
        raise CompatError(
            f"unknown reset field(s) {', '.join(map(repr, unknown))}; the arena's reset takes "
            "task_type, difficulty, seed, judge_mode (and session_id here)",
            422,
        )
    task = body.get("task_type", "single_trade")
    if task not in TASK_TYPES:
        raise CompatError(f"task_type {task!r} is not one of {', '.join(TASK_TYPES)}"[:200], 422)
    difficulty = body.get("difficulty") or DEFAULT_DIFFICULTY[task]
    if difficulty not in DIFFICULTIES:
        raise CompatError(
            f"difficulty {difficulty!r} is not one of {', '.join(DIFFICULTIES)} or null"[:200], 422
        )
    seed = check_seed(body.get("seed", DEFAULT_SEED))
    judge = body.get("judge_mode", "off")
    if judge not in JUDGE_MODES:
        raise CompatError(
            f"judge_mode {judge!r} is not one of {', '.join(JUDGE_MODES)} (the rule judge only: "
            "this server never calls a model)"[:200],
            422,
        )
    return task, difficulty, seed, judge


def create_arena_app(
    out_dir: Path,
    allow_origins: Sequence[str] = (),
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> FastAPI:
    """The arena-compatible app; transcripts go to ``out_dir`` (see the module docstring)."""
    table = SessionTable(out_dir, "arena", max_sessions, max_sessions_per_client, idle_timeout_s)
    app = build_app(table, allow_origins)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "benchmark_id": BENCHMARK_ID, "served_by": "gpumarket"}

    @app.get("/tasks")
    def tasks() -> dict[str, object]:
        return {
            "benchmark_id": BENCHMARK_ID,
            "tasks": [
                {
                    "task_type": t,
                    "difficulty": d,
                    "scenario": f"{t}_{d}",
                    "default": d == DEFAULT_DIFFICULTY[t],
                }
                for t in TASK_TYPES
                for d in DIFFICULTIES
            ],
            "features": ["coalitions", "optional_rule_judge", "redacted_public_state", "sessions"],
        }

    @app.post("/reset")
    async def reset(request: Request) -> JSONResponse:
        body = await json_body(request, required=False)
        task, difficulty, seed, judge = reset_config(body)
        client = client_of(request)
        session_id = requested_session(request, body) or table.new_session_id()
        table.admit(client, session_id)
        overrides: dict[str, Any] = {}
        if judge == "off":
            overrides["mechanism__judge_pool_share"] = 0.0
        scenario = load_scenario(f"{task}_{difficulty}", **overrides)
        match_id, path = table.new_match()
        view = ArenaView(task, difficulty, seed)

        def start() -> tuple[CompatEpisode, dict[str, Any]]:
            episode = CompatEpisode(scenario, CLIENT_SEAT, seed, path, "arena_client")
            return episode, view.render(episode.first)

        episode, observation = await asyncio.to_thread(start)
        session = Session(client, session_id, match_id, episode, {"view": view})
        table.put(session)
        reply = JSONResponse(
            {"observation": observation, "session_id": session_id, "match_id": match_id}
        )
        reply.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict")
        return reply

    @app.post("/step")
    async def step(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        session = table.get(client_of(request), requested_session(request, body))
        view: ArenaView = session.extra["view"]
        action = arena_action(body)

        def play() -> dict[str, Any]:
            return view.render(session.episode.step(action))

        return {"observation": await in_session(session, play)}

    @app.get("/state")
    async def state(request: Request, include_private: bool = False) -> dict[str, Any]:
        if include_private:
            raise CompatError(
                "private state is never served here (another lab's budget, jobs and holdings "
                "are private in this market); drop include_private",
                403,
            )
        session = table.get(client_of(request), requested_session(request, None))
        view: ArenaView = session.extra["view"]
        return {"state": view.public_state(session)}

    return app


__all__ = [
    "ArenaView",
    "CLIENT_SEAT",
    "DEFAULT_DIFFICULTY",
    "arena_action",
    "create_arena_app",
    "lab_of",
    "reset_config",
]
