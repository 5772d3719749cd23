"""Served matches: one episode whose line-up has ``remote`` seats, played by clients over a wire.

A :class:`Match` holds a scenario, a seed and a line-up. Each seat is either an agent spec that the
server runs itself (built by :func:`agents.registry.make_agent`, as in a local run) or the word
``remote``: a seat that a client plays. Every remote seat gets a secret *seat token*
(:func:`secrets.token_urlsafe`, drawn from the operating system, never from the episode's seeded
streams, so a served episode is bit-identical to a local run with the same seed and decisions).

The rules of a remote seat's turn:

- the seat's *turn number* counts the decisions it was asked for (0, 1, 2, ...); the client reads
  the observation of the current turn and answers with an action carrying that turn number;
- an answer for any other turn (an old turn replayed, a guess at a future one) is refused and
  changes nothing; so is an action that does not parse or whose type is not legal in the phase;
- a seat that has not answered within ``turn_deadline`` seconds plays the runner's fallback action
  (:func:`market.run.rollout.fallback_action`), counted as a timeout in the episode's tallies, the
  seat's ``stats`` and the transcript step's ``agent_error``;
- a client that drops and comes back with the same token resumes at the current turn.

The episode itself is :func:`market.run.rollout.arun_episode` on the server's event loop, so the
transcript is the runner's: the same format, replayable with ``gpumarket replay``, and ended with
the ``aborted`` footer when the match is cancelled (the server shutting down).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.base import BaseAgent
from agents.llm.prompts import legal_action_schema
from agents.registry import AgentSpecError, make_agent, parse_spec, registered
from market.core.actions import ActionModel, ActionParseError, parse_action
from market.core.ledger import ActionError
from market.core.phases import check_turn
from market.core.seats import DESIGNER
from market.environment import Observation
from market.run.deadlines import AgentTimeout
from market.run.rollout import EpisodeResult, arun_episode, resolve_seats
from scenarios import builtin_names, load_scenario
from scenarios.schema import Scenario

#: the line-up word for a seat that a client plays
REMOTE = "remote"
#: the most a client may wait for its turn in one request (seconds)
MAX_WAIT_S = 30.0


class MatchError(Exception):
    """A request the match refuses: ``status`` is the HTTP status, the message says the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class PendingTurn:
    """The decision a remote seat owes now."""

    turn: int
    observation: Observation
    deadline_at: float  # time.monotonic() after which the seat falls back
    answer: asyncio.Future[ActionModel]


class RemoteSeat(BaseAgent):
    """The server-side stand-in for a seat that a client plays: its ``aact`` publishes the
    observation and waits for the client's action until the turn deadline, then raises
    :class:`~market.run.deadlines.AgentTimeout` (the runner then plays the fallback and counts
    the timeout)."""

    name = REMOTE
    roles = frozenset({"bidder", "designer"})

    def __init__(self, seat: str, turn_deadline: float) -> None:
        super().__init__()
        self.seat = seat
        self.turn_deadline = turn_deadline
        self.seat_seed: int | None = None
        self.turns = 0  # decisions asked so far; the next turn's number
        self.pending: PendingTurn | None = None
        self.changed = asyncio.Event()  # set whenever a turn starts or the match ends
        self.stats = {"decisions": 0.0, "answered": 0.0, "timeouts": 0.0}
        self.last_seen: float | None = None  # when the client last asked or answered

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.seat_seed = seed

    def act(self, observation: Observation) -> ActionModel:
        raise RuntimeError("a remote seat plays only in a served match (it has no act)")

    async def aact(self, observation: Observation) -> ActionModel:
        loop = asyncio.get_running_loop()
        turn = self.turns
        self.turns += 1
        self.stats["decisions"] += 1
        answer: asyncio.Future[ActionModel] = loop.create_future()
        self.pending = PendingTurn(turn, observation, time.monotonic() + self.turn_deadline, answer)
        self.wake()
        try:
            action = await asyncio.wait_for(answer, self.turn_deadline)
        except TimeoutError:
            self.stats["timeouts"] += 1
            raise AgentTimeout(
                f"remote seat {self.seat} sent no action for turn {turn} within "
                f"{self.turn_deadline:g} s"
            ) from None
        finally:
            self.pending = None
        self.stats["answered"] += 1
        return action

    def wake(self) -> None:
        """Wake every client waiting on this seat (a new turn, or the match ended)."""
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass
class MatchConfig:
    """What a match is created from (checked by :func:`check_lineup`)."""

    scenario: str
    seed: int
    seats: dict[str, str] = field(default_factory=dict)  # seat -> spec or "remote"
    turn_deadline: float = 30.0
    digest_every: int = 1


@functools.cache
def seatable(role: str) -> frozenset[str]:
    """The agent names an open server seats in a ``role`` seat (the registry's and plug-ins',
    read once: listing plug-ins scans every installed distribution)."""
    return frozenset(registered(role))


