"""What the two seed-compatible servers (:mod:`market.serve.compat_arena`,
:mod:`market.serve.compat_daedalus`) share: one episode with the client in one seat, recorded as
a transcript, and a table of sessions with limits.

**One episode per session, never one for the whole server.** A session is named by a session id:
the client's own (a ``session_id`` in the body or the query, or an ``X-Session-Id`` header), or
else the id the server makes at ``/reset`` (128 random bits), which it returns in the reply and
in a ``gpumarket_session`` cookie. Sessions are keyed by (client address, session id): a client
can reach only sessions opened from its own address, so two clients that both call their
session ``demo`` never share one. A reset under an id that already has a session ends that
session's episode (its transcript gets an ``aborted`` footer) and starts a fresh one.

**Limits.** At most ``max_sessions`` sessions at once and ``max_sessions_per_client`` per client
address. A session whose episode is over stays readable (``/state``) until its room is needed:
a reset at the limit first closes the least recently used finished session (the client's own
for its limit); with none to close it is refused (HTTP 503) with a one-line reason. A session none of whose requests
came for ``idle_timeout_s`` seconds is closed (its transcript ends ``aborted``) when the table is
next touched. A session's requests are served one at a time, each on a worker thread, so a long
step never blocks the other sessions.

**The episode** (:class:`CompatEpisode`) is :class:`market.run.rollout.Episode`, as
``run_episode`` plays it: the scenario's own agents in every other seat (a client never names
agents, files, URLs or code), the client's actions in its seat, parsed by the AEC env with
:func:`market.core.actions.parse_action` (a refused action costs the env's invalid-action
penalty and passes the turn, as everywhere). Every episode is written to a transcript in the
operator's folder, ``<match id>.jsonl``; once the client's seat is done the server plays the
other seats to the episode's end, so a finished transcript is whole and
``gpumarket replay FILE`` replays it bit for bit.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from market.environment.aec import raw_env
from market.environment.observations import Observation
from market.run.rollout import Episode
from scenarios import Scenario

DEFAULT_MAX_SESSIONS = 256
DEFAULT_MAX_SESSIONS_PER_CLIENT = 64
DEFAULT_IDLE_TIMEOUT_S = 900.0
MAX_BODY_BYTES = 64 * 1024  # an arena action is a few hundred bytes, a mechanism less
SESSION_COOKIE = "gpumarket_session"
SESSION_HEADER = "x-session-id"
_SESSION_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
SEED_LIMIT = 2**63  # a client's seed is an int in [0, 2**63)


class CompatError(ValueError):
    """A request the server cannot serve; ``status`` is the HTTP status, the message one line
    saying what to send instead."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_session_id(value: object, where: str) -> str:
    """A client's session id, or :class:`CompatError` saying what one looks like."""
    if not isinstance(value, str) or not _SESSION_ID.fullmatch(value):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise CompatError(
            f"{where}: session id {shown} is not 1-64 characters of letters, digits, '_', '.' "
            "or '-'; send such an id or none (the server makes one at /reset)"
        )
    return value


