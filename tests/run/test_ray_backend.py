"""The Ray backend: same results as the local pool, transcripts shipped back, resumable, clear
errors; and on a real two-node cluster on 127.0.0.1, an evaluation, a tournament, and a worker
node killed mid-run (see tests/ray_cluster.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from real_model_utils import skip_or_fail
from support import ROOT, TESTS, ctrl_c_able

from market.cli import main as cli_main
from market.run.ray_backend import RayBackendError, batch_size, check_reachable, ray_map
from market.run.runner import RunConfigError, run_scenario

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
VOLATILE = ("seconds", "transcript")


@pytest.fixture(autouse=True)
def _needs_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        skip_or_fail("Ray is not installed: pip install 'gpumarket[ray]'")


def comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without wall time and file paths (which differ between any two runs)."""
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def step_events(path: Path) -> list[dict[str, Any]]:
    """A transcript's events other than header/footer (which carry creation time and totals)."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    keep = [e for e in events if e.get("type") not in ("header", "footer")]
    for e in keep:
        e.pop("prev", None)  # the hash chain starts from the header, which holds a timestamp
        e.pop("digest", None)
        e.pop("latency_s", None)  # wall time
    return keep


# ----------------------------------------------------------------------------- no cluster


def test_batch_size_spreads_work_and_is_bounded() -> None:
    assert batch_size(8, 2) == 1  # fewer items than 4 tasks per CPU: one each
    assert batch_size(100, 2) == 13  # ceil(100 / 8)
    assert batch_size(10_000, 2) == 32  # capped
    assert batch_size(0, 4) == 1


def test_private_ray_gives_the_local_results_and_ships_transcripts(tmp_path: Path) -> None:
    from market.review.replay import replay

    seeds = range(10)
    on_ray = run_scenario(
        "market_round",
        seeds,
        {"bidder_0": "rule_expert"},
        tmp_path / "ray",
        backend="ray",
        progress=False,
    )
    local = run_scenario(
        "market_round",
        seeds,
        {"bidder_0": "rule_expert"},
        tmp_path / "local",
        workers=1,
        progress=False,
    )
    assert on_ray.complete and sorted(on_ray.played) == list(seeds)
    assert comparable(on_ray.rows) == comparable(local.rows)
    for seed in seeds:
        shipped = tmp_path / "ray" / "transcripts" / f"{seed}.jsonl"
        row = next(r for r in on_ray.rows if r["seed"] == seed)
        assert row["transcript"] == str(shipped)  # the driver's path, not the worker's temp dir
        assert step_events(shipped) == step_events(
            tmp_path / "local" / "transcripts" / f"{seed}.jsonl"
        )
        assert replay(shipped).ok
    assert not list((tmp_path / "ray" / "transcripts").glob("*.part"))


def test_ray_run_resumes_from_the_folder(tmp_path: Path) -> None:
    first = run_scenario(
        "single_trade", range(4), None, tmp_path, backend="ray", transcripts=False, progress=False
    )
    second = run_scenario(
        "single_trade", range(7), None, tmp_path, backend="ray", transcripts=False, progress=False
    )
    assert sorted(first.played) == [0, 1, 2, 3]
    assert sorted(second.skipped) == [0, 1, 2, 3] and sorted(second.played) == [4, 5, 6]
    alone = run_scenario(
        "single_trade",
        range(7),
        None,
        tmp_path / "alone",
        workers=1,
        transcripts=False,
        progress=False,
    )
    assert comparable(second.rows) == comparable(alone.rows)


def test_a_function_error_on_a_worker_reaches_the_caller_as_itself() -> None:
    with pytest.raises(ValueError, match="math domain error"):
        dict(ray_map(math.sqrt, [4.0, -1.0, 9.0], batch=1))


def test_no_head_at_the_address_is_a_quick_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RunConfigError, match=r"no Ray head answers at 127\.0\.0\.1:1 "):
        run_scenario(
            "single_trade",
            range(2),
            None,
            tmp_path,
            backend="ray",
            address="127.0.0.1:1",
            progress=False,
        )
    code = cli_main(
        [
            "run",
            "single_trade",
            "--seeds",
            "0:2",
            "--backend",
            "ray",
            "--address",
            "not-an-address",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "give the head's HOST:PORT" in err and "Traceback" not in err
    with pytest.raises(RayBackendError, match="HOST:PORT"):
        check_reachable("127.0.0.1:notaport")


class _ProbedCluster:
    """Just enough of ``ray`` for the worker check: two live CPU nodes and a CPU-less one; the
    probe pinned to ``stale`` reports another gpumarket version."""

    def __init__(self, stale: str | None) -> None:
        self.stale, self.pinned = stale, []
        self.live = [
            {"NodeID": "aa" * 28, "Alive": True, "Resources": {"CPU": 1.0}},
            {"NodeID": "bb" * 28, "Alive": True, "Resources": {"CPU": 1.0}},
            {"NodeID": "cc" * 28, "Alive": True, "Resources": {"memory": 1.0}},  # no episodes
            {"NodeID": "dd" * 28, "Alive": False, "Resources": {"CPU": 1.0}},  # dead
        ]

    def nodes(self) -> list[dict[str, Any]]:
        return self.live

    def remote(self, fn: Any) -> Any:
        cluster = self

        class Task:
            def options(self, **kw: Any) -> Any:
                node = kw["scheduling_strategy"].node_id
                cluster.pinned.append((node, kw["scheduling_strategy"].soft, kw["num_cpus"]))

                class Bound:
                    def remote(self) -> dict[str, Any]:
                        found = fn()
                        return {**found, "version": "0.0.0"} if node == cluster.stale else found

                return Bound()

        return Task()

    @staticmethod
    def get(ref: Any, timeout: float) -> Any:
        return ref


def test_the_worker_check_probes_every_node_that_plays_episodes_and_names_a_stale_one() -> None:
    from market.run.ray_backend import _check_workers

    fine = _ProbedCluster(stale=None)
    _check_workers(fine)
    assert fine.pinned == [("aa" * 28, False, 0), ("bb" * 28, False, 0)]
    stale = _ProbedCluster(stale="bb" * 28)
    with pytest.raises(RayBackendError, match=r"on node bbbbbbbb run gpumarket 0\.0\.0"):
        _check_workers(stale)


# ----------------------------------------------------------------------------- real cluster


def run_case(case: str, out: Path) -> dict[str, Any]:
    """Run a tests/ray_cluster.py case in its own network namespace (loopback only)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        skip_or_fail("the cluster tests need root, unshare and ip (a private network namespace)")
    cmd = [
        "unshare",
        "-n",
        "sh",
        "-c",
        f"ip link set lo up && exec {sys.executable} {TESTS / 'ray_cluster.py'} {case} {out}",
    ]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "case.json").read_text())


