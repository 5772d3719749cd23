"""The stand-in model's server (``python -m market.serve.stand_in``) on 127.0.0.1: LLM seats play
it through the real ``openai`` client (JSON schema, JSON object, tools; default memory) without a
fallback or a refused action; answers honour the requested format; requests an attacker might
send get a 4xx with a clear message, and the server stays up."""

from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.llm.prompts import prompt_messages, sample_observations
from agents.registry import make_agent
from market.cli import main as cli
from market.run.rollout import run_episode
from market.serve.stand_in import MAX_BODY


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    """The server started as its documented command, on a free port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "market.serve.stand_in", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY http://127.0.0.1:"), (line, proc.stderr)
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def post(base_url: str, body: Any, **kwargs: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
    return httpx.post(
        f"{base_url}/chat/completions", content=content, headers=headers, timeout=30, **kwargs
    )


def bidding_messages() -> list[dict[str, str]]:
    obs = next(o for o in sample_observations() if o.phase == "bidding")
    return prompt_messages(obs)


def still_serving(base_url: str) -> None:
    answer = post(base_url, {"model": "stand-in", "messages": bidding_messages()})
    assert answer.status_code == 200
    assert json.loads(answer.json()["choices"][0]["message"]["content"])["action_type"] == "bid"


@pytest.mark.parametrize(
    "extra",
    ["", "&memory=none&response_format=json_object", "&mode=tools&reasoning=field"],
    ids=["default", "json_object", "tools"],
)
def test_llm_seats_play_market_round_on_it(base_url: str, extra: str) -> None:
    spec = f"llm:openai?model=stand-in&base_url={base_url}&max_retries=0{extra}"
    seats = {"bidder_0": make_agent(spec), "designer_0": make_agent(spec)}
    result = run_episode("market_round", seed=1000, seats=seats, agent_timeout=0)
    truthful = run_episode("market_round", seed=1000, seats={"bidder_0": "truthful"})
    for seat in seats.values():
        stats = seat.stats
        assert stats["decisions"] > 0 and stats["prompt_tokens"] > 0, stats
        assert stats["fallbacks"] == stats["parse_failures"] == stats["backend_errors"] == 0
        assert stats["retries"] == stats["semantic_refusals"] == 0, stats
    assert result.invalid_actions["bidder_0"] == result.invalid_actions["designer_0"] == 0
    assert result.returns["bidder_0"] == pytest.approx(truthful.returns["bidder_0"], abs=0.01)


def test_answers_are_well_formed_chat_completions(base_url: str) -> None:
    answer = post(base_url, {"model": "stand-in", "messages": bidding_messages(), "seed": 3})
    body = answer.json()
    assert answer.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 100 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    models = httpx.get(f"{base_url}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["stand-in"]


def test_the_requested_format_is_honoured(base_url: str) -> None:
    only_wait = {"properties": {"action_type": {"const": "wait"}}}
    strict = {"type": "object", "properties": {"action": {"anyOf": [only_wait]}}}
    answer = post(
        base_url,
        {
            "model": "stand-in",
            "messages": bidding_messages(),
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "action", "schema": strict, "strict": True},
            },
        },
    )
    assert json.loads(answer.json()["choices"][0]["message"]["content"]) == {
        "action": {"action_type": "wait"}
    }
    cut = post(base_url, {"model": "stand-in", "messages": bidding_messages(), "max_tokens": 2})
    assert cut.json()["choices"][0]["finish_reason"] == "length"
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in ("bid", "wait")
    ]
    called = post(base_url, {"model": "stand-in", "messages": bidding_messages(), "tools": tools})
    choice = called.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "bid"


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"x" * (MAX_BODY + 1), 413, "too large"),
        (b'{"model": "stand-in", "messages": [', 400, "not valid JSON"),
        ({"model": "stand-in"}, 400, "messages: Field required"),
        ({"model": "stand-in", "messages": "hi"}, 400, "messages: Input should be a valid list"),
        ({"model": "stand-in", "messages": []}, 400, "messages: List should have at least 1"),
        ({"model": "stand-in", "messages": [{"role": "root", "content": "x"}]}, 400, "role"),
        ({"model": 7, "messages": [{"role": "user", "content": "x"}]}, 400, "model"),
        ({"model": "stand-in", "messages": [{"role": "user", "content": 5}]}, 400, "content"),
        ({"model": "gpt-9", "messages": [{"role": "user"}]}, 404, "not served here"),
        ({"model": "stand-in", "messages": [{"role": "user"}], "stream": True}, 400, "stream"),
        ({"model": "stand-in", "messages": [{"role": "user"}], "n": 4}, 400, "n=4"),
        ([1, 2], 400, "invalid request"),
    ],
    ids=[
        "huge",
        "not-json",
        "no-messages",
        "messages-str",
        "messages-empty",
        "role",
        "model-type",
        "content-type",
        "other-model",
        "stream",
        "n",
        "array",
    ],
)
def test_bad_requests_get_a_clear_4xx_and_the_server_stays_up(
    base_url: str, body: Any, status: int, says: str
) -> None:
    answer = post(base_url, body)
    assert answer.status_code == status
    assert says in answer.text, answer.text
    still_serving(base_url)


def test_a_page_of_another_origin_may_not_post(base_url: str) -> None:
    answer = post(
        base_url,
        {"model": "stand-in", "messages": bidding_messages()},
        headers={"origin": "http://evil.example"},
    )
    assert answer.status_code == 403
    started = time.monotonic()
    still_serving(base_url)
    assert time.monotonic() - started < 10


DOC = Path(__file__).resolve().parents[2] / "docs" / "llm-seats.md"
SECTION = "### The prompt-only stand-in: a competent model"
MEASURED = DOC.parent / "data" / "leaderboard-stand-in.csv"
SETTINGS = "### Settings with the stand-in: what a competent reader loses"
SETTINGS_CSV = DOC.parent / "data" / "leaderboard-stand-in-settings.csv"


def documented_commands() -> list[list[str]]:
    """The section's shell commands, as argv lists (comments dropped)."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", 1)]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the section must show how to start the server and rank it"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [shlex.split(line.split("  #")[0]) for line in lines if line.strip()]


