"""The market as an OpenEnv environment: one learner seat per session, the other seats played
by the server.

A session is reset with ``scenario`` (a built-in name, :func:`scenarios.builtin_names`: never a
file of the server), ``overrides`` (scenario keys to change, as ``market.env(name, **overrides)``
takes them), ``seat`` (the learner's seat, e.g. ``bidder_0`` or ``designer_0``), ``seed`` (an int
below ``2**128``; None draws 128 bits of fresh entropy, never revealed) and ``lineup`` (seat ->
agent spec as :func:`agents.registry.make_agent` takes it, for any of the other seats; the rest
play the scenario's default agents). The env then drives the episode exactly as
:func:`market.run.rollout.run_episode` does (its :class:`~market.run.rollout.Episode`: the same
agents, seat seeds, time limits and fallbacks) until it is the learner's turn, and returns the
learner's observation.

``step`` takes one action of the market's action models (:mod:`market.core.actions`) as a JSON
object or JSON text in :class:`MarketAction`'s ``action`` field. The AEC env parses it with
:func:`market.core.actions.parse_action` and applies it; the other seats play on until the
learner's next turn (or its seat's end). The rule for a rejected action is the env's own: the
market is not changed, the seat pays ``invalid_action_penalty`` (reward component
``invalid_action``), its turn passes as a ``wait`` would, and ``error`` says what was wrong and how
to fix it. A payload that is not a :class:`MarketAction` at all (unknown fields, a missing
``action``) is refused by the server's message checks (:mod:`market.serve.openenv_sessions`)
before the env sees it: nothing changes, no penalty.

Rewards: every observation's ``reward`` is what the learner's seat earned since its previous
turn (PettingZoo's ``env.last()``), with ``reward_components`` splitting it; the first one (from
``reset``) covers the steps before the learner's first turn. Their sum over an episode is the
seat's return in a local :func:`~market.run.rollout.run_episode` with the same scenario, seed,
line-up and actions, bit for bit.

What the learner sees is the seat's own :class:`~market.environment.observations.Observation`
(structured, and as ``to_prompt()`` text): never another lab's private state, never the seed.

What one reset may cost is bounded before anything is built: the scenario, with its overrides, is
checked against :data:`EPISODE_MAXIMA` (labs, rounds, turns, jobs, blocks, shocks), its default
agents against the operator's allow-list as a line-up's are (an ``agents`` override is a line-up
too), and its judges must be the rule judges (an LLM judge would make the server call out).
:meth:`MarketEnvironment.cancel` (the session's client left, the server is stopping) ends the
work of a reset or step at the next seat's turn with :class:`SessionCancelled`.
"""

from __future__ import annotations

import math
import secrets
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field, JsonValue
from pydantic_core import to_jsonable_python

from agents.registry import AgentSpecError, make_agent
from agents.spec_policy import SpecPolicy
from market.core.seats import DESIGNER
from market.environment.aec import raw_env
from market.environment.observations import Observation as SeatObservation
from market.run.rollout import Episode, default_seats
from market.version import __version__
from scenarios import Scenario, ScenarioError, builtin_names, load_scenario

DEFAULT_SCENARIO = "market_round"
DEFAULT_SEAT = "bidder_0"
RESET_OPTIONS = ("scenario", "seat", "seed", "lineup", "overrides", "episode_id")
MAX_OVERRIDES = 32  # keys in one reset's scenario overrides
MAX_EPISODE_ID = 200  # characters of a client's own episode label
SEED_BITS = 128  # a client's seed is below 2**128; a reset without one draws this many bits
#: the most a scenario (with a client's overrides) may ask for, checked before the env is built:
#: key (as docs/scenarios.md writes it) -> maximum. A range's high end counts, a list its length.
#: Every built-in scenario fits (large_market sets labs.count and capacity.blocks); a step's cost
#: grows with the labs (each plays its turns), a reset's with rounds x labs x arrival_rate.
EPISODE_MAXIMA: dict[str, float] = {
    "labs.count": 300,
    "labs.entrants": 32,
    "labs.jobs": 20,
    "labs.endowment": 100,
    "labs.endowment_rounds": 100,
    "rounds": 100,
    "negotiation_turns": 10,
    "jobs.arrival_rate": 2.0,
    "capacity.blocks": 2000,
    "capacity.max_units_per_bid": 2000,
    "shocks": 64,
    "agent_timeout": 120.0,  # seconds a server seat may take per decision (0, no limit, refused)
}
RULE_JUDGE = "rule"


class SessionError(ValueError):
    """A request this session cannot serve; the message says what to send instead."""


