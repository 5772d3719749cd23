"""Served matches (``gpumarket serve``) safe to expose, on the real server under uvicorn on
127.0.0.1 with real HTTP clients: heavy matches do not stall other clients, creating a match can
need a creator token (checked before the body is read), a creator can cancel its match, running
matches are limited per client, in wall time and in silence, seat seeds give the episode seed
away to nobody, lone surrogates are refused at the door, and a restart ends every match."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from devtools import CHROMIUM, browser
from match_support import ROOT, auth, create, free_port, served, wait_done, wait_ready

from agents.base import BaseAgent
from agents.registry import make_agent
from market.cli.parser import build_parser
from market.core.rng import RngStreams
from market.environment.aec import raw_env
from market.record.reader import read_transcript
from market.review.replay import replay
from market.run.rollout import arun_episode, run_episode
from market.serve import matches

TOKEN = "creator-" + "k" * 32


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _one_line_error(reply: httpx.Response) -> str:
    error = reply.json()["error"]
    assert isinstance(error, str) and error and "\n" not in error
    return error


# -- heavy matches off the event loop ---------------------------------------------------------


def test_two_large_matches_do_not_stall_other_clients(tmp_path: Path) -> None:
    """Two large_market matches (300 labs; the server plays every seat but one, whose turns
    fall back at once) run while another client polls /healthz and its own seat: before the
    env moved off the event loop each such request waited up to 0.7 s."""
    with served(tmp_path / "t") as base:
        mine = create(base, "single_trade", 1, {"bidder_0": "remote"}, turn_deadline=600)
        seat_url = f"{base}/matches/{mine['match_id']}/seat"
        seat_auth = auth(mine["tokens"]["bidder_0"])
        assert httpx.get(seat_url, headers=seat_auth, params={"wait": 10}).json()["turn"] == 0
        heavy = [
            create(base, "large_market", i, {"bidder_0": "remote"}, turn_deadline=0.01)
            for i in range(2)
        ]
        health: list[float] = []
        seat: list[float] = []
        with httpx.Client(timeout=30) as client:
            end = time.monotonic() + 180
            while time.monotonic() < end:
                began = time.perf_counter()
                assert client.get(f"{base}/healthz").status_code == 200
                health.append(time.perf_counter() - began)
                began = time.perf_counter()
                view = client.get(seat_url, headers=seat_auth).json()
                seat.append(time.perf_counter() - began)
                assert view["status"] == "your_turn"
                views = [client.get(f"{base}/matches/{m['match_id']}").json() for m in heavy]
                if all(v["status"] != "running" for v in views):
                    break
                time.sleep(0.02)
        print(
            f"\n/healthz p95 {1000 * p95(health):.1f} ms, max {1000 * max(health):.1f} ms; "
            f"seat p95 {1000 * p95(seat):.1f} ms; {len(health)} samples"
        )
        assert p95(health) < 0.25 and p95(seat) < 0.25, (sorted(health)[-5:], sorted(seat)[-5:])
        assert [v["status"] for v in views] == ["done", "done"]
        assert len(health) >= 5  # sampled throughout, not once


# -- the creator token ------------------------------------------------------------------------


def test_creating_needs_the_creator_token_checked_before_the_body(tmp_path: Path) -> None:
    token_file = tmp_path / "create-token"
    token_file.write_text(TOKEN + "\n")
    with served(tmp_path / "t", "--create-token-file", str(token_file)) as base:
        body = {"scenario": "single_trade", "seats": {"bidder_0": "remote"}}
        for headers in ({}, auth("x" * len(TOKEN)), {"Authorization": f"Basic {TOKEN}"}):
            refused = httpx.post(f"{base}/matches", json=body, headers=headers)
            assert refused.status_code == 401, refused.text
            assert "creator token" in _one_line_error(refused)
        assert httpx.get(f"{base}/healthz").json()["matches"] == 0
        made = httpx.post(f"{base}/matches", json=body, headers=auth(TOKEN))
        assert made.status_code == 201, made.text
        # the answer comes before any body byte: the token is checked first (a server that
        # read the body first would wait for it)
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                b"POST /matches HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 401")
        # every other route is as before: seats play with their own tokens
        mid, seat = made.json()["match_id"], made.json()["tokens"]["bidder_0"]
        got = httpx.get(f"{base}/matches/{mid}/seat", headers=auth(seat), params={"wait": 10})
        assert got.json()["status"] == "your_turn"
    with served(tmp_path / "e", env={"GPUMARKET_CREATE_TOKEN": TOKEN}) as base:
        assert httpx.post(f"{base}/matches", json=body).status_code == 401
        assert httpx.post(f"{base}/matches", json=body, headers=auth(TOKEN)).status_code == 201


@pytest.mark.parametrize(
    ("token", "env", "problem"),
    [
        ("short", None, "at least 16"),
        ("two words " + "x" * 20, None, "no spaces"),
        ("", None, "empty"),
        (TOKEN, TOKEN, "give one creator token"),
    ],
)
def test_a_bad_creator_token_is_one_line_at_start(
    tmp_path: Path, token: str, env: str | None, problem: str
) -> None:
    path = tmp_path / "token"
    path.write_text(token)
    got = subprocess.run(
        [sys.executable, "-m", "market", "serve", "--create-token-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            **({"GPUMARKET_CREATE_TOKEN": env} if env else {}),
        },
    )
    assert got.returncode == 2
    assert problem in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert "Traceback" not in got.stderr


def test_the_cli_defaults_are_the_documented_limits() -> None:
    args = build_parser().parse_args(["serve"])
    assert args.max_matches == matches.MAX_MATCHES == 1000
    assert args.max_matches_per_client == matches.MAX_MATCHES_PER_CLIENT == 64
    assert args.max_match_time == matches.MAX_MATCH_S == 21600
    assert args.idle_timeout == matches.IDLE_S == 900
    assert args.create_token_file is None
    docs = (ROOT / "docs" / "remote-agents.md").read_text()
    for flag in ("--create-token-file", "GPUMARKET_CREATE_TOKEN", "--max-matches-per-client"):
        assert flag in docs
    for flag in ("--max-matches ", "--max-match-time", "--idle-timeout"):
        assert flag in docs


# -- cancel, limits, silence, wall time ---------------------------------------------------------


def test_the_creator_cancels_its_match(tmp_path: Path) -> None:
    out = tmp_path / "t"
    with served(out) as base:
        made = create(base, "single_trade", 3, {"bidder_0": "remote"}, turn_deadline=600)
        mid, seat = made["match_id"], made["tokens"]["bidder_0"]
        url = f"{base}/matches/{mid}"
        view = httpx.get(f"{url}/seat", headers=auth(seat), params={"wait": 10}).json()
        ok = httpx.post(
            f"{url}/seat/action",
            json={"turn": view["turn"], "action": {"action_type": "wait"}},
            headers=auth(seat),
        )
        assert ok.status_code == 200
        for headers in ({}, auth(seat), auth("y" * 43)):  # only the owner token cancels
            refused = httpx.delete(url, headers=headers)
            assert refused.status_code == 401 and "owner token" in _one_line_error(refused)
        assert httpx.get(url).json()["status"] == "running"
        gone = httpx.delete(url, headers=auth(made["owner_token"]))
        assert gone.status_code == 200, gone.text
        assert gone.json()["status"] == "aborted" and "creator" in gone.json()["error"]
        seat_view = httpx.get(f"{url}/seat", headers=auth(seat), params={"wait": 5}).json()
        assert seat_view["status"] == "aborted" and "observation" not in seat_view
        again = httpx.delete(url, headers=auth(made["owner_token"]))
        assert again.status_code == 409 and "already ended" in _one_line_error(again)
        late = httpx.post(
            f"{url}/seat/action",
            json={"turn": view["turn"] + 1, "action": {"action_type": "wait"}},
            headers=auth(seat),
        )
        assert late.status_code == 409
    t = read_transcript(out / f"{mid}.jsonl")
    assert t.footer is not None and t.footer.status == "aborted" and len(t.steps) >= 1
    assert replay(out / f"{mid}.jsonl", partial=True).ok


@pytest.mark.slow
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is not installed (apt-get install -y chromium chromium-driver)",
)
def test_the_seat_page_says_its_match_was_cancelled(tmp_path: Path) -> None:
    with served(tmp_path / "t") as base:
        made = create(base, "single_trade", 1, {"bidder_0": "remote"}, turn_deadline=600)
        mid, token = made["match_id"], made["tokens"]["bidder_0"]
        with browser(tmp_path / "profile") as page:
            page.goto(f"{base}/matches/{mid}/play#token={token}")
            page.wait_for("document.body.dataset.state === 'your_turn'", 60)
            gone = httpx.delete(f"{base}/matches/{mid}", headers=auth(made["owner_token"]))
            assert gone.status_code == 200
            page.wait_for("document.body.dataset.state === 'aborted'", 30)
            status = page.js("document.getElementById('status').textContent")
            assert status == "the match was stopped (cancelled by its creator)"


def test_running_matches_are_limited_per_client(tmp_path: Path) -> None:
    with served(tmp_path / "t", "--max-matches-per-client", "2") as base:
        body = {"scenario": "single_trade", "seats": {"bidder_0": "remote"}, "turn_deadline": 600}
        made = [httpx.post(f"{base}/matches", json=body).json() for _ in range(2)]
        third = httpx.post(f"{base}/matches", json=body)
        assert third.status_code == 429 and "per client" in _one_line_error(third)
        assert httpx.get(f"{base}/healthz").json()["matches"] == 2
        cancel = httpx.delete(
            f"{base}/matches/{made[0]['match_id']}", headers=auth(made[0]["owner_token"])
        )
        assert cancel.status_code == 200
        assert httpx.post(f"{base}/matches", json=body).status_code == 201  # room again


def test_silent_and_overlong_matches_are_ended(tmp_path: Path) -> None:
    """A match whose remote seats are all silent for --idle-timeout is ended; one whose seat
    keeps asking lives until --max-match-time. Both end aborted and replay."""
    out = tmp_path / "t"
    with served(out, "--idle-timeout", "1.5", "--max-match-time", "5") as base:
        silent = create(base, "single_trade", 0, {"bidder_0": "remote"}, turn_deadline=600)
        busy = create(base, "single_trade", 1, {"bidder_0": "remote"}, turn_deadline=600)
        busy_url = f"{base}/matches/{busy['match_id']}"
        began = time.monotonic()
        while time.monotonic() < began + 30:
            seat = httpx.get(f"{busy_url}/seat", headers=auth(busy["tokens"]["bidder_0"]))
            if seat.json()["status"] != "your_turn":
                break
            time.sleep(0.25)
        lived = time.monotonic() - began
        quiet = httpx.get(f"{base}/matches/{silent['match_id']}").json()
        assert quiet["status"] == "aborted" and "heard from" in quiet["error"]
        assert seat.json()["status"] == "aborted" and "5 s" in seat.json()["error"]
        assert lived >= 4  # the busy match outlived the idle timeout, until its wall time
    for m in (silent, busy):
        path = out / f"{m['match_id']}.jsonl"
        t = read_transcript(path)
        assert t.footer is not None and t.footer.status == "aborted"
        assert replay(path, partial=True).ok


def test_ended_matches_kept_are_bounded(tmp_path: Path) -> None:
    """Created and cancelled over and over, ended matches do not pile up in memory."""

    async def scenario() -> tuple[list[str], list[str]]:
        registry = matches.MatchRegistry(tmp_path, max_ended=2)
        made = []
        for seed in range(4):
            match = registry.create(
                matches.MatchConfig("single_trade", seed, {"bidder_0": "remote"}, 600.0)
            )
            while not match.transcript.exists():  # started: its header is written
                await asyncio.sleep(0.01)
            await match.cancel("cancelled by its creator")
            made.append(match.id)
        registry.expire(force=True)
        await registry.close()
        assert all(registry.matches[m].status == "aborted" for m in registry.matches)
        return made, [m for m in made if m in registry.matches]

    made, kept = asyncio.run(scenario())
    assert kept == made[-2:]  # the newest two
    assert len(list(tmp_path.glob("*.jsonl"))) == 4  # the transcripts stay


# -- seeds ----------------------------------------------------------------------------------


def test_a_seat_seed_does_not_give_a_small_episode_seed_away(tmp_path: Path) -> None:
    """The attack: recompute a local run's seat seed for every small episode seed and compare
    it with the one the server shows. The shown one is keyed by a secret of the match."""
    seed, seat = 1234, "bidder_0"
    env = raw_env("market_round")
    env.reset(seed=seed)
    index = env.possible_agents.index(seat)
    assert RngStreams(seed).seat_seed(index) == env.seat_seed(seat)  # the attacker's function
    with served(tmp_path / "t") as base:
        shown = []
        for _ in range(2):
            made = create(base, "market_round", seed, {seat: "remote"}, turn_deadline=600)
            view = httpx.get(
                f"{base}/matches/{made['match_id']}/seat",
                headers=auth(made["tokens"][seat]),
                params={"wait": 10},
            ).json()
            shown.append(view["seat_seed"])
    assert shown[0] != shown[1]  # a fresh key per match
    assert all(isinstance(s, int) and 0 <= s < 2**32 for s in shown)  # a seat seed's range
    table = [RngStreams(s).seat_seed(index) for s in range(2**15)]
    assert table.index(env.seat_seed(seat)) == seed  # the search works on a local seat seed
    found = [s for s, seat_seed in enumerate(table) if seat_seed in shown]
    assert seed not in found  # and finds nothing from the served ones


def test_a_match_without_a_seed_draws_128_bits_and_replays(tmp_path: Path) -> None:
    out = tmp_path / "t"
    with served(out) as base:
        drawn = [
            httpx.post(
                f"{base}/matches",
                json={
                    "scenario": "single_trade",
                    "seats": {"bidder_0": "remote"},
                    "turn_deadline": 0.02,
                },
            ).json()["match_id"]
            for _ in range(2)
        ]
        top = create(base, "single_trade", 2**128 - 1, {"bidder_0": "remote"}, turn_deadline=0.02)
        over = httpx.post(
            f"{base}/matches",
            json={"scenario": "single_trade", "seed": 2**128, "seats": {"bidder_0": "remote"}},
        )
        assert over.status_code == 422 and "seed" in _one_line_error(over)
        for mid in [*drawn, top["match_id"]]:
            assert wait_done(base, mid)["status"] == "done"
    seeds = [read_transcript(out / f"{mid}.jsonl").header.seed for mid in drawn]
    assert seeds[0] != seeds[1] and all(0 <= s < 2**128 for s in seeds)
    assert max(seeds) >= 2**64  # 128 bits drawn, not 31 (fails once in 2**64 runs)
    assert read_transcript(out / f"{top['match_id']}.jsonl").header.seed == 2**128 - 1
    for mid in [*drawn, top["match_id"]]:
        report = replay(out / f"{mid}.jsonl")
        assert report.ok and report.steps_checked > 0


# -- lone surrogates ------------------------------------------------------------------------


SURROGATE_ACTIONS = [
    b'{"action_type": "send_message", "to": "all", "text": "hi \\ud800"}',
    b'{"action_type": "send_message", "to": "all", "text": "\\udfff"}',
    b'{"action_type": "send_offer", "to": "bidder_1", "blocks": 1, "price": 1.0,'
    b' "conditions": {"note": "\\ud800"}}',
    b'{"action_type": "send_offer", "to": "bidder_1", "blocks": 1, "price": 1.0,'
    b' "conditions": {"\\udbff": 1}}',
    b'{"action_type": "wait", "\\ud800": 1}',
]


def test_a_lone_surrogate_in_a_create_body_gets_422(tmp_path: Path) -> None:
    with served(tmp_path / "t") as base:
        for body in (
            b'{"scenario": "\\ud800", "seats": {"bidder_0": "remote"}}',
            b'{"scenario": "single_trade", "seats": {"\\ud800": "remote"}}',
            b'{"scenario": "single_trade", "seats": {"bidder_0": "remote\\udc00"}}',
        ):
            refused = httpx.post(
                f"{base}/matches", content=body, headers={"content-type": "application/json"}
            )
            assert refused.status_code == 422, refused.text
            assert "surrogate" in _one_line_error(refused)
        assert httpx.get(f"{base}/healthz").json()["matches"] == 0


def test_lone_surrogates_in_actions_get_422_and_the_match_replays(tmp_path: Path) -> None:
    """Before, an action holding a lone surrogate got HTTP 500 (or was taken, and its match's
    transcript could not be replayed)."""
    out = tmp_path / "t"
    with served(out) as base:
        made = create(base, "single_trade", 4, {"bidder_0": "remote"}, turn_deadline=120)
        mid, token = made["match_id"], made["tokens"]["bidder_0"]
        url = f"{base}/matches/{mid}/seat"
        refusals = 0
        while True:
            view = httpx.get(url, headers=auth(token), params={"wait": 10}).json()
            if view["status"] != "your_turn":
                break
            if view["observation"]["phase"] == "negotiation" and not refusals:
                for action in SURROGATE_ACTIONS:
                    body = b'{"turn": %d, "action": %s}' % (view["turn"], action)
                    refused = httpx.post(
                        f"{url}/action",
                        content=body,
                        headers={**auth(token), "content-type": "application/json"},
                    )
                    assert refused.status_code == 422, refused.text
                    assert "surrogate" in _one_line_error(refused)
                    refusals += 1
                # a surrogate pair (an emoji as JSON escapes) is text: accepted and recorded
                action = (
                    b'{"action_type": "send_message", "to": "all", "text": "ok \\ud83d\\ude00"}'
                )
                sent = httpx.post(
                    f"{url}/action",
                    content=b'{"turn": %d, "action": %s}' % (view["turn"], action),
                    headers={**auth(token), "content-type": "application/json"},
                )
                assert sent.status_code == 200, sent.text
                continue
            reply = httpx.post(
                f"{url}/action",
                json={"turn": view["turn"], "action": {"action_type": "wait"}},
                headers=auth(token),
            )
            assert reply.status_code == 200
        assert refusals == len(SURROGATE_ACTIONS)
        assert wait_done(base, mid)["status"] == "done"
    path = out / f"{mid}.jsonl"
    t = read_transcript(path)
    assert any(
        s.action.get("text") == "ok \U0001f600" for s in t.steps if isinstance(s.action, dict)
    )
    report = replay(path)
    assert report.ok and report.steps_checked == len(t.steps)


# -- a restart ends every match -------------------------------------------------------------


def test_a_restart_ends_every_match_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "t"
    with served(out) as base:
        made = create(base, "single_trade", 0, {"bidder_0": "remote"}, turn_deadline=600)
        mid, token = made["match_id"], made["tokens"]["bidder_0"]
        view = httpx.get(f"{base}/matches/{mid}/seat", headers=auth(token), params={"wait": 10})
        assert view.json()["status"] == "your_turn"
    t = read_transcript(out / f"{mid}.jsonl")  # SIGTERM wrote the aborted footer
    assert t.footer is not None and t.footer.status == "aborted"
    with served(out) as base:  # the same folder, a new process
        for url, headers in (
            (f"{base}/matches/{mid}", {}),
            (f"{base}/matches/{mid}/seat", auth(token)),
        ):
            gone = httpx.get(url, headers=headers)
            assert gone.status_code == 404
            assert "server restart" in _one_line_error(gone)
    assert read_transcript(out / f"{mid}.jsonl").footer == t.footer  # left as it was


def test_sigterm_during_a_heavy_step_still_writes_the_footer(tmp_path: Path) -> None:
    """The env runs on a worker thread: stopping the server waits for the step in progress,
    then writes the aborted footer (never a footer in the middle of a step)."""
    out = tmp_path / "t"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "market", "serve", "--port", str(port), "--out", str(out)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        made = create(base, "large_market", 0, {"bidder_0": "remote"}, turn_deadline=0.01)
        end = time.monotonic() + 60
        while httpx.get(f"{base}/matches/{made['match_id']}").json()["steps"] < 50:
            assert time.monotonic() < end
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    path = out / f"{made['match_id']}.jsonl"
    t = read_transcript(path)
    assert t.footer is not None and t.footer.status == "aborted" and len(t.steps) >= 50
    assert replay(path, partial=True).ok


class AsyncTruthful(BaseAgent):
    """A bidder with its own ``aact`` (as a remote or LLM seat has): awaited on the loop."""

    name = "async_truthful"
    roles = frozenset({"bidder"})

    def __init__(self) -> None:
        super().__init__()
        self.inner = make_agent("truthful")

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.inner.reset(seed)

    def act(self, observation: Any) -> Any:  # what a local run calls
        return self.inner.act(observation)

    async def aact(self, observation: Any) -> Any:
        await asyncio.sleep(0)
        return self.inner.act(observation)


def test_an_episode_on_worker_threads_equals_the_local_run(tmp_path: Path) -> None:
    """arun_episode with an executor (as the server plays its matches) records the same steps
    as run_episode, with agents on the loop and on the workers."""
    seats = {"bidder_0": AsyncTruthful, "bidder_1": "rule_expert"}
    with ThreadPoolExecutor(2) as pool:
        got = asyncio.run(
            arun_episode(
                "coalition_market", 7, seats, transcript=tmp_path / "a.jsonl", executor=pool
            )
        )
    local = run_episode("coalition_market", 7, seats, transcript=tmp_path / "b.jsonl")
    assert got.returns == local.returns and got.steps == local.steps

    def steps(path: Path) -> list[dict[str, Any]]:
        return [
            {
                k: v
                for k, v in s.model_dump(mode="json").items()
                if k not in ("latency_s", "prev", "digest")
            }
            for s in read_transcript(path).steps
        ]

    assert steps(tmp_path / "a.jsonl") == steps(tmp_path / "b.jsonl")
    assert replay(tmp_path / "a.jsonl").ok
