"""The browser human seat (market/serve/human_page.py) in a real headless Chromium.

The real ``gpumarket serve`` runs in a subprocess. In the single_trade match both seats are
remote: bidder_1 is played by a scripted HTTP client that opens with a hostile message (markup
and script payloads), bidder_0 by the page in Chromium, driven through the DevTools protocol: the
test picks an action and fills the form's fields, as a person would, and submits. The person plays
round 0 through the page (a refused value is shown and corrected, a raw-JSON action, a bid
schedule), the test's own client finishes the match with the same token, and the transcript (read
with the owner token) holds the page's actions and replays exactly. The hostile message is shown
as text and nothing in it runs.

In the market_round match the page plays bidder_0 for the whole episode (bidder_1 a scripted
HTTP client that offers bidder_0 a trade, the rest the server's scripted agents): the menu offers
only the actions valid now, an offer is accepted from a select list, a bid over the budget is
sent, and the next turn shows the env's refusal word for word; the page that says the match is
over shows the verdict on the last bid. Screenshots (the offer turn, the refused turn, a normal
turn, the end) go to ``$GPUMARKET_SCREENS`` when set, else the test's tmp dir. The designer's page
sets the mechanism through its nested fields. Without a browser: the seat view's ``guide`` carries the env's verdict and the POST answer
says only that the action was received.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from devtools import CHROMIUM, Page, browser
from match_support import auth, create, served, wait_done

from market.record.reader import read_transcript
from market.review.replay import replay

PAYLOAD = (
    "<img src=x onerror=\"document.title='PWNED';window.__pwned=1\"> "
    "</script><script>window.__pwned=1</script> "
    '<svg onload="window.__pwned=1"></svg> [bold]markup[/bold]'
)

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is not installed (apt-get install -y chromium chromium-driver)",
)

Script = Callable[[dict[str, Any]], dict[str, Any] | None]


def play_plainly(base: str, match_id: str, token: str, opening: dict[str, Any] | None) -> None:
    """A remote seat that sends ``opening`` on its first turn, then waits (bids nothing)."""
    openings = [opening] if opening is not None else []
    play_script(base, match_id, token, lambda view: openings.pop() if openings else None)


def play_script(base: str, match_id: str, token: str, script: Script) -> None:
    """A remote seat that plays ``script(view)`` on each turn; None: wait, or bid nothing."""
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
            action = script(view)
            if action is None and view["observation"]["phase"] == "bidding":
                action = {"action_type": "bid", "bids": []}
            elif action is None:
                action = {"action_type": "wait"}
            reply = client.post(f"{url}/action", json={"turn": view["turn"], "action": action})
            assert reply.status_code in (200, 409), reply.text  # 409: the page answered first


def pick(page: Page, kind: str) -> None:
    """Pick ``kind`` in the action list."""
    page.js(
        f"(() => {{ const k = document.getElementById('kind'); k.value = {json.dumps(kind)}; "
        "k.dispatchEvent(new Event('change')); })()"
    )
    assert page.js("document.getElementById('kind').value") == kind, f"{kind} is not offered"


def fill(page: Page, kind: str, values: dict[str, str]) -> None:
    """Pick ``kind`` in the action list and type ``values`` into its form's fields."""
    pick(page, kind)
    for name, value in values.items():
        page.js(
            f"document.querySelector('form[data-kind={kind}] [name=\"{name}\"]').value = "
            f"{json.dumps(value)}"
        )


def submit(page: Page, kind: str) -> None:
    page.js(f"document.querySelector('form[data-kind={kind}]').requestSubmit()")


def turn_open(page: Page, turn: int) -> None:
    page.wait_for(
        f"document.body.dataset.state === 'your_turn' && document.body.dataset.turn === '{turn}'"
        " && !document.getElementById('play').hidden",
        60,
    )


def offered(page: Page) -> list[str]:
    """The action types the page offers now."""
    return list(page.js("[...document.querySelectorAll('#kind option')].map(o => o.value)"))


def options(page: Page, kind: str, name: str) -> list[str]:
    """The values of a select field of ``kind``'s form (the choice placeholder left out)."""
    return [
        v
        for v in page.js(
            f"[...document.querySelectorAll('form[data-kind={kind}] [name=\"{name}\"] option')]"
            ".map(o => o.value)"
        )
        if v
    ]


