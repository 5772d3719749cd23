"""Served matches through the real server (``gpumarket serve`` under uvicorn on 127.0.0.1) and
real HTTP clients: a served episode equals the local one, deadlines fall back and count, a
dropped client resumes with its token, and a token reaches only its own seat."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from match_support import (
    ROOT,
    auth,
    create,
    free_port,
    play_seat,
    served,
    wait_done,
    wait_ready,
)

from agents.registry import make_agent
from market.environment.aec import raw_env
from market.record.reader import read_transcript
from market.review.replay import replay
from market.run.rollout import run_episode


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("served") / "transcripts"
    with served(out) as base:
        yield base, out


def _steps(path: Path) -> list[dict[str, Any]]:
    """The transcript's steps without the wall-clock field (latency) and the digest chain
    (which starts from the header, whose seat specs and creation time differ)."""
    return [
        {
            k: v
            for k, v in s.model_dump(mode="json").items()
            if k not in ("latency_s", "prev", "digest")
        }
        for s in read_transcript(path).steps
    ]


def _seeded(spec: str, seed: int) -> Any:
    """The agent ``spec``, reset with ``seed`` whatever seed the runner gives it."""
    agent = make_agent(spec)
    reset = agent.reset
    agent.reset = lambda _seed=None: reset(seed)
    return agent


def test_two_remote_seats_equal_the_local_run(server: Any, tmp_path: Path) -> None:
    base, out = server
    seats = {"bidder_0": "random_valid", "bidder_1": "rule_expert"}
    made = create(base, "market_round", 5, {s: "remote" for s in seats})
    assert set(made["tokens"]) == set(seats) and len(set(made["tokens"].values())) == 2
    shown: dict[str, int] = {}

    def play(seat: str, spec: str) -> None:
        shown[seat] = play_seat(base, made["match_id"], made["tokens"][seat], spec)["seat_seed"]

    threads = [threading.Thread(target=play, args=item) for item in seats.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    view = wait_done(base, made["match_id"])
    # a served seat's seed is keyed by the match's secret (a local run's would give the seed
    # away): the local run seeds each agent with the seed its served client was shown
    env = raw_env("market_round")
    env.reset(seed=5)
    assert all(shown[s] != env.seat_seed(s) for s in seats)
    local = run_episode(
        "market_round",
        5,
        {s: _seeded(spec, shown[s]) for s, spec in seats.items()},
        transcript=tmp_path / "local.jsonl",
    )
    assert view["status"] == "done"
    assert view["returns"] == local.returns  # bit-identical floats through JSON
    assert view["timeouts"] == {"bidder_0": 0, "bidder_1": 0}
    served_file = out / f"{made['match_id']}.jsonl"
    assert _steps(served_file) == _steps(tmp_path / "local.jsonl")  # actions, rewards, digests
    header = read_transcript(served_file).header
    assert header.seats["bidder_0"].spec == "remote" and header.seed == 5
    report = replay(served_file)
    assert report.ok and report.steps_checked == local.steps
    # the CLI replays it too, and the transcript endpoint serves the same bytes
    cli = subprocess.run(
        [sys.executable, "-m", "market", "replay", str(served_file)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert cli.returncode == 0, cli.stderr
    url = f"{base}/matches/{made['match_id']}/transcript"
    got = httpx.get(url, headers=auth(made["owner_token"]))
    assert got.status_code == 200 and got.content == served_file.read_bytes()
    # every seat's actions and private state: not for a seat's token, nor for anyone
    for headers in ({}, auth(made["tokens"]["bidder_0"])):
        assert httpx.get(url, headers=headers).status_code == 401


def test_a_missed_deadline_plays_the_fallback_and_counts_a_timeout(
    server: Any, tmp_path: Path
) -> None:
    base, out = server
    made = create(base, "single_trade", 2, {"bidder_0": "remote"}, turn_deadline=0.15)
    view = wait_done(base, made["match_id"])  # nobody plays bidder_0
    local = run_episode("single_trade", 2, {"bidder_0": "idle"})
    # the fallback (abstain in bidding, wait otherwise) is what the idle bidder does
    assert view["returns"] == local.returns
    assert view["timeouts"]["bidder_0"] == local.decisions["bidder_0"] == 9
    t = read_transcript(out / f"{made['match_id']}.jsonl")
    mine = [s for s in t.steps if s.seat == "bidder_0" and s.live]
    assert len(mine) == 9
    assert all(s.agent_error and s.agent_error.startswith("AgentTimeout") for s in mine)
    assert {s.action["action_type"] for s in mine} == {"wait", "bid"}
    assert all(s.action["bids"] == [] for s in mine if s.action["action_type"] == "bid")
    assert t.footer is not None and t.footer.status == "complete"
    assert t.footer.agent_stats["bidder_0"]["timeouts"] == 9
    # once over, the seat's view says so and actions are refused
    seat = httpx.get(
        f"{base}/matches/{made['match_id']}/seat", headers=auth(made["tokens"]["bidder_0"])
    )
    assert seat.json()["status"] == "done" and seat.json()["timeouts"] == 9
    late = httpx.post(
        f"{base}/matches/{made['match_id']}/seat/action",
        json={"turn": 9, "action": {"action_type": "wait"}},
        headers=auth(made["tokens"]["bidder_0"]),
    )
    assert late.status_code == 409 and "done" in late.json()["error"]


def test_reconnect_with_the_same_token_resumes(server: Any) -> None:
    base, _ = server
    made = create(base, "single_trade", 1, {"bidder_0": "remote"}, turn_deadline=30)
    mid, token = made["match_id"], made["tokens"]["bidder_0"]
    url = f"{base}/matches/{mid}/seat"
    with httpx.Client(headers=auth(token)) as first:
        view = first.get(url, params={"wait": 10}).json()
        assert view["status"] == "your_turn" and view["turn"] == 0
        ok = first.post(f"{url}/action", json={"turn": 0, "action": {"action_type": "wait"}})
        assert ok.status_code == 200
        before = first.get(url, params={"wait": 10}).json()
    # the first client is gone; a new connection with the same token sees the same turn
    with httpx.Client(headers=auth(token)) as second:
        again = second.get(url, params={"wait": 10}).json()
        assert again["turn"] == before["turn"] == 1
        assert again["observation"] == before["observation"]
    play_seat(base, mid, token, "truthful")
    assert wait_done(base, mid)["status"] == "done"


def test_a_token_reaches_only_its_own_seat(server: Any) -> None:
    base, _ = server
    a = create(base, "market_round", 0, {"bidder_0": "remote", "bidder_1": "remote"})
    b = create(base, "market_round", 0, {"bidder_0": "remote"})
    mid = a["match_id"]
    tok0, tok1 = a["tokens"]["bidder_0"], a["tokens"]["bidder_1"]
    view0 = httpx.get(f"{base}/matches/{mid}/seat", headers=auth(tok0), params={"wait": 10}).json()
    assert view0["seat"] == "bidder_0" and view0["observation"]["seat"] == "bidder_0"
    view1 = httpx.get(f"{base}/matches/{mid}/seat", headers=auth(tok1)).json()
    assert view1["seat"] == "bidder_1" and "observation" not in view1  # not its turn yet
    # bidder_1's token cannot act on bidder_0's turn: its own seat has no turn open
    refused = httpx.post(
        f"{base}/matches/{mid}/seat/action",
        json={"turn": 0, "action": {"action_type": "wait"}},
        headers=auth(tok1),
    )
    assert refused.status_code == 409
    # a token of match a is nothing in match b; no token, a wrong one or another scheme: 401
    for headers in (auth(tok0), {}, auth("x" * 43), {"Authorization": f"Basic {tok0}"}):
        for url in (f"{base}/matches/{b['match_id']}/seat", f"{base}/matches/{mid}/seat"):
            if url.endswith(f"{mid}/seat") and headers == auth(tok0):
                continue
            got = httpx.get(url, headers=headers)
            assert got.status_code == 401 and "token" in got.json()["error"]
    # the spectators' view shows no observation and no private state of any seat
    public = httpx.get(f"{base}/matches/{mid}").json()
    text = json.dumps(public)
    for private in ("observation", "budget", "jobs", "holdings", "offers", "seat_seed", tok0):
        assert private not in text
    assert "seed" not in public  # the seed would let anyone redraw every lab's private values
    assert public["waiting_for"] == ["bidder_0"] and public["status"] == "running"
    # the transcript (every seat's actions) is not served while the match runs
    assert (
        httpx.get(f"{base}/matches/{mid}/transcript", headers=auth(a["owner_token"])).status_code
        == 409
    )
    state = httpx.get(f"{base}/matches/{mid}/seat", headers=auth(tok0)).json()
    assert state["turn"] == 0 and state["status"] == "your_turn"  # nothing moved


def test_stopping_the_server_ends_a_running_match_with_the_aborted_footer(
    tmp_path: Path,
) -> None:
    out = tmp_path / "t"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "market", "serve", "--port", str(port), "--out", str(out)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        done = create(base, "single_trade", 0, {"bidder_0": "remote"}, turn_deadline=0.05)
        wait_done(base, done["match_id"])
        made = create(base, "single_trade", 0, {"bidder_0": "remote"}, turn_deadline=60)
        url = f"{base}/matches/{made['match_id']}/seat"
        token = made["tokens"]["bidder_0"]
        view = httpx.get(url, headers=auth(token), params={"wait": 10}).json()
        httpx.post(
            f"{url}/action",
            json={"turn": view["turn"], "action": {"action_type": "wait"}},
            headers=auth(token),
        )
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    t = read_transcript(out / f"{made['match_id']}.jsonl")  # readable, chain verified
    assert t.footer is not None and t.footer.status == "aborted"
    assert t.incomplete is not None and len(t.steps) >= 1
    finished = read_transcript(out / f"{done['match_id']}.jsonl")  # nothing finished is lost
    assert finished.complete and finished.footer is not None
    assert replay(out / f"{made['match_id']}.jsonl", partial=True).ok


def test_tokens_expire_with_their_match(tmp_path: Path) -> None:
    with served(tmp_path / "t", "--keep", "3") as base:  # seconds; room for a loaded box
        made = create(base, "single_trade", 0, {"bidder_0": "remote"}, turn_deadline=0.02)
        url = f"{base}/matches/{made['match_id']}/seat"
        token = made["tokens"]["bidder_0"]
        assert wait_done(base, made["match_id"])["status"] == "done"
        assert httpx.get(url, headers=auth(token)).status_code == 200  # kept a while
        time.sleep(3.5)
        gone = httpx.get(url, headers=auth(token))
        assert gone.status_code == 404 and "expired" in gone.json()["error"]
        late = httpx.post(
            f"{url}/action",
            json={"turn": 0, "action": {"action_type": "wait"}},
            headers=auth(token),
        )
        assert late.status_code == 404
    assert (tmp_path / "t" / f"{made['match_id']}.jsonl").exists()  # the transcript stays
