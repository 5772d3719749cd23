"""The browser human seat (market/serve/human_page.py) in a real headless Chromium.

The real ``gpumarket serve`` runs in a subprocess; a match of single_trade has two remote seats:
bidder_1 is played by a scripted HTTP client that opens with a hostile message (markup and script
payloads), bidder_0 by the page in Chromium, driven through the DevTools protocol: the test picks
an action type and fills the generated form fields, as a person would, and submits. The person
plays round 0 through the page (a refused value is shown and corrected, a raw-JSON action, a bid
schedule), the test's own client finishes the match with the same token, and the transcript
(read with the owner token) holds the page's actions and replays exactly. The hostile message is
shown as text and nothing in it runs.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from devtools import CHROMIUM, browser
from match_support import auth, create, served, wait_done

from market.record.reader import read_transcript
from market.record.replay import replay

PAYLOAD = (
    "<img src=x onerror=\"document.title='PWNED';window.__pwned=1\"> "
    "</script><script>window.__pwned=1</script> "
    '<svg onload="window.__pwned=1"></svg> [bold]markup[/bold]'
)

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is not installed (apt-get install -y chromium chromium-driver)",
)


def play_plainly(base: str, match_id: str, token: str, opening: dict[str, Any] | None) -> None:
    """A remote seat that sends ``opening`` on its first turn, then waits (bids nothing)."""
    url = f"{base}/matches/{match_id}/seat"
    with httpx.Client(headers=auth(token), timeout=60) as client:
        while True:
            got = client.get(url, params={"wait": 10})
            if got.status_code != 200:  # the server stopped (a failed test): nothing to play
                return
            view = got.json()
            if view["status"] in ("done", "aborted"):
                return
            if view["status"] != "your_turn":
                continue
            if opening is not None:
                action, opening = opening, None
            elif view["observation"]["phase"] == "bidding":
                action = {"action_type": "bid", "bids": []}
            else:
                action = {"action_type": "wait"}
            reply = client.post(f"{url}/action", json={"turn": view["turn"], "action": action})
            assert reply.status_code in (200, 409), reply.text  # 409: the page answered first


def fill(page: Any, kind: str, values: dict[str, str]) -> None:
    """Pick ``kind`` in the action list and type ``values`` into its form's fields."""
    page.js(
        f"(() => {{ const k = document.getElementById('kind'); k.value = {json.dumps(kind)}; "
        "k.dispatchEvent(new Event('change')); })()"
    )
    for name, value in values.items():
        page.js(
            f"document.querySelector('form[data-kind={kind}] [name={name}]').value = "
            f"{json.dumps(value)}"
        )


def submit(page: Any, kind: str) -> None:
    page.js(f"document.querySelector('form[data-kind={kind}]').requestSubmit()")


def turn_open(page: Any, turn: int) -> None:
    page.wait_for(
        f"document.body.dataset.state === 'your_turn' && document.body.dataset.turn === '{turn}'"
        " && !document.getElementById('play').hidden",
        60,
    )


