"""LLM costs in one unit (USD per million tokens) from one price lookup: a seat's own
``price_prompt``/``price_completion``, else the run's ``--price`` table; and the tokens and cost
columns of the ``eval`` and ``tournament`` tables. Checked by hand against the FakeOpenAIServer
test double answering every request with a fixed 1,000 prompt and 500 completion tokens."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from market.bench.fake_openai_server import FakeOpenAIServer
from market.cli import main as cli

KEY_ENV = "GPUMARKET_COST_TEST_KEY"
PROMPT, COMPLETION = 1_000, 500
# 1,000 prompt tokens at $2/M + 500 completion tokens at $8/M = $0.002 + $0.004
USD_PER_REQUEST = 0.006


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-cost-test")


@pytest.fixture
def server() -> Any:
    with FakeOpenAIServer(usage=(PROMPT, COMPLETION)) as srv:
        yield srv


def llm(srv: FakeOpenAIServer, extra: str = "") -> str:
    return f"llm:openai?model=fake-model&base_url={srv.base_url}&api_key_env={KEY_ENV}{extra}"


def _run(out: Path, seat: str, *flags: str) -> dict[str, Any]:
    """``gpumarket run single_trade`` on seeds 0 and 1 with ``bidder_0`` = ``seat``; returns the
    LLM seat's requests, tokens and cost summed over its results rows."""
    code = cli(
        [
            "run",
            "single_trade",
            "--seeds",
            "0:2",
            "--out",
            str(out / "single_trade"),
            "--no-progress",
            "--no-transcripts",
            "--seat",
            f"bidder_0={seat}",
            *flags,
        ]
    )
    assert code == 0
    rows = [
        json.loads(line)
        for line in (out / "single_trade" / "results.jsonl").read_text().splitlines()
    ]
    mine = [r for r in rows if r["seat"] == "bidder_0"]
    assert len(mine) == 2
    return {
        "requests": sum(r["stats"]["requests"] for r in mine),
        "tokens": sum(r["tokens"]["total"] for r in mine),
        "cost_usd": sum(r["stats"]["cost_usd"] for r in mine),
    }


def _budget_usd(err: str) -> float:
    match = re.search(
        r"budget: [\d,]+ tokens \([\d,]+ prompt, [\d,]+ completion\), \$([\d.]+)", err
    )
    assert match, err
    return float(match.group(1))


def test_only_the_price_table_prices_each_seat(
    server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _run(tmp_path, llm(server), "--price", "fake-model=2,8")
    err = capsys.readouterr().err
    n = len(server.requests)
    assert n > 0 and got["requests"] == n  # the only LLM seat made every request
    assert got["tokens"] == n * (PROMPT + COMPLETION)
    assert got["cost_usd"] == pytest.approx(n * USD_PER_REQUEST, rel=1e-12)
    assert _budget_usd(err) == pytest.approx(round(n * USD_PER_REQUEST, 4))


def test_a_seat_price_needs_no_table_and_wins_over_it(
    server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    own = llm(server, "&price_prompt=2&price_completion=8")
    got = _run(tmp_path / "own", own)
    n = len(server.requests)
    assert got["requests"] == n and got["cost_usd"] == pytest.approx(n * USD_PER_REQUEST, rel=1e-12)
    capsys.readouterr()
    # a table that would price the model at $1/M both ways: the seat's own price is used, by the
    # seat and by the run's total alike
    got = _run(tmp_path / "both", own, "--price", "fake-model=1,1")
    err = capsys.readouterr().err
    m = len(server.requests) - n
    assert got["requests"] == m and got["cost_usd"] == pytest.approx(m * USD_PER_REQUEST, rel=1e-12)
    assert _budget_usd(err) == pytest.approx(round(m * USD_PER_REQUEST, 4))


def test_a_cost_budget_accepts_a_seat_priced_by_its_spec(
    server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _run(tmp_path, llm(server, "&price_prompt=2&price_completion=8"), "--budget-usd", "100")
    assert got["cost_usd"] == pytest.approx(len(server.requests) * USD_PER_REQUEST, rel=1e-12)
    assert "no price" not in capsys.readouterr().err


def test_eval_table_has_the_seats_tokens_and_cost(
    server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    agent = llm(server)
    code = cli(
        [
            "eval",
            "--agents",
            f"{agent},truthful",
            "--scenarios",
            "single_trade",
            "--seat",
            "bidder_0",
            "--seeds",
            "0:2",
            "--out",
            str(out),
            "--workers",
            "1",
            "--no-progress",
            "--price",
            "fake-model=2,8",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    n = len(server.requests)
    rows = {r["agent"]: r for r in csv.DictReader(io.StringIO((out / "eval.csv").read_text()))}
    assert int(rows[agent]["tokens"]) == n * (PROMPT + COMPLETION)
    assert float(rows[agent]["cost_usd"]) == pytest.approx(n * USD_PER_REQUEST, rel=1e-12)
    assert int(rows["truthful"]["tokens"]) == 0 and float(rows["truthful"]["cost_usd"]) == 0
    assert "tokens" in printed and "cost USD" in printed
    assert f"{n * (PROMPT + COMPLETION):,}" in printed and f"{n * USD_PER_REQUEST:.4f}" in printed
    md = (out / "eval.md").read_text()
    assert f"| {n * (PROMPT + COMPLETION):,} | {n * USD_PER_REQUEST:.4f} |" in md
    assert "| truthful |" in md and " | 0 | 0.0000 |" in md


def test_tournament_table_has_each_agents_tokens_and_cost(
    server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tour"
    agent = llm(server, "&price_prompt=2&price_completion=8")
    code = cli(
        [
            "tournament",
            "--scenario",
            "single_trade",
            "--bidders",
            f"{agent},truthful",
            "--seeds",
            "0:2",
            "--workers",
            "1",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    n = len(server.requests)
    rows = {r["agent"]: r for r in csv.DictReader(io.StringIO((out / "ratings.csv").read_text()))}
    assert int(rows[agent]["tokens"]) == n * (PROMPT + COMPLETION)
    assert float(rows[agent]["cost_usd"]) == pytest.approx(n * USD_PER_REQUEST, abs=1e-6)
    assert int(rows["truthful"]["tokens"]) == 0 and float(rows["truthful"]["cost_usd"]) == 0
    assert "cost USD" in printed and f"{n * USD_PER_REQUEST:.4f}" in printed
    md = (out / "ratings.md").read_text()
    assert f"| {n * (PROMPT + COMPLETION):,} | {n * USD_PER_REQUEST:.4f} |" in md
    summary = json.loads((out / "summary.json").read_text())
    assert {r["agent"]: r["tokens"] for r in summary["rows"]}[agent] == n * (PROMPT + COMPLETION)