def check_spec(spec: str, role: str, allow_any: bool) -> None:
    """Refuse a server-run spec that is not a registered agent name (unless ``allow_any``): a
    ``py:`` spec imports code and an ``llm:`` or ``remote?url=`` spec makes the server call out,
    so an open server only seats its own registered agents."""
    if spec == REMOTE:
        return
    name, _ = parse_spec(spec)
    if not allow_any and name not in seatable(role):
        raise MatchError(
            422,
            f"seat spec {spec!r}: this server seats only 'remote' or a registered {role} agent "
            f"({', '.join(sorted(seatable(role)))}); start it with --allow-any-spec to allow "
            "others",
        )
    make_agent(spec, role)  # raises AgentSpecError with the reason


def check_lineup(config: MatchConfig, allow_any: bool = False) -> tuple[Scenario, dict[str, Any]]:
    """(scenario, seat -> spec) for ``config``, or :class:`MatchError` (422) saying what is wrong."""
    if config.scenario not in builtin_names():
        raise MatchError(
            422,
            f"unknown scenario {config.scenario!r}; use a built-in one: "
            f"{', '.join(builtin_names())}",
        )
    if not math.isfinite(config.turn_deadline) or not 0 < config.turn_deadline <= 3600:
        raise MatchError(422, "turn_deadline must be seconds in (0, 3600]")
    sc = load_scenario(config.scenario)
    try:
        specs = resolve_seats(sc, config.seats)
        for seat, spec in specs.items():
            check_spec(spec, "designer" if seat == DESIGNER else "bidder", allow_any)
    except (AgentSpecError, ValueError) as exc:
        raise MatchError(422, str(exc).splitlines()[0][:500]) from None
    if REMOTE not in specs.values():
        raise MatchError(422, "a served match needs at least one 'remote' seat in 'seats'")
    return sc, specs


class Match:
    """One served episode (see the module docstring). Create it inside the server's event loop,
    then :meth:`start` it."""

    def __init__(
        self,
        match_id: str,
        config: MatchConfig,
        transcript_dir: Path,
        allow_any_spec: bool = False,
    ) -> None:
        self.id = match_id
        self.config = config
        self.scenario, specs = check_lineup(config, allow_any_spec)
        self.remote = {
            seat: RemoteSeat(seat, config.turn_deadline)
            for seat, spec in specs.items()
            if spec == REMOTE
        }
        self.lineup: dict[str, Any] = {s: self.remote.get(s, spec) for s, spec in specs.items()}
        self.tokens = {seat: secrets.token_urlsafe(32) for seat in self.remote}
        # the creator's token: reads the transcript (every seat's actions and private state)
        self.owner_token = secrets.token_urlsafe(32)
        self.transcript = transcript_dir / f"{match_id}.jsonl"
        self.task: asyncio.Task[EpisodeResult] | None = None
        self.result: EpisodeResult | None = None
        self.error: str | None = None
        self.created = time.time()
        self.ended: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the episode as a task of the running event loop."""
        sc = self.scenario
        limit = sc.agent_timeout or None
        grace = self.config.turn_deadline + 5.0  # the runner's own limit must not cut in first
        agent_timeout = None if limit is None or limit >= grace else grace
        self.task = asyncio.create_task(
            arun_episode(
                sc,
                self.config.seed,
                self.lineup,
                agent_timeout=agent_timeout,
                transcript=self.transcript,
                digest_every=self.config.digest_every,
            )
        )
        self.task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[EpisodeResult]) -> None:
        self.ended = time.time()
        if task.cancelled():
            self.error = "cancelled (the server stopped)"
        elif task.exception() is not None:
            exc = task.exception()
            self.error = f"{type(exc).__name__}: {exc}"[:500]
        else:
            self.result = task.result()
        for seat in self.remote.values():
            seat.wake()

    async def cancel(self) -> None:
        """Stop the episode; its transcript ends with the ``aborted`` footer."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task  # the cancellation (or the episode's own error) ends it

    @property
    def status(self) -> str:
        if self.result is not None:
            return "done"
        if self.error is not None:
            return "aborted"
        return "running"

    # -- seats -------------------------------------------------------------------------------

    def seat_of(self, token: str | None) -> str:
        """The seat ``token`` authorises in this match, or :class:`MatchError` (401)."""
        if token:
            for seat, secret in self.tokens.items():
                if secrets.compare_digest(token.encode(), secret.encode()):
                    return seat
        raise MatchError(401, "missing or wrong seat token for this match")

    def check_owner(self, token: str | None) -> None:
        """:class:`MatchError` (401) unless ``token`` is the match's owner token."""
        if not token or not secrets.compare_digest(token.encode(), self.owner_token.encode()):
            raise MatchError(401, "missing or wrong owner token for this match")

    def seat_view(self, seat: str) -> dict[str, Any]:
        """What the seat's client may see now: its own observation when it is its turn."""
        box = self.remote[seat]
        box.last_seen = time.time()
        view: dict[str, Any] = {
            "match_id": self.id,
            "seat": seat,
            "status": self.status,
            "seat_seed": box.seat_seed,
            "turn_deadline_s": self.config.turn_deadline,
            "turn": box.turns,  # the next turn's number while it is not the seat's turn
            "timeouts": int(box.stats["timeouts"]),
        }
        pending = box.pending
        if pending is not None and not pending.answer.done() and self.status == "running":
            obs = pending.observation
            view.update(
                status="your_turn",
                turn=pending.turn,
                seconds_left=round(max(0.0, pending.deadline_at - time.monotonic()), 3),
                observation=obs.model_dump(mode="json"),
                prompt=obs.to_prompt(),
                legal_actions=list(obs.legal_actions),
                legal_action_schema=legal_action_schema(obs.legal_actions, seat == DESIGNER),
            )
        elif self.status == "running":
            view["status"] = "waiting"
        if self.result is not None:
            view["return"] = self.result.returns.get(seat)
        return view

    async def wait_view(self, seat: str, wait: float) -> dict[str, Any]:
        """:meth:`seat_view`, after waiting up to ``wait`` seconds for the seat's turn."""
        box = self.remote[seat]
        wait = min(max(wait, 0.0), MAX_WAIT_S)
        pending = box.pending
        if wait > 0 and self.status == "running" and (pending is None or pending.answer.done()):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(box.changed.wait(), wait)
        return self.seat_view(seat)

    def submit(self, seat: str, turn: int, raw: Any) -> dict[str, Any]:
        """Take the seat's action for ``turn``; :class:`MatchError` (4xx) changes nothing."""
        box = self.remote[seat]
        box.last_seen = time.time()
        if self.status != "running":
            raise MatchError(409, f"the match is {self.status}; no more actions are taken")
        pending = box.pending
        if pending is None or pending.answer.done():
            raise MatchError(
                409, f"it is not {seat}'s turn (next turn: {box.turns}); GET the seat first"
            )
        if turn != pending.turn:
            raise MatchError(
                409, f"turn {turn} is not the current turn {pending.turn}; GET the seat again"
            )
        try:
            action = parse_action(raw, designer=seat == DESIGNER)
            check_turn(action, seat, pending.observation.phase)
        except (ActionParseError, ActionError) as exc:
            raise MatchError(422, str(exc)[:500]) from None
        pending.answer.set_result(action)
        return {"accepted": True, "match_id": self.id, "seat": seat, "turn": turn}

    # -- public view -------------------------------------------------------------------------

    def public_view(self) -> dict[str, Any]:
        """What a spectator may see: the line-up, progress and, once done, the returns (no
        seat's observation or private state, and not the seed: with the scenario it would let
        anyone redraw every lab's private jobs and values)."""
        progress = read_progress(self.transcript)
        view: dict[str, Any] = {
            "match_id": self.id,
            "scenario": self.scenario.name,
            "status": self.status,
            "seats": {
                s: (REMOTE if isinstance(a, RemoteSeat) else str(a)) for s, a in self.lineup.items()
            },
            "waiting_for": [s for s, b in self.remote.items() if b.pending is not None],
            "timeouts": {s: int(b.stats["timeouts"]) for s, b in self.remote.items()},
            **progress,
        }
        if self.result is not None:
            view["returns"] = dict(self.result.returns)
        if self.error is not None:
            view["error"] = self.error
        return view