@needs_chromium
@pytest.mark.slow
def test_a_person_plays_a_round_in_the_browser(tmp_path: Path) -> None:
    with served(tmp_path / "served") as base:
        made = create(
            base,
            "single_trade",
            1,
            {"bidder_0": "remote", "bidder_1": "remote"},
            turn_deadline=120,
        )
        mid, tokens = made["match_id"], made["tokens"]
        hostile = {"action_type": "send_message", "to": "all", "text": PAYLOAD}
        other = threading.Thread(
            target=play_plainly, args=(base, mid, tokens["bidder_1"], hostile), daemon=True
        )
        other.start()
        page_url = f"{base}/matches/{mid}/play#token={tokens['bidder_0']}"
        with browser(tmp_path / "profile") as page:
            page.goto(page_url)
            turn_open(page, 0)
            kinds = page.js("[...document.querySelectorAll('#kind option')].map(o => o.value)")
            assert kinds[:2] == ["send_offer", "counter_offer"] and "wait" in kinds
            fields = page.js(
                "[...document.querySelectorAll('form[data-kind=send_offer] [name]')]"
                ".map(e => e.name)"
            )
            assert fields[:3] == ["to", "blocks", "price"] and fields[-1] == "reasoning"
            # a value the server refuses: the message is shown, the turn stays open
            fill(page, "send_offer", {"to": "bidder_1", "blocks": "0", "price": "30"})
            submit(page, "send_offer")
            error = page.wait_for("document.getElementById('error').textContent")
            assert "blocks" in error and "greater than or equal to 1" in error
            assert page.js("document.body.dataset.sentTurn") is None
            fill(page, "send_offer", {"blocks": "2", "message": "from the page <b>hi</b>"})
            submit(page, "send_offer")
            page.wait_for("document.body.dataset.sentTurn === '0'")

            turn_open(page, 1)  # bidder_1 has spoken: its payload is on the page
            shown = page.js("document.getElementById('prompt').textContent")
            assert "<img src=x onerror=" in shown and "</script><script>" in shown
            assert page.js("window.__pwned") is None
            assert page.js("document.title") == f"gpumarket: bidder_0 in match {mid}"
            assert page.js("document.querySelectorAll('img, svg, iframe').length") == 0
            assert page.js("document.scripts.length") == 1  # the page's own script only
            page.js(
                "document.getElementById('raw').value = '{\"action_type\": \"wait\"}';"
                "document.getElementById('send-raw').click()"
            )
            page.wait_for("document.body.dataset.sentTurn === '1'")

            turn_open(page, 2)  # the bidding phase: a bid schedule typed as a list
            assert page.js("document.getElementById('prompt').textContent").count("bidding") >= 1
            fill(page, "bid", {"bids": "30, 10"})
            submit(page, "bid")
            page.wait_for("document.body.dataset.sentTurn === '2'")
            page.screenshot(tmp_path / "seat.png")
            assert (tmp_path / "seat.png").stat().st_size > 10_000
            # the rest of the match: the test's own client, with the same seat token
            play_plainly(base, mid, tokens["bidder_0"], None)
            assert page.wait_for(
                "document.body.dataset.state === 'done' && "
                "document.getElementById('status').textContent"
            ).startswith("the match is over")
        other.join(60)
        assert wait_done(base, mid)["status"] == "done"
        reply = httpx.get(f"{base}/matches/{mid}/transcript", headers=auth(made["owner_token"]))
        assert reply.status_code == 200
    path = tmp_path / "match.jsonl"
    path.write_bytes(reply.content)
    t = read_transcript(path)
    mine = [ev.action for ev in t.steps if ev.seat == "bidder_0" and ev.live][:3]
    assert mine[0]["action_type"] == "send_offer"
    assert (mine[0]["to"], mine[0]["blocks"], mine[0]["price"]) == ("bidder_1", 2, 30.0)
    assert mine[0]["message"] == "from the page <b>hi</b>"
    assert mine[1]["action_type"] == "wait"
    assert mine[2]["action_type"] == "bid" and mine[2]["bids"] == [30.0, 10.0]
    said = [ev.action for ev in t.steps if ev.seat == "bidder_1" and ev.live][0]
    assert said["text"] == PAYLOAD
    assert all(not ev.agent_error for ev in t.steps)  # nobody timed out
    assert replay(path).ok


def test_the_page_carries_no_secret_and_forbids_inline_script(tmp_path: Path) -> None:
    with served(tmp_path / "served") as base:
        made = create(base, "single_trade", 1, {"bidder_0": "remote"}, turn_deadline=5)
        page = httpx.get(f"{base}/matches/{made['match_id']}/play")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp
        assert made["tokens"]["bidder_0"] not in page.text  # the token stays in the fragment
        assert "<script>" not in page.text  # no inline script: the CSP forbids it anyway
        script = httpx.get(f"{base}/human/seat.js").text
        assert "innerHTML" not in script and "insertAdjacentHTML" not in script
        assert "document.write" not in script and "eval(" not in script
        bad = httpx.get(f"{base}/matches/not-a-match/play")
        assert bad.status_code == 422 and "error" in bad.json()
