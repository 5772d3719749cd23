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
- an action taken is answered ``received``: the env judges it when it plays it, and the seat's
  next view carries the verdict (``last_action``) with its ``guide`` (:mod:`.seat_guide_view`);
- a seat that has not answered within ``turn_deadline`` seconds plays the runner's fallback action
  (:func:`market.run.rollout.fallback_action`), counted as a timeout in the episode's tallies, the
  seat's ``stats`` and the transcript step's ``agent_error``;
- a client that drops and comes back with the same token resumes at the current turn.

The episode itself is :func:`market.run.rollout.arun_episode`, so the transcript is the runner's:
the same format, replayable with ``gpumarket replay``, and ended with the ``aborted`` footer when
the match is cancelled (its creator cancels it, it runs past the server's limits, or the server
shuts down). Its env steps, their recording and the server's own scripted agents run on the
registry's worker threads, never on the event loop: a heavy match does not stall other clients'
requests; only the remote seats' waits (and agents with their own ``aact``) live on the loop.

Secrets: the episode seed is the creator's, or 128 bits from the operating system when none is
given; it is shown to nobody but the transcript's reader (the creator). A remote seat's
``seat_seed`` is a keyed BLAKE2b of the seat seed a local run would use, under a per-match key
(:func:`secrets.token_bytes`) that never leaves the server, so it tells nothing about the episode
seed, even a small one (a local run's seat seeds could be matched against every small seed).

Limits (each a :class:`MatchRegistry` argument and a ``gpumarket serve`` flag): matches running
at once, in all and per client address; a match's wall time; and how long its remote seats may
all stay silent (no request with their tokens) before it is ended. Nothing survives a restart:
matches live in the server's memory, and stopping the server ends each running one with the
``aborted`` footer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import math
import secrets
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.base import BaseAgent
from agents.llm.prompts import legal_action_schema
from agents.registry import AgentSpecError, make_agent
from agents.spec_policy import SpecPolicy
from agents.specs_redact import redact_spec
from market.core.actions import ActionModel, ActionParseError, parse_action
from market.core.ledger import ActionError
from market.core.phases import check_turn
from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER
from market.environment import Observation
from market.record.reader import read_progress
from market.run.deadlines import AgentTimeout
from market.run.rollout import EpisodeResult, arun_episode, resolve_seats
from market.serve.seat_guide_view import SeatGuide
from scenarios import builtin_names, load_scenario

#: the line-up word for a seat that a client plays
REMOTE = "remote"
#: the most a client may wait for its turn in one request (seconds)
MAX_WAIT_S = 30.0
#: a seed drawn by the server when the creator gives none: this many bits from the OS
SEED_BITS = 128
#: defaults of ``gpumarket serve``'s limits (docs/remote-agents.md names them)
MAX_MATCHES = 1000  # running at once, all clients together (--max-matches)
MAX_MATCHES_PER_CLIENT = 64  # running at once per client address (--max-matches-per-client)
MAX_MATCH_S = 6 * 3600.0  # a match's wall time (--max-match-time)
IDLE_S = 900.0  # every remote seat silent this long ends the match (--idle-timeout)
MAX_ENDED = 10_000  # ended matches kept reachable; the oldest are forgotten first
EXPIRE_EVERY_S = 0.5  # ended matches are looked for at most this often (besides at creation)
#: threads that play the matches' env steps and server-run agents (all matches share them)
MATCH_WORKERS = 4


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
    view: dict[str, Any]  # the turn's part of the seat's view, drawn once off the event loop


class RemoteSeat(BaseAgent):
    """The server-side stand-in for a seat that a client plays: its ``aact`` publishes the
    observation and waits for the client's action until the turn deadline, then raises
    :class:`~market.run.deadlines.AgentTimeout` (the runner then plays the fallback and counts
    the timeout)."""

    name = REMOTE
    roles = frozenset({"bidder", "designer"})

    def __init__(
        self, seat: str, turn_deadline: float, seed_key: bytes, transcript: Path | None = None
    ) -> None:
        super().__init__()
        self.seat = seat
        self.guide = SeatGuide(seat, transcript)  # what its view tells a person, turn by turn
        self.turn_deadline = turn_deadline
        self._seed_key = seed_key  # the match's secret: never shown, never written
        self.seat_seed: int | None = None  # the seed the client is shown (shown_seat_seed)
        self.turns = 0  # decisions asked so far; the next turn's number
        self.pending: PendingTurn | None = None
        self.changed = asyncio.Event()  # set whenever a turn starts or the match ends
        self.stats = {"decisions": 0.0, "answered": 0.0, "timeouts": 0.0}
        self.last_seen: float | None = None  # when the client last asked or answered

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.seat_seed = None if seed is None else shown_seat_seed(seed, self._seed_key)

    def act(self, observation: Observation) -> ActionModel:
        raise RuntimeError("a remote seat plays only in a served match (it has no act)")

    async def aact(self, observation: Observation) -> ActionModel:
        loop = asyncio.get_running_loop()
        turn = self.turns
        self.turns += 1
        self.stats["decisions"] += 1
        answer: asyncio.Future[ActionModel] = loop.create_future()
        # the env is idle while this seat is asked: its observation is drawn on a thread once,
        # not on the loop at every poll (a large market's prompt takes milliseconds)
        view = await asyncio.to_thread(turn_view, observation, self.seat == DESIGNER, self.guide)
        self.pending = PendingTurn(
            turn, observation, time.monotonic() + self.turn_deadline, answer, view
        )
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


def turn_view(obs: Observation, designer: bool, guide: SeatGuide | None = None) -> dict[str, Any]:
    """What a seat's view adds on its turn: its observation, prompt, legal actions and ``guide``
    (:mod:`market.serve.seat_guide_view`: the verdict on its last action, the story since, the
    actions valid now, the screen; ``guide`` is called once per turn, in order)."""
    return {
        "observation": obs.model_dump(mode="json"),
        "prompt": obs.to_prompt(),
        "legal_actions": list(obs.legal_actions),
        "legal_action_schema": legal_action_schema(obs.legal_actions, designer),
        "guide": None if guide is None else guide.view(obs),
    }


def shown_seat_seed(seat_seed: int, key: bytes) -> int:
    """The ``seat_seed`` a remote seat is shown: a keyed BLAKE2b of the seat seed a local run
    gives it, under the match's secret ``key``, in the same 32-bit range. Without the key it
    cannot be matched against the seat seeds of candidate episode seeds, so it reveals nothing
    of the episode seed."""
    digest = hashlib.blake2b(
        seat_seed.to_bytes(16, "big"), key=key, digest_size=4, person=b"gpumarket-seat"
    ).digest()
    return int.from_bytes(digest, "big")


@dataclass
class MatchConfig:
    """What a match is created from (checked by :func:`check_lineup`); ``seed`` None: the server
    draws one (:data:`SEED_BITS` bits from the OS)."""

    scenario: str
    seed: int | None = None
    seats: dict[str, str] = field(default_factory=dict)  # seat -> spec or "remote"
    turn_deadline: float = 30.0
    digest_every: int = 1


def check_spec(spec: str, role: str, policy: SpecPolicy) -> None:
    """Refuse a server-run spec named by a client unless ``policy`` allows it (read from the
    spec's text, before anything is imported or called: :mod:`agents.spec_policy`), then build
    it once so that a bad spec is this request's error."""
    if spec == REMOTE:
        return
    policy.check(spec, role)
    make_agent(spec, role)  # raises AgentSpecError with the reason


def check_lineup(
    config: MatchConfig, policy: SpecPolicy | None = None
) -> tuple[Scenario, dict[str, Any]]:
    """(scenario, seat -> spec) for ``config``, or :class:`MatchError` (422) saying what is wrong.
    The client's seats are checked against ``policy`` (default: built-in agents only); the
    scenario's own default seats come from the server's built-in file."""
    policy = policy or SpecPolicy()
    if config.scenario not in builtin_names():
        raise MatchError(
            422,
            f"unknown scenario {config.scenario!r}; use a built-in one: "
            f"{', '.join(builtin_names())}",
        )
    if not math.isfinite(config.turn_deadline) or not 0 < config.turn_deadline <= 3600:
        raise MatchError(422, "turn_deadline must be seconds in (0, 3600]")
    try:
        for seat, spec in config.seats.items():
            if isinstance(spec, str):
                check_spec(spec, "designer" if seat == DESIGNER else "bidder", policy)
        sc = load_scenario(config.scenario)
        specs = resolve_seats(sc, config.seats)
        for seat, spec in specs.items():
            if seat not in config.seats:
                make_agent(spec, "designer" if seat == DESIGNER else "bidder")
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
        policy: SpecPolicy | None = None,
        *,
        client: str = "",
        executor: Executor | None = None,
        lineup: tuple[Scenario, dict[str, Any]] | None = None,
    ) -> None:
        self.id = match_id
        self.config = config
        self.client = client  # the creator's address: per-client limits count by it
        self.executor = executor  # where the env and the server's agents run (None: the loop)
        self.seed = config.seed if config.seed is not None else secrets.randbits(SEED_BITS)
        self.scenario, specs = lineup if lineup is not None else check_lineup(config, policy)
        seed_key = secrets.token_bytes(32)  # keys the seat seeds shown: never leaves the server
        self.transcript = transcript_dir / f"{match_id}.jsonl"
        self.remote = {
            seat: RemoteSeat(seat, config.turn_deadline, seed_key, self.transcript)
            for seat, spec in specs.items()
            if spec == REMOTE
        }
        self.lineup: dict[str, Any] = {s: self.remote.get(s, spec) for s, spec in specs.items()}
        self.tokens = {seat: secrets.token_urlsafe(32) for seat in self.remote}
        # the creator's token: reads the transcript (every seat's actions and private state)
        self.owner_token = secrets.token_urlsafe(32)
        self.task: asyncio.Task[EpisodeResult] | None = None
        self.result: EpisodeResult | None = None
        self.error: str | None = None
        self.created = time.time()
        self.ended: float | None = None
        self.stop_reason: str | None = None  # why cancel() stopped it; None: the server stopped

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
                self.seed,
                self.lineup,
                agent_timeout=agent_timeout,
                transcript=self.transcript,
                digest_every=self.config.digest_every,
                executor=self.executor,
            )
        )
        self.task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[EpisodeResult]) -> None:
        self.ended = time.time()
        if task.cancelled():
            self.error = self.stop_reason or "cancelled (the server stopped)"
        elif task.exception() is not None:
            exc = task.exception()
            self.error = f"{type(exc).__name__}: {exc}"[:500]
        else:
            self.result = task.result()
        for seat in self.remote.values():
            seat.wake()

    async def cancel(self, reason: str | None = None) -> None:
        """Stop the episode (``reason``: what its ``error`` will say); its transcript ends with
        the ``aborted`` footer."""
        if self.task is not None and not self.task.done():
            self.stop_reason = self.stop_reason or reason
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

    def silent_s(self, now: float) -> float:
        """Seconds since any remote seat's client was last heard from (or the match began)."""
        heard = [b.last_seen for b in self.remote.values() if b.last_seen is not None]
        return now - max([self.created, *heard])

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
            view.update(
                status="your_turn",
                turn=pending.turn,
                seconds_left=round(max(0.0, pending.deadline_at - time.monotonic()), 3),
                **pending.view,
            )
        elif self.status == "running":
            view["status"] = "waiting"
        if self.result is not None:
            view.update({"return": self.result.returns.get(seat), "guide": box.guide.final()})
        elif self.error is not None and self.error.startswith("cancelled"):
            view["error"] = self.error  # the server's own words (a failure's text may be private)
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
        # received, not yet judged: the env's verdict is the next turn's guide.last_action
        return {"received": True, "match_id": self.id, "seat": seat, "turn": turn}

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
            "seats": {  # a spec's token (remote?url=...&token=) shown as token=***
                s: (REMOTE if isinstance(a, RemoteSeat) else redact_spec(str(a)))
                for s, a in self.lineup.items()
            },
            "waiting_for": [s for s, b in self.remote.items() if b.pending is not None],
            "timeouts": {s: int(b.stats["timeouts"]) for s, b in self.remote.items()},
            **progress,
        }
        if self.result is not None:
            view["returns"] = dict(self.result.returns)
        if self.error is not None:  # a cancellation as it is; a failure by its exception type
            # only: its text may quote a seat's private state (the owner's transcript has it)
            kind = self.error.split(":", 1)[0].strip()
            view["error"] = (
                self.error
                if self.error.startswith("cancelled")
                else f"the episode failed ({kind[:80]})"
                if kind.isidentifier()
                else "the episode failed"
            )
        return view


