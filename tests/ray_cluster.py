"""A real two-node Ray cluster on 127.0.0.1 for the Ray backend tests, and the cases they run.

Run inside a private network namespace with only loopback up, so every byte stays on 127.0.0.1
(Ray replaces ``--node-ip-address=127.0.0.1`` with the machine's own address otherwise)::

    unshare -n sh -c 'ip link set lo up && exec python tests/ray_cluster.py CASE OUT_DIR'

Nodes start with ``ray start --block`` in their own process groups and are stopped by PID
(``ray stop`` would kill every Ray process on the host). Ray is kept light: no dashboard, a small
object store, usage stats off, one CPU per node, and token authentication off on every node
alike (``RAY_AUTH_MODE``; a mismatch makes a joining worker fail after ~20 s). The case writes
``OUT_DIR/case.json`` (what happened: exit codes, timings, rows seen when a node was killed) for
the pytest side to check.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PORT = 6379
ADDRESS = f"127.0.0.1:{PORT}"
BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    # notice a killed node within seconds rather than the default ~30 s
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "4",
    "RAY_health_check_initial_delay_ms": "500",
}
KILL_SEEDS = 20  # large_market episodes (about 1.6 s each with a transcript)
NODE_FLAGS = [
    "--node-ip-address=127.0.0.1",
    "--num-cpus=1",
    "--object-store-memory=80000000",
    "--disable-usage-stats",
    "--block",
]


class LocalRayCluster:
    """A head and ``workers`` worker nodes, each ``ray start --block`` in its own process group."""

    def __init__(self, workers: int = 1) -> None:
        self.temp = tempfile.mkdtemp(prefix="gmrc-", dir="/tmp")  # short: socket path limit
        self.logs = Path(self.temp) / "node-logs"
        self.logs.mkdir()
        self.head = self._start(
            "head",
            ["--head", f"--port={PORT}", "--include-dashboard=false", f"--temp-dir={self.temp}"],
        )
        self._wait_nodes(1)
        self.workers = [self._start(f"worker{i}", [f"--address={ADDRESS}"]) for i in range(workers)]
        self._wait_nodes(1 + workers)

    def _start(self, name: str, flags: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the node
        return subprocess.Popen(
            [str(BIN / "ray"), "start", *flags, *NODE_FLAGS],
            env=ENV,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive_nodes(self) -> int:
        code = (
            f"import ray, json; ray.init(address={ADDRESS!r}, log_to_driver=False, "
            "logging_level='error'); print(json.dumps(sum(n['Alive'] for n in ray.nodes())))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120
        )
        lines = out.stdout.strip().splitlines()
        return int(lines[-1]) if out.returncode == 0 and lines else 0

    def _wait_nodes(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive_nodes() >= n:
                return
            time.sleep(0.5)
        logs = {p.name: p.read_text(errors="replace")[-2000:] for p in self.logs.iterdir()}
        raise RuntimeError(f"the Ray cluster did not reach {n} live node(s): {logs}")

    @staticmethod
    def kill(node: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """Stop one node: its whole process group (raylet, workers), by PID."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, sig)
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=30)

    def stop(self) -> None:
        for node in [*self.workers, self.head]:
            self.kill(node, signal.SIGTERM)


def gpumarket(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gpumarket"), *args], env=ENV, capture_output=True, text=True, timeout=900, **kw
    )


def case_eval(out: Path) -> dict[str, Any]:
    """An evaluation and a tournament across the cluster, through the CLI."""
    began = time.monotonic()
    ev = gpumarket(
        "eval",
        "--agents",
        "rule_expert,random_valid",
        "--scenarios",
        "single_trade,market_round",
        "--seeds",
        "0:12",
        "--transcripts",
        "--backend",
        "ray",
        "--address",
        ADDRESS,
        "--out",
        str(out / "eval"),
    )
    tour = gpumarket(
        "tournament",
        "--bidders",
        "rule_expert,truthful,random_valid",
        "--scenario",
        "market_round",
        "--seeds",
        "0:4",
        "--backend",
        "ray",
        "--address",
        ADDRESS,
        "--out",
        str(out / "tournament"),
    )
    return {
        "eval": [ev.returncode, ev.stdout[-3000:], ev.stderr[-3000:]],
        "tournament": [tour.returncode, tour.stdout[-3000:], tour.stderr[-3000:]],
        "seconds": time.monotonic() - began,
    }


def _rows(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def case_kill_worker(out: Path, cluster: LocalRayCluster) -> dict[str, Any]:
    """Kill the worker node while a run is half done; the run must finish or resume."""
    cmd = [
        str(BIN / "gpumarket"),
        "run",
        "large_market",
        "--seeds",
        f"0:{KILL_SEEDS}",
        "--backend",
        "ray",
        "--address",
        ADDRESS,
        "--out",
        str(out / "kill" / "large_market"),
    ]
    results = out / "kill" / "large_market" / "results.jsonl"
    began = time.monotonic()
    run = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while len(_rows(results)) < 3 * 300 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # 300 rows per large_market episode: wait for 3 finished episodes
    before = _rows(results)
    cluster.kill(cluster.workers[0])
    killed_at = len(before)
    stdout, stderr = run.communicate(timeout=900)
    first = [run.returncode, stdout[-3000:], stderr[-3000:]]
    resumed = None
    if run.returncode != 0:  # the run may stop; the same command must then finish it
        again = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=900)
        resumed = [again.returncode, again.stdout[-3000:], again.stderr[-3000:]]
    (out / "rows_at_kill.jsonl").write_text("".join(r + "\n" for r in before))
    return {
        "first": first,
        "resumed": resumed,
        "rows_at_kill": killed_at,
        "alive_after": cluster.alive_nodes(),
        "seconds": time.monotonic() - began,
    }


def main() -> None:
    case, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    cluster = LocalRayCluster(workers=1)
    try:
        report = {"nodes": cluster.alive_nodes()}
        if case == "eval":
            report.update(case_eval(out))
        elif case == "kill-worker":
            report.update(case_kill_worker(out, cluster))
        else:
            raise SystemExit(f"unknown case {case!r}")
    finally:
        cluster.stop()
    (out / "case.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
