"""``gpumarket eval --leaderboard``: each agent in the designer and a bidder seat against the
reference agent of that seat on the same seeds, checked by hand against the run folders' result
rows and the FakeOpenAIServer test double (a fixed 1,000 prompt and 500 completion tokens per
answer): one fake answers every request with a legal action, one with garbage, so every decision
is repaired once and then falls back. A last test runs the real llama.cpp server."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shlex
import statistics
from pathlib import Path
from typing import Any

import pytest
from real_model_utils import LLAMA_INSTALL, LLAMA_SERVER_MODULES, LlamaServer, require_gguf
from real_model_utils import require_modules as require_packages

from agents.base import BaseAgent
from market.bench.fake_openai_server import FakeOpenAIServer, default_policy
from market.cli import main as cli
from market.cli.leaderboard_sweep import FIXED
from market.cli.leaderboard_sweep import main as sweep
from market.core.actions import Bid, Wait
from market.run.evaluation import slug
from market.run.folders import open_folder
from market.run.jobs import RunConfigError, play
from market.run.leaderboard import labels, leaderboard, stat_totals

KEY_ENV = "GPUMARKET_LEADERBOARD_TEST_KEY"
PROMPT, COMPLETION = 1_000, 500
SEEDS = [0, 1, 2]
T95_2DF = 4.303  # Student t, 95% two-sided, 2 degrees of freedom (3 seeds)
WALL_TIME = {"latency_s", "queue_wait_s", "retry_wait_s"}  # the only stats that may differ


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-leaderboard-test")


def llm(srv: FakeOpenAIServer, extra: str = "") -> str:
    return (
        f"llm:openai?model=fake-model&base_url={srv.base_url}&api_key_env={KEY_ENV}"
        f"&price_prompt=2&price_completion=8{extra}"
    )


def seat_rows(out: Path, scenario: str, seat: str, agent: str) -> dict[int, dict[str, Any]]:
    """The seat's result rows in the entry's run folder, by seed (read back by hand)."""
    path = out / scenario / seat / slug(agent) / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["seed"]: r for r in rows if r["seat"] == seat}


def by_key(board_rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(r["scenario"], r["seat"], r["agent"]): r for r in board_rows}


def hand_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the 95% CI half-width, t * s / sqrt(n), for three values."""
    assert len(values) == 3
    return statistics.fmean(values), T95_2DF * statistics.stdev(values) / math.sqrt(3)


