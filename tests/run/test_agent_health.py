"""Loud failures: per-decision time limits (sync and async paths), the per-seat counts of
fallbacks, agent errors, timeouts and repairs in rows, on the terminal and in the HTML report,
LLM-judge fallbacks, and ``--strict``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.llm.agent import LLMAgent
from agents.llm.backends.base import Completion
from agents.scripted import TruthfulBidder
from market.cli import main as cli
from market.core.actions import Bid, Wait
from market.record.transcript import read_transcript
from market.review.replay import builtin_drift, replay
from market.review.report import COMPONENT_COLORS, PALETTE, load_episodes, write_report
from market.run.health import STRICT_EXIT, from_episodes, from_rows, judge_counts, parse_share
from market.run.rollout import arun_episode, run_concurrent, run_episode
from market.run.runner import episode_rows, read_results, run_scenario
from scenarios import load_scenario

LIMIT = 0.2
RELEASE = threading.Event()  # set after each test: a hung call returns, its thread ends


@pytest.fixture(autouse=True)
def _release_hung_calls() -> Iterator[None]:
    RELEASE.clear()
    yield
    RELEASE.set()


def flat(text: str) -> str:
    """Terminal output with its line wrapping undone."""
    return " ".join(text.split())


def finishes(fn: Callable[[], Any], within: float = 60.0) -> Any:
    """``fn()`` on a daemon thread; fails (instead of hanging the suite) if it does not return."""
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    worker.start()
    worker.join(within)
    assert not worker.is_alive(), f"still running after {within} s: a hung agent blocked the run"
    return box[0]


def agent_threads(besides: set[threading.Thread] | None = None) -> set[threading.Thread]:
    """The live worker threads of agent calls, other than ``besides``."""
    return {
        t
        for t in threading.enumerate()
        if t.name == "gpumarket-agent" and t.is_alive() and t not in (besides or set())
    }


class HangsAtFirstBid(TruthfulBidder):
    """Truthful until its first bidding turn, where its act never returns (until the test ends)."""

    name = "hangs_at_first_bid"

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.calls = 0

    def act(self, obs: Any) -> Any:
        self.calls += 1
        if obs.phase == "bidding":
            RELEASE.wait()
        return super().act(obs)


class AbstainsFromFirstBid(TruthfulBidder):
    """What the runner must make of HangsAtFirstBid: the same actions until its first bidding
    turn, then the fallback action (an empty bid in bidding, wait otherwise) on every turn."""

    name = "abstains_from_first_bid"

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.calls, self.gone = 0, False

    def act(self, obs: Any) -> Any:
        self.calls += 1
        self.gone = self.gone or obs.phase == "bidding"
        if self.gone:
            return Bid(bids=[]) if obs.phase == "bidding" else Wait()
        return super().act(obs)


class HangsAlways(TruthfulBidder):
    """Never returns from act (until the test ends)."""

    name = "hangs_always"

    def act(self, obs: Any) -> Any:
        RELEASE.wait()
        return super().act(obs)


class Boom(TruthfulBidder):
    """Raises in every act."""

    name = "boom"

    def act(self, obs: Any) -> Any:
        raise RuntimeError("boom in act")


class Garbage:
    """A model backend whose every reply is unusable, so an LLM seat repairs, then falls back."""

    model = "garbage-model"

    def complete(self, messages: Any, schema: Any, params: Any) -> Completion:
        return Completion(
            text="no JSON here", model=self.model, prompt_tokens=7, completion_tokens=3
        )

    async def acomplete(self, messages: Any, schema: Any, params: Any) -> Completion:
        return self.complete(messages, schema, params)


# --- the time limit, sync path -------------------------------------------------------------------


def test_a_hung_agent_times_out_and_the_episode_goes_on_as_if_it_had_abstained() -> None:
    hung, same = HangsAtFirstBid(), AbstainsFromFirstBid()
    began = time.perf_counter()
    result = finishes(
        lambda: run_episode("market_round", 4, {"bidder_1": hung}, agent_timeout=LIMIT)
    )
    elapsed = time.perf_counter() - began
    expected = run_episode("market_round", 4, {"bidder_1": same})
    assert elapsed >= LIMIT  # it waited for the first hung decision
    # the other seats saw exactly the world of a seat that abstained from its first bid on
    assert result.returns == expected.returns and result.round_log == expected.round_log
    assert result.decisions["bidder_1"] == same.calls  # every turn was a decision
    # the hung call was the last one the agent got; every decision from it on timed out
    assert result.timeouts["bidder_1"] == same.calls - hung.calls + 1 > 1
    assert result.agent_errors["bidder_1"] == 0
    assert result.first_error["bidder_1"] == f"AgentTimeout: no action within {LIMIT:g} s"
    assert all(
        result.timeouts[s] == 0 and not result.agent_errors[s]
        for s in result.seats
        if s != "bidder_1"
    )


def test_a_hung_seat_holds_one_thread_however_many_turns_it_misses() -> None:
    before = agent_threads()
    result = finishes(
        lambda: run_episode(
            "market_round",
            0,
            {"bidder_0": HangsAlways(), "bidder_2": HangsAlways()},
            agent_timeout=LIMIT,
        )
    )
    assert result.timeouts["bidder_0"] == result.decisions["bidder_0"] > 5
    assert result.timeouts["bidder_2"] == result.decisions["bidder_2"] > 5
    deadline = time.monotonic() + 5  # an idle worker of the episode ends once it is closed
    while len(agent_threads(before)) > 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(agent_threads(before)) == 2  # one stuck call per hung seat, not one per turn


def test_the_scenario_sets_the_default_limit_and_zero_means_none() -> None:
    sc = load_scenario("market_round", agent_timeout=LIMIT)
    assert load_scenario("market_round").agent_timeout == 120.0
    result = finishes(lambda: run_episode(sc, 1, {"bidder_1": HangsAtFirstBid()}))
    assert result.timeouts["bidder_1"] > 0
    calls: list[float] = []

    class Slow(TruthfulBidder):
        def act(self, obs: Any) -> Any:
            calls.append(obs.round)
            time.sleep(0.01)
            return super().act(obs)

    # a limit of 0 is none: a slow agent is waited for, never cut off
    result = run_episode(
        load_scenario("single_trade", agent_timeout=0.001), 0, {"bidder_0": Slow()}, agent_timeout=0
    )
    assert result.timeouts["bidder_0"] == 0 and result.decisions["bidder_0"] == len(calls) > 0


def test_a_timeout_is_recorded_and_replays_exactly(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    finishes(
        lambda: run_episode(
            "market_round", 2, {"bidder_1": HangsAtFirstBid()}, agent_timeout=LIMIT, transcript=path
        )
    )
    events = [json.loads(line) for line in path.read_text().splitlines()]
    errors = [e for e in events if e.get("type") == "step" and e.get("agent_error")]
    assert errors and all(
        e["seat"] == "bidder_1" and e["agent_error"].startswith("AgentTimeout") for e in errors
    )
    assert replay(path).ok


def test_a_transcript_played_under_another_limit_is_not_a_changed_builtin(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    run_episode(load_scenario("single_trade", agent_timeout=5), 0, transcript=path)
    t = read_transcript(path)
    assert t.header.scenario["agent_timeout"] == 5  # the header says what limit applied
    assert builtin_drift(t) is None and replay(t).ok
    path.write_text(path.read_text().replace('"rounds":3,', '"rounds":4,', 1))  # a real change
    assert "scenario.rounds" in (builtin_drift(read_transcript(path, verify=False)) or "")


def test_a_hung_agent_in_a_process_pool_does_not_stop_the_run(tmp_path: Path) -> None:
    summary = finishes(
        lambda: run_scenario(
            "single_trade",
            range(4),
            {"bidder_0": "py:test_agent_health:HangsAtFirstBid"},
            tmp_path / "r",
            workers=2,
            progress=False,
            transcripts=False,
            agent_timeout=LIMIT,
        )
    )
    assert summary.complete and len(summary.episodes) == 4
    rows = [r for r in summary.rows if r["seat"] == "bidder_0"]
    assert all(r["timeouts"] > 0 and r["fallbacks"] == r["timeouts"] for r in rows)


# --- the time limit, async path ------------------------------------------------------------------


def test_a_blocking_agent_times_out_on_the_async_path_without_stalling_other_episodes() -> None:
    async def both() -> list[Any]:
        return list(
            await asyncio.gather(
                arun_episode("market_round", 4, {"bidder_1": HangsAtFirstBid}, agent_timeout=LIMIT),
                arun_episode("market_round", 5, agent_timeout=LIMIT),
            )
        )

    hung, clean = finishes(lambda: asyncio.run(both()))
    same = AbstainsFromFirstBid()
    expected = run_episode("market_round", 4, {"bidder_1": same})
    assert hung.returns == expected.returns and hung.round_log == expected.round_log
    assert hung.timeouts["bidder_1"] > 1 and hung.decisions["bidder_1"] == same.calls
    assert clean.returns == run_episode("market_round", 5).returns
    assert not any(clean.timeouts.values())
    # and through run_concurrent, with a limit from the argument
    results = finishes(
        lambda: run_concurrent(
            "market_round", [4], {"bidder_1": HangsAtFirstBid}, agent_timeout=LIMIT
        )
    )
    assert results[0].returns == expected.returns


# --- counts in rows ---------------------------------------------------------------------------------


def test_rows_count_decisions_errors_and_first_error(tmp_path: Path) -> None:
    summary = run_scenario(
        "single_trade",
        range(2),
        {"bidder_0": "py:test_agent_health:Boom"},
        tmp_path / "r",
        workers=1,
        progress=False,
        transcripts=False,
    )
    for seed in range(2):
        row = next(r for r in summary.rows if r["seed"] == seed and r["seat"] == "bidder_0")
        expected = run_episode("single_trade", seed, {"bidder_0": AbstainsFromFirstBid()})
        turns = expected.decisions["bidder_0"]
        assert row["decisions"] == row["agent_errors"] == row["fallbacks"] == turns > 0
        assert row["timeouts"] == row["repairs"] == 0
        assert row["first_error"] == row["last_agent_error"] == "RuntimeError: boom in act"
        other = next(r for r in summary.rows if r["seed"] == seed and r["seat"] == "bidder_1")
        assert other["fallbacks"] == other["agent_errors"] == 0 and other["decisions"] > 0
    (health,) = [h for h in from_rows(read_results(tmp_path / "r")) if h.seat == "bidder_0"]
    assert health.share == 1.0 and health.episodes == 2


def test_an_llm_seat_without_usable_replies_counts_repairs_and_fallbacks(tmp_path: Path) -> None:
    agent = LLMAgent(Garbage(), retries=2)
    path = tmp_path / "llm.jsonl"
    result = run_episode("single_trade", 0, {"bidder_0": agent}, transcript=path)
    (row,) = [r for r in episode_rows(result, "c") if r["seat"] == "bidder_0"]
    decisions = result.decisions["bidder_0"]
    # every decision: one request and two repairs, all unusable, then the fallback
    assert row["fallbacks"] == decisions > 0 and row["agent_errors"] == row["timeouts"] == 0
    assert row["repairs"] == 2 * decisions
    assert row["stats"]["requests"] == 3 * decisions
    assert row["first_error"].startswith("fallback: ")
    # the report counts the same from the transcript
    (seat,) = [h for h in from_episodes(load_episodes(path)) if h.seat == "bidder_0"]
    assert (seat.decisions, seat.fallbacks, seat.repairs) == (decisions, decisions, 2 * decisions)


def test_judge_counts_of_a_round_log() -> None:
    def verdict(kind: str, rationale: str = "ok") -> dict[str, Any]:
        return {"judge": kind, "model": "m1", "rationale": rationale}

    log = [
        {"judge": [verdict("llm"), verdict("llm-audit"), verdict("rule")]},
        {
            "judge": [
                verdict("llm-fallback", "LLM judge failed (down); rule verdict: x"),
                verdict("llm-fallback", "LLM judge failed (later)"),
            ]
        },
        {"judge": []},
    ]
    assert judge_counts(log) == {
        "verdicts": 3,
        "fallbacks": 2,
        "model": "m1",
        "first_error": "LLM judge failed (down)",
    }
    # rows repeat the episode's judge counts: they are summed once per episode
    rows = [
        {
            "config": "c",
            "seed": s,
            "seat": seat,
            "agent": "truthful",
            "decisions": 4,
            "judge": judge_counts(log),
        }
        for s in (0, 1)
        for seat in ("bidder_0", "bidder_1")
    ]
    (judge,) = [h for h in from_rows(rows) if h.seat == "judge"]
    assert (judge.decisions, judge.fallbacks, judge.agent) == (6, 4, "LLM judge m1")


def test_an_unreachable_llm_judge_falls_back_on_every_verdict() -> None:
    sc = load_scenario(
        "coalition_market",
        judge="llm:openai?model=m&base_url=http://127.0.0.1:9/v1&retries=0&max_retries=0",
    )
    result = run_episode(sc, 0, {"bidder_0": "rule_expert"})  # it pitches for the pool
    counts = judge_counts(result.round_log)
    assert counts["verdicts"] == counts["fallbacks"] > 0
    assert counts["first_error"].startswith("LLM judge failed")


# --- the command line -------------------------------------------------------------------------------


def test_run_prints_the_failures_and_strict_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [
        "run",
        "single_trade",
        "--seeds",
        "0:2",
        "--seat",
        "bidder_0=py:test_agent_health:Boom",
        "--out",
        str(tmp_path),
        "--workers",
        "1",
        "--no-progress",
        "--no-transcripts",
    ]
    assert cli(base) == 0  # without --strict the run succeeds, but says so loudly
    out = flat(capsys.readouterr().out)
    assert "WARNING" in out and "bidder_0 (py:test_agent_health:Boom) fell back on 100%" in out
    assert "RuntimeError: boom in act" in out
    assert cli([*base, "--strict"]) == STRICT_EXIT
    err = flat(capsys.readouterr().err)
    assert "--strict: bidder_0 (py:test_agent_health:Boom) fell back on" in err
    assert cli([*base, "--strict", "100%"]) == 0  # nobody failed more than all decisions
    assert (
        cli(
            [
                "run",
                "single_trade",
                "--seeds",
                "0:2",
                "--out",
                str(tmp_path / "clean"),
                "--workers",
                "1",
                "--no-progress",
                "--no-transcripts",
                "--strict",
            ]
        )
        == 0
    )
    assert "agent health: no fallbacks, agent errors, timeouts or repairs" in flat(
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--strict", "2"], "--strict '2': give a share from 0 to 1"),
        (["--strict", "lots"], "--strict 'lots': give the share of failed decisions"),
        (["--agent-timeout", "-1"], "--agent-timeout '-1': give seconds from 0 up"),
        (["--agent-timeout", "soon"], "--agent-timeout 'soon': give seconds from 0 up"),
    ],
)
def test_bad_strict_and_timeout_values_are_usage_errors(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli(["run", "single_trade", "--out", str(tmp_path), *flags])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert parse_share("10%") == pytest.approx(0.1) and parse_share("0.25") == 0.25


def test_agent_timeout_flag_applies_and_a_run_resumes_with_another_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [
        "run",
        "single_trade",
        "--seat",
        "bidder_0=py:test_agent_health:HangsAtFirstBid",
        "--out",
        str(tmp_path / "single_trade"),
        "--workers",
        "1",
        "--no-progress",
        "--no-transcripts",
    ]
    assert finishes(lambda: cli([*base, "--seeds", "0:1", "--agent-timeout", str(LIMIT)])) == 0
    assert "timed out" in flat(capsys.readouterr().out)
    # the limit is not part of the run's configuration: another one resumes the same folder
    assert (
        finishes(
            lambda: cli([*base, "--seeds", "0:2", "--agent-timeout", "0.3", "--strict", "0.99"])
        )
        == 0
    )
    rows = read_results(tmp_path / "single_trade")
    assert sorted({r["seed"] for r in rows}) == [0, 1]
    assert all(r["timeouts"] > 0 for r in rows if r["seat"] == "bidder_0")


def test_eval_and_tournament_report_failures_and_honour_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    boom = "py:test_agent_health:Boom"
    args = [
        "eval",
        "--agents",
        f"truthful,{boom}",
        "--scenarios",
        "single_trade",
        "--seeds",
        "0:2",
        "--out",
        str(tmp_path / "eval"),
        "--workers",
        "1",
        "--no-progress",
    ]
    assert cli([*args, "--strict", "0.5"]) == STRICT_EXIT
    captured = capsys.readouterr()
    out = flat(captured.out)
    assert "single_trade/py_test_agent_health_Boom-" in out  # the seat's run folder
    assert f"bidder_0 ({boom}) fell back on 100%" in out and "--strict" in captured.err
    tour = [
        "tournament",
        "--bidders",
        f"truthful,{boom}",
        "--scenario",
        "single_trade",
        "--seeds",
        "0:1",
        "--out",
        str(tmp_path / "tour"),
        "--workers",
        "1",
    ]
    assert cli([*tour, "--strict"]) == STRICT_EXIT
    out = flat(capsys.readouterr().out)
    assert f"bidder ({boom}) fell back on 100%" in out
    assert cli(tour) == 0  # resumed: nothing to play, the counts are still shown
    assert "WARNING" in capsys.readouterr().out


def test_an_llm_judge_that_always_falls_back_fails_a_strict_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "dead_judge.toml"
    toml.write_text(
        'extends = "coalition_market"\nname = "dead_judge"\n'
        'judge = "llm:openai?model=m&base_url=http://127.0.0.1:9/v1&retries=0'
        '&max_retries=0"\n'
    )
    args = [
        "run",
        str(toml),
        "--seeds",
        "0:1",
        "--seat",
        "bidder_0=rule_expert",
        "--out",
        str(tmp_path),
        "--workers",
        "1",
        "--no-progress",
        "--no-transcripts",
    ]
    assert cli([*args, "--strict", "0.5"]) == STRICT_EXIT
    out = flat(capsys.readouterr().out)
    assert "judge (LLM judge m) fell back on 100%" in out and "LLM judge failed" in out


# --- the HTML report ----------------------------------------------------------------------------------


def test_report_shows_failures_on_top_and_names_episodes_by_seed(tmp_path: Path) -> None:
    out = tmp_path / "r"
    run_scenario(
        "single_trade",
        [3, 0],
        {"bidder_0": "py:test_agent_health:Boom"},
        out,
        workers=1,
        progress=False,
    )
    html = write_report(out, tmp_path / "report.html").read_text()
    top = html.index('id="health"')
    assert top < html.index('id="index"')  # above everything else
    assert 'class="health alert"' in html and "Agent failures" in html
    assert "bidder_0 (py:test_agent_health:Boom) fell back on 100%" in html
    assert "single_trade, seed 0</h2>" in html and "single_trade, seed 3</h2>" in html
    assert "Episode 1" not in html
    clean = tmp_path / "clean"
    run_scenario("single_trade", [0], None, clean, workers=1, progress=False)
    html = write_report(clean, tmp_path / "clean.html").read_text()
    assert "Agent health: no fallbacks" in html and "health alert" not in html


def test_a_component_has_one_colour_in_every_chart(tmp_path: Path) -> None:
    # two scenarios with different sets of components (market_round adds the designer's
    # composite, talk costs and trades): a name's colour must not depend on which others exist
    run_scenario("single_trade", [0], None, tmp_path / "a", workers=1, progress=False)
    run_scenario(
        "market_round", [0], {"bidder_0": "rule_expert"}, tmp_path / "b", workers=1, progress=False
    )
    html = write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "report.html").read_text()
    strokes: dict[str, set[str]] = {}
    legends: dict[str, set[str]] = {}
    charts: list[set[str]] = []
    for figure in html.split('<figure class="chart">')[1:]:
        if "cumulative reward by component" not in figure.split("</figcaption>", 1)[0]:
            continue
        names = set()
        for part in figure.split('<g class="series"><title>')[1:]:
            name = part.split("</title>", 1)[0]
            names.add(name)
            strokes.setdefault(name, set()).add(part.split('stroke="', 1)[1].split('"', 1)[0])
        for part in figure.split('<span class="sw c')[1:]:
            index, rest = part.split('"', 1)
            legends.setdefault(rest.split("</span>", 1)[1].split("</li>", 1)[0], set()).add(
                PALETTE[int(index)]
            )
        charts.append(names)
    assert len({frozenset(c) for c in charts}) > 1  # charts with different component sets
    assert {"job_value", "auction_payments", "composite"} <= set(strokes)
    for name, colours in strokes.items():
        assert len(colours) == 1, (name, colours)  # one colour in every chart
        assert legends[name] == colours, name  # and its legend swatch agrees
    assert len({c for cs in strokes.values() for c in cs}) == len(strokes)  # distinct names differ
    assert set(COMPONENT_COLORS) >= set(strokes)
