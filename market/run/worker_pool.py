"""Worker processes for runs, the expert matrix, tournaments and the run report's pages: each
worker has its own pipe, gets a task or two at a time, and sends back each result as soon as it
has it; the calling thread does all of the parent's work, and a worker that dies is reported,
not waited for.

Why not ``multiprocessing.Pool``: its parent keeps two helper threads that pass every task and
result through shared queues. At one task per episode that cost the parent about 0.7 ms of CPU
an episode (handing the GIL between three threads), a core's worth on a 2-core machine; and a
worker killed in the middle of a task (the out-of-memory killer, ``kill -9``) left that task
unanswered, so the run waited forever. Here the parent waits on the workers' pipes and process
sentinels at once (:func:`multiprocessing.connection.wait`): a result is read the moment it
arrives, and a worker's exit turns the task it was running into a :class:`TaskFailed` saying
why; the task waiting behind it goes back to the queue, and a fresh worker takes its place.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, cast


@dataclass(frozen=True)
class TaskFailed:
    """The result of a task that gave none: its worker died, or the task raised (``reason``)."""

    reason: str

    def __str__(self) -> str:
        return self.reason


def exit_reason(exitcode: int | None) -> str:
    """Why a worker process ended, for a user: the signal that killed it or its exit code."""
    if exitcode is None:
        return "its worker process stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the system may have run out of memory)" if -exitcode == signal.SIGKILL else ""
        return f"its worker process was killed by {name}{hint}"
    return f"its worker process exited with code {exitcode}"


def _serve(
    conn: Connection,
    work: Callable[[Any], Any],
    initializer: Callable[..., None] | None,
    initargs: Sequence[Any],
) -> None:
    """A worker: run ``work`` on each ``(position, task)`` received, send ``(position, result)``;
    stop at ``None`` or when the parent is gone. Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        position, task = message
        try:
            result = work(task)
        except Exception as exc:  # the task's bug, not the worker's: report it and go on
            result = TaskFailed(f"{type(exc).__name__}: {exc}"[:1000])
        try:
            conn.send((position, result))
        except (EOFError, OSError):
            return
        except Exception as exc:  # a result that cannot be pickled
            conn.send((position, TaskFailed(f"result not sendable: {type(exc).__name__}: {exc}")))


@dataclass(eq=False)
class _Worker:
    process: Any  # multiprocessing.Process of the pool's context
    conn: Connection
    in_flight: deque[int] = field(default_factory=deque)  # task positions, oldest first
    hung_up: bool = False  # its pipe is closed; its sentinel will say how it ended


