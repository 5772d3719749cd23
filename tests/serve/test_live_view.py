"""The live match view through the real server (``gpumarket serve`` under uvicorn on 127.0.0.1):
a real server-sent-events client follows a match played by scripted remote clients (events in
order, the final state equal to the transcript's returns, no private state in any event), and
headless Chromium, driven through the DevTools protocol, watches the page update while a seat
sends hostile text that must show as text and run nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from devtools import CHROMIUM, browser
from match_support import auth, create, play_seat, served, wait_done

import market.serve.live_view as live
from agents.base import BaseAgent
from agents.registry import make_agent
from market.core.actions import ActionModel, SendMessage
from market.environment import Observation
from market.record.reader import read_transcript
from market.review.report import Episode
from market.review.report.page import episode_section
from market.run.rollout import run_episode
from market.serve.live_view import PRIVATE_TEXT, SEALED, public_steps
from market.serve.matches import MatchConfig, MatchRegistry

SCENARIO = "coalition_market"
SEED = 48213577  # distinctive: it must never appear in the public stream
PAYLOAD = (
    "<img src=x onerror=\"document.title='PWNED';document.body.setAttribute('data-pwned','1')\">"
    " </script><script>document.title='PWNED';window.__pwned=1</script>"
)
SECRET_DM = "SECRET-DM-7f3a"
SECRET_WHY = "SECRET-REASONING-91bc"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("live") / "transcripts"
    with served(out) as base:
        yield base, out


def play_hostile(base: str, match_id: str, token: str, pause: float = 0.0) -> list[int]:
    """Play a seat that, in negotiation, posts ``PAYLOAD`` publicly and ``SECRET_DM`` privately
    (both with a secret reasoning), and otherwise bids truthfully; returns the seat seeds seen."""
    inner = make_agent("truthful", "bidder")
    seeds: list[int] = []
    turn_no = 0
    with httpx.Client(base_url=base, headers=auth(token), timeout=60) as client:
        while True:
            view = client.get(f"/matches/{match_id}/seat", params={"wait": 10}).json()
            if view.get("seat_seed") is not None and not seeds:
                seeds.append(view["seat_seed"])
                inner.reset(view["seat_seed"])
            if view["status"] in ("done", "aborted"):
                return seeds
            if view["status"] != "your_turn":
                continue
            time.sleep(pause)
            turn_no += 1
            if "send_message" in view["legal_actions"]:
                to: Any = "all" if turn_no % 2 else ["bidder_1"]
                text = f"hello {PAYLOAD}" if to == "all" else SECRET_DM
                body: Any = {
                    "action_type": "send_message",
                    "to": to,
                    "text": text,
                    "reasoning": SECRET_WHY,
                }
            else:
                body = inner.act(Observation.model_validate(view["observation"]))
                body = body.model_dump(mode="json")
            reply = client.post(
                f"/matches/{match_id}/seat/action", json={"turn": view["turn"], "action": body}
            )
            assert reply.status_code == 200, reply.text


def read_events(url: str, into: list[tuple[str, dict[str, Any]]]) -> None:
    """A plain SSE client: every event's (name, JSON data), until the stream ends."""
    name, data = "message", ""
    with httpx.stream("GET", url, timeout=120) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and data:
                into.append((name, json.loads(data)))
                name, data = "message", ""


def start_match(base: str, pause: float) -> tuple[dict[str, Any], list[threading.Thread], list]:
    made = create(
        base, SCENARIO, SEED, {"bidder_0": "remote", "bidder_1": "remote"}, turn_deadline=30
    )
    seeds: list[Any] = []

    def hostile() -> None:
        seeds.extend(play_hostile(base, made["match_id"], made["tokens"]["bidder_0"], pause))

    def plain() -> None:
        view = play_seat(base, made["match_id"], made["tokens"]["bidder_1"], "truthful")
        seeds.append(view.get("seat_seed"))

    threads = [threading.Thread(target=hostile), threading.Thread(target=plain)]
    return made, threads, seeds


