"""The human seat in the terminal: a scripted person plays whole single_trade episodes.

The :class:`agents.human.HumanAgent` is driven by an injected input function (a list of answers),
and ``gpumarket play`` by a real subprocess with the answers piped to stdin. Each checks what a
person's game must give: the transcript replays exactly, ``export-sft`` exports the person's
decisions, a bad value is asked again and the corrected value is the one played, and quitting
(EOF) leaves the transcript with the runner's ``aborted`` footer and its complete steps.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from rich.console import Console

from agents.base import BaseAgent
from agents.human import HumanAgent, HumanQuit, clean, coerce
from agents.registry import make_agent
from market.cli.play_command import play_episode
from market.core.actions import ActionModel, Bid, SendMessage, SendOffer, SetMechanism, Wait
from market.environment.aec import raw_env
from market.record.transcript import read_transcript
from market.review.replay import replay
from market.run.rollout import resolve_seats, run_episode
from market.train.training_data import export_sft
from scenarios import load_scenario

ROOT = Path(__file__).resolve().parents[2]
# one seed-1 game of bidder_0 in single_trade: 3 rounds x (2 negotiation turns, 1 bidding turn)
GAME = [
    # round 0, negotiation 1: send_offer with its optional fields (+), a bad blocks value, then
    # the fix; a bad price, then the fix
    "send_offer+",
    "1",  # to: the first lab listed, bidder_1
    "",  # side: default sell
    "0",  # blocks: refused (>= 1), asked again
    "2",  # blocks
    "abc",  # price: refused (a number), asked again
    "30",  # price
    "1",  # delivery_round: round 1 (rounds are typed as their number)
    "",  # expires_in
    "hi [bold]there[/]",  # message (typed rich markup is kept as text)
    "",  # short
    "",  # conditions
    "",  # reasoning
    # round 0, negotiation 2: an action not valid now is refused, a number off the menu too
    "bid",
    "14",
    "wait",
    # round 0, bidding: a bad raw JSON (rising bids), then a good one
    '{"action_type": "bid", "bids": [10, 20]}',
    '{"action_type": "bid", "bids": [20, 10]}',
    # round 1: an action the market refuses (raw JSON: no offer o9), wait, a guided bid
    '{"action_type": "accept_offer", "offer_id": "o9"}',
    "wait",
    "bid",
    "25, 5",
    # round 2: wait, wait, a guided bid
    "wait",
    "wait",
    "bid",
    "25, 5",
]


class Answers:
    """The person: answers in order; EOF when they run out."""

    def __init__(self, answers: Iterable[str]) -> None:
        self.answers = list(answers)
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if not self.answers:
            raise EOFError
        return self.answers.pop(0)


def human(answers: Iterable[str]) -> tuple[HumanAgent, Answers, io.StringIO]:
    screen = io.StringIO()
    feed = Answers(answers)
    return HumanAgent(feed, Console(file=screen, width=140)), feed, screen


def actions_of(path: Path, seat: str = "bidder_0") -> list[dict]:
    t = read_transcript(path)
    return [ev.action for ev in t.steps if ev.seat == seat and ev.live]


def test_a_person_plays_a_whole_episode(tmp_path: Path) -> None:
    agent, feed, screen = human(GAME)
    path = tmp_path / "game.jsonl"
    result = run_episode("single_trade", 1, {"bidder_0": agent}, transcript=path, agent_timeout=0)
    assert feed.answers == []  # every answer was used, none left over
    assert result.decisions["bidder_0"] == 9 and result.agent_errors.get("bidder_0", 0) == 0
    played = actions_of(path)
    assert len(played) == 9
    # the corrected values are the ones played, not the refused ones
    offer = SendOffer.model_validate(played[0])
    assert (offer.to, offer.blocks, offer.price, offer.side) == ("bidder_1", 2, 30.0, "sell")
    assert offer.delivery_round == 1 and offer.message == "hi [bold]there[/]"
    assert Wait.model_validate(played[1]).action_type == "wait"
    assert Bid.model_validate(played[2]).bids == [20.0, 10.0]
    assert Bid.model_validate(played[5]).bids == [25.0, 5.0]
    text = screen.getvalue()
    assert "blocks: Input should be greater than or equal to 1; try again" in text
    assert "price: give a number, e.g. 30 or 12.5; try again" in text
    assert "'bid' is not one of the actions you can take now" in text
    assert "'14' is not one of the actions you can take now" in text
    assert "marginal bids must be non-increasing" in text
    assert agent.stats == {"decisions": 9.0, "re_asked": 5.0, "raw_json": 2.0}
    # the blocks prompt was asked twice in a row (re-asked, the earlier fields kept)
    blocks = [i for i, p in enumerate(feed.prompts) if p.startswith("  blocks (")]
    assert blocks == [3, 4]
    # the next turn's story says what the market did with each action
    flat = " ".join(text.split())  # the console wraps long sentences
    assert "The market accepted your send_offer: offer o" in flat
    assert (
        "The market refused your accept_offer: offer 'o9' does not exist; use an offer_id from "
        "offers_received. It cost you a penalty of 0.05 reward; nothing else changed." in flat
    )
    assert result.invalid_actions["bidder_0"] == 1
    # the first menu has no action that needs an offer, a coalition or a reservation
    first_menu = text.split("What you can do now:")[1].split("Your choice")[0]
    for absent in ("accept_offer", "reject_offer", "counter_offer", "commit_to", "release_"):
        assert f") {absent}" not in first_menu.replace("  ", " ")
    # no Python reprs, JSON objects or reST markup on screen
    assert "JobView" not in text and '{"job_id"' not in text and "``" not in text
    assert "round 1: 2 blocks" in text  # holdings labelled by round
    # a normal transcript: replays exactly; export-sft gives the person's 9 decisions
    report = replay(path)
    assert report.ok and report.steps_checked == len(read_transcript(path).steps)
    counts = export_sft([path], tmp_path / "sft.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert counts.exported == 9 and len(rows) == 9
    assert {r["metadata"]["kind"] for r in rows} == {"human"}
    assert {r["metadata"]["seat"] for r in rows} == {"bidder_0"}
    first = json.loads(rows[0]["messages"][-1]["content"])
    assert first["action_type"] == "send_offer" and first["blocks"] == 2
    assert rows[0]["messages"][0]["role"] == "system"


def test_eof_ends_the_game_with_the_aborted_footer(tmp_path: Path) -> None:
    agent, _, _ = human(["wait"])  # EOF at the second turn's prompt
    path = tmp_path / "quit.jsonl"
    with pytest.raises(HumanQuit):
        run_episode("single_trade", 1, {"bidder_0": agent}, transcript=path, agent_timeout=0)
    t = read_transcript(path)
    assert t.footer is not None and t.footer.status == "aborted"
    assert "HumanQuit" in (t.footer.error or "")
    assert [ev.seat for ev in t.steps if ev.live and ev.seat == "bidder_0"] == ["bidder_0"]
    assert replay(path, partial=True).ok
    assert isinstance(HumanQuit(), KeyboardInterrupt)  # the CLI exits 130 on it


class Shouter(BaseAgent):
    """bidder_1: sends a message that tries to restyle and retitle the terminal, then waits."""

    name = "shouter"
    PAYLOAD = "[bold red]GOT YOU[/] \x1b]0;PWNED\x07\x1b[31mred <img src=x onerror=alert(1)>"

    def act(self, observation: object) -> ActionModel:
        return SendMessage(to="all", text=self.PAYLOAD)


def test_others_text_is_shown_as_plain_text() -> None:
    assert clean("a\x1b[31mb\x07c\u2028d") == "a?[31mb?c?d"
    agent, _, screen = human(["wait", "wait"])
    with pytest.raises(HumanQuit):
        run_episode("single_trade", 1, {"bidder_0": agent, "bidder_1": Shouter()}, agent_timeout=0)
    text = screen.getvalue()
    assert "[bold red]GOT YOU[/]" in text  # the markup shown literally, not interpreted
    assert "\x1b" not in text and "\x07" not in text  # no terminal escape reaches the screen
    assert "]0;PWNED[31mred <img src=x onerror=alert(1)>" in text  # the market dropped escapes


def test_answers_are_read_by_the_field_schema() -> None:
    props = {n: SendOffer.model_json_schema()["properties"][n] for n in ("to", "blocks")}
    assert coerce("3", props["to"]) == "3" and coerce("3", props["blocks"]) == 3
    bids = Bid.model_json_schema()["properties"]["bids"]
    assert coerce("30, 20", bids) == [30, 20] and coerce("[1.5]", bids) == [1.5]
    to = SendMessage.model_json_schema()["properties"]["to"]
    assert coerce("all", to) == "all" and coerce("bidder_1, bidder_2", to) == [
        "bidder_1",
        "bidder_2",
    ]
    assert isinstance(make_agent("human"), HumanAgent)  # a spec any runner can seat


def test_the_designer_fills_a_nested_mechanism() -> None:
    env = raw_env("market_round")
    env.reset(seed=0)
    obs, *_ = env.last()
    assert obs.seat == "designer_0" and "set_mechanism" in obs.legal_actions
    # auction_type vcg, a bad reserve re-asked, then 7; the other 10 rules kept (blank)
    agent, feed, screen = human(["set_mechanism", "vcg", "cheap", "7", *[""] * 10])
    action = agent.act(obs)
    assert isinstance(action, SetMechanism) and feed.answers == []
    assert action.mechanism.model_dump(exclude_none=True) == {
        "auction_type": "vcg",
        "reserve_price": 7.0,
    }
    assert "mechanism.reserve_price: give a number, e.g. 30 or 12.5; try again" in screen.getvalue()
    env.step(action)
    assert env.infos["designer_0"].get("error") is None


def test_gpumarket_play_tells_the_verdict_at_once_and_the_rewards(tmp_path: Path) -> None:
    """``gpumarket play``'s loop: the verdict right after each action (not again in the next
    story), the rewards by component since the last turn, and the end of the game."""
    answers = [
        '{"action_type": "accept_offer", "offer_id": "o9"}',
        *["wait", "wait", "bid", "25, 5"] * 3,
    ]
    agent, feed, screen = human(answers)
    lineup = resolve_seats(load_scenario("single_trade"), {"bidder_1": "truthful"})
    lineup["bidder_0"] = agent
    result = play_episode(load_scenario("single_trade"), 1, lineup, "bidder_0", agent, tmp_path)
    flat = " ".join(screen.getvalue().split())
    refusal = (
        "The market refused your accept_offer: offer 'o9' does not exist; use an offer_id from "
        "offers_received. It cost you a penalty of 0.05 reward; nothing else changed."
    )
    # shown once, right after the action (before the next turn's header), not in the story
    assert flat.count(refusal) == 1
    assert flat.index(refusal) < flat.index(
        "bidder_0: your turn", flat.index("You play accept_offer")
    )
    assert "Your reward since your last turn: -0.05 (invalid action -0.05)" in flat
    assert "auction payments" in flat and "job value" in flat  # after a round's clearing
    assert "The episode is over. Since your last turn:" in flat
    assert result.invalid_actions["bidder_0"] == 1 and feed.answers == []
    assert replay(tmp_path / "1.jsonl").ok


def play(args: list[str], answers: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "market", "play", *args],
        input="\n".join(answers) + "\n",
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_gpumarket_play_with_piped_input(tmp_path: Path) -> None:
    out = tmp_path / "single_trade"
    args = ["single_trade", "--seat", "bidder_0", "--seed", "1", "--out", str(out)]
    done = play([*args, "--seat", "bidder_1=always_accept"], GAME, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    path = tmp_path / "single_trade" / "1.jsonl"
    assert "episode returns" in done.stdout and str(path) in done.stdout
    assert SendOffer.model_validate(actions_of(path)[0]).blocks == 2
    assert read_transcript(path).footer.status == "complete"
    cli = [sys.executable, "-m", "market"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rep = subprocess.run([*cli, "replay", str(path)], capture_output=True, text=True, env=env)
    assert rep.returncode == 0 and "replay exact" in rep.stdout, rep.stdout + rep.stderr
    out = tmp_path / "sft.jsonl"
    sft = subprocess.run(
        [*cli, "export-sft", str(path), "-o", str(out), "--seat", "bidder_0"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert sft.returncode == 0 and len(out.read_text().splitlines()) == 9, sft.stderr

    quit_ = play(args, ["wait"], tmp_path)  # EOF in the second turn
    assert quit_.returncode == 130
    assert "aborted footer" in quit_.stderr
    assert read_transcript(path).footer.status == "aborted"

    bad = play(["single_trade", "--seat", "bidder_0", "--seat", "bidder_1"], [], tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "exactly once" in bad.stderr
    nope = play(["single_trade", "--seat", "designer_0"], [], tmp_path)
    assert nope.returncode == 2 and "pick one of them" in nope.stderr