def test_the_documented_commands_run(base_url: str, tmp_path: Path) -> None:
    """The section's server command is the fixture's (on a free port), and its leaderboard
    command, on 3 seeds against that server, ranks the stand-in within noise of truthful."""
    serve, board = documented_commands()
    assert serve == ["python", "-m", "market.serve.stand_in", "--port", "8090"]
    assert board[0] == "gpumarket"
    argv = [a.replace("http://127.0.0.1:8090/v1", base_url) for a in board[1:]]
    argv[argv.index("--seeds") + 1] = "1000:1003"
    argv[argv.index("--out") + 1] = str(tmp_path)
    assert cli([*argv, "--no-progress", "--workers", "1", "--agent-timeout", "0"]) == 0
    with (tmp_path / "leaderboard.csv").open(encoding="utf-8") as f:
        rows = {r["label"]: r for r in csv.DictReader(f)}
    stand_in = rows["llm stand-in"]
    assert stand_in["n"] == "3" and float(stand_in["fallback_rate"]) == 0.0
    assert abs(float(stand_in["diff_mean"])) < 0.01


def test_the_docs_table_is_the_measured_file() -> None:
    """The section's table shows exactly the committed leaderboard CSV."""
    with MEASURED.open(encoding="utf-8") as f:
        measured = list(csv.DictReader(f))
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(SECTION) : text.index(SETTINGS)]
    shown = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and "±" in line and "95% CI" not in line
    ]
    assert len(shown) == len(measured) == 5
    for cells, row in zip(shown, measured, strict=True):
        assert cells[1] == row["n"]
        assert cells[2] == f"{float(row['mean']):.3f} ± {float(row['ci95']):.3f}"
        assert cells[4] == f"{float(row['invalid_rate']):.3f}"
        assert cells[6] == f"{float(row['fallback_rate']):.3f}"
        if row["is_reference"] == "True":
            assert row["agent"] == "truthful" and "reference" in cells[0]
            continue
        places = 5 if row["label"].startswith("llm") else 3
        diff = f"{float(row['diff_mean']):.{places}f} ± {float(row['diff_ci95']):.{places}f}"
        assert cells[3] == diff
        if row["label"].startswith("llm"):
            extra = row["label"].removeprefix("llm stand-in").strip().replace(" ", "&")
            assert cells[0] == ("stand-in" + (f" `{extra}`" if extra else ""))
            assert cells[8] == row["stats.semantic_refusals"] == "0"
            assert cells[9] == f"{int(row['prompt_tokens']):,}"


def test_the_settings_table_is_the_measured_file_and_every_setting_played_alike() -> None:
    """The settings table shows the committed sweep: per (scenario, seat) the reference, one
    stand-in return shared by all nine settings, its paired difference and the worst rates."""
    with SETTINGS_CSV.open(encoding="utf-8") as f:
        measured = list(csv.DictReader(f))
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(SETTINGS) : text.index("## Model leaderboard")]
    shown = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and "±" in line and "95% CI" not in line
    ]
    assert len(shown) == 4
    for cells in shown:
        rows = [r for r in measured if r["scenario"] == cells[0] and f"`{r['seat']}`" == cells[1]]
        ref = next(r for r in rows if r["is_reference"] == "True")
        played = [r for r in rows if r["is_reference"] != "True"]
        assert len(played) == 9 and cells[5] == "9 of 9"
        assert len({(r["mean"], r["ci95"], r["diff_mean"]) for r in played}) == 1
        one = played[0]
        assert cells[2] == f"`{ref['agent']}` {float(ref['mean']):.3f} ± {float(ref['ci95']):.3f}"
        assert cells[3] == f"{float(one['mean']):.3f} ± {float(one['ci95']):.3f}"
        assert cells[
            4
        ] == f"{float(one['diff_mean']):+.3f} ± {float(one['diff_ci95']):.3f}".replace("+-", "-")
        assert cells[6] == f"{sum(int(float(r['decisions'])) for r in played):,}"
        assert cells[7] == f"{max(float(r['invalid_rate'] or 0) for r in played):.3f}"
        assert cells[8] == f"{max(float(r['fallback_rate'] or 0) for r in played):.3f}"