def test_event_stream_follows_the_match_in_order_and_public(server: Any) -> None:
    base, out = server
    made, players, seeds = start_match(base, 0.01)
    assert made["live_url"] == f"/matches/{made['match_id']}/live"
    events: list[tuple[str, dict[str, Any]]] = []
    reader = threading.Thread(target=read_events, args=(f"{base}{made['live_url']}/events", events))
    reader.start()
    time.sleep(0.3)  # the reader sees the match before any move
    for t in players:
        t.start()
    for t in [*players, reader]:
        t.join(120)
    assert not reader.is_alive()
    view = wait_done(base, made["match_id"])
    assert view["status"] == "done"

    names = [n for n, _ in events]
    assert names[-1] == "end" and names.count("end") == 1 and set(names[:-1]) == {"state"}
    states = [d for n, d in events if n == "state"]
    assert len(states) >= 5
    assert [d["seq"] for d in states] == list(range(1, len(states) + 1))
    assert events[-1][1]["seq"] == len(states) + 1
    steps = [d["steps"] for d in states]
    rounds = [d["round"] for d in states]
    assert steps == sorted(steps) and rounds == sorted(rounds) and rounds[-1] > rounds[0]
    assert [d["status"] for d in states[:-1]] == ["running"] * (len(states) - 1)

    final = states[-1]
    transcript = read_transcript(out / f"{made['match_id']}.jsonl")
    assert transcript.footer is not None
    assert final["status"] == "done" and final["steps"] == len(transcript.steps)
    assert final["returns"] == transcript.footer.returns  # bit-identical through JSON
    assert final["rewards"] == pytest.approx(transcript.footer.returns, abs=1e-9)
    assert final["rounds_closed"] == len(transcript.rounds) and final["mechanism"]
    # the conduct scores so far: those the last closed round recorded
    last = transcript.rounds[-1].conduct
    assert last is not None and final["conduct"] == last["scores"]
    assert final["conduct_as_of"] == f"after round {transcript.rounds[-1].round}"
    # the hostile seat's public message is there, escaped, in the report's own round tables
    assert "hello &lt;img src=x onerror=" in final["html"] and "<img" not in final["html"]
    assert 'class="round"' in final["html"] and 'data-plot="price"' in final["html"]

    # nothing private in any event: no seed, seat seed, token, reasoning, private message text,
    # observation, prompt or digest
    raw = json.dumps([d for _, d in events])
    secrets = [str(SEED), SECRET_DM, SECRET_WHY, made["owner_token"], *made["tokens"].values()]
    secrets += [str(s) for s in seeds if s is not None]
    assert len(seeds) == 2
    for secret in secrets:
        assert secret not in raw, secret
    assert PRIVATE_TEXT in raw  # the private message is shown as sent, without its text
    for key in ("observation", "prompt", "seat_seed", "obs_digest", "state_digest", "seed"):
        assert f'"{key}"' not in raw, key
    assert not re.search(r"\bseed\b", final["html"])


def test_live_page_headers_and_unknown_match(server: Any) -> None:
    base, _ = server
    missing = httpx.get(f"{base}/matches/{'0' * 16}/live")
    assert missing.status_code == 404 and "no match" in missing.json()["error"]
    assert httpx.get(f"{base}/matches/nothex/live/events").status_code == 422
    made = create(base, SCENARIO, 1, {"bidder_0": "remote"}, turn_deadline=0.05)
    page = httpx.get(f"{base}{made['live_url']}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    nonce = re.search(r"'nonce-([^']+)'", policy)
    assert nonce and f'<script nonce="{nonce.group(1)}">' in page.text
    assert "unsafe-inline" not in policy and "connect-src 'self'" in policy
    assert page.text.count("<script") == 1 and "innerHTML" not in page.text
    wait_done(base, made["match_id"])