class SessionCancelled(RuntimeError):
    """The session's work was stopped: its client left or the server is stopping."""


class MarketAction(Action):  # type: ignore[misc]  # openenv ships no type information
    """One action of the learner's seat: ``{"action": {"action_type": "wait"}}``.

    ``action`` is an action of :mod:`market.core.actions` as a JSON object (or JSON text), the
    same JSON an LLM seat replies with (schema: ``market.core.actions.action_json_schema()``).
    """

    action: dict[str, JsonValue] | str = Field(
        description="one market action as a JSON object or JSON text, e.g. "
        '{"action_type": "bid", "bids": [12.5]}; see market.core.actions'
    )


class MarketObservation(Observation):  # type: ignore[misc]
    """The learner's view at its turn (or at its seat's end, ``done=True``).

    ``observation`` is the seat's observation model as JSON (rebuild it with
    :meth:`seat_observation`), ``prompt`` its ``to_prompt()`` text. ``reward`` is what the seat
    earned since its previous turn, split in ``reward_components``; ``error`` is why the env
    rejected the last action (None when it was accepted); ``info`` is the rest of the env's info
    for the seat (round, phase, action, result).
    """

    seat: str = ""
    observation: dict[str, Any] | None = None
    prompt: str = ""
    reward_components: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    episode_return: float = 0.0

    def seat_observation(self) -> SeatObservation | None:
        """The structured observation as the market's model (what agents ``act`` on)."""
        if self.observation is None:
            return None
        return SeatObservation.model_validate(self.observation)


class MarketState(State):  # type: ignore[misc]
    """The session's public bookkeeping (never the seed)."""

    scenario: str | None = None
    seat: str | None = None
    lineup: dict[str, str] = Field(default_factory=dict)
    overrides: dict[str, Any] = Field(default_factory=dict)
    round: int = 0
    phase: str = ""
    done: bool = False
    episode_return: float = 0.0
    invalid_actions: int = 0
    # the server's seats that failed this episode (counts only): an agent that raised
    # ("errors"), ran past the time limit ("timeouts") or fell back on an unusable LLM reply
    # ("fallbacks"); each such turn played the fallback action
    degraded: dict[str, dict[str, int]] = Field(default_factory=dict)


class _Learner:
    """The learner's seat in the :class:`~market.run.rollout.Episode`: its actions come from
    the OpenEnv client, so the episode never asks it."""

    name = "openenv"

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, observation: object) -> object:
        raise RuntimeError("the OpenEnv learner's actions come from the client")