def read_progress(path: Path) -> dict[str, Any]:
    """Steps, round and phase so far, read from the transcript's last step record."""
    out: dict[str, Any] = {"steps": 0, "round": 0, "phase": None}
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            lines = fh.read().splitlines()
    except OSError:
        return out
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("type") == "step":
            out.update(steps=int(rec["i"]) + 1, round=rec.get("round"), phase=rec.get("phase"))
            break
    return out


class MatchRegistry:
    """The server's matches by id; finished ones are forgotten ``keep_s`` seconds after they end
    (their tokens then expire; the transcript files stay)."""

    def __init__(
        self,
        transcript_dir: Path,
        allow_any_spec: bool = False,
        keep_s: float = 3600.0,
        max_matches: int = 1000,
    ) -> None:
        self.dir = transcript_dir
        self.allow_any_spec = allow_any_spec
        self.keep_s = keep_s
        self.max_matches = max_matches
        self.matches: dict[str, Match] = {}

    def create(self, config: MatchConfig) -> Match:
        self.expire()
        running = sum(m.ended is None for m in self.matches.values())
        if running >= self.max_matches:
            raise MatchError(429, f"{running} matches are running (the limit); try again later")
        self.dir.mkdir(parents=True, exist_ok=True)
        match = Match(secrets.token_hex(8), config, self.dir, self.allow_any_spec)
        self.matches[match.id] = match
        match.start()
        return match

    def get(self, match_id: str) -> Match:
        self.expire()
        match = self.matches.get(match_id)
        if match is None:
            raise MatchError(404, f"no match {match_id!r} (unknown, or expired)")
        return match

    def expire(self) -> None:
        now = time.time()
        for mid in [
            k
            for k, m in self.matches.items()
            if m.ended is not None and now - m.ended > self.keep_s
        ]:
            del self.matches[mid]

    async def close(self) -> None:
        """Cancel every running match (each transcript ends with the ``aborted`` footer)."""
        await asyncio.gather(*(m.cancel() for m in self.matches.values()))
