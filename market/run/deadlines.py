"""Per-decision time limits: a seat's ``act`` runs on a worker thread and the turn waits at
most the limit, after which the seat plays its fallback action (counted as a timeout).

A seat whose earlier call is still running falls back at once without being called again, so a
hung agent holds one thread, not one per turn. Built-in scripted agents are called directly (they
are the project's own code and return in microseconds)."""

from __future__ import annotations

import asyncio
import contextvars
import math
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from agents.base import BaseAgent
from market.core.scenario_schema import Scenario


class AgentTimeout(TimeoutError):
    """A decision took longer than the seat's time limit (the seat played its fallback)."""


def resolve_timeout(scenario: Scenario, agent_timeout: float | None) -> float | None:
    """The time limit in seconds for one decision: ``agent_timeout`` if given, else the
    scenario's; None when that is 0 (no limit)."""
    limit = scenario.agent_timeout if agent_timeout is None else float(agent_timeout)
    if not limit >= 0 or math.isinf(limit):
        raise ValueError(f"agent_timeout {agent_timeout!r}: give seconds >= 0 (0: no limit)")
    return limit or None


def decision_limit(agent: Any, limit: float | None, explicit: bool) -> float | None:
    """The time limit of one seat's decisions: ``limit``, raised to what the seat's backend says a
    decision needs (``backend.decision_timeout``: an ``llm:hf`` model decoding on the CPU) when the
    limit is the scenario's default, not one the user set (``explicit``: ``--agent-timeout`` or
    ``agent_timeout`` in the scenario file). None: no limit."""
    if explicit or limit is None:
        return limit
    backend = getattr(agent, "backend", None)
    backend = getattr(backend, "backend", backend)  # the response cache wraps the backend
    need = getattr(backend, "decision_timeout", None)
    if isinstance(need, int | float) and not isinstance(need, bool) and need > limit:
        return float(need)
    return limit


def with_agent_timeout(scenario: Scenario, agent_timeout: float | None) -> Scenario:
    """``scenario`` with its ``agent_timeout`` replaced (unchanged for None)."""
    if agent_timeout is None:
        return scenario
    resolve_timeout(scenario, agent_timeout)  # the same check as at play time
    return scenario.model_copy(update={"agent_timeout": float(agent_timeout)})


#: the modules of the built-in scripted agents: the package's own code, without I/O, returning
#: within milliseconds; they are called directly (a thread hop per decision costs about a third of
#: a scripted episode's time on two busy cores). Subclasses defined elsewhere are timed.
BOUNDED_MODULES = frozenset(
    {
        "agents.scripted",
        "agents.population.baselines",
        "agents.population.expert",
        "agents.population.designers",
    }
)


def bounded(agent: Any) -> bool:
    return type(agent).__module__ in BOUNDED_MODULES


def sync_only(agent: Any) -> bool:
    """True for an agent without its own ``aact`` (its ``aact`` would block the event loop)."""
    aact = getattr(type(agent), "aact", None)
    return aact is None or aact is BaseAgent.aact


class DecisionWorker(threading.Thread):
    """A daemon thread that runs one agent call at a time. Once a call runs past its limit the
    worker is retired: it ends when that call returns, and a fresh worker takes later calls."""

    def __init__(self) -> None:
        super().__init__(name="gpumarket-agent", daemon=True)
        self.jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self.retired = False

    def run(self) -> None:
        while (job := self.jobs.get()) is not None:
            fut, call = job
            if fut.set_running_or_notify_cancel():  # False: the waiter gave up before it started
                try:
                    fut.set_result(call())
                except BaseException as exc:  # the agent's error travels to the waiting turn
                    fut.set_exception(exc)
            if self.retired:
                return


class Deadline:
    """Each decision of an episode with a time limit: the agent runs on a worker thread (a
    daemon), the turn waits at most ``limit`` seconds. A seat whose call is still running after
    its limit is *hung*: its later turns time out at once, without a new call, until that call
    returns, so a hung agent holds at most one thread."""

    def __init__(
        self, limit: float | None, seat_limits: dict[str, float | None] | None = None
    ) -> None:
        self.limit = limit
        #: seats whose limit is not ``limit`` (:func:`decision_limit`)
        self.seat_limits = dict(seat_limits or {})
        self._worker: DecisionWorker | None = None
        self._hung: dict[str, Future[Any]] = {}

    def limit_of(self, seat: str) -> float | None:
        """The time limit of ``seat``'s decisions (None: no limit)."""
        return self.seat_limits.get(seat, self.limit)

    def _check_hung(self, seat: str) -> None:
        fut = self._hung.get(seat)
        if fut is not None:
            if not fut.done():
                raise AgentTimeout(
                    f"still running a decision that passed the {self.limit_of(seat):g} s "
                    "limit; the seat falls back until it returns"
                )
            del self._hung[seat]

    def _submit(self, call: Callable[[], Any]) -> Future[Any]:
        if self._worker is None:
            self._worker = DecisionWorker()
            self._worker.start()
        fut: Future[Any] = Future()
        context = contextvars.copy_context()  # the caller's context variables hold in the call
        self._worker.jobs.put((fut, lambda: context.run(call)))
        return fut

    def _timed_out(self, seat: str, fut: Future[Any]) -> AgentTimeout:
        self._hung[seat] = fut
        if self._worker is not None:  # it may stay busy: later calls get a fresh worker
            self._worker.retired = True
            self._worker.jobs.put(None)
            self._worker = None
        return AgentTimeout(f"no action within {self.limit_of(seat):g} s")

    def act(self, seat: str, agent: Any, obs: Any) -> Any:
        """``agent.act(obs)`` within the limit; raises :class:`AgentTimeout` past it."""
        limit = self.limit_of(seat)
        if limit is None or bounded(agent):
            return agent.act(obs)
        self._check_hung(seat)
        fut = self._submit(lambda: agent.act(obs))
        try:
            return fut.result(limit)
        except TimeoutError:
            if fut.done():  # it finished just now, or the agent itself raised a TimeoutError
                return fut.result()
            raise self._timed_out(seat, fut) from None

    async def aact(self, seat: str, agent: Any, obs: Any) -> Any:
        """``agent.aact(obs)`` within the limit. An agent without its own ``aact`` runs its
        ``act`` on the worker thread, so that a blocking agent cannot stall other episodes."""
        limit = self.limit_of(seat)
        if limit is None or bounded(agent):
            return await agent.aact(obs)
        self._check_hung(seat)
        if sync_only(agent):
            fut = self._submit(lambda: agent.act(obs))
            try:
                async with asyncio.timeout(limit):
                    return await asyncio.wrap_future(fut)
            except TimeoutError:
                if fut.done() and not fut.cancelled():
                    return fut.result()
                raise self._timed_out(seat, fut) from None
        try:
            async with asyncio.timeout(limit) as scope:
                return await agent.aact(obs)
        except TimeoutError:
            if not scope.expired():
                raise  # the agent's own TimeoutError
            raise AgentTimeout(f"no action within {limit:g} s") from None

    def close(self) -> None:
        if self._worker is not None:
            self._worker.jobs.put(None)
            self._worker = None
