"""The runner (market.run.runner) and ``gpumarket run``: the results file, resuming, refusing to mix
configurations, Ctrl-C, parallel == serial, exit codes and one-line errors."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import ctrl_c_able

from agents.scripted import TruthfulBidder
from market.cli import EXAMPLES
from market.cli import main as cli
from market.environment.aec import raw_env
from market.record.reader import read_transcript
from market.review.replay import replay
from market.run.folders import RESULTS, ROUNDS
from market.run.rollout import run_episode
from market.run.runner import (
    ROW_KEYS,
    RunConfigError,
    read_results,
    run_scenario,
)
from scenarios import load_scenario

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent


class FlakyTokenBidder(TruthfulBidder):
    """Truthful, but every third call raises, and it books 10 + 2 'tokens' per call."""

    name = "flaky_tokens"

    def act(self, obs: Any) -> Any:
        self.stats["prompt_tokens"] = self.stats.get("prompt_tokens", 0) + 10
        self.stats["completion_tokens"] = self.stats.get("completion_tokens", 0) + 2
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls % 3 == 0:
            raise RuntimeError("flaky")
        return super().act(obs)


class SlowTruthful(TruthfulBidder):
    """Truthful, 2 ms per decision: long enough runs to interrupt."""

    name = "slow_truthful"

    def act(self, obs: Any) -> Any:
        time.sleep(0.002)
        return super().act(obs)


class BrokenReset(TruthfulBidder):
    """Raises in reset, outside the turn loop, so the whole episode fails."""

    name = "broken_reset"

    def reset(self, seed: Any = None) -> None:
        raise RuntimeError("cannot reset")


_TEST_PROCESS = os.getpid()


class KilledInItsWorker(TruthfulBidder):
    """Kills its own process with SIGKILL, as the out-of-memory killer would, when reset with
    the seat seed in ``GM_TEST_KILL_SEAT_SEED``; only in a pool worker, never in the tests."""

    name = "killed_in_its_worker"

    def reset(self, seed: Any = None) -> None:
        wanted = os.environ.get("GM_TEST_KILL_SEAT_SEED")
        if str(seed) == wanted and os.getpid() != _TEST_PROCESS:
            os.kill(os.getpid(), signal.SIGKILL)
        super().reset(seed)


def stable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without wall time and file paths, in (seed, seat) order."""
    drop = ("seconds", "transcript")
    return sorted(
        ({k: v for k, v in r.items() if k not in drop} for r in rows),
        key=lambda r: (r["seed"], r["seat"]),
    )


def results_lines(out: Path) -> list[str]:
    return (out / RESULTS).read_text().splitlines()


# --------------------------------------------------------------------------------- the API


def test_run_folder_layout_and_rows_match_the_episodes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    seats = {"bidder_0": "rule_expert"}
    summary = run_scenario("market_round", range(3), seats, out, workers=1, progress=False)
    assert summary.played == [0, 1, 2] and summary.skipped == [] and summary.complete
    assert sorted(p.name for p in out.iterdir()) == [
        "results.jsonl",
        "rounds.jsonl",
        "run.json",
        "transcripts",
    ]
    assert sorted(p.name for p in (out / "transcripts").iterdir()) == [
        "0.jsonl",
        "1.jsonl",
        "2.jsonl",
    ]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["config_hash"] == summary.config_hash
    assert manifest["seats"] == {
        "designer_0": "fixed",
        "bidder_0": "rule_expert",
        "bidder_1": "reciprocal",
        "bidder_2": "random_valid",
    }
    assert manifest["scenario"] == load_scenario("market_round").model_dump(mode="json")
    rows = read_results(out)
    assert len(rows) == 3 * 4 and all(tuple(r) == ROW_KEYS for r in rows)
    for seed in range(3):
        episode = run_episode("market_round", seed, seats)
        mine = {r["seat"]: r for r in rows if r["seed"] == seed}
        assert {s: r["return"] for s, r in mine.items()} == episode.returns
        assert {s: r["components"] for s, r in mine.items()} == episode.components
        assert {s: r["invalid_actions"] for s, r in mine.items()} == episode.invalid_actions
        row = mine["bidder_0"]
        assert row["agent"] == "rule_expert" and row["role"] == "bidder"
        assert mine["designer_0"]["role"] == "designer"
        assert row["welfare_ratio"] == episode.welfare_ratio
        assert row["revenue"] == episode.revenue
        prices = [r["price"] for r in episode.round_log]
        assert row["mean_price"] == pytest.approx(sum(prices) / len(prices))
        composite = [r["designer"]["composite"] for r in episode.round_log]
        assert row["designer"]["composite"] == pytest.approx(sum(composite) / len(composite))
        assert row["agent_errors"] == row["fallbacks"] == 0
        assert row["tokens"] == {"prompt": 0, "completion": 0, "total": 0}
        assert summary.round_logs[seed] == json.loads(json.dumps(episode.round_log))
    assert replay(out / "transcripts" / "1.jsonl").ok
    assert summary.returns("bidder_0") == {
        r["seed"]: r["return"] for r in rows if r["seat"] == "bidder_0"
    }