@pytest.mark.slow
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is not installed (apt-get install -y chromium chromium-driver)",
)
def test_live_page_in_headless_chromium_updates_and_runs_nothing(
    server: Any, tmp_path: Path
) -> None:
    base, out = server
    made, players, _ = start_match(base, 0.15)  # slow enough to watch
    with browser(tmp_path / "profile") as page:
        page.call("Page.navigate", url=f"{base}{made['live_url']}")
        end = time.monotonic() + 30
        while page.js("document.body && document.body.dataset.updates") in (None, "0"):
            assert time.monotonic() < end, "the page got no update"
            time.sleep(0.05)
        for t in players:
            t.start()
        seen: list[tuple[str, str, str]] = []
        end = time.monotonic() + 120
        while page.js("document.body.dataset.ended") != "1":
            assert time.monotonic() < end, "the page never saw the end"
            seen.append(
                page.js(
                    "[document.getElementById('round').textContent,"
                    " document.getElementById('steps').textContent,"
                    " document.getElementById('rewards').textContent]"
                )
            )
            time.sleep(0.1)
        for t in players:
            t.join(60)
        rounds = [int(r) for r, _, _ in seen if r.isdigit()]
        assert len(set(rounds)) >= 2 and rounds == sorted(rounds)  # the counter moved, forward
        assert len({rw for _, _, rw in seen}) >= 2  # the rewards changed while it ran
        footer = read_transcript(out / f"{made['match_id']}.jsonl").footer
        assert footer is not None
        cells = page.js(
            "Array.from(document.querySelectorAll('#rewards tr')).map("
            "r => [r.dataset.seat, r.children[3].textContent])"
        )
        assert {s: float(v) for s, v in cells} == pytest.approx(footer.returns, abs=1e-3)
        assert page.js("document.getElementById('status').textContent") == "done"
        # the hostile text is on the page as text, and nothing of it ran
        assert page.js("document.title").startswith("gpumarket live match")
        assert page.js("window.__pwned === undefined") is True
        assert page.js("document.body.dataset.pwned === undefined") is True
        assert page.js("document.querySelectorAll('#episode img, #episode script').length") == 0
        assert page.js("document.body.textContent.includes('<img src=x onerror=')") is True
        assert page.js("document.querySelectorAll('#episode svg').length") >= 3  # the plots
        # a screenshot of the finished page (to GPUMARKET_TEST_ARTIFACTS when set, to look at)
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=1280,
            height=2400,
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
        assert shot.startswith(b"\x89PNG") and len(shot) > 20_000
        folder = Path(os.environ.get("GPUMARKET_TEST_ARTIFACTS", tmp_path))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "live-view.png").write_bytes(shot)
    wait_done(base, made["match_id"])


def test_snapshot_cache_draws_a_match_once_per_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[int] = []
    real = live.public_snapshot

    def counting(match: Any) -> dict[str, Any]:
        drawn.append(1)
        return real(match)

    monkeypatch.setattr(live, "public_snapshot", counting)

    async def scenario() -> None:
        registry = MatchRegistry(tmp_path)
        match = registry.create(MatchConfig(SCENARIO, 3, {"bidder_0": "remote"}, 0.001))
        assert match.task is not None
        await match.task
        cache = live.SnapshotCache(registry)
        first, second = cache.snapshot(match), cache.snapshot(match)
        assert first == second and len(drawn) == 1  # nothing changed: drawn once
        first["seq"] = 99
        assert "seq" not in cache.snapshot(match)  # callers get copies
        # the stream of an ended match: its one state, then the end
        chunks = [c async for c in live.follow(match, 0.01, cache)]
        assert [c.split("\n")[1] for c in chunks] == ["event: state", "event: end"]
        assert len(drawn) == 1
        registry.matches.clear()  # the registry forgot it: so does the cache, at the next draw
        other = registry.create(MatchConfig(SCENARIO, 4, {"bidder_0": "remote"}, 0.001))
        assert other.task is not None
        await other.task
        cache.snapshot(other)
        assert set(cache.last) == {other.id}

    asyncio.run(scenario())