@pytest.mark.slow
def test_two_node_cluster_evaluation_and_tournament_match_the_local_backend(tmp_path: Path) -> None:
    from market.review.replay import replay

    report = run_case("eval", tmp_path / "cluster")
    assert report["nodes"] == 2
    code, out, err = report["eval"]
    assert code == 0, err
    assert "on 2 node(s)" in err  # episodes really ran on both nodes
    code, _, err = report["tournament"]
    assert code == 0, err
    local = tmp_path / "local"
    assert (
        cli_main(
            [
                "eval",
                "--agents",
                "rule_expert,random_valid",
                "--scenarios",
                "single_trade,market_round",
                "--seeds",
                "0:12",
                "--transcripts",
                "--workers",
                "1",
                "--out",
                str(local / "eval"),
                "--no-progress",
            ]
        )
        == 0
    )
    assert (
        cli_main(
            [
                "tournament",
                "--bidders",
                "rule_expert,truthful,random_valid",
                "--scenario",
                "market_round",
                "--seeds",
                "0:4",
                "--workers",
                "1",
                "--out",
                str(local / "tournament"),
            ]
        )
        == 0
    )
    cluster = tmp_path / "cluster"
    assert (cluster / "eval" / "eval.csv").read_bytes() == (
        local / "eval" / "eval.csv"
    ).read_bytes()
    for results in sorted((local / "eval").glob("*/*/results.jsonl")):
        twin = cluster / "eval" / results.relative_to(local / "eval")
        rows = [json.loads(x) for x in twin.read_text().splitlines()]
        expected = [json.loads(x) for x in results.read_text().splitlines()]
        key = lambda r: (r["seed"], r["seat"])  # noqa: E731 - arrival order differs
        assert comparable(sorted(rows, key=key)) == comparable(sorted(expected, key=key))
    shipped = sorted((cluster / "eval").glob("*/*/transcripts/*.jsonl"))
    assert len(shipped) == 2 * 2 * 12
    assert all(replay(path).ok for path in shipped[:8])
    for name in ("ratings.csv", "summary.json"):
        assert (cluster / "tournament" / name).read_bytes() == (
            local / "tournament" / name
        ).read_bytes()