def test_leaderboard_with_a_legal_fake_model_matches_hand_computation(tmp_path: Path) -> None:
    with FakeOpenAIServer(usage=(PROMPT, COMPLETION)) as srv:
        agent = llm(srv)
        board = leaderboard(
            [agent, "truthful"],
            ["single_trade", "market_round"],
            SEEDS,
            tmp_path,
            workers=1,
            progress=False,
        )
        requests = len(srv.requests)
    rows = by_key(board.rows())
    # single_trade has no designer seat; truthful fills no designer seat
    assert set(rows) == {
        ("single_trade", "bidder_0", "rule_expert"),
        ("single_trade", "bidder_0", agent),
        ("single_trade", "bidder_0", "truthful"),
        ("market_round", "bidder_0", "rule_expert"),
        ("market_round", "bidder_0", agent),
        ("market_round", "bidder_0", "truthful"),
        ("market_round", "designer_0", "rule_designer"),
        ("market_round", "designer_0", agent),
    }
    assert any("single_trade has no seat designer_0" in n for n in board.notes)
    total_decisions = 0
    for scenario, seat, ref in (
        ("single_trade", "bidder_0", "rule_expert"),
        ("market_round", "bidder_0", "rule_expert"),
        ("market_round", "designer_0", "rule_designer"),
    ):
        mine = seat_rows(tmp_path, scenario, seat, agent)
        theirs = seat_rows(tmp_path, scenario, seat, ref)
        row = rows[(scenario, seat, agent)]
        decisions = sum(r["decisions"] for r in mine.values())
        assert decisions > 0 and decisions == sum(r["stats"]["decisions"] for r in mine.values())
        total_decisions += decisions
        assert row["reference"] == ref and row["n"] == 3 and row["seeds"] == 3
        assert row["decisions"] == decisions
        # a legal action every time: one request per decision, nothing repaired or fallen back
        assert row["repair_rate"] == 0 and row["fallback_rate"] == 0
        assert row["parse_failure_rate"] == 0 and row["backend_errors"] == 0
        assert row["degraded"] == ""
        assert row["prompt_tokens"] == decisions * PROMPT
        assert row["completion_tokens"] == decisions * COMPLETION
        # LLM seats count the tokens of any reasoning the model wrote (here the fake's
        # "reasoning" field): the column is the sum of the seat's own stats
        assert row["reasoning_tokens"] == sum(r["stats"]["reasoning_tokens"] for r in mine.values())
        assert row["cost_usd"] == pytest.approx(decisions * (PROMPT * 2 + COMPLETION * 8) / 1e6)
        latency = math.fsum(r["stats"]["latency_s"] for r in mine.values())
        assert row["latency_per_decision_s"] == pytest.approx(latency / decisions)
        assert row["latency_per_decision_s"] > 0
        invalid = sum(r["invalid_actions"] for r in mine.values())
        assert row["invalid_rate"] == pytest.approx(invalid / decisions)
        # mean return and CI by hand; the paired difference is the mean of per-seed differences
        mean, half = hand_ci([mine[s]["return"] for s in SEEDS])
        assert row["mean"] == pytest.approx(mean) and row["ci95"] == pytest.approx(half)
        diffs = [mine[s]["return"] - theirs[s]["return"] for s in SEEDS]
        dmean, dhalf = hand_ci(diffs)
        assert row["diff_n"] == 3
        assert row["diff_mean"] == pytest.approx(dmean) and row["diff_ci95"] == pytest.approx(dhalf)
        assert row["diff_mean"] == pytest.approx(row["mean"] - rows[(scenario, seat, ref)]["mean"])
        reference = rows[(scenario, seat, ref)]
        assert reference["is_reference"] and math.isnan(reference["diff_mean"])
        assert reference["prompt_tokens"] == 0 and reference["latency_per_decision_s"] is None
    assert total_decisions == requests  # every request the server saw is one LLM decision
    # the files: CSV (every stats key as a column), Markdown, JSON
    table = list(csv.DictReader(io.StringIO((tmp_path / "leaderboard.csv").read_text())))
    assert len(table) == 8
    llm_row = next(r for r in table if r["agent"] == agent and r["seat"] == "designer_0")
    assert (
        int(llm_row["stats.requests"]) == rows[("market_round", "designer_0", agent)]["decisions"]
    )
    assert "stats.cost_usd" in llm_row and llm_row["reference"] == "rule_designer"
    md = (tmp_path / "leaderboard.md").read_text()
    assert "`designer_0` (designer seat): reference `rule_designer`" in md
    assert "`bidder_0` (bidder seat): reference `rule_expert`" in md
    assert "on the same 3 seed(s) (0..2)" in md
    assert "| market_round | rule_designer (reference) | 3 |" in md
    data = json.loads((tmp_path / "leaderboard.json").read_text())
    assert data["references"] == {"designer": "rule_designer", "bidder": "rule_expert"}
    assert data["warnings"] == [] and len(data["rows"]) == 8