class MarketEnvironment(Environment[MarketAction, MarketObservation, MarketState]):  # type: ignore[misc]
    """The GPU market for one learner seat (see the module docstring).

    ``policy``: the agent specs a client's line-up may name (default: the built-in agents only;
    a spec that loads code or makes the server call out needs the operator's allow-list,
    :mod:`agents.spec_policy`).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session builds its own env, agents and streams

    def __init__(self, policy: SpecPolicy | None = None) -> None:
        super().__init__()
        self.policy = policy or SpecPolicy()
        self.market: raw_env | None = None  # the AEC env of the current episode (read-only)
        self._episode: Episode | None = None
        self._turns: Iterator[tuple[str, Any, bool]] | None = None
        self._seat = ""
        self._pending: tuple[str, Any, bool] | None = None
        self._state = MarketState()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop this env's work (thread-safe): a reset or step in progress raises
        :class:`SessionCancelled` at the next seat's turn, and so does every later call."""
        self._cancelled.set()

    def _check_cancelled(self) -> None:
        if self._cancelled.is_set():
            raise SessionCancelled("the session was closed; its work stopped")

    # --- OpenEnv surface -----------------------------------------------------------------
    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        scenario: str = DEFAULT_SCENARIO,
        seat: str = DEFAULT_SEAT,
        lineup: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        **unknown: Any,
    ) -> MarketObservation:
        """Start an episode with the learner in ``seat``; return its first observation."""
        if unknown:
            raise SessionError(
                f"unknown reset option(s) {', '.join(map(repr, sorted(unknown)))}; "
                f"use {', '.join(RESET_OPTIONS)}"
            )
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**SEED_BITS
        ):
            raise SessionError(
                f"seed must be a non-negative integer below 2**{SEED_BITS} or null, "
                f"got {short_repr(seed)}"
            )
        if episode_id is not None and (
            not isinstance(episode_id, str) or len(episode_id) > MAX_EPISODE_ID
        ):
            raise SessionError(
                f"episode_id must be a string of at most {MAX_EPISODE_ID} characters or null, "
                f"got {short_repr(episode_id)}"
            )
        self._check_cancelled()
        sc = self._scenario(scenario, overrides)
        env = raw_env(sc)
        seats = self._lineup(env, seat, lineup)
        self._check_defaults(sc, seat, seats)
        if seed is None:  # 128 bits of fresh entropy, never revealed (not guessable by search)
            seed = secrets.randbits(SEED_BITS)
        self._check_cancelled()
        self.close()
        self.market, self._seat = env, seat
        self._episode = Episode(env, seed, {**seats, seat: _Learner()}, None, 1)
        self._turns = self._episode.turns()
        self._state = MarketState(
            episode_id=episode_id or uuid.uuid4().hex,
            scenario=sc.name,
            seat=seat,
            lineup={s: str(v) for s, v in self._episode.specs.items() if s != seat},
            overrides=to_jsonable_python(dict(overrides or {}), fallback=str),
        )
        return self._advance()

    def step(
        self, action: MarketAction, timeout_s: float | None = None, **kwargs: Any
    ) -> MarketObservation:
        """Play the learner's action, then the other seats until its next turn."""
        if self._episode is None or self._pending is None:
            why = (
                "the episode is over; reset to start another"
                if self._episode is not None
                else "no episode in this session; reset first (over HTTP every request gets a "
                "fresh env: use the WebSocket session, e.g. the MarketEnvClient)"
            )
            return MarketObservation(done=True, error=why, seat=self._seat)
        seat, obs, live = self._pending
        self._pending = None
        self._episode.step(seat, obs, live, action.action, None, None)
        self._state.step_count += 1
        return self._advance()

    @property
    def state(self) -> MarketState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="gpumarket",
            description="A scarce-GPU market: labs negotiate, form coalitions and bid for "
            "GPU capacity; one learner seat per session, the others played by the server.",
            version=__version__,
        )

    def close(self) -> None:
        if self._episode is not None:
            self._episode.deadline.close()
        self._episode = self._turns = self._pending = None
        self.market = None

    # --- driving the episode -------------------------------------------------------------
    def _advance(self) -> MarketObservation:
        """Play the other seats until the learner's turn or its seat's end."""
        assert self._episode is not None and self._turns is not None
        episode = self._episode
        for seat, obs, live in self._turns:
            self._check_cancelled()  # the client left or the server stops: no more turns
            if seat == self._seat:
                if live:
                    self._pending = (seat, obs, live)
                    return self._observation(obs, done=False)
                result = self._observation(obs, done=True)
                episode.step(seat, obs, live, None, None, None)  # the dead seat's step
                self._turns = None
                return result
            action = error = latency = None
            if live:
                action, error, latency = episode.act(seat, obs)
            episode.step(seat, obs, live, action, latency, error)
        # the learner's seat was never stepped dead (it had no seat in this episode)
        self._turns = None
        return MarketObservation(done=True, seat=self._seat, episode_return=self._return())

    def _observation(self, obs: SeatObservation, done: bool) -> MarketObservation:
        assert self.market is not None and self._episode is not None
        env = self.market
        _, reward, terminated, truncated, info = env.last()
        info = dict(info)
        components = {k: float(v) for k, v in dict(info.pop("reward_components", {})).items()}
        error = info.pop("error", None)
        if error is not None:
            self._state.invalid_actions += 1
        self._state.round, self._state.phase = env.round, env.phase
        self._state.done = done
        self._state.episode_return = self._return()
        self._state.degraded = self._degraded()
        return MarketObservation(
            done=done,
            reward=float(reward),
            seat=self._seat,
            observation=obs.model_dump(mode="json"),
            prompt=obs.to_prompt(),
            reward_components=components,
            error=None if error is None else str(error),
            info=to_jsonable_python(info, fallback=str),
            terminated=bool(terminated),
            truncated=bool(truncated),
            episode_return=self._state.episode_return,
        )

    def _degraded(self) -> dict[str, dict[str, int]]:
        assert self._episode is not None
        tally, out = self._episode.tally, {}
        for seat, agent in self._episode.agents.items():
            if seat == self._seat:
                continue
            stats = getattr(agent, "stats", None) or {}
            counts = {
                "errors": int(tally.agent_errors.get(seat, 0)),
                "timeouts": int(tally.timeouts.get(seat, 0)),
                "fallbacks": int(stats.get("fallbacks", 0)) if isinstance(stats, dict) else 0,
            }
            if any(counts.values()):
                out[seat] = counts
        return out

    def _return(self) -> float:
        assert self._episode is not None
        value = float(self._episode.tally.returns.get(self._seat, 0.0))
        return value if math.isfinite(value) else 0.0

    # --- checking a reset ----------------------------------------------------------------
    @staticmethod
    def _scenario(name: object, overrides: object) -> Scenario:
        """The built-in scenario ``name`` with ``overrides``, within :data:`EPISODE_MAXIMA`;
        nothing is built yet."""
        names = builtin_names()
        if not isinstance(name, str) or name not in names:
            raise SessionError(
                f"scenario {short_repr(name)} is not a built-in scenario name; "
                f"use one of: {', '.join(names)}"
            )
        if overrides is None:
            overrides = {}
        if not isinstance(overrides, Mapping) or len(overrides) > MAX_OVERRIDES:
            raise SessionError(
                "overrides must be an object of at most "
                f'{MAX_OVERRIDES} scenario keys, e.g. {{"rounds": 2, "labs__count": 3}}'
            )
        try:
            sc = load_scenario(name, **{str(k): v for k, v in overrides.items()})
        except ScenarioError as exc:
            raise SessionError(" ".join(str(exc).split())) from None
        for key, maximum in EPISODE_MAXIMA.items():
            value = _size(sc, key)
            if key == "agent_timeout" and value == 0:
                raise SessionError(
                    f"overrides: agent_timeout = 0 (no time limit) is not allowed on this "
                    f"server; ask for at most {maximum:g} seconds"
                )
            if not value <= maximum:  # NaN too
                raise SessionError(
                    f"overrides: {key} = {value:g} is above this server's maximum of "
                    f"{maximum:g}; ask for at most {maximum:g} ({key.replace('.', '__')})"
                )
        for key in ("judge", "conduct_judge"):
            if getattr(sc, key) != RULE_JUDGE:
                raise SessionError(
                    f"overrides: {key} must be {RULE_JUDGE!r} on this server (an LLM judge "
                    "would make the server call the URL it names)"
                )
        return sc

    def _check_defaults(self, sc: Scenario, learner: str, lineup: Mapping[str, str]) -> None:
        """The seats the line-up leaves to the scenario's ``[agents]`` table (which overrides
        can change) are held to the line-up's rule: the operator's allow-list."""
        for seat, spec in default_seats(sc).items():
            if seat == learner or seat in lineup:
                continue
            try:
                self.policy.check(spec, "designer" if seat == DESIGNER else "bidder")
            except AgentSpecError as exc:
                raise SessionError(f"overrides: agents ({seat}): {exc}") from None

    def _lineup(self, env: raw_env, seat: object, lineup: object) -> dict[str, str]:
        seats = env.possible_agents
        if not isinstance(seat, str) or seat not in seats:
            raise SessionError(
                f"seat {seat!r} is not a seat of {env.scenario.name!r}; seats: {', '.join(seats)}"
            )
        if lineup is None:
            return {}
        if not isinstance(lineup, Mapping):
            raise SessionError(
                'lineup must be an object of seat -> agent spec, e.g. {"bidder_1": "truthful"}'
            )
        out: dict[str, str] = {}
        for other, spec in lineup.items():
            if other == seat:
                raise SessionError(f"lineup names the learner's seat {seat!r}; leave it out")
            if other not in seats:
                raise SessionError(
                    f"lineup seat {other!r} is not a seat of {env.scenario.name!r}; "
                    f"seats: {', '.join(seats)}"
                )
            if not isinstance(spec, str) or not spec.strip():
                raise SessionError(f"lineup[{other!r}] must be an agent spec string, got {spec!r}")
            role = "designer" if other == DESIGNER else "bidder"
            try:  # the operator's allow-list, read from the text before anything is built
                self.policy.check(spec, role)
            except AgentSpecError as exc:
                raise SessionError(f"lineup[{other!r}]: {exc}") from None
            try:  # build it once here, so that a bad spec is this request's error
                make_agent(spec, role)
            except Exception as exc:
                raise SessionError(f"lineup[{other!r}] = {spec!r}: {exc}") from None
            out[other] = spec
        return out


def _size(sc: Scenario, key: str) -> float:
    """How much of ``key`` the scenario asks for: a number, a range's high end, a list's length."""
    value: Any = sc
    for part in key.split("."):
        value = getattr(value, part)
    if isinstance(value, tuple):
        return float(value[1])
    if isinstance(value, list):
        return float(len(value))
    return float(value)


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message that echoes input."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "DEFAULT_SCENARIO",
    "short_repr",
    "DEFAULT_SEAT",
    "EPISODE_MAXIMA",
    "MarketAction",
    "MarketEnvironment",
    "MarketObservation",
    "MarketState",
    "SessionCancelled",
    "SessionError",
]