def shown(page: Page, element: str) -> str:
    return str(page.js(f"document.getElementById('{element}').textContent"))


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
            kinds = offered(page)
            assert kinds[0] == "send_offer" and "wait" in kinds
            assert "counter_offer" not in kinds and "accept_offer" not in kinds  # no offer yet
            fields = page.js(
                "[...document.querySelectorAll('form[data-kind=send_offer] [name]')]"
                ".map(e => e.name)"
            )
            assert fields[:1] == ["to"] and {"blocks", "price", "reasoning"} <= set(fields)
            assert options(page, "send_offer", "to") == ["bidder_1"]  # the valid seats only
            # a value the server refuses: the message is shown, the turn stays open
            fill(page, "send_offer", {"to": "bidder_1", "blocks": "0", "price": "30"})
            submit(page, "send_offer")
            error = page.wait_for("document.getElementById('error').textContent")
            assert "blocks" in error and "greater than or equal to 1" in error
            assert page.js("document.body.dataset.sentTurn") is None
            fill(page, "send_offer", {"blocks": "1", "message": "from the page <b>hi</b>"})
            submit(page, "send_offer")
            page.wait_for("document.body.dataset.sentTurn === '0'")

            turn_open(page, 1)  # bidder_1 has spoken: its payload is on the page, as text
            assert page.js("document.body.dataset.verdict") == "accepted"  # the env took it
            assert shown(page, "verdict").startswith("The market accepted your send_offer")
            for element in ("prompt", "story"):
                assert "<img src=x onerror=" in shown(page, element), element
            assert "</script><script>" in shown(page, "prompt")
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
            assert "bidding" in shown(page, "prompt")
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
            ).startswith("The match is over")
        other.join(60)
        assert wait_done(base, mid)["status"] == "done"
        reply = httpx.get(f"{base}/matches/{mid}/transcript", headers=auth(made["owner_token"]))
        assert reply.status_code == 200
    path = tmp_path / "match.jsonl"
    path.write_bytes(reply.content)
    t = read_transcript(path)
    mine = [ev.action for ev in t.steps if ev.seat == "bidder_0" and ev.live][:3]
    assert mine[0]["action_type"] == "send_offer"
    assert (mine[0]["to"], mine[0]["blocks"], mine[0]["price"]) == ("bidder_1", 1, 30.0)
    assert mine[0]["message"] == "from the page <b>hi</b>"
    assert mine[1]["action_type"] == "wait"
    assert mine[2]["action_type"] == "bid" and mine[2]["bids"] == [30.0, 10.0]
    said = [ev.action for ev in t.steps if ev.seat == "bidder_1" and ev.live][0]
    assert said["text"] == PAYLOAD
    assert all(not ev.agent_error for ev in t.steps)  # nobody timed out
    assert replay(path).ok


def bidder_1_offers(view: dict[str, Any]) -> dict[str, Any] | None:
    """bidder_1 of the market_round match: on its first turn, offers to buy a block of round 1
    from bidder_0 (a note with a hostile payload); on its second, says it publicly; then waits."""
    if view["turn"] == 0:
        return {
            "action_type": "send_offer",
            "to": "bidder_0",
            "side": "buy",
            "blocks": 1,
            "price": 25,
            "delivery_round": 1,
            "message": PAYLOAD,
        }
    if view["turn"] == 1:
        return {"action_type": "send_message", "to": "all", "text": PAYLOAD}
    return None