def test_a_garbage_model_is_repaired_falls_back_and_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeOpenAIServer(policy=lambda body: "I think I will bid high!", usage=(10, 5)) as srv:
        agent = llm(srv, "&retries=1")
        code = cli(
            [
                "eval",
                "--leaderboard",
                "--agents",
                agent,
                "--scenarios",
                "market_round",
                "--seats",
                "designer,bidder_0",
                "--seeds",
                "0:3",
                "--out",
                str(tmp_path),
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        requests = len(srv.requests)
    printed = capsys.readouterr().out
    assert code == 0
    data = json.loads((tmp_path / "leaderboard.json").read_text())
    rows = by_key(data["rows"])
    decisions = 0
    for seat in ("designer_0", "bidder_0"):
        row = rows[("market_round", seat, agent)]
        n = row["decisions"]
        decisions += n
        assert n == sum(
            r["decisions"] for r in seat_rows(tmp_path, "market_round", seat, agent).values()
        )
        # each decision: a reply, a parse failure, one repair, a second parse failure, a fallback
        assert row["stats"]["requests"] == 2 * n
        assert row["repair_rate"] == 1.0 and row["fallback_rate"] == 1.0
        assert row["parse_failure_rate"] == 2.0
        assert row["prompt_tokens"] == 2 * n * 10 and row["completion_tokens"] == 2 * n * 5
        assert row["degraded"] == f"{n} fallbacks"
        label = row["label"]  # the spec's model and parameters, without the server's address
        assert label == "llm fake-model price_prompt=2 price_completion=8 retries=1"
        assert f"DEGRADED market_round / {seat} / {label}: {n} fallbacks" in data["warnings"]
    assert decisions * 2 == requests
    assert "WARNING" in printed and "DEGRADED market_round / designer_0" in printed
    md = (tmp_path / "leaderboard.md").read_text()
    assert md.count("fallbacks |") == 2 and "- DEGRADED market_round / bidder_0" in md


class Reporter(BaseAgent):
    """A bidder that reports stats keys the leaderboard has never heard of."""

    name = "reporter"
    roles = frozenset({"bidder"})

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.stats = {"decisions": 0, "reasoning_tokens": 0, "novel_metric": 0.0}

    def act(self, obs: Any) -> Any:
        self.stats["decisions"] += 1
        self.stats["reasoning_tokens"] += 7
        self.stats["novel_metric"] += 0.25
        self.stats["degraded_features"] = 1  # e.g. a feature the backend could not honour
        return Bid(bids=[]) if obs.phase == "bidding" else Wait()


def test_new_numeric_stats_keys_flow_through_and_degraded_keys_flag(tmp_path: Path) -> None:
    spec = "py:test_leaderboard:Reporter"
    board = leaderboard(
        [spec], ["single_trade"], [0, 1], tmp_path, seats=["bidder_0"], workers=1, progress=False
    )
    row = by_key(board.rows())[("single_trade", "bidder_0", spec)]
    n = row["decisions"]
    assert n > 0
    assert row["reasoning_tokens"] == 7 * n
    assert row["stats"]["novel_metric"] == pytest.approx(0.25 * n)
    assert row["degraded"] == "degraded_features=2"  # one per episode, two episodes
    header = (tmp_path / "leaderboard.csv").read_text().splitlines()[0].split(",")
    assert {"stats.novel_metric", "stats.reasoning_tokens", "stats.degraded_features"} <= set(
        header
    )


def flaky(body: dict[str, Any]) -> str:
    """Garbage for every negotiation prompt of round 1, else the default legal policy: the same
    answer for the same prompt, however the episodes interleave."""
    first = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if "phase: negotiation" in first and re.search(r"Round 1\b", first):
        return "not json at all"
    return default_policy(body)


def test_process_pool_worker_and_async_runner_give_the_same_stats(tmp_path: Path) -> None:
    """The leaderboard's LLM folders are played by the async runner; the process pool's worker
    (:func:`market.run.jobs.play`, blocking ``act``) gives the same rows but wall times."""
    with FakeOpenAIServer(policy=flaky, usage=(PROMPT, COMPLETION)) as srv:
        agent = llm(srv, "&retries=1&memory=none")  # flaky reads the whole observation
        leaderboard([agent], ["single_trade"], [0, 1], tmp_path, seats=["bidder_0"], progress=False)
        folder = open_folder(
            "single_trade",
            [0, 1],
            {"bidder_0": agent},
            tmp_path / "single_trade" / "bidder_0" / slug(agent),
            False,
            False,
            1,
            None,
        )
        async_rows = {s: next(r for r in folder.done[s] if r["seat"] == "bidder_0") for s in [0, 1]}
        pooled = {}
        for seed in [0, 1]:
            _, rows, _, error = play(folder.job(seed))
            assert error is None and rows is not None
            pooled[seed] = next(r for r in rows if r["seat"] == "bidder_0")
    for seed in [0, 1]:
        a, b = async_rows[seed], pooled[seed]
        assert a["return"] == b["return"]
        for key in ("decisions", "fallbacks", "repairs", "invalid_actions", "tokens"):
            assert a[key] == b[key], key
        keep = set(a["stats"]) - WALL_TIME
        assert {k: a["stats"][k] for k in keep} == {k: b["stats"][k] for k in keep}
    totals = stat_totals(async_rows.values())
    assert totals["fallbacks"] > 0 and totals["retries"] == totals["fallbacks"]
    assert totals["parse_failures"] == 2 * totals["fallbacks"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seats", "lab_3"], "--seats 'lab_3': give designer_0"),
        (["--reference", "designer=truthful"], "cannot fill the designer seat"),
        (["--reference", "nobody"], "unknown agent 'nobody'"),
        (["--leaderboard", "--seat", "bidder_1"], "give --seats bidder_1"),
        (["--leaderboard", "--mechanisms"], "two evaluations; give one"),
    ],
)
def test_bad_leaderboard_input_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    code = cli(
        ["eval", "--agents", "truthful", "--scenarios", "single_trade", "--seeds", "0:1"]
        + ["--out", str(tmp_path), "--no-progress", *flags]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "leaderboard.csv").exists()


def test_no_scenario_with_the_seat_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunConfigError, match="no scenario has any of the seats designer_0"):
        leaderboard(["truthful"], ["single_trade"], [0], tmp_path, seats=["designer_0"])


