"""``gpumarket serve --compat daedalus`` on a real uvicorn server of 127.0.0.1: the DAEDALUS
card's section 5.1 request sequence run as the card prints it (only its host is this server),
whole episodes, the card's mechanism JSON unchanged, transcripts that replay exactly, sessions
kept apart, and what the server refuses."""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import market
from market.serve.compat_daedalus import create_daedalus_app
from market.serve.compat_server import CompatServer
from market.serve.compat_sessions import SessionTable

CARD = Path(__file__).resolve().parents[1] / "compat_seed" / "daedalus" / "card_5_1.py"
#: the card's section 1 mechanism, verbatim
CARD_MECHANISM = {
    "auction_type": "second_price",
    "reserve_price": 0.18,
    "reveal_reserve": False,
    "reveal_competing_bids": False,
    "reveal_winner_identity": True,
    "reveal_clearing_price": True,
    "reveal_bid_distribution": False,
    "shill_penalty": 1.2,
    "withdrawal_penalty": 0.6,
    "collusion_penalty": 1.9,
    "coalition_policy": "penalize_suspected",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CompatServer, Path]]:
    out = tmp_path_factory.mktemp("daedalus-transcripts")
    with CompatServer(create_daedalus_app(out)) as srv:
        yield srv, out


def _run_card(url: str) -> str:
    """The card's snippet with its host replaced by ``url`` (the only change), its stdout."""
    lines = CARD.read_text().splitlines()
    source = "\n".join(f'BASE = "{url}"' if ln.startswith("BASE = ") else ln for ln in lines)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, str(CARD), "exec"), {"__name__": "card_5_1"})
    return printed.getvalue()


def test_the_cards_section_5_1_sequence_runs(server: tuple[CompatServer, Path]) -> None:
    srv, _ = server
    printed = _run_card(srv.url).splitlines()
    assert printed[-1].startswith("R = ")
    assert math.isfinite(float(printed[-1].removeprefix("R = ")))
    # the session the card opened ("demo") is one design step in, and goes on to its end
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        state = client.get("/state", params={"session_id": "demo"}).json()["state"]
        assert state["round_number"] == 1 and state["episode_length"] == 10
        assert state["n_agents"] == 8


def test_a_whole_episode_with_the_cards_mechanism_unchanged(
    server: tuple[CompatServer, Path],
) -> None:
    srv, out = server
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        reset = client.post(
            "/reset",
            json={"session_id": "whole", "n_agents": 6, "episode_length": 4, "stage": 3, "seed": 7},
        ).json()
        obs = reset["observation"]
        assert (obs["round_number"], obs["episode_length"], obs["market_outcomes"]) == (0, 4, [])
        rewards, steps, body = [], 0, None
        while True:
            body = client.post(
                "/step", json={"session_id": "whole", "action": CARD_MECHANISM}
            ).json()
            steps += 1
            assert body["info"]["error"] is None  # read in DAEDALUS units in this family
            rewards.append(body["reward"])
            if body["done"]:
                break
            # five market rounds per design step, one outcome each
            assert len(body["observation"]["market_outcomes"]) == 5 * steps
        assert steps == 4
        assert sum(rewards) == pytest.approx(body["info"]["episode_return"], abs=1e-9)
    path = out / f"{reset['match_id']}.jsonl"
    assert market.replay(path).ok
    header = json.loads(path.read_text().splitlines()[0])
    assert header["scenario"]["name"] == "daedalus_stage_3"


def test_sessions_of_one_id_from_two_clients_stay_apart(
    server: tuple[CompatServer, Path],
) -> None:
    srv, _ = server
    with httpx.Client(base_url=srv.url, timeout=60) as mine:
        mine.post("/reset", json={"session_id": "demo2", "n_agents": 4, "episode_length": 2})
        other = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=srv.url, transport=other, timeout=60) as theirs:
            theirs.post("/reset", json={"session_id": "demo2", "n_agents": 9, "episode_length": 3})
            assert theirs.get("/state?session_id=demo2").json()["state"]["n_agents"] == 9
        assert mine.get("/state?session_id=demo2").json()["state"]["n_agents"] == 4


def test_attackers_are_refused(server: tuple[CompatServer, Path]) -> None:
    srv, _ = server
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        assert (
            client.post(
                "/reset", json={"n_agents": 8}, headers={"Origin": "http://evil.example"}
            ).status_code
            == 403
        )
        huge = client.post(
            "/api/design",
            content=b'{"market_outcomes": [' + b"{}," * 40_000 + b"{}]}",
            headers={"content-type": "application/json"},
        )
        assert huge.status_code == 413
        for body in (
            {"n_agents": 10_000},
            {"episode_length": 0},
            {"scenario": "../../etc/passwd"},
            {"agents": {"designer": "py:os:system"}},
            {"judge": "llm:openai?base_url=http://169.254.169.254"},
        ):
            got = client.post("/reset", json=body)
            assert got.status_code == 422, body
            assert "\n" not in got.json()["detail"]
        client.post("/reset", json={"session_id": "atk", "n_agents": 3, "episode_length": 1})
        assert client.post("/step", json={"session_id": "atk"}).status_code == 422
        extra = client.post(
            "/step", json={"session_id": "atk", "action": {}, "callback": "http://x"}
        )
        assert extra.status_code == 422
        # a mechanism the market cannot use is the env's refusal (penalty), never a crash
        bad = client.post(
            "/step", json={"session_id": "atk", "action": {"auction_type": "rm -rf /"}}
        ).json()
        assert bad["info"]["error"] and bad["done"] is True


def test_idle_sessions_are_closed_with_an_aborted_transcript(tmp_path: Path) -> None:
    from market.serve.compat_sessions import CompatEpisode, Session
    from scenarios import load_scenario

    now = [0.0]
    table = SessionTable(tmp_path, "daedalus", idle_timeout_s=10, clock=lambda: now[0])
    match_id, path = table.new_match()
    episode = CompatEpisode(
        load_scenario("daedalus_stage_0"), "designer_0", 1, path, "daedalus_client"
    )
    table.put(Session("127.0.0.1", "s", match_id, episode, last_seen=0.0))
    now[0] = 5.0
    table.sweep()
    assert len(table) == 1
    now[0] = 16.0
    table.sweep()
    assert len(table) == 0
    footer = json.loads(path.read_text().splitlines()[-1])
    assert footer.get("aborted") or footer.get("status") == "aborted", footer
