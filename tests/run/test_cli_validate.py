"""``gpumarket validate`` checks what ``gpumarket run`` checks (issue 34, item 6): the scenario's
keys, every seat's agent and its role, the judges; it reports every problem at once, one line
each, and prints the summary and the line-up of a scenario without problems."""

from __future__ import annotations

from pathlib import Path

import pytest

from market.cli import main as cli

MISSPELT = """extends = "market_round"
[agents]
bidders = ["rule_expert", "truthfull"]
"""
BIDDER_AS_DESIGNER = """extends = "market_round"
[agents]
designer = "truthful"
"""
EVERYTHING_WRONG = """extends = "market_round"
rounds = 0
judge = "nobody"
[labs]
cuont = 3
[agents]
designer = "truthful"
bidders = ["rule_expert", "truthfull"]
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def validate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli(["validate", *argv])
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            MISSPELT,
            [
                "key 'agents.bidders[1]' (bidder_1, bidder_2)",
                "unknown agent 'truthfull' (did you mean 'truthful'?)",
            ],
        ),
        (
            BIDDER_AS_DESIGNER,
            [
                "key 'agents.designer' (designer_0)",
                "agent 'truthful' cannot fill a designer seat (it fills: bidder)",
            ],
        ),
    ],
    ids=["misspelt-agent", "bidder-in-the-designer-seat"],
)
def test_a_file_that_run_refuses_is_refused(
    text: str, words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "mine", text)
    code, out, err = validate(capsys, str(path))
    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}: 1 problem(s):\n")
    for w in words:
        assert w in err
    # run refuses the same file, before playing anything
    assert cli(["run", str(path), "--seeds", "0:1", "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_every_problem_is_reported_at_once_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "wrong", EVERYTHING_WRONG)
    code, _, err = validate(capsys, str(path))
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0] == f"error: {path}: 5 problem(s):"
    problems = [line.removeprefix("  - ") for line in lines[1:]]
    assert len(problems) == 5 and all(line.startswith("  - ") for line in lines[1:])
    assert problems[0].startswith("key 'rounds': ")  # the schema's problems ...
    assert problems[1].startswith("key 'labs.cuont': unknown key")
    assert problems[2].startswith("key 'judge': ")
    assert problems[3].startswith("key 'agents.designer' (designer_0): ")  # ... and the seats'
    assert problems[4].startswith("key 'agents.bidders[1]' (bidder_1, bidder_2): unknown agent")


def test_a_good_file_prints_its_summary_and_line_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "five",
        'extends = "market_round"\ndescription = "Five labs, one expert."\n'
        '[labs]\ncount = 5\n[agents]\nbidders = ["rule_expert", "truthful"]\n',
    )
    code, out, err = validate(capsys, str(path), "large_market")
    assert code == 0 and err == ""
    assert out.startswith(f"ok: {path} (5 labs, 5 rounds)\n  Five labs, one expert.\n")
    assert "5 rounds of 2 negotiation pass(es) and an auction; 5 labs;" in out
    assert "designer_0 sets the mechanism every round" in out
    assert "judge rule, conduct judge rule; agent timeout 120 s" in out
    mine = out[: out.index("ok: large_market")]
    assert mine.endswith(
        "  line-up:\n"
        "    designer_0          fixed\n"
        "    bidder_0            rule_expert\n"
        "    bidder_1..bidder_4  truthful\n"
    )
    assert "ok: large_market (300 labs, 3 rounds)" in out
    assert "    bidder_5..bidder_299  truthful\n" in out  # 300 seats on a few lines


def test_seat_overrides_are_checked_and_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = validate(capsys, "single_trade", "--seat", "bidder_1=rule_expert")
    assert code == 0 and "    bidder_1  rule_expert (--seat)\n" in out
    code, _, err = validate(
        capsys, "single_trade", "--seat", "bidder_7=truthful", "--seat", "bidder_0=idle?x=1"
    )
    assert code == 2 and "2 problem(s)" in err
    assert "--seat bidder_7: no such seat in this scenario; its seats: bidder_0, bidder_1" in err
    assert "--seat bidder_0: " in err and "'x'" in err


def test_unreadable_files_keep_their_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path, "bad", "rounds = = 3\n")
    code, _, err = validate(capsys, str(bad), str(tmp_path / "missing.toml"), "single_trade")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"error: {bad}: not valid TOML")
    assert "neither a built-in scenario" in lines[1]


def test_no_scenario_lists_the_built_in_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = validate(capsys)
    assert code == 0
    assert "  market_round\n" in out and "  single_trade\n" in out
