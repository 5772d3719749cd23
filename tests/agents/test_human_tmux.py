"""A person plays ``gpumarket play market_round --seat bidder_0`` in a real terminal (tmux).

The test reads the screen as a person would (``tmux capture-pane``) and types answers
(``tmux send-keys``): at its first turn an action the market refuses (accept offer o9, which
does not exist, pasted as JSON), then a guided offer, bids in the bidding phase and waits
otherwise, to the end of the episode. It checks that the refusal's reason and penalty appear on
screen right after the action, that the menu shows only valid actions, that the game ends with
the returns table, and that the transcript replays exactly. The screen of the refused turn is
saved as ``refused_turn.txt`` and the whole game's as ``whole_game.txt`` (in
``$GPUMARKET_SCREENS`` when set, else the test's tmp dir).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from market.record.transcript import read_transcript
from market.review.replay import replay

ROOT = Path(__file__).resolve().parents[2]
REFUSED = '{"action_type": "accept_offer", "offer_id": "o9"}'
PROMPT = re.compile(r"> ?$")
CHOICE = "Your choice ("
WAIT_S = 120  # a hang guard for each screen, not a speed target


class Terminal:
    """One tmux session of ``width`` x ``height`` running a shell."""

    def __init__(self, name: str, width: int = 120, height: int = 50) -> None:
        self.name = name
        self.tmux("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height))
        self.tmux("set-option", "-t", name, "history-limit", "20000")

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", *args], capture_output=True, text=True, check=True)
        return done.stdout

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", self.name, "-l", text)
        self.tmux("send-keys", "-t", self.name, "Enter")

    def screen(self) -> str:
        """Everything the terminal showed so far, wrapped lines joined."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", self.name)

    def wait_for(self, ready: Callable[[str], bool], what: str) -> str:
        give_up = time.monotonic() + WAIT_S
        while time.monotonic() < give_up:
            text = self.screen()
            if ready(text):
                return text
            time.sleep(0.15)
        raise AssertionError(f"no {what} on screen after {WAIT_S} s:\n{self.screen()[-3000:]}")

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True, check=False)


def last_line(text: str) -> str:
    lines = [line for line in text.rstrip("\n").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def menu_of(screen: str) -> list[str]:
    """The action names of the last menu on screen."""
    block = screen.rsplit("What you can do now:", 1)[-1]
    return re.findall(r"^\s+\d+\)\s+(\w+)", block, flags=re.M)


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed: apt-get install -y tmux")
    term = Terminal(f"gpumarket-test-{os.getpid()}")
    try:
        yield term
    finally:
        term.close()


def test_a_person_plays_market_round_in_a_terminal(terminal: Terminal, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    command = (
        f"cd {shlex.quote(str(tmp_path))} && PYTHONPATH={shlex.quote(str(ROOT))} "
        f"{shlex.quote(sys.executable)} -m market play market_round --seat bidder_0 --seed 0 "
        f"--out {shlex.quote(str(out))}; echo GAME-''EXIT=$?"  # the quotes keep the echo unmatched
    )
    terminal.type(command)
    turns, refused_screen, offered = 0, "", False
    while True:  # one turn a loop: wait for the next "Your choice" prompt or the end
        text = terminal.wait_for(
            lambda s, n=turns: (
                "GAME-EXIT=" in s or s.count(CHOICE) > n and bool(PROMPT.search(last_line(s)))
            ),
            "prompt",
        )
        if "GAME-EXIT=" in text:
            break
        assert last_line(text).startswith(CHOICE), last_line(text)
        turns += 1
        menu = menu_of(text)
        if turns == 1:  # no offer exists: the market must refuse this, and say why
            assert "accept_offer" not in menu and "wait" in menu, menu
            terminal.type(REFUSED)
            after = terminal.wait_for(
                lambda s: s.count(CHOICE) > 1 or "GAME-EXIT=" in s, "the next turn"
            )
            lines = after.splitlines()
            heads = [i for i, line in enumerate(lines) if "bidder_0: your turn" in line]
            shown = lines[heads[0] : heads[1] if len(heads) > 1 else None]
            refused_screen = "\n".join(line.rstrip() for line in shown)
        elif "send_offer" in menu and not offered:  # a guided offer: only the fields it needs
            offered = True
            for answer in ("send_offer", "1", "buy", "1", "12", ""):
                terminal.type(answer)
        elif "bid" in menu:
            terminal.type("bid")
            terminal.wait_for(lambda s: last_line(s).startswith("  bids ("), "the bids prompt")
            terminal.type("30, 20")
        else:
            terminal.type("wait")
    screen = "\n".join(line.rstrip() for line in terminal.screen().splitlines())
    final = " ".join(screen.split())  # sentences wrap at the terminal's width
    said = " ".join(refused_screen.split())
    assert "GAME-EXIT=0" in final, final[-3000:]
    # the refusal, its reason and its penalty, on screen right after the action
    assert (
        "The market refused your accept_offer: offer 'o9' does not exist; use an offer_id from "
        "offers_received. It cost you a penalty of 0.05 reward; nothing else changed." in said
    ), refused_screen
    assert "Round 0 (rounds 0 to 4), negotiation phase. You are bidder_0, a lab." in said
    assert "Your reward since your last turn: -0.05 (invalid action -0.05)" in final
    assert "The market accepted your send_offer: offer o" in final
    assert "auction (second price) sold" in final and "The episode is over." in final
    assert "episode returns" in final
    assert turns == 15  # 5 rounds x (2 negotiation turns + 1 bidding turn)
    # no Python reprs or JSON objects on screen, other than the JSON the person typed
    assert "View(" not in final and '{"job_id"' not in final.replace(REFUSED, "")
    saved = Path(os.environ.get("GPUMARKET_SCREENS") or tmp_path) / "refused_turn.txt"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(refused_screen + "\n")
    (saved.parent / "whole_game.txt").write_text(screen + "\n")
    found = re.search(r"transcript: (\S+\.jsonl)", final)
    assert found, final[-2000:]
    path = Path(found.group(1))
    assert path.is_relative_to(out)
    t = read_transcript(path)
    assert t.footer is not None and t.footer.status == "complete"
    mine = [ev for ev in t.steps if ev.seat == "bidder_0" and ev.live]
    assert len(mine) == 15
    assert (mine[0].action["action_type"], mine[0].action["offer_id"]) == ("accept_offer", "o9")
    assert replay(path).ok