@pytest.mark.slow
@pytest.mark.real_model
def test_leaderboard_on_the_real_llama_cpp_server(tmp_path: Path) -> None:
    """SmolLM2-135M on llama.cpp in bidder_0 of one round of single_trade (two negotiation turns
    and a bid), one seed: the columns come from the seat's real stats (tokens and latency above
    0), whatever the model plays. One round: a CPU model on a loaded machine may take minutes
    per decision."""
    gguf = require_gguf()
    require_packages(LLAMA_SERVER_MODULES, LLAMA_INSTALL)
    scenario = tmp_path / "one_round_trade.toml"
    scenario.write_text('extends = "single_trade"\nrounds = 1\n')
    with LlamaServer(gguf) as server:
        agent = (
            f"llm:openai?model={server.alias}&base_url={server.base_url}"
            "&response_format=json_object&timeout=900&max_retries=0&max_tokens=128&retries=1"
        )
        board = leaderboard(
            [agent],
            [scenario],
            [0],
            tmp_path / "out",
            seats=["bidder_0"],
            progress=False,
            agent_timeout=900.0,
        )
        log = server.log_tail(1500)
    name = board.scenarios[0]
    row = by_key(board.rows())[(name, "bidder_0", agent)]
    assert row["n"] == 1 and row["decisions"] > 0, log
    assert row["stats"]["requests"] >= row["decisions"]
    assert row["backend_errors"] == 0 and row["timeouts"] == 0, (row["degraded"], log)
    assert row["prompt_tokens"] > 0 and row["completion_tokens"] > 0
    assert row["latency_per_decision_s"] > 0
    assert 0 <= row["fallback_rate"] <= 1 and row["repair_rate"] >= 0
    ref = by_key(board.rows())[(name, "bidder_0", "rule_expert")]
    assert row["diff_mean"] == pytest.approx(row["mean"] - ref["mean"]) and row["diff_n"] == 1
    assert math.isnan(row["ci95"]) and math.isnan(row["diff_ci95"])  # one seed: no interval
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    print(md)  # the measured row, for the report (-s)
    assert f"{row['mean']:.3f} (1 seed: no CI)" in md
    assert f"| {row['prompt_tokens']:,} | {row['completion_tokens']:,} |" in md