def check_seed(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise CompatError(f"seed must be an integer in [0, 2**63), got {value!r}"[:160])
    return value


class ClientSeat:
    """The client's seat in the episode: its actions come over HTTP, so the episode never asks
    it. The transcript names it ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, observation: object) -> object:
        raise RuntimeError("the compat client's actions come over HTTP")


@dataclass
class Turn:
    """The client's seat at its turn (or at its end, ``done``): its observation, the reward
    since its previous turn split in components, why its last action was refused (None when
    accepted) and its return so far."""

    observation: Observation | None
    reward: float
    components: dict[str, float]
    error: str | None
    info: dict[str, Any]
    done: bool
    episode_return: float


class CompatEpisode:
    """One episode of ``scenario`` with the client in ``seat`` (see the module docstring)."""

    def __init__(
        self,
        scenario: Scenario,
        seat: str,
        seed: int,
        transcript: Path,
        client_name: str,
    ) -> None:
        env = raw_env(scenario)
        if seat not in env.possible_agents:
            raise CompatError(f"seat {seat!r} is not a seat of {scenario.name!r}")
        self.env, self.seat, self.seed = env, seat, seed
        self.transcript = transcript
        self.episode = Episode(env, seed, {seat: ClientSeat(client_name)}, transcript, 1)
        self._turns: Iterator[tuple[str, Any, bool]] | None = self.episode.turns()
        self._pending: tuple[str, Any, bool] | None = None
        self.finished = False
        self.steps = 0
        self.first = self._advance()
        self.last = self.first

    def step(self, action: Any) -> Turn:
        """Play the client's action (a JSON object or text, as ``parse_action`` reads it), then
        the other seats until the client's next turn or its end."""
        if self._pending is None:
            return self.last
        seat, obs, live = self._pending
        self._pending = None
        self.episode.step(seat, obs, live, action, None, None)
        self.steps += 1
        self.last = self._advance()
        return self.last

    def close(self, why: str = "the session was closed") -> None:
        """End the episode: a finished one is already written, an unfinished one gets its
        ``aborted`` footer."""
        if not self.finished:
            self.finished = True
            self.episode.abort(RuntimeError(why))

    def _advance(self) -> Turn:
        assert self._turns is not None
        episode = self.episode
        for seat, obs, live in self._turns:
            if seat == self.seat:
                if live:
                    self._pending = (seat, obs, live)
                    return self._turn(obs, done=False)
                turn = self._turn(obs, done=True)
                episode.step(seat, obs, live, None, None, None)  # the dead seat's step
                self._drain()
                return turn
            action = error = latency = None
            if live:
                action, error, latency = episode.act(seat, obs)
            episode.step(seat, obs, live, action, latency, error)
        self._drain()
        return Turn(None, 0.0, {}, None, {}, True, self._return())

    def _drain(self) -> None:
        """The client's seat is done: play the others to the episode's end and write the
        transcript's footer, so that it replays whole."""
        assert self._turns is not None
        episode = self.episode
        for seat, obs, live in self._turns:
            action = error = latency = None
            if live and seat != self.seat:
                action, error, latency = episode.act(seat, obs)
            episode.step(seat, obs, live, action, latency, error)
        self._turns = None
        if not self.finished:
            self.finished = True
            episode.result()

    def _turn(self, obs: Observation, done: bool) -> Turn:
        _, reward, _, _, info = self.env.last()
        info = dict(info)
        components = {k: float(v) for k, v in dict(info.pop("reward_components", {})).items()}
        error = info.pop("error", None)
        return Turn(
            obs,
            float(reward),
            components,
            None if error is None else str(error),
            info,
            done,
            self._return(),
        )

    def _return(self) -> float:
        return float(self.episode.tally.returns.get(self.seat, 0.0))


@dataclass(eq=False)
class Session:
    """One client's session: its episode and what its protocol keeps between requests
    (``extra``)."""

    client: str
    session_id: str
    match_id: str
    episode: CompatEpisode
    extra: dict[str, Any] = field(default_factory=dict)
    last_seen: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SessionTable:
    """The server's sessions and their limits (see the module docstring)."""

    def __init__(
        self,
        out_dir: Path,
        kind: str,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1 or max_sessions_per_client < 1:
            raise ValueError("max_sessions and max_sessions_per_client must be at least 1")
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be above 0 seconds, got {idle_timeout_s}")
        self.out_dir = Path(out_dir)
        self.kind = kind
        self.max_sessions = max_sessions
        self.max_sessions_per_client = max_sessions_per_client
        self.idle_timeout_s = float(idle_timeout_s)
        self.clock = clock
        self._sessions: dict[tuple[str, str], Session] = {}
        self._per_client: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._sessions)

    def new_match(self) -> tuple[str, Path]:
        """A fresh match id and its transcript path in the operator's folder."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        match_id = f"{self.kind}-{uuid.uuid4().hex[:16]}"
        return match_id, self.out_dir / f"{match_id}.jsonl"

    @staticmethod
    def new_session_id() -> str:
        return secrets.token_urlsafe(16)

    def sweep(self) -> None:
        """Close the sessions idle past the timeout."""
        now = self.clock()
        for key, session in list(self._sessions.items()):
            if now - session.last_seen > self.idle_timeout_s and not session.lock.locked():
                self._drop(key, f"idle for more than {self.idle_timeout_s:g} s")

    def get(self, client: str, session_id: str | None) -> Session:
        """The client's session ``session_id``, or :class:`CompatError` saying to reset first."""
        self.sweep()
        session = None if session_id is None else self._sessions.get((client, session_id))
        if session is None:
            raise CompatError(
                "no session: POST /reset first, then send its session_id (body, query, "
                f"X-Session-Id header or the {SESSION_COOKIE} cookie) with every request"
                if session_id is None
                else f"no session {session_id!r} for this client (never opened, or closed after "
                f"{self.idle_timeout_s:g} s idle); POST /reset to start one",
                404 if session_id is not None else 400,
            )
        session.last_seen = self.clock()
        return session

    def admit(self, client: str, session_id: str) -> None:
        """Room for the client to open ``session_id`` (an existing one will be replaced), or
        :class:`CompatError` (503)."""
        self.sweep()
        if (client, session_id) in self._sessions:
            return
        if self._per_client[client] >= self.max_sessions_per_client:
            self._evict_finished(client)
        if len(self._sessions) >= self.max_sessions:
            self._evict_finished(None)
        if len(self._sessions) >= self.max_sessions:
            raise CompatError(
                f"server at capacity: {len(self._sessions)}/{self.max_sessions} sessions open; "
                "try again later",
                503,
            )
        if self._per_client[client] >= self.max_sessions_per_client:
            raise CompatError(
                f"this client ({client}) already holds {self._per_client[client]} sessions, the "
                "most one client may hold here; reuse one (reset it) or let one idle out",
                503,
            )

    def _evict_finished(self, client: str | None) -> None:
        """Make room: close the least recently used session whose episode is over (of
        ``client``, or of anyone when None)."""
        done = [
            (session.last_seen, key)
            for key, session in self._sessions.items()
            if session.episode.finished
            and not session.lock.locked()
            and (client is None or key[0] == client)
        ]
        if done:
            self._drop(min(done)[1], "its room was needed")

    def put(self, session: Session) -> None:
        key = (session.client, session.session_id)
        if key in self._sessions:
            self._drop(key, "reset by its client")
        self._sessions[key] = session
        self._per_client[session.client] += 1

    def close_all(self) -> None:
        for key in list(self._sessions):
            self._drop(key, "the server stopped")

    def _drop(self, key: tuple[str, str], why: str) -> None:
        session = self._sessions.pop(key)
        self._per_client[session.client] -= 1
        if self._per_client[session.client] <= 0:
            del self._per_client[session.client]
        session.episode.close(why)


def session_id_of(
    headers: Mapping[str, str],
    query: Mapping[str, str],
    cookies: Mapping[str, str],
    body: Mapping[str, Any] | None,
) -> str | None:
    """The session id a request names: body ``session_id``, else the query's, else the
    ``X-Session-Id`` header, else the cookie; None when it names none."""
    for where, value in (
        ("session_id", None if body is None else body.get("session_id")),
        ("?session_id", query.get("session_id")),
        ("X-Session-Id", headers.get(SESSION_HEADER)),
        (SESSION_COOKIE, cookies.get(SESSION_COOKIE)),
    ):
        if value is not None:
            return check_session_id(value, where)
    return None


__all__ = [
    "ClientSeat",
    "CompatEpisode",
    "CompatError",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_SESSIONS_PER_CLIENT",
    "MAX_BODY_BYTES",
    "SESSION_COOKIE",
    "Session",
    "SessionTable",
    "check_seed",
    "check_session_id",
    "session_id_of",
]