@needs_chromium
@pytest.mark.slow
def test_a_person_plays_a_whole_market_round_in_the_browser(tmp_path: Path) -> None:
    screens = Path(os.environ.get("GPUMARKET_SCREENS") or tmp_path / "screens")
    screens.mkdir(parents=True, exist_ok=True)
    with served(tmp_path / "served") as base:
        made = create(
            base,
            "market_round",
            3,
            {"bidder_0": "remote", "bidder_1": "remote"},
            turn_deadline=300,
        )
        mid, tokens = made["match_id"], made["tokens"]
        other = threading.Thread(
            target=play_script, args=(base, mid, tokens["bidder_1"], bidder_1_offers), daemon=True
        )
        other.start()
        with browser(tmp_path / "profile", width=1100, height=1500) as page:
            page.goto(f"{base}/matches/{mid}/play#token={tokens['bidder_0']}")
            turn_open(page, 0)
            kinds = offered(page)
            # nothing to accept, reject or counter, no coalition to commit to or leave, nothing
            # reserved to release: those are not offered
            for absent in ("accept_offer", "reject_offer", "counter_offer"):
                assert absent not in kinds, absent
            for absent in ("commit_to_coalition", "leave_coalition", "release_capacity"):
                assert absent not in kinds, absent
            assert {"send_offer", "send_message", "wait", "finish"} <= set(kinds)
            assert "first move" in shown(page, "story")
            assert options(page, "send_offer", "to") == ["bidder_1", "bidder_2"]
            names = page.js(
                "[...document.querySelectorAll('form[data-kind=wait] [name]')].map(e => e.name)"
            )
            assert names == ["reasoning"]  # only the optional extra, folded away
            pick(page, "wait")
            submit(page, "wait")
            page.wait_for("document.body.dataset.sentTurn === '0'")

            turn_open(page, 1)  # bidder_1's offer: accepted from the list of offers to me
            assert page.js("document.body.dataset.verdict") == "accepted"
            assert "accept_offer" in offered(page) and "reject_offer" in offered(page)
            offer_ids = options(page, "accept_offer", "offer_id")
            assert len(offer_ids) == 1
            story = shown(page, "story")
            assert "bidder_1" in story and "<img src=x onerror=" in story  # the note, as text
            fill(page, "accept_offer", {"offer_id": offer_ids[0]})
            page.screenshot(screens / "browser_offer_turn.png")
            submit(page, "accept_offer")
            page.wait_for("document.body.dataset.sentTurn === '1'")

            turn_open(page, 2)  # bidding: over the budget, which the form cannot know
            assert page.js("document.body.dataset.verdict") == "accepted"
            assert offered(page)[0] == "bid"
            fill(page, "bid", {"bids": "5000"})
            submit(page, "bid")
            page.wait_for("document.body.dataset.sentTurn === '2'")

            turn_open(page, 3)  # the refusal, its reason and its cost, on the page
            assert page.js("document.body.dataset.verdict") == "refused"
            refusal = shown(page, "verdict")
            assert refusal.startswith("The market refused your bid: your bids add up to 5000.00")
            assert "penalty of 0.05" in refusal
            page.screenshot(screens / "browser_refused_turn.png")
            page.js(
                "document.getElementById('raw').value = '{\"action_type\": \"wait\"}';"
                "document.getElementById('send-raw').click()"
            )
            page.wait_for("document.body.dataset.sentTurn === '3'")

            turn = 4
            while True:  # the rest of the episode: wait in talks, bid within the budget
                page.wait_for(
                    "document.body.dataset.state === 'done' || "
                    f"(document.body.dataset.turn === '{turn}' && "
                    "!document.getElementById('play').hidden)",
                    60,
                )
                if page.js("document.body.dataset.state") == "done":
                    break
                assert page.js("document.body.dataset.verdict") == "accepted"
                assert "{" not in shown(page, "screen") and "{" not in shown(page, "verdict")
                if turn == 6:  # round 1's auction has cleared: a normal turn with news
                    page.screenshot(screens / "browser_normal_turn.png")
                if offered(page)[0] == "bid":
                    fill(page, "bid", {"bids": "40, 20"})
                    submit(page, "bid")
                else:
                    pick(page, "wait")
                    submit(page, "wait")
                page.wait_for(f"document.body.dataset.sentTurn === '{turn}'")
                turn += 1
            assert turn == 15  # 5 rounds of 2 talks and a bid
            assert shown(page, "status").startswith("The match is over. Your return: ")
            # the verdict on the last bid and the rewards since, once the match is over
            assert (
                shown(page, "verdict")
                == "The market accepted your bid: your bid for 2 blocks is in."
            )
            assert "Your reward since your last turn: " in shown(page, "story")
            page.screenshot(screens / "browser_match_over.png")
        other.join(60)
        assert wait_done(base, mid)["status"] == "done"
        reply = httpx.get(f"{base}/matches/{mid}/transcript", headers=auth(made["owner_token"]))
    path = tmp_path / "match.jsonl"
    path.write_bytes(reply.content)
    t = read_transcript(path)
    mine = [ev for ev in t.steps if ev.seat == "bidder_0" and ev.live]
    assert len(mine) == 15 and all(not ev.agent_error for ev in mine)  # the page played each
    assert (mine[1].action["action_type"], mine[1].action["offer_id"]) == (
        "accept_offer",
        offer_ids[0],
    )
    assert mine[1].info.error is None
    assert mine[2].action["bids"] == [5000.0]
    assert mine[2].info.error is not None and mine[2].info.error in refusal  # word for word
    assert [ev.info.error for ev in mine if ev.info.error] == [mine[2].info.error]
    assert replay(path).ok