class WorkerPool:
    """``processes`` worker processes running ``work`` (a module-level function) on tasks.

    The workers start (fork, where that is the platform's default) when the pool is made, each
    running ``initializer(*initargs)`` first. Use it as a context manager, or call
    :meth:`close` (let the workers finish) or :meth:`terminate` (stop them now)."""

    def __init__(
        self,
        work: Callable[[Any], Any],
        processes: int,
        initializer: Callable[..., None] | None = None,
        initargs: Sequence[Any] = (),
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self._ctx = multiprocessing.get_context()
        self._target = (work, initializer, tuple(initargs))
        self.processes = processes
        self.workers = [self._start() for _ in range(processes)]
        self.replaced = 0  # workers started again after one died
        self.gave_up: str | None = None  # why no more workers are started (they die at start)
        self._deaths_without_task = 0

    def _start(self) -> _Worker:
        parent_end, child_end = self._ctx.Pipe()
        process = self._ctx.Process(
            target=_serve, args=(child_end, *self._target), daemon=True, name="gpumarket-worker"
        )
        process.start()
        child_end.close()  # the parent's copy: the worker's end closes when the worker dies
        return _Worker(process, parent_end)

    def imap_unordered(self, tasks: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        """``(position of the task in tasks, its result)`` for every task, as each finishes.

        A worker holds at most two tasks (the second so that it never waits for the parent
        between them) and only one once fewer tasks are left than there are workers. A task
        that raised, or whose worker died while running it, gives a :class:`TaskFailed`; a
        task still waiting in a dead worker's pipe is handed to another worker."""
        pending = deque(enumerate(tasks))
        by_position = dict(pending)
        for worker in self.workers:
            self._feed(worker, pending)
        while True:
            if pending:  # e.g. a task handed back by a dead worker while others were idle
                for worker in self.workers:
                    if not worker.in_flight:
                        self._feed(worker, pending)
            # a worker that hung up is watched until its exit is seen, even with no task
            watched = [w for w in self.workers if w.in_flight or w.hung_up]
            if not watched:  # done, or no worker is left to take what is
                while pending:
                    yield pending.popleft()[0], TaskFailed(self.gave_up or "no worker process")
                return
            waitables: dict[Any, _Worker] = {w.process.sentinel: w for w in watched}
            waitables.update({w.conn: w for w in watched if not w.hung_up})
            for ready in wait(list(waitables)):
                worker = waitables[ready]
                if worker not in self.workers:  # replaced while this batch was handled
                    continue
                if ready is worker.conn:
                    yield from self._receive(worker, pending)
                else:
                    yield from self._bury(worker, pending, by_position)

    def _feed(self, worker: _Worker, pending: deque[tuple[int, Any]]) -> None:
        depth = 2 if len(pending) > len(self.workers) else 1
        while pending and len(worker.in_flight) < depth and not worker.hung_up:
            position, task = pending[0]
            try:
                worker.conn.send((position, task))
            except (EOFError, OSError):  # it died; its sentinel will report it
                worker.hung_up = True
                return
            pending.popleft()
            worker.in_flight.append(position)

    def _receive(
        self, worker: _Worker, pending: deque[tuple[int, Any]]
    ) -> Iterator[tuple[int, Any]]:
        try:
            position, result = worker.conn.recv()
        except (EOFError, OSError):
            worker.hung_up = True
            return
        worker.in_flight.remove(position)
        self._feed(worker, pending)
        yield position, result

    def _bury(
        self, worker: _Worker, pending: deque[tuple[int, Any]], tasks: dict[int, Any]
    ) -> Iterator[tuple[int, Any]]:
        """A worker ended: the results it sent first; then the task it was running fails, and
        the one waiting behind it (never started: a worker runs its tasks in turn) goes back
        to the front of the queue."""
        while not worker.hung_up and worker.conn.poll():
            try:
                position, result = worker.conn.recv()
            except (EOFError, OSError):
                break
            worker.in_flight.remove(position)
            yield position, result
        worker.process.join()
        worker.conn.close()
        reason = exit_reason(worker.process.exitcode)
        running, *waiting = worker.in_flight or [None]
        worker.in_flight = deque()
        pending.extendleft((p, tasks[p]) for p in reversed(cast(list[int], waiting)))
        self.workers.remove(worker)
        if running is None:  # it died before taking a task, e.g. in its initializer
            self._deaths_without_task += 1
        if self._deaths_without_task > 2 * self.processes:
            self.gave_up = f"{self._deaths_without_task} worker processes died at start ({reason})"
        elif pending:  # the tasks left still need a worker
            fresh = self._start()
            self.workers.append(fresh)
            self.replaced += 1
            self._feed(fresh, pending)
        if running is not None:
            yield running, TaskFailed(reason)

    def close(self, timeout: float = 5.0) -> None:
        """Tell every worker to stop once it is idle, and wait for them (terminate stragglers)."""
        for worker in self.workers:
            with contextlib.suppress(EOFError, OSError):  # already gone
                worker.conn.send(None)
        for worker in self.workers:
            worker.process.join(timeout)
        self.terminate()

    def terminate(self) -> None:
        """Stop every worker now (tasks in flight are abandoned)."""
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.terminate()
        for worker in self.workers:
            worker.process.join()
            worker.conn.close()
        self.workers = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()
