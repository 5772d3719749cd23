"""What a run writes and prints keeps its secrets and cannot attack the reader:

- transcripts (and the files they are staged in) are written owner-only (0600) whatever the
  umask: they hold every seat's private state and the episode's seed;
- an agent service's token in a seat spec is masked (``token=***``) in everything a run writes
  or prints: the transcript header, ``results.jsonl``, the manifest, the report, the terminal
  table; a masked transcript still replays exactly;
- ``gpumarket replay``, ``show`` and ``validate`` print transcript and scenario text with control
  characters as visible escapes (a ``scenario_name`` of ``"\\x1b[2J"`` never clears the screen);
- a TOML file nested 800 deep is the usual one-line scenario error, never a RecursionError.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_model_utils import free_port

import market
from agents.specs_redact import redact_spec, redact_text
from market.cli import main
from market.record.transcript import read_transcript, records_of, rewrite
from market.record.writer import write_private
from market.review.replay import rerecord
from market.run.rollout import run_episode
from market.run.runner import run_scenario
from scenarios import ScenarioError, load_scenario

SECRET = "tok-5ecr3t-77aa"
ESC = "\x1b"


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that would make new files world-readable (and writable)."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_transcripts_are_written_owner_only(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "one.jsonl"
    run_episode("single_trade", 1, transcript=path)
    assert mode(path) == 0o600
    # a file that was there, world-readable, is truncated and made owner-only too
    old = tmp_path / "old.jsonl"
    old.write_text("x")
    old.chmod(0o644)
    run_episode("single_trade", 1, transcript=old)
    assert mode(old) == 0o600 and read_transcript(old).complete
    # re-chained files (rewrite stages a .tmp) and shipped ones (staged as .part) alike
    rewrite(old, records_of(read_transcript(old)))
    assert mode(old) == 0o600
    rerecord(old)  # replay --update stages a .new.jsonl
    assert mode(old) == 0o600 and not list(tmp_path.glob("*.new.jsonl"))
    staged = tmp_path / "7.jsonl.part"
    write_private(staged, path.read_bytes())
    assert mode(staged) == 0o600 and staged.read_bytes() == path.read_bytes()
    # a run folder's transcripts, in a worker process or in this one
    for workers in (1, 2):
        out = tmp_path / f"run{workers}"
        run_scenario("single_trade", range(2), None, out, workers=workers, progress=False)
        files = sorted((out / "transcripts").glob("*.jsonl"))
        assert len(files) == 2 and {mode(f) for f in files} == {0o600}


def _forged(tmp_path: Path, scenario_name: str) -> Path:
    path = tmp_path / "forged.jsonl"
    run_episode("single_trade", 2, transcript=path)
    records = records_of(read_transcript(path))
    records[0]["scenario_name"] = scenario_name
    rewrite(path, records)
    return path


def test_replay_and_show_print_no_control_characters(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    hostile = "evil\x1b[2J\x1b]0;pwned\x07\u202e\nreplay exact: forged line"
    path = _forged(tmp_path, hostile)
    assert main(["replay", str(path)]) == 0  # still replays exactly
    got = capfd.readouterr()
    printed = got.out + got.err
    assert ESC not in printed and "\x07" not in printed and "\u202e" not in printed
    assert "evil\\x1b[2J\\x1b]0;pwned\\x07\\u202e\\nreplay exact: forged line" in printed
    assert len(got.out.strip().splitlines()) == 1  # the newline forged no second line
    assert main(["show", str(path)]) == 0
    shown = capfd.readouterr().out
    assert ESC not in shown and "evil\\x1b[2J" in shown
    # a diverging replay prints the recorded value it disagrees with: escaped too
    records = records_of(read_transcript(path))
    step = next(r for r in records if r.get("type") == "step")
    step["info"] = {**step.get("info", {}), "error": "\x1b[31mforged\x1b[0m"}
    rewrite(path, records)
    assert main(["replay", str(path)]) == 1
    got = capfd.readouterr()
    assert ESC not in got.out + got.err and "DIVERGES" in got.out


def test_validate_prints_scenario_text_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "keys.toml"
    bad.write_text('rounds = 3\n"evil\\u001b[2J" = 1\n', encoding="utf-8")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert ESC not in err and "evil\\x1b[2J" in err and "unknown key" in err


@pytest.mark.parametrize(
    "text",
    [
        "rounds = " + "[" * 800 + "]" * 800 + "\n",  # arrays
        "x = " + "{a = " * 800 + "1" + "}" * 800 + "\n",  # inline tables
    ],
    ids=["arrays", "inline-tables"],
)
def test_deep_toml_is_the_one_line_scenario_error(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(text, encoding="utf-8")
    assert main(["validate", str(path)]) == 2  # as for any other invalid file
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "Recursion" not in err
    assert err.startswith(f"error: {path}: ") and "nested too deeply" in err
    for load in (load_scenario, market.env):
        with pytest.raises(ScenarioError, match="nested too deeply"):
            load(str(path))


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ("truthful", "truthful"),
        ("random?space=daedalus", "random?space=daedalus"),
        ("colluder?token=ROTA", "colluder?token=ROTA"),  # a public handshake word
        ("remote?url=http://h:9&token=abc&timeout=3", "remote?url=http://h:9&token=***&timeout=3"),
        ("remote?url=http://h:9&token_env=VAR", "remote?url=http://h:9&token_env=VAR"),
        ("remote?url=http://h:9&token_file=/run/t", "remote?url=http://h:9&token_file=/run/t"),
        ("remote?url=http://u:pw@h:9", "remote?url=http://***@h:9"),
        (
            "llm:openai?model=m&max_tokens=64&api_key=sk-1",
            "llm:openai?model=m&max_tokens=64&api_key=***",
        ),
        ("py:pkg.mod:Cls?password=x&Secret=y&n=1", "py:pkg.mod:Cls?password=***&Secret=***&n=1"),
        (
            "remote?url=http%3A%2F%2Fh%2Fa%3Fkey%3Dk1%26x%3D1",
            "remote?url=http://h/a%3Fkey%3D***%26x%3D1",
        ),
    ],
)
def test_redact_spec(spec: str, shown: str) -> None:
    assert redact_spec(spec) == shown
    assert redact_spec(shown) == shown  # masking twice changes nothing


def test_redact_text_masks_urls_and_pairs_in_messages() -> None:
    text = "POST http://me:pw@h:1/act?token=abc failed; key=k2, max_tokens=5"
    assert redact_text(text) == "POST http://***@h:1/act?token=*** failed; key=***, max_tokens=5"


def test_a_runs_files_and_tables_never_hold_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # the terminal table's cells are never folded
    port = free_port()  # nobody listens: every decision of the seat falls back, quickly
    spec = f"remote?url=http://127.0.0.1:{port}&token={SECRET}&timeout=2"
    argv = ["run", "single_trade", "--seeds", "0:2", "--seat", f"bidder_0={spec}"]
    argv += ["--out", str(tmp_path / "single_trade"), "--no-progress", "--workers", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "single_trade"
    assert "token=***" in printed and SECRET not in printed
    files = [p for p in out.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"results.jsonl", "run.json", "rounds.jsonl", "0.jsonl", "1.jsonl"} <= names
    assert any(p.suffix == ".html" for p in files)
    for p in files:
        assert SECRET not in p.read_text(encoding="utf-8"), p
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    masked = redact_spec(spec)
    assert {r["agent"] for r in rows if r["seat"] == "bidder_0"} == {masked}
    assert json.loads((out / "run.json").read_text())["seats"]["bidder_0"] == masked
    header = read_transcript(out / "transcripts" / "0.jsonl").header
    assert header.seats["bidder_0"].spec == masked and not header.seats["bidder_0"].rebuildable
    # the masked transcripts still replay exactly, and print without the token
    assert main(["replay", str(out)]) == 0
    assert main(["show", str(out / "transcripts" / "0.jsonl")]) == 0
    assert main(["report", str(out / "transcripts"), "-o", str(tmp_path / "r.html")]) == 0
    assert SECRET not in capsys.readouterr().out + (tmp_path / "r.html").read_text()
    # another token for the same service is the same run: it resumes
    other = spec.replace(SECRET, "another-token")
    argv[argv.index(f"bidder_0={spec}")] = f"bidder_0={other}"
    assert main([*argv[:3], "0:3", *argv[4:]]) == 0
    assert "2 episode(s) were already complete" in capsys.readouterr().out


def test_an_old_transcript_with_a_token_is_shown_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A transcript written before specs were masked: ``show`` and the report mask it."""
    path = tmp_path / "old.jsonl"
    run_episode("single_trade", 4, transcript=path)
    records = records_of(read_transcript(path))
    records[0]["seats"]["bidder_0"]["spec"] = f"remote?url=http://h:1&token={SECRET}"
    rewrite(path, records)
    assert main(["show", str(path)]) == 0
    assert main(["report", str(path), "-o", str(tmp_path / "old.html")]) == 0
    printed = capsys.readouterr().out
    assert SECRET not in printed and "token=***" in printed
    page = (tmp_path / "old.html").read_text()
    assert SECRET not in page and "token=***" in page