def test_the_settings_sweep_passes_each_combination_through_as_spec_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = sweep(
        ["--dry-run", "--memory", "none,window:4", "--reasoning", "field", "--mode", "json,tools"]
        + ["--out", str(tmp_path), "--", "--workers", "1"]
    )
    argv = shlex.split(capsys.readouterr().out)
    assert code == 0 and argv[:3] == ["gpumarket", "eval", "--leaderboard"]
    assert argv[-2:] == ["--workers", "1"]
    specs = argv[argv.index("--agents") + 1].split(",")
    assert [s.split("&retries=1")[1] for s in specs] == [
        "&memory=none&reasoning=field&mode=json",
        "&memory=none&reasoning=field&mode=tools",
        "&memory=window:4&reasoning=field&mode=json",
        "&memory=window:4&reasoning=field&mode=tools",
    ]
    assert list(labels(specs).values()) == [
        "llm smollm2-135m memory=none mode=json",
        "llm smollm2-135m memory=none mode=tools",
        "llm smollm2-135m memory=window:4 mode=json",
        "llm smollm2-135m memory=window:4 mode=tools",
    ]
    assert sweep(["--dry-run", "--memory", "a&b"]) == 2  # a value that would break the spec


def test_the_settings_sweep_runs_the_leaderboard(tmp_path: Path) -> None:
    """With no settings to sweep, one spec: the sweep runs ``gpumarket eval --leaderboard``."""
    with FakeOpenAIServer() as srv:
        code = sweep(
            ["--base-url", srv.base_url, "--model", "fake-model"]
            + ["--memory", "", "--reasoning", "", "--mode", ""]
            + ["--scenarios", "single_trade", "--seats", "bidder_0", "--seeds", "0:1"]
            + ["--out", str(tmp_path), "--", "--no-progress"]
        )
    assert code == 0
    rows = json.loads((tmp_path / "leaderboard.json").read_text())["rows"]
    assert [r["label"] for r in rows] == [
        "rule_expert",
        "llm fake-model " + FIXED.replace("&", " "),
    ]
    assert rows[1]["decisions"] > 0 and rows[1]["prompt_tokens"] > 0


def test_the_docs_leaderboard_table_is_the_measured_file() -> None:
    """docs/llm-seats.md's SmolLM2 table shows exactly the committed measurement (the CSV that
    `gpumarket eval --leaderboard` wrote), so neither can be edited without the other."""
    root = Path(__file__).resolve().parents[2]
    with (root / "docs" / "data" / "leaderboard-smollm2.csv").open(encoding="utf-8") as f:
        measured = list(csv.DictReader(f))
    text = (root / "docs" / "llm-seats.md").read_text(encoding="utf-8")
    section = text[text.index("### Measured: SmolLM2-135M on llama.cpp") :]
    shown = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and "±" in line and "95% CI" not in line
    ]
    assert len(shown) == len(measured) == 9
    for cells, row in zip(shown, measured, strict=True):
        assert cells[4] == f"{float(row['mean']):.3f} ± {float(row['ci95']):.3f}"
        assert cells[3] == row["n"]
        if row["is_reference"] == "True":
            assert "rule_expert" in cells[0]
            continue
        assert f"memory={cells[0]} reasoning={cells[1]} mode={cells[2]}" in row["label"]
        assert cells[5] == f"{float(row['diff_mean']):.3f} ± {float(row['diff_ci95']):.3f}"
        assert cells[8] == f"{float(row['fallback_rate']):.3f}"
        assert cells[9] == row["backend_errors"]
