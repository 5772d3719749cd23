"""``gpumarket serve --compat arena`` on a real uvicorn server of 127.0.0.1, driven with httpx by
the arena's own client code (tests/compat_seed/arena, unchanged): its smoke script, its
rule-based expert and random policies in lab_0 for whole episodes (every observation validated
by the arena's own model), 20 concurrent sessions that never see each other's state, transcripts
that replay exactly, and what the server refuses."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import market
from market.serve.compat_arena import create_arena_app
from market.serve.compat_server import CompatServer

SEED_DIR = Path(__file__).resolve().parents[1] / "compat_seed"
sys.path.insert(0, str(SEED_DIR))

from arena_play import POLICIES, play  # noqa: E402

EXPERT = POLICIES["arena:rule_based_expert"]
RANDOM = POLICIES["arena:random_validish"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CompatServer, Path]]:
    out = tmp_path_factory.mktemp("arena-transcripts")
    with CompatServer(create_arena_app(out, max_sessions_per_client=64)) as srv:
        yield srv, out


def _client(srv: CompatServer, **kw: Any) -> httpx.Client:
    return httpx.Client(base_url=srv.url, timeout=60, **kw)


def test_the_arena_smoke_script_runs_unchanged(server: tuple[CompatServer, Path]) -> None:
    srv, _ = server
    script = SEED_DIR / "arena" / "scripts" / "live_space_smoke.py"
    done = subprocess.run(
        [sys.executable, str(script), "--base-url", srv.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["health"]["status"] == "ok"
    assert set(report["task_types"]) == {"single_trade", "market_round", "coalition_market"}
    assert report["reset_task_id"] == "market_round-42"  # the arena's default seed
    assert report["visible_labs"] == 2  # market_round's default difficulty: medium, 3 labs


@pytest.mark.parametrize(
    ("task", "difficulty", "compact"),
    [
        ("single_trade", "easy", False),
        ("market_round", "medium", True),
        ("coalition_market", "hard", False),
        ("coalition_market", None, True),
    ],
)
def test_the_arena_expert_plays_whole_episodes(
    server: tuple[CompatServer, Path], task: str, difficulty: str | None, compact: bool
) -> None:
    srv, out = server
    with _client(srv) as client:
        played = play(client, EXPERT, task, difficulty, seed=5, compact=compact)
    final = played.final
    assert final["done"] is True
    # the arena's cumulative reward is the sum of every step's reward, the reset's included
    rewards = [o["reward"] for o in played.observations]
    assert final["cumulative_reward"] == pytest.approx(sum(rewards), abs=1e-9)
    # lab_0 is bidder_0: the same return as a local episode of the scenario with those actions
    report = market.replay(out / f"{played.match_id}.jsonl")
    assert report.ok, report
    header = json.loads((out / f"{played.match_id}.jsonl").read_text().splitlines()[0])
    assert header["scenario"]["name"] == f"{task}_{difficulty or 'hard'}"


def test_the_arena_random_policy_plays_a_whole_episode(server: tuple[CompatServer, Path]) -> None:
    srv, out = server
    with _client(srv) as client:
        played = play(client, RANDOM, "market_round", "easy", seed=3)
    assert played.final["done"] is True
    assert market.replay(out / f"{played.match_id}.jsonl").ok


def test_block_ids_are_the_markets_and_list_the_holdings_in_round_order(
    server: tuple[CompatServer, Path],
) -> None:
    srv, _ = server
    with _client(srv) as client:
        played = play(client, RANDOM, "market_round", "medium", seed=11)
    for obs in played.observations[:-1]:
        blocks = obs["owned_blocks"]
        # b_0_<k>: the k-th block from this round on, in round order (market.core.arena_payloads)
        assert [b["block_id"] for b in blocks] == [f"b_0_{k}" for k in range(len(blocks))]
        rounds = [b["start_round"] for b in blocks]
        assert rounds == sorted(rounds) and all(r >= obs["round_index"] for r in rounds)
        assert all(b["owner_lab_id"] == "lab_0" for b in blocks)
        shown = {b["block_id"] for b in obs["public_market"]["available_blocks"]}
        assert {b["block_id"] for b in blocks} <= shown
        for offer in obs["active_offers"]:  # every block an offer would move is shown
            assert set(offer["offered_blocks"]) | set(offer["requested_blocks"]) <= shown | {
                b for b in offer["requested_blocks"] if b.startswith("r")
            }


def _trajectory(srv: CompatServer, task: str, seed: int, results: dict[int, Any]) -> None:
    with _client(srv) as client:
        played = play(client, EXPERT, task, None, seed)
        results[seed] = played


def test_twenty_concurrent_sessions_never_see_each_others_state(
    server: tuple[CompatServer, Path],
) -> None:
    srv, _ = server
    tasks = ["single_trade", "market_round", "coalition_market"]
    together: dict[int, Any] = {}
    threads = [
        threading.Thread(target=_trajectory, args=(srv, tasks[s % 3], s, together))
        for s in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert sorted(together) == list(range(20))
    assert len({p.session_id for p in together.values()}) == 20
    for seed, played in together.items():
        # every observation is of its own task and seed ...
        assert {o["task_id"] for o in played.observations} == {f"{tasks[seed % 3]}-{seed}"}
        # ... and is exactly what the same client sees alone (no other session changed it)
        alone: dict[int, Any] = {}
        _trajectory(srv, tasks[seed % 3], seed, alone)
        assert alone[seed].observations == played.observations


def test_session_ids_by_header_body_and_query_and_none(server: tuple[CompatServer, Path]) -> None:
    srv, _ = server
    with _client(srv) as a, _client(srv) as b:
        a.post("/reset", json={"task_type": "single_trade", "seed": 1, "session_id": "mine"})
        b.post("/reset", json={"task_type": "market_round", "seed": 2, "session_id": "mine"})
        # the same id from one address: b's reset replaced a's session
        state = a.get("/state", params={"session_id": "mine"}).json()["state"]
        assert state["task_id"] == "market_round-2"
        step = b.post("/step", json={"action_type": "wait"}, headers={"X-Session-Id": "mine"})
        assert step.status_code == 200
    with httpx.Client(base_url=srv.url) as bare:  # no cookie, no id
        missing = bare.post("/step", json={"action_type": "wait"})
        assert missing.status_code == 400
        assert "POST /reset first" in missing.json()["detail"]
        unknown = bare.post("/step", json={"action_type": "wait", "session_id": "nobody"})
        assert unknown.status_code == 404
        bad = bare.post("/step", json={"action_type": "wait", "session_id": "../etc"})
        assert bad.status_code == 400 and "letters, digits" in bad.json()["detail"]


def test_another_address_cannot_reach_a_session(server: tuple[CompatServer, Path]) -> None:
    srv, _ = server
    with _client(srv) as owner:
        sid = owner.post("/reset", json={"seed": 4}).json()["session_id"]
    other = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=srv.url, transport=other) as stranger:
        got = stranger.post("/step", json={"action_type": "wait", "session_id": sid})
    assert got.status_code == 404


def test_attackers_are_refused(server: tuple[CompatServer, Path]) -> None:
    srv, _ = server
    with _client(srv) as client:
        evil = client.post("/reset", json={"seed": 1}, headers={"Origin": "http://evil.example"})
        assert evil.status_code == 403
        huge = client.post(
            "/step",
            content=b'{"action_type": "send_message", "message": "' + b"x" * 200_000 + b'"}',
            headers={"content-type": "application/json"},
        )
        assert huge.status_code == 413
        deep = client.post("/reset", content=b"[" * 100 + b"]" * 100)
        assert deep.status_code == 422
        for field, value in (
            ("scenario", "/etc/passwd"),
            ("lineup", {"bidder_1": "py:os:system"}),
            ("url", "http://169.254.169.254/"),
            ("code", "import os"),
        ):
            got = client.post("/reset", json={"task_type": "single_trade", field: value})
            assert got.status_code == 422, field
            assert "unknown reset field" in got.json()["detail"]
        assert client.post("/reset", json={"task_type": "ladder"}).status_code == 422
        assert client.post("/reset", json={"seed": -1}).status_code == 400
        assert client.post("/reset", json={"judge_mode": "llm"}).status_code == 422
        client.post("/reset", json={"seed": 1})
        assert client.get("/state", params={"include_private": "true"}).status_code == 403
        # an action the market cannot use is the env's refusal (penalty), never a crash
        step = client.post("/step", json={"action_type": "drop_tables", "payment": 1e308})
        assert step.status_code == 200
        obs = step.json()["observation"]
        assert obs["last_action_result"]["ok"] is False
        assert obs["error"]


def test_sessions_per_client_are_capped(tmp_path: Path) -> None:
    app = create_arena_app(tmp_path, max_sessions_per_client=2)
    with CompatServer(app) as srv, _client(srv) as client:
        for k in range(2):
            assert client.post("/reset", json={"seed": k, "session_id": f"s{k}"}).is_success
        third = client.post("/reset", json={"seed": 9, "session_id": "s9"})
        assert third.status_code == 503
        assert "already holds 2 sessions" in third.json()["detail"]
        # resetting one it holds is fine
        assert client.post("/reset", json={"seed": 3, "session_id": "s1"}).is_success
        # a finished session gives its room to a new one (s0 finishes: lab_0 leaves)
        assert client.post("/step", json={"action_type": "finish", "session_id": "s0"}).json()[
            "observation"
        ]["done"]
        assert client.post("/reset", json={"seed": 9, "session_id": "s9"}).is_success
        assert client.get("/state", params={"session_id": "s0"}).status_code == 404
        assert client.get("/state", params={"session_id": "s1"}).is_success


def test_gpumarket_serve_compat_arena(tmp_path: Path) -> None:
    """The command: a finished episode's transcript replays; SIGTERM ends an open one
    ``aborted``; a bad flag combination is one line."""
    from match_support import served

    out = tmp_path / "runs" / "arena"
    with served(out, "--compat", "arena") as base, httpx.Client(base_url=base) as client:
        assert client.get("/health").json()["benchmark_id"] == "gpu_budget_negotiation"
        first = client.post("/reset", json={"seed": 8}).json()
        assert client.post("/step", json={"action_type": "finish"}).json()["observation"]["done"]
        client.post("/reset", json={"seed": 9, "session_id": "left-open"})
    assert market.replay(out / f"{first['match_id']}.jsonl").ok
    files = sorted(out.glob("arena-*.jsonl"))
    assert len(files) == 2
    footers = [json.loads(f.read_text().splitlines()[-1]) for f in files]
    assert sum(1 for f in footers if "aborted" in json.dumps(f)) == 1
    both = subprocess.run(
        [sys.executable, "-m", "market", "serve", "--compat", "arena", "--agent", "truthful"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert both.returncode == 2
    assert both.stderr.strip() == "gpumarket serve: give --agent SPEC or --compat KIND, not both"
