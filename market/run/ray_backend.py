"""Episodes on a Ray cluster: the runner's and the tournament's ``backend="ray"``.

:func:`ray_map` plays a list of items (episode jobs, tournament matches) with a module-level
function on a Ray cluster and yields each result in the driver as soon as it is finished, so the
caller records it at once (the same files and resumability as the local process pool).

How work is cut up: items go out in *batches* (one Ray task plays several episodes, because a Ray
task costs about 1 ms of scheduling against a few ms for an episode), but each batch is a
streaming generator task, so every episode comes back the moment it ends, not when its batch
does. A worker or node that dies takes only its episodes in flight with it: Ray retries the
task, results already received are not recorded twice, and a batch that still fails is sent
again with its unfinished items only. Episodes are pure functions of (scenario, seed, seats), so
where they run does not change a single number.

Connecting (:func:`ray_session`): ``address=None`` starts a private single-machine Ray instance
for this run (it never joins a cluster that happens to run on the host); ``address="HOST:PORT"``
(or ``"auto"``) joins an existing cluster, whose workers must have the same gpumarket installed
(checked with a probe task on every node before any episode is sent).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from market.run.jobs import default_workers
from market.version import __version__


class RayBackendError(RuntimeError):
    """The Ray backend cannot run: Ray missing, no cluster at the address, workers unfit."""


#: most items per Ray task (the batch size adapts to the work and the cluster below that)
MAX_BATCH = 32
#: times a batch whose task failed for a system reason (worker or node died) is sent again
RESUBMITS = 3


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayBackendError(
            "backend 'ray' needs Ray on this machine and on every node: "
            "pip install 'gpumarket[ray]'"
        ) from None
    return ray


def _probe() -> dict[str, Any]:
    """Runs on a worker: what it would play episodes with."""
    return {"version": __version__, "python": list(sys.version_info[:2])}


def _check_workers(ray: Any) -> None:
    """Probe every live node that can play episodes (has CPUs), pinned to it.

    Checking one node would let a node with another gpumarket or Python slip through. Probing
    each also starts a worker process on each, so a joining node is ready when the first batch
    arrives: otherwise a node whose worker is still starting can lose every batch to a node that
    is already running (Ray hands a finished worker the next queued task of the same kind).
    """
    from ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
    )

    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")]
    probe = ray.remote(_probe)
    pending = {
        node["NodeID"]: probe.options(
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote()
        for node in nodes
    }
    for node_id, ref in pending.items():
        where = f"node {node_id[:8]}"
        try:
            found = ray.get(ref, timeout=120)
        except Exception as exc:
            raise RayBackendError(
                f"Ray workers on {where} cannot import gpumarket; install the project on every "
                f"node (pip install 'gpumarket[ray]', or pip install -e . in a checkout): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        if found["version"] != __version__:
            raise RayBackendError(
                f"Ray workers on {where} run gpumarket {found['version']} but this driver runs "
                f"{__version__}; install the same version on every node"
            )
        if tuple(found["python"]) != tuple(sys.version_info[:2]):
            raise RayBackendError(
                f"Ray workers on {where} run Python {found['python'][0]}.{found['python'][1]} "
                f"but this driver runs {sys.version_info[0]}.{sys.version_info[1]}; "
                "Ray needs the same Python minor version everywhere"
            )


def _local_init_options() -> dict[str, Any]:
    """A private, light single-machine instance: no dashboard, a small object store, and a
    short temp dir (Ray's socket paths must stay under 107 bytes)."""
    temp = tempfile.mkdtemp(prefix="gm-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    return {
        "address": "local",
        "num_cpus": default_workers(),
        "include_dashboard": False,
        "object_store_memory": 100 * 1024 * 1024,
        "_temp_dir": temp,
    }


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a head that is not there: Ray's own connect retries for over a minute."""
    if address in ("auto", "local") or address.startswith("ray://"):
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise RayBackendError(
            f"--address {address!r}: give the head's HOST:PORT "
            "(e.g. 10.0.0.5:6379), or 'auto' on a cluster node"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RayBackendError(
            f"no Ray head answers at {address} ({exc.strerror or exc}); start one with "
            f"`ray start --head --port {port}` or check the address"
        ) from None


@contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
    """Connect to Ray for one run and disconnect afterwards; yields the ``ray`` module.

    Uses a session the caller already opened (``ray.is_initialized()``) and leaves it open.
    """
    ray = _ray()
    if ray.is_initialized():
        yield ray
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        check_reachable(address)
    options: dict[str, Any] = {"address": address} if address else _local_init_options()
    try:
        ray.init(log_to_driver=False, logging_level="error", **options)
    except Exception as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        hint = (
            " — is the head running (ray start --head --port PORT) and RAY_AUTH_MODE the "
            "same here as on the cluster?"
            if address
            else ""
        )
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RayBackendError(f"could not start or reach {where}: {first}{hint}") from None
    try:
        if address:
            _check_workers(ray)
        yield ray
    finally:
        ray.shutdown()


def batch_size(n_items: int, cpus: float) -> int:
    """Items per Ray task: about four tasks per CPU (so a slow batch cannot hold the run's tail
    long), at most :data:`MAX_BATCH`."""
    if n_items <= 0:
        return 1
    return max(1, min(MAX_BATCH, math.ceil(n_items / max(1.0, 4 * cpus))))


def _play_batch(
    fn: Callable[[Any], Any], batch: list[tuple[int, Any]]
) -> Iterator[tuple[int, str, Any]]:
    """The Ray task: play each item and stream ``(position, node id, result)`` back as it ends."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    for position, item in batch:
        yield position, node, fn(item)


@dataclass
class RayStats:
    """Where a :func:`ray_map` ran: items per node, batch size, batches sent again."""

    batch: int = 0
    batches: int = 0
    resubmitted: int = 0
    per_node: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        nodes = ", ".join(f"{node[:8]}: {n}" for node, n in sorted(self.per_node.items()))
        again = (
            f"; {self.resubmitted} batch(es) sent again after a lost worker"
            if self.resubmitted
            else ""
        )
        return (
            f"ray: {sum(self.per_node.values())} episode(s) on {len(self.per_node)} node(s) "
            f"({nodes}) in {self.batches} task(s) of up to {self.batch}{again}"
        )


def ray_map(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    address: str | None = None,
    batch: int | None = None,
    stats: RayStats | None = None,
) -> Iterator[tuple[int, Any]]:
    """``(position, fn(items[position]))`` for every item, in the order they finish, computed on
    Ray (see the module doc). ``fn`` must be importable (a module-level function of an installed
    package). An exception raised by ``fn`` itself propagates; a lost worker or node does not.
    ``stats`` (optional) is filled in as results arrive.
    """
    if not items:
        return
    with ray_session(address) as ray:
        yield from _stream(ray, fn, items, batch, stats if stats is not None else RayStats())


def _stream(
    ray: Any, fn: Callable[[Any], Any], items: Sequence[Any], batch: int | None, stats: RayStats
) -> Iterator[tuple[int, Any]]:
    cpus = float(ray.cluster_resources().get("CPU", 1.0))
    size = stats.batch = batch or batch_size(len(items), cpus)
    task = ray.remote(_play_batch).options(num_returns="streaming", num_cpus=1, max_retries=2)
    delivered: set[int] = set()
    running: dict[Any, tuple[list[int], int]] = {}  # generator -> (its positions, resubmits)

    def submit(positions: list[int], tries: int) -> None:
        gen = task.remote(fn, [(p, items[p]) for p in positions])
        running[gen] = (positions, tries)
        stats.batches += 1
        stats.resubmitted += tries > 0

    everything = list(range(len(items)))
    for start in range(0, len(everything), size):
        submit(everything[start : start + size], 0)
    try:
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            gen = ready[0]
            positions, tries = running[gen]
            try:
                position, node, result = ray.get(next(gen))
            except StopIteration:
                del running[gen]
                continue
            except ray.exceptions.RayTaskError as exc:  # fn raised: the caller's bug, not Ray's
                raise exc.as_instanceof_cause() from None
            except ray.exceptions.RayError as exc:  # worker/node lost beyond Ray's own retries
                del running[gen]
                left = [p for p in positions if p not in delivered]
                if tries >= RESUBMITS:
                    raise RayBackendError(
                        f"{len(left)} item(s) failed {tries + 1} times on the cluster "
                        f"({type(exc).__name__}); the finished ones are kept, run again to "
                        "resume"
                    ) from None
                if left:
                    submit(left, tries + 1)
                continue
            if position in delivered:  # a retried task replays items already received
                continue
            delivered.add(position)
            stats.per_node[node] = stats.per_node.get(node, 0) + 1
            yield position, result
    finally:
        for gen in running:
            with contextlib.suppress(Exception):  # already finished, or its node is gone
                ray.cancel(gen, force=True)


__all__ = [
    "MAX_BATCH",
    "RayBackendError",
    "RayStats",
    "batch_size",
    "check_reachable",
    "ray_map",
    "ray_session",
]
