"""An episode whose env runs on worker threads, driven from an event loop.

:func:`market.run.rollout.arun_episode` with an ``executor`` plays through
:func:`run_offloaded`: building the env, every step and its recording, and every agent without
its own ``aact`` run on the executor's threads, never on the event loop, so a server's loop stays
free for its requests however heavy a match is; only agents with their own ``aact`` (remote
seats, LLM seats) are awaited on the loop. The episode is the same, step for step.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

from market.run.deadlines import sync_only


class OffloadedEpisode(Protocol):
    """What :func:`run_offloaded` needs of an episode (:class:`market.run.rollout.Episode`)."""

    agents: dict[str, Any]

    def turns(self) -> Iterator[tuple[str, Any, bool]]: ...

    def act(self, seat: str, obs: Any) -> tuple[Any, str | None, float]: ...

    async def aact(self, seat: str, obs: Any) -> tuple[Any, str | None, float]: ...

    def step(
        self,
        seat: str,
        obs: Any,
        live: bool,
        action: Any,
        latency: float | None,
        error: str | None,
    ) -> None: ...

    def result(self) -> Any: ...

    def abort(self, exc: BaseException) -> None: ...


#: what :func:`run_offloaded`'s worker returns when the episode was told to stop
_STOPPED = object()
_T = TypeVar("_T")


async def run_offloaded(executor: Executor, build: Callable[[], OffloadedEpisode]) -> Any:
    """:func:`arun_episode` with the env on ``executor``: each call into the worker plays every
    turn it can (env steps, recording, agents without their own ``aact``) up to the next turn
    whose agent must be awaited on the loop, so one thread hop serves a whole run of turns."""
    loop = asyncio.get_running_loop()
    stop = threading.Event()  # set on cancellation: the worker returns after its current step

    async def in_worker(call: Callable[[], _T]) -> _T:
        # the caller's context variables hold in the call, as in asyncio.to_thread
        fut: asyncio.Future[_T] = loop.run_in_executor(
            executor, contextvars.copy_context().run, call
        )
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            stop.set()
            while not fut.done():  # the env must be idle before the footer is written
                try:
                    await asyncio.shield(fut)
                except asyncio.CancelledError:
                    continue
                except BaseException:
                    break
            raise

    built: list[OffloadedEpisode] = []

    def make() -> OffloadedEpisode:
        built.append(build())  # its header is written: from here on it needs a footer
        return built[0]

    try:
        episode = await in_worker(make)
    except BaseException as exc:  # cancelled while it was built: end its transcript
        if built:
            built[0].abort(exc)
        raise
    turns = episode.turns()

    def advance(decided: tuple[str, Any, Any, str | None, float] | None) -> Any:
        """Step ``decided`` (seat, obs, action, error, latency of a decision awaited on the loop),
        then play on: (seat, obs) of the next turn to await on the loop, None at the end."""
        if decided is not None:
            seat, obs, action, error, took = decided
            episode.step(seat, obs, True, action, took, error)
        for seat, obs, live in turns:
            if stop.is_set():
                return _STOPPED
            if live and not sync_only(episode.agents[seat]):
                return seat, obs
            if live:
                action, error, took = episode.act(seat, obs)
                episode.step(seat, obs, live, action, took, error)
            else:
                episode.step(seat, obs, live, None, None, None)
        return None

    finished: list[Any] = []

    def finish() -> Any:
        finished.append(episode.result())  # the footer is written: nothing to abort after this
        return finished[0]

    try:
        decided = None
        while (turn := await in_worker(functools.partial(advance, decided))) is not None:
            if turn is _STOPPED:  # only after a cancellation, which in_worker re-raised
                raise asyncio.CancelledError
            seat, obs = turn
            action, error, latency = await episode.aact(seat, obs)
            decided = (seat, obs, action, error, latency)
        return await in_worker(finish)
    except BaseException as exc:  # includes CancelledError and KeyboardInterrupt
        if not finished:
            episode.abort(exc)
        raise


__all__ = ["OffloadedEpisode", "run_offloaded"]