def test_resume_skips_complete_episodes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = run_scenario("single_trade", range(3), None, out, workers=1, progress=False)
    assert first.played == [0, 1, 2]
    second = run_scenario("single_trade", range(5), None, out, workers=1, progress=False)
    assert second.skipped == [0, 1, 2] and second.played == [3, 4]
    assert len(results_lines(out)) == 5 * 2 and len(second.rows) == 10
    before = (out / RESULTS).read_bytes()
    third = run_scenario("single_trade", range(5), None, out, workers=2, progress=False)
    assert third.played == [] and third.skipped == [0, 1, 2, 3, 4]
    assert (out / RESULTS).read_bytes() == before
    # a subset of the seeds: only those rows in the summary
    assert run_scenario("single_trade", [4, 1], None, out, progress=False).episodes == [1, 4]


def test_refuses_to_mix_configurations(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_scenario("single_trade", range(2), None, out, workers=1, progress=False)
    with pytest.raises(
        RunConfigError, match="seat bidder_0 holds 'truthful' there but 'random_valid' now.*--fresh"
    ):
        run_scenario("single_trade", range(2), {"bidder_0": "random_valid"}, out, progress=False)
    with pytest.raises(RunConfigError, match=r"scenario\.rounds is 3 there but 2 now"):
        run_scenario(load_scenario("single_trade", rounds=2), range(2), None, out, progress=False)
    with pytest.raises(RunConfigError, match="not in scenario"):
        run_scenario("single_trade", range(2), {"bidder_7": "truthful"}, out, progress=False)
    with pytest.raises(RunConfigError, match="unknown agent"):
        run_scenario("single_trade", range(2), {"bidder_0": "nobody"}, out, progress=False)
    with pytest.raises(RunConfigError, match="spec strings"):
        run_scenario("single_trade", range(2), {"bidder_0": TruthfulBidder()}, out, progress=False)
    fresh = run_scenario(
        "single_trade",
        range(1),
        {"bidder_0": "random_valid"},
        out,
        workers=1,
        progress=False,
        fresh=True,
    )
    assert fresh.played == [0] and len(results_lines(out)) == 2
    assert sorted(p.name for p in (out / "transcripts").iterdir()) == ["0.jsonl"]


def test_cut_and_incomplete_rows_are_dropped_and_replayed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    whole = run_scenario(
        "market_round", range(4), None, out, workers=1, progress=False, transcripts=False
    )
    lines = results_lines(out)
    # seed 3's episode lost its last row, and a line was cut mid-write
    kept = [line for line in lines if json.loads(line)["seed"] != 3]
    seed3 = [line for line in lines if json.loads(line)["seed"] == 3]
    (out / RESULTS).write_text("\n".join(kept + seed3[:2]) + "\n" + seed3[2][:40])
    again = run_scenario(
        "market_round", range(4), None, out, workers=1, progress=False, transcripts=False
    )
    assert again.played == [3] and again.skipped == [0, 1, 2]
    assert stable(read_results(out)) == stable(whole.rows)
    assert len(results_lines(out)) == 16


def test_parallel_runs_equal_serial_runs(tmp_path: Path) -> None:
    seeds = range(8)
    seats = {"designer_0": "random"}
    serial = run_scenario(
        "mechanism_stage_3",
        seeds,
        seats,
        tmp_path / "serial",
        workers=1,
        progress=False,
        transcripts=False,
    )
    pooled = run_scenario(
        "mechanism_stage_3",
        seeds,
        seats,
        tmp_path / "pool",
        workers=2,
        progress=False,
        transcripts=False,
    )
    assert stable(serial.rows) == stable(pooled.rows)
    assert serial.round_logs == pooled.round_logs
    # the pool's workers encode the lines: the files hold exactly the rows and rounds returned
    for summary, folder in ((serial, "serial"), (pooled, "pool")):
        rows = [json.loads(line) for line in results_lines(tmp_path / folder)]
        assert stable(rows) == stable(serial.rows) and len(rows) == len(summary.rows)
        assert sorted(results_lines(tmp_path / folder)) == sorted(
            json.dumps(r, separators=(",", ":")) for r in summary.rows
        )
        logged = [
            json.loads(line) for line in (tmp_path / folder / ROUNDS).read_text().splitlines()
        ]
        assert {e["seed"]: e["rounds"] for e in logged} == serial.round_logs
        assert {e["config"] for e in logged} == {serial.config_hash}
    # and in two sittings
    run_scenario(
        "mechanism_stage_3",
        [5, 1, 6],
        seats,
        tmp_path / "split",
        workers=2,
        progress=False,
        transcripts=False,
    )
    split = run_scenario(
        "mechanism_stage_3",
        seeds,
        seats,
        tmp_path / "split",
        workers=2,
        progress=False,
        transcripts=False,
    )
    assert split.skipped == [1, 5, 6]
    assert stable(split.rows) == stable(serial.rows)


def test_agent_errors_fallbacks_and_tokens_are_counted(tmp_path: Path) -> None:
    spec = "py:test_runner:FlakyTokenBidder"
    summary = run_scenario(
        "single_trade",
        range(2),
        {"bidder_0": spec},
        tmp_path / "r",
        workers=1,
        progress=False,
        transcripts=False,
    )
    for seed in range(2):
        row = next(r for r in summary.rows if r["seed"] == seed and r["seat"] == "bidder_0")
        episode = run_episode("single_trade", seed, {"bidder_0": spec})
        calls = row["tokens"]["prompt"] // 10
        assert row["agent_errors"] == episode.agent_errors["bidder_0"] == calls // 3 > 0
        assert row["fallbacks"] == row["agent_errors"]
        assert row["tokens"] == {"prompt": 10 * calls, "completion": 2 * calls, "total": 12 * calls}
        assert row["last_agent_error"] == "RuntimeError: flaky"
        assert row["stats"]["prompt_tokens"] == 10 * calls


@pytest.mark.parametrize("workers", [1, 2])  # in this process, and in the pool's workers
def test_a_failing_episode_is_reported_and_not_recorded(tmp_path: Path, workers: int) -> None:
    out = tmp_path / "r"
    summary = run_scenario(
        "single_trade",
        range(2),
        {"bidder_0": "py:test_runner:BrokenReset"},
        out,
        workers=workers,
        progress=False,
    )
    assert set(summary.failed) == {0, 1} and "cannot reset" in summary.failed[0]
    assert not summary.complete and summary.rows == [] and results_lines(out) == []


def test_a_worker_killed_mid_episode_fails_that_seed_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = raw_env("single_trade")
    env.reset(seed=4)
    monkeypatch.setenv("GM_TEST_KILL_SEAT_SEED", str(env.seat_seed("bidder_0")))
    spec = "py:test_runner:KilledInItsWorker"
    out = tmp_path / "single_trade"
    argv = ["run", "single_trade", "--seeds", "0:8", "--workers", "2", "--out", str(out)]
    argv += ["--no-progress", "--seat", f"bidder_0={spec}"]
    assert cli(argv) == 1  # before the worker pool, the run waited for seed 4 forever
    err = capsys.readouterr().err
    assert (
        "episode seed 4 failed: episode not finished: its worker process was killed by SIGKILL"
        in err
    )
    assert sorted({json.loads(line)["seed"] for line in results_lines(out)}) == [
        0,
        1,
        2,
        3,
        5,
        6,
        7,
    ]

    monkeypatch.delenv("GM_TEST_KILL_SEAT_SEED")
    assert cli(argv) == 0
    assert "7 episode(s) were already complete, 1 played now" in capsys.readouterr().out
    assert read_transcript(out / "transcripts" / "4.jsonl").complete
    serial = run_scenario(
        "single_trade", range(8), {"bidder_0": spec}, tmp_path / "serial", 1, progress=False
    )
    rows = [json.loads(line) for line in results_lines(out)]
    assert stable(rows) == stable(serial.rows)


# --------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_keeps_finished_episodes_and_a_rerun_completes_them(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    seats = ["--seat", "bidder_0=py:test_runner:SlowTruthful"]
    argv = [
        sys.executable,
        "-m",
        "market",
        "run",
        "market_round",
        "--seeds",
        "0:40",
        "--workers",
        "2",
        "--out",
        str(out / "market_round"),
        "--no-progress",
        "--no-transcripts",
        *seats,
    ]
    # tests/ too: this module imports the shared test helpers (support)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), str(ROOT)])}
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        **ctrl_c_able(),
    )
    results = out / "market_round" / RESULTS
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if results.is_file() and len(results.read_text().splitlines()) >= 3 * 4:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr and "resume" in stderr
    kept = read_results(out / "market_round")
    done = {r["seed"] for r in kept}
    assert 3 <= len(done) < 40 and len(kept) == 4 * len(done)  # whole episodes only
    rerun = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(done)} episode(s) were already complete" in rerun.stdout
    rows = read_results(out / "market_round")
    assert len(rows) == 40 * 4
    whole = run_scenario(
        "market_round",
        range(40),
        {"bidder_0": "py:test_runner:SlowTruthful"},
        tmp_path / "whole",
        workers=2,
        progress=False,
        transcripts=False,
    )
    assert stable(rows) == stable(whole.rows)