def test_the_seat_view_says_what_the_env_made_of_the_last_action(tmp_path: Path) -> None:
    """The POST answer says the action was received, not accepted; the next turn's guide holds
    the env's verdict (its reason word for word, the penalty), the story with the rewards, and
    only the actions valid now."""
    with served(tmp_path / "served") as base:
        made = create(base, "market_round", 3, {"bidder_0": "remote"}, turn_deadline=60)
        mid, token = made["match_id"], made["tokens"]["bidder_0"]
        url = f"{base}/matches/{mid}/seat"
        with httpx.Client(headers=auth(token), timeout=60) as client:
            first = client.get(url, params={"wait": 20}).json()
            assert first["status"] == "your_turn" and first["guide"]["last_action"] is None
            valid = {c["action_type"] for c in first["guide"]["valid"]}
            assert not valid & {"accept_offer", "reject_offer", "commit_to_coalition"}
            assert all(isinstance(line, str) for line in first["guide"]["screen"])
            bad = {"action_type": "accept_offer", "offer_id": "o99"}
            answer = client.post(f"{url}/action", json={"turn": 0, "action": bad}).json()
            assert answer["received"] is True and "accepted" not in answer
            second = client.get(url, params={"wait": 20}).json()
        last = second["guide"]["last_action"]
        assert (last["action_type"], last["accepted"], last["penalty"]) == (
            "accept_offer",
            False,
            0.05,
        )
        assert "'o99' does not exist" in last["error"] and last["error"] in last["text"]
        assert any("0.05" in line for line in second["guide"]["story"])  # the reward lost


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


@needs_chromium
@pytest.mark.slow
def test_the_designer_sets_the_rules_on_the_page(tmp_path: Path) -> None:
    """The designer's form: the mechanism's fields (nested under ``mechanism``) filled in with
    the rules in force; two changed are sent, and the next turn says they are in force."""
    with served(tmp_path / "served") as base:
        made = create(base, "market_round", 3, {"designer_0": "remote"}, turn_deadline=120)
        mid, token = made["match_id"], made["tokens"]["designer_0"]
        with browser(tmp_path / "profile") as page:
            page.goto(f"{base}/matches/{mid}/play#token={token}")
            turn_open(page, 0)
            assert offered(page) == ["set_mechanism", "wait"]
            assert options(page, "set_mechanism", "mechanism.reveal_reserve") == ["true", "false"]
            fill(
                page,
                "set_mechanism",
                {"mechanism.auction_type": "first_price", "mechanism.reserve_price": "12"},
            )
            submit(page, "set_mechanism")
            turn_open(page, 1)
            assert shown(page, "verdict") == (
                "The market accepted your set_mechanism: the new rules are in force."
            )
            assert "auction type second_price -> first_price" in shown(page, "story")
            assert "reserve price 5.0 -> 12.0" in shown(page, "story")
            play_plainly(base, mid, token, None)
        reply = httpx.get(f"{base}/matches/{mid}/transcript", headers=auth(made["owner_token"]))
    path = tmp_path / "match.jsonl"
    path.write_bytes(reply.content)
    t = read_transcript(path)
    first = next(ev for ev in t.steps if ev.seat == "designer_0")
    mechanism = first.action["mechanism"]
    assert (mechanism["auction_type"], mechanism["reserve_price"]) == ("first_price", 12.0)
    # a blank field is left out of the update, so the rule in force is kept
    assert mechanism["coalition_policy"] is None
    in_force = t.rounds[0].summary["mechanism"]
    assert (in_force["auction_type"], in_force["reserve_price"]) == ("first_price", 12.0)
    assert in_force["coalition_policy"] == "penalize_suspected"  # the rule in force, kept
    assert first.info.error is None