def test_bids_stay_sealed_while_the_match_runs() -> None:
    """A spectator sees a bid's amounts only for rounds whose mechanism revealed competing bids,
    until the match ends; then everything, as in the report. The golden coalition_market episode
    has rounds of both kinds."""
    root = Path(__file__).resolve().parents[2]
    t = read_transcript(root / "transcripts" / "golden" / "coalition_market.jsonl")
    revealed = {
        r.round for r in t.rounds if r.summary["mechanism"]["reveal_competing_bids"] is True
    }
    sealed = {r.round for r in t.rounds} - revealed
    assert revealed and sealed  # both kinds, or the test proves nothing
    running, running_rounds, _ = public_steps(t, ended=False)
    ended, ended_rounds, _ = public_steps(t, ended=True)
    bids_running = [
        e for e in running if isinstance(e.action, dict) and e.action.get("action_type") == "bid"
    ]
    bids_ended = [
        e for e in ended if isinstance(e.action, dict) and e.action.get("action_type") == "bid"
    ]
    assert len(bids_running) == len(bids_ended) > 0
    for shown, done in zip(bids_running, bids_ended, strict=True):
        assert done.action["bids"] != SEALED
        assert (shown.action["bids"] == SEALED) == (shown.round in sealed)
    for live_round, done_round in zip(running_rounds, ended_rounds, strict=True):
        assert "bids" in done_round
        assert ("bids" in live_round) == (done_round["round"] in revealed)


class Boaster(BaseAgent):
    """Bids truthfully; in negotiation claims a budget of 9999 in public and 86421 in private."""

    name = "boaster"

    def __init__(self) -> None:
        super().__init__()
        self.inner = make_agent("truthful", "bidder")
        self.turn = 0

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.inner.reset(seed)

    def act(self, observation: Any) -> ActionModel:
        if observation.phase != "negotiation":
            return self.inner.act(observation)
        self.turn += 1
        if self.turn % 2:
            return SendMessage(to="all", text="Our budget is 9999 credits.")
        return SendMessage(to=["bidder_1"], text="Our budget is 86421 credits.")


def test_conduct_reasons_stay_sealed_while_the_match_runs(tmp_path: Path) -> None:
    """A spectator sees each claim as it is made, but neither its verdict (label and reason: the
    reason states the seat's true budget) nor the seats' scores until the match ends; a private
    message's claim shows neither its span nor its value, ever."""
    path = tmp_path / "boast.jsonl"
    run_episode("market_round", 3, {"bidder_0": Boaster()}, transcript=path)
    t = read_transcript(path)
    truths = {
        e["reason"]
        for s in t.steps
        for e in s.conduct or []
        if e["kind"] == "claim" and e["claim"] == "budget"
    }
    assert truths and all("claimed; budget " in r for r in truths)
    secrets = {r.split("; ")[1] for r in truths}  # e.g. "budget 148.59": the private fact
    running, running_rounds, _ = public_steps(t, ended=False)
    ended, _, _ = public_steps(t, ended=True)
    shown = [e for ev in running for e in ev.conduct]
    assert any(e.get("value") == 9999.0 for e in shown)  # the public claim, as it was made
    assert all(e["label"] == SEALED for e in shown if e["kind"] in ("claim", "promise"))
    assert all("reason" not in e for e in shown)
    sealed = [v for r in running_rounds for v in r["conduct"]["verdicts"]]
    assert all("reason" not in v and v["label"] == SEALED for v in sealed)
    assert all(r["conduct"]["scores"] == {} for r in running_rounds)
    ep = Episode(label="match", header={"scenario_name": "market_round", "seats": {}})
    ep.events.extend(running)
    ep.rounds.extend(running_rounds)
    page = str(episode_section(ep, 0, public=True))
    blob = page + json.dumps([e.conduct for e in running]) + json.dumps(running_rounds)
    for secret in secrets:
        assert secret not in blob, secret
    assert "is 86421" not in blob and "claim budget" in page  # the claim is there, the DM is not
    assert "false" not in json.dumps([e.conduct for e in running])
    scores, _ = ep.conduct_scores()
    assert scores == {}
    # once the match has ended: the verdicts and reasons, as in the report; private spans stay
    # private
    done = [e for ev in ended for e in ev.conduct]
    assert any(e["label"] == "false" and e.get("value") == 9999.0 for e in done)
    assert {e["reason"] for e in done if e.get("claim") == "budget"} <= truths
    assert any(e.get("reason") in truths for e in done)
    assert "is 86421" not in json.dumps(done) and all(e.get("value") != 86421 for e in done)
    assert any(e.get("span") == PRIVATE_TEXT for e in done)