# --------------------------------------------------------------------------------- the CLI


def test_cli_run_resumes_refuses_and_starts_fresh(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["run", "single_trade", "--workers", "1", "--out", str(tmp_path / "single_trade")]
    base.append("--no-progress")
    assert cli([*base, "--seeds", "0:2"]) == 0
    out = capsys.readouterr().out
    assert "single_trade: 2 episode(s)" in out and "bidder_0" in out and "return" in out
    assert cli([*base, "--seeds", "0:3"]) == 0
    assert "2 episode(s) were already complete, 1 played now" in capsys.readouterr().out
    assert cli([*base, "--seeds", "0:3", "--seat", "bidder_1=random_valid"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another configuration" in err and "bidder_1" in err
    assert cli([*base, "--seeds", "0:1", "--seat", "bidder_1=random_valid", "--fresh"]) == 0
    assert len(read_results(tmp_path / "single_trade")) == 2
    json_out = tmp_path / "e.json"
    assert (
        cli([*base, "--seeds", "0:1", "--seat", "bidder_1=random_valid", "--json", str(json_out)])
        == 0
    )
    episodes = json.loads(json_out.read_text())
    assert [e["seed"] for e in episodes] == [0] and len(episodes[0]["rounds"]) == 3


def test_cli_run_exit_1_when_an_episode_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "run",
        "single_trade",
        "--seeds",
        "0:1",
        "--workers",
        "1",
        "--out",
        str(tmp_path),
        "--no-progress",
        "--seat",
        "bidder_0=py:test_runner:BrokenReset",
    ]
    assert cli(argv) == 1
    assert "episode seed 0 failed: RuntimeError: cannot reset" in capsys.readouterr().err


def bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    files = {
        "bad_key": ('extends = "market_round"\n[labs]\ncuont = 3\n', "key 'labs.cuont'"),
        "bad_value": ('extends = "market_round"\nrounds = 0\n', "key 'rounds'"),
        "bad_toml": ("rounds = = 3\n", "not valid TOML"),
        "bad_parent": ('extends = "no_such_parent"\n', "key 'extends'"),
    }
    out = {}
    for name, (text, words) in files.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        out[name] = (path, words)
    out["missing"] = (tmp_path / "missing.toml", "neither a built-in scenario")
    return out


@pytest.mark.parametrize("case", ["bad_key", "bad_value", "bad_toml", "bad_parent", "missing"])
def test_bad_scenarios_give_one_line_and_exit_2(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, words = bad_files(tmp_path)[case]
    for argv in (
        ["run", str(path), "--seeds", "0:1", "--out", str(tmp_path / "o")],
        [
            "eval",
            "--scenarios",
            f"single_trade,{path}",
            "--agents",
            "truthful",
            "--seeds",
            "0:1",
            "--out",
            str(tmp_path / "e"),
        ],
        [
            "eval",
            "--mechanisms",
            "--scenario",
            str(path),
            "--seeds",
            "0:1",
            "--out",
            str(tmp_path / "m"),
        ],
    ):
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert str(path) in err and words in err, err
    assert not (tmp_path / "o").exists()


def test_bad_scenario_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    path, _ = bad_files(tmp_path)["bad_key"]
    proc = subprocess.run(
        [sys.executable, "-m", "market", "run", str(path), "--seeds", "0:1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"gpumarket run: {path}: key 'labs.cuont': unknown key (check its spelling against "
        "docs/scenarios.md)"
    )
    assert proc.stdout == ""


def test_every_command_has_help_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    for command in EXAMPLES:
        with pytest.raises(SystemExit) as exit_:
            cli([command, "--help"])
        assert exit_.value.code == 0
        text = capsys.readouterr().out
        assert "example:" in text and f"gpumarket {command}" in text, command


def test_the_command_line_freezes_start_up_and_main_with_arguments_does_not() -> None:
    probe = (
        "import gc, sys\n"
        "from market.cli import main\n"
        "sys.argv = ['gpumarket', 'agents']\n"
        "code = main()\n"
        "print('frozen', gc.get_freeze_count(), code)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    _, frozen, code = done.stdout.splitlines()[-1].split()
    assert int(frozen) > 10_000 and code == "0"  # the modules, classes and models of start-up
    before = gc.get_freeze_count()
    assert cli(["agents"]) == 0
    assert gc.get_freeze_count() == before  # a program calling main([...]) keeps its collector