class MatchRegistry:
    """The server's matches by id; finished ones are forgotten ``keep_s`` seconds after they end
    (their tokens then expire; the transcript files stay), or sooner, oldest first, once more
    than ``max_ended`` have ended.

    Limits: ``max_matches`` running at once in all and ``max_per_client`` per client address
    (0: no per-client limit), so no one client can fill the server; a running match is ended
    (``aborted``) once it has run ``max_match_s`` seconds, or once none of its remote seats'
    clients has been heard from for ``idle_s`` seconds. Every match's env steps and server-run
    agents play on ``workers`` shared threads, off the event loop."""

    def __init__(
        self,
        transcript_dir: Path,
        policy: SpecPolicy | None = None,
        keep_s: float = 3600.0,
        max_matches: int = MAX_MATCHES,
        *,
        max_per_client: int = MAX_MATCHES_PER_CLIENT,
        max_match_s: float = MAX_MATCH_S,
        idle_s: float = IDLE_S,
        max_ended: int = MAX_ENDED,
        workers: int = MATCH_WORKERS,
    ) -> None:
        self.dir = transcript_dir
        self.policy = policy or SpecPolicy()
        self.keep_s = keep_s
        self.max_matches = max_matches
        self.max_per_client = max_per_client
        self.max_match_s = max_match_s
        self.idle_s = idle_s
        self.max_ended = max_ended
        self.matches: dict[str, Match] = {}
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="gpumarket-match")
        self._reaper: asyncio.Task[None] | None = None
        self._expired_at = -math.inf

    def _check_room(self, client: str) -> None:
        self.expire(force=True)
        running = [m for m in self.matches.values() if m.ended is None]
        if len(running) >= self.max_matches:
            raise MatchError(
                429, f"{len(running)} matches are running (the server's limit); try again later"
            )
        mine = sum(m.client == client for m in running)
        if self.max_per_client and mine >= self.max_per_client:
            raise MatchError(
                429,
                f"you have {mine} matches running (the limit per client); let one end, or "
                "cancel one with DELETE /matches/{id} and its owner token",
            )

    def create(
        self,
        config: MatchConfig,
        client: str = "",
        lineup: tuple[Scenario, dict[str, Any]] | None = None,
    ) -> Match:
        """Create and start a match for ``client`` (an address), within the limits (429 past
        them). Call it on the server's event loop."""
        self._check_room(client)
        self.dir.mkdir(parents=True, exist_ok=True)
        match = Match(
            secrets.token_hex(8),
            config,
            self.dir,
            self.policy,
            client=client,
            executor=self.executor,
            lineup=lineup,
        )
        self.matches[match.id] = match
        match.start()
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_forever())
        return match

    async def acreate(self, config: MatchConfig, client: str = "") -> Match:
        """:meth:`create`, its line-up checked (agents built, scenario read) on a worker thread."""
        self._check_room(client)  # refuse early, before any work
        loop = asyncio.get_running_loop()
        lineup = await loop.run_in_executor(self.executor, check_lineup, config, self.policy)
        return self.create(config, client, lineup)  # checks the room again: others came meanwhile

    def get(self, match_id: str) -> Match:
        self.expire()
        match = self.matches.get(match_id)
        if match is None:
            raise MatchError(
                404,
                f"no match {match_id!r}: unknown, expired (ended matches are kept "
                f"{self.keep_s:g} s), or ended by a server restart (matches do not survive one)",
            )
        return match

    def expire(self, force: bool = False) -> None:
        """Forget the ended matches past ``keep_s``, and the oldest past ``max_ended``. It scans
        every match, so a request runs it at most every :data:`EXPIRE_EVERY_S` seconds."""
        now = time.time()
        if not force and now - self._expired_at < EXPIRE_EVERY_S:
            return
        self._expired_at = now
        ended = [(m.ended, k) for k, m in self.matches.items() if m.ended is not None]
        gone = {k for when, k in ended if now - when > self.keep_s}
        over = len(ended) - len(gone) - self.max_ended
        if over > 0:
            gone.update(k for _, k in heapq.nsmallest(over, (e for e in ended if e[1] not in gone)))
        for mid in gone:
            del self.matches[mid]

    async def reap(self) -> None:
        """End every running match past its wall time or whose remote seats are all silent."""
        now = time.time()
        doomed = []
        for m in list(self.matches.values()):
            if m.ended is not None:
                continue
            if now - m.created > self.max_match_s:
                doomed.append(
                    m.cancel(f"cancelled: ran past the server's {self.max_match_s:g} s limit")
                )
            elif m.silent_s(now) > self.idle_s:
                doomed.append(
                    m.cancel(f"cancelled: no remote seat was heard from for {self.idle_s:g} s")
                )
        await asyncio.gather(*doomed)
        self.expire(force=True)

    async def _reap_forever(self) -> None:
        pause = max(0.05, min(5.0, self.idle_s / 4, self.max_match_s / 4))
        while True:
            await asyncio.sleep(pause)
            await self.reap()

    async def close(self) -> None:
        """Cancel every running match (each transcript ends with the ``aborted`` footer)."""
        if self._reaper is not None:
            self._reaper.cancel()
        await asyncio.gather(*(m.cancel() for m in self.matches.values()))
        self.executor.shutdown(wait=False, cancel_futures=True)