@pytest.mark.slow
def test_killing_a_worker_node_mid_run_loses_no_finished_episode(tmp_path: Path) -> None:
    from ray_cluster import KILL_SEEDS

    report = run_case("kill-worker", tmp_path)
    seats = 301  # large_market: 300 labs and the designer
    assert report["nodes"] == 2 and report["alive_after"] == 1  # the worker node really died
    assert 3 * seats <= report["rows_at_kill"] < KILL_SEEDS * seats  # killed mid-run
    code, _, err = report["first"] if report["resumed"] is None else report["resumed"]
    assert code == 0, err
    results = tmp_path / "kill" / "large_market" / "results.jsonl"
    final = results.read_text().splitlines()
    kept = (tmp_path / "rows_at_kill.jsonl").read_text().splitlines()
    assert set(kept) <= set(final)  # every episode finished before the kill is still there
    rows = [json.loads(x) for x in final]
    assert len(rows) == KILL_SEEDS * seats
    assert len({(r["seed"], r["seat"]) for r in rows}) == len(rows)  # nothing recorded twice
    local = run_scenario(
        "large_market",
        range(KILL_SEEDS),
        None,
        tmp_path / "local",
        transcripts=False,
        progress=False,
    )
    key = lambda r: (r["seed"], r["seat"])  # noqa: E731
    assert comparable(sorted(rows, key=key)) == comparable(sorted(local.rows, key=key))
    assert (
        len(list((tmp_path / "kill" / "large_market" / "transcripts").glob("*.jsonl")))
        == KILL_SEEDS
    )


def test_llm_pool_flags_are_refused_with_the_ray_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(
        [
            "run",
            "single_trade",
            "--seeds",
            "0:2",
            "--backend",
            "ray",
            "--budget-tokens",
            "100",
            "--out",
            str(tmp_path / "single_trade"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--budget-tokens apply to LLM runs on the local backend" in err
    assert not (tmp_path / "single_trade").exists()  # nothing was started


@pytest.mark.slow
def test_ctrl_c_keeps_finished_episodes_and_the_same_command_resumes(tmp_path: Path) -> None:
    import signal
    import time

    cmd = [
        sys.executable,
        "-m",
        "market",
        "run",
        "large_market",
        "--seeds",
        "0:16",
        "--backend",
        "ray",
        "--out",
        str(tmp_path / "large_market"),
        "--no-progress",
        "--no-transcripts",
    ]
    results = tmp_path / "large_market" / "results.jsonl"
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **ctrl_c_able()
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if results.is_file() and len(results.read_text().splitlines()) >= 301:
            break
        time.sleep(0.05)
    kept = results.read_text().splitlines()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "finished and kept" in err and "Traceback" not in err
    after = results.read_text().splitlines()
    assert after[: len(kept)] == kept and len(after) % 301 == 0 and len(after) < 16 * 301
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"{len(after) // 301} episode(s) were already complete" in again.stdout
    rows = [json.loads(x) for x in results.read_text().splitlines()]
    assert sorted({r["seed"] for r in rows}) == list(range(16)) and len(rows) == 16 * 301
