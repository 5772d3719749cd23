"""The local backend's worker pool: every task answered once, with its position; a task that
raises, a worker killed mid-task or one that exits all give a TaskFailed saying why, the other
tasks still finish (a fresh worker takes the dead one's place), and nothing waits forever."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from market.run.worker_pool import TaskFailed, WorkerPool, exit_reason

_GREETING = "unset"


def greet(word: str) -> None:
    global _GREETING
    _GREETING = word


def square(x: int) -> tuple[int, int, str]:
    time.sleep(0.002 * (x % 3))  # finish out of order
    return x * x, os.getpid(), _GREETING


def troublesome(x: int) -> int:
    """Task 3 raises, task 5 kills its own worker, task 7 exits it, task 9 gives a lock."""
    if x == 3:
        raise ValueError("three is not allowed")
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    if x == 7:
        os._exit(3)
    if x == 9:
        return threading.Lock()  # type: ignore[return-value]  # cannot be pickled
    time.sleep(0.001)
    return x + 100


def killed_after_answering(x: int) -> int:
    """Task 0 answers, then its worker is killed 0.2 s later, in the middle of the next task."""
    if x == 0:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
    else:
        time.sleep(0.6)
    return x + 100


def crash_at_start() -> None:
    raise RuntimeError("no worker today")


def collect(pool: WorkerPool, tasks: list[Any], limit: float = 60.0) -> dict[int, Any]:
    """Every (position, result), checking that no position comes twice; fails after ``limit``
    seconds instead of hanging the test run."""
    out: dict[int, Any] = {}
    done = threading.Event()

    def run() -> None:
        for position, result in pool.imap_unordered(tasks):
            assert position not in out
            out[position] = result
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert done.wait(limit), f"the pool stopped answering after {len(out)} of {len(tasks)} tasks"
    return out


def test_every_task_is_answered_once_with_its_position() -> None:
    tasks = [7, 3, 11, 0, 5, 2, 9, 4, 8, 1, 6, 10]
    with WorkerPool(square, 3, initializer=greet, initargs=("hello",)) as pool:
        results = collect(pool, tasks)
        pool.close()
    assert sorted(results) == list(range(len(tasks)))
    assert {p: r[0] for p, r in results.items()} == {p: t * t for p, t in enumerate(tasks)}
    assert {r[2] for r in results.values()} == {"hello"}  # the initializer ran in each worker
    pids = {r[1] for r in results.values()}
    assert os.getpid() not in pids and 1 < len(pids) <= 3


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_failures_are_reported_and_every_other_task_finishes(processes: int) -> None:
    tasks = list(range(30))  # tasks still queued when each worker dies: it is replaced
    with WorkerPool(troublesome, processes) as pool:
        results = collect(pool, tasks)
        replaced = pool.replaced
        pool.close()
    failed = {p: str(r) for p, r in results.items() if isinstance(r, TaskFailed)}
    assert failed == {
        3: "ValueError: three is not allowed",
        5: "its worker process was killed by SIGKILL (the system may have run out of memory)",
        7: "its worker process exited with code 3",
        9: "result not sendable: TypeError: cannot pickle '_thread.lock' object",
    }
    # the tasks waiting behind a dying worker's task were run by other workers
    assert {p: r for p, r in results.items() if p not in failed} == {
        p: p + 100 for p in tasks if p not in failed
    }
    # one worker: each death needs a fresh one; more: the others may have taken every task left
    # by the time the second death is seen
    assert replaced == 2 if processes == 1 else 1 <= replaced <= 2


def test_a_worker_killed_between_tasks_fails_only_the_task_it_was_running() -> None:
    with WorkerPool(killed_after_answering, 1) as pool:
        results = collect(pool, [0, 1, 2, 3])
        assert pool.replaced == 1
        pool.close()
    assert results[1] == TaskFailed(
        "its worker process was killed by SIGKILL (the system may have run out of memory)"
    )
    assert {p: r for p, r in results.items() if p != 1} == {0: 100, 2: 102, 3: 103}


def test_workers_that_cannot_start_fail_every_task_instead_of_hanging() -> None:
    with WorkerPool(square, 2, initializer=crash_at_start) as pool:
        results = collect(pool, list(range(6)))
    assert sorted(results) == list(range(6))
    assert all(
        isinstance(r, TaskFailed) and "exited with code 1" in str(r) for r in results.values()
    )


def test_terminate_stops_busy_workers() -> None:
    pool = WorkerPool(time.sleep, 2)
    it = pool.imap_unordered([0.0, 30.0, 30.0])
    assert next(it) == (0, None)
    processes = [w.process for w in pool.workers]
    began = time.monotonic()
    pool.terminate()
    assert time.monotonic() - began < 10 and not any(p.is_alive() for p in processes)


def test_exit_reasons_name_the_signal_or_code() -> None:
    assert exit_reason(-signal.SIGTERM) == "its worker process was killed by SIGTERM"
    assert exit_reason(-signal.SIGKILL).endswith("(the system may have run out of memory)")
    assert exit_reason(2) == "its worker process exited with code 2"
    with pytest.raises(ValueError, match="at least 1"):
        WorkerPool(square, 0)
