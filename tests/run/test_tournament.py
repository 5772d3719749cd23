"""Role-aware tournaments: schedule balance, ratings, resumability, determinism and the CLI."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agents.scripted import TruthfulBidder
from market.cli import main as cli_main
from market.run.tournament import (
    MATCHES_FILE,
    TournamentConfig,
    TournamentError,
    bidder_lineups,
    plan,
    rate_games,
    run_tournament,
    standings,
    wilson_ci95,
)

BIDDERS = ("rule_expert", "truthful", "random_valid", "greedy_hoarder")
DESIGNERS = ("fixed", "random", "rule_designer")
OUTPUTS = ("ratings.csv", "ratings.md", "summary.json")


def config(**kw: object) -> TournamentConfig:
    base: dict[str, object] = {
        "scenario": "market_round",
        "bidders": BIDDERS,
        "designers": DESIGNERS,
        "seeds": (0, 1, 2),
    }
    base.update(kw)
    return TournamentConfig(**base)  # type: ignore[arg-type]


def outputs(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in OUTPUTS}


# ------------------------------------------------------------------------- schedule


@pytest.mark.parametrize(("n_agents", "n_seats"), [(2, 3), (3, 3), (4, 3), (5, 2), (6, 4)])
def test_every_agent_plays_every_seat_index_once_per_seed(n_agents: int, n_seats: int) -> None:
    agents = [f"a{i}" for i in range(n_agents)]
    for seed in range(8):
        lineups = bidder_lineups(agents, n_seats, seed)
        assert len(lineups) == n_agents
        assert all(len(lineup) == n_seats for lineup in lineups)
        for j in range(n_seats):
            assert Counter(lineup[j] for lineup in lineups) == {a: 1 for a in agents}
        assert lineups == bidder_lineups(agents, n_seats, seed)  # a function of the seed


def test_more_agents_than_seats_vary_the_lineups_with_the_seed() -> None:
    agents = [f"a{i}" for i in range(6)]
    per_seed = {tuple(sorted(bidder_lineups(agents, 3, seed))) for seed in range(10)}
    assert len(per_seed) > 1


def test_schedule_is_balanced_and_complete() -> None:
    p = plan(config(seeds=range(5)))
    seats = [f"bidder_{j}" for j in range(3)]
    bidder = [m for m in p.matches if m.kind == "bidder"]
    assert len(bidder) == 5 * len(BIDDERS)
    counts = Counter((m.seats[s], s) for m in bidder for s in seats)
    assert set(counts.values()) == {5} and len(counts) == len(BIDDERS) * len(seats)
    assert {m.seats["designer_0"] for m in bidder} == {"fixed"}  # the house designer
    designer = [m for m in p.matches if m.kind == "designer"]
    assert len(designer) == len(DESIGNERS) * 2 * 5  # two populations, five seeds
    for pop in ("default", "mixed"):  # every designer faces the same bidders on the same seeds
        lineups = {
            d: [
                (m.seed, {s: a for s, a in m.seats.items() if s != "designer_0"})
                for m in designer
                if m.population == pop and m.designer == d
            ]
            for d in DESIGNERS
        }
        assert lineups["fixed"] == lineups["random"] == lineups["rule_designer"]
    assert len({m.id for m in p.matches}) == len(p.matches)


# ------------------------------------------------------------------------- ratings


def test_rating_update_on_hand_made_outcomes() -> None:
    mus = []
    games = [{"winner": 2.0, "middle": 1.0, "loser": -1.0}] * 8
    for k in range(1, len(games) + 1):
        table = {s.agent: s for s in rate_games("bidder", ["loser", "middle", "winner"], games[:k])}
        mus.append(table["winner"].mu)
        assert table["winner"].mu > table["middle"].mu > table["loser"].mu
        assert table["winner"].sigma < 25 / 3
    assert mus == sorted(mus) and mus[0] > 25.0  # the winner's mu only goes up
    assert table["winner"].wins == 8 and table["loser"].wins == 0 and table["loser"].matches == 8


def test_ties_rate_equally_and_share_the_win() -> None:
    table = rate_games("designer", ["x", "y"], [{"x": 1.0, "y": 1.0}] * 4)
    assert table[0].mu == pytest.approx(table[1].mu)
    assert table[0].wins == table[1].wins == 2.0


def test_rigged_match_file_ranks_the_rigged_winner_first() -> None:
    p = plan(config(designers=(), bidders=("truthful", "shader", "random_valid")))
    score = {"truthful": 3.0, "shader": 1.0, "random_valid": -2.0}
    records = {
        m.id: {"returns": {s: score.get(a, 0.0) for s, a in m.seats.items()}} for m in p.matches
    }
    rows = standings(p, records)
    assert [r["agent"] for r in rows] == ["truthful", "shader", "random_valid"]
    assert rows[0]["win_rate"] == 1.0 and rows[-1]["win_rate"] == 0.0


def test_wilson_interval() -> None:
    assert wilson_ci95(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson_ci95(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)


# ------------------------------------------------------------------------- running


def test_designer_ratings_are_separate_from_bidder_ratings(tmp_path: Path) -> None:
    both = run_tournament(config(), tmp_path / "both")
    only_b = run_tournament(config(designers=()), tmp_path / "bidders")
    only_d = run_tournament(config(bidders=()), tmp_path / "designers")
    assert [r for r in both.rows if r["role"] == "bidder"] == only_b.rows
    assert [r for r in both.rows if r["role"] == "designer"] == only_d.rows
    assert {r["agent"] for r in only_d.rows} == set(DESIGNERS)
    assert all(r["matches"] == 2 * 3 for r in only_d.rows)  # 2 populations x 3 seeds
    assert all(r["matches"] == 3 * 3 for r in only_b.rows)  # 3 of 4 rotations x 3 seeds


def test_resume_gives_the_same_table_as_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = run_tournament(config(), tmp_path / "whole")
    assert whole.complete and whole.played == whole.total == 4 * 3 + 3 * 2 * 3
    half = run_tournament(config(), tmp_path / "half", max_matches=whole.total // 2)
    assert not half.complete and half.done == whole.total // 2
    assert "partial" in (tmp_path / "half" / "ratings.md").read_text()
    with open(tmp_path / "half" / MATCHES_FILE, "a") as f:  # a line cut by a killed run
        f.write('{"id": "bidder|seed=2|rot=3", "kind": "bid')
    seen: list[tuple[int, int]] = []
    rest = run_tournament(config(), tmp_path / "half", progress=lambda d, t: seen.append((d, t)))
    assert rest.complete and rest.played == whole.total - whole.total // 2
    assert seen[0] == (whole.total // 2, whole.total) and seen[-1] == (whole.total, whole.total)
    assert outputs(tmp_path / "half") == outputs(tmp_path / "whole")
    again = run_tournament(config(), tmp_path / "half")  # nothing left to play
    assert again.played == 0 and outputs(tmp_path / "half") == outputs(tmp_path / "whole")
    lines = (tmp_path / "half" / MATCHES_FILE).read_text().splitlines()
    assert len(lines) == whole.total and all(json.loads(x)["returns"] for x in lines)


def test_a_last_line_without_its_newline_is_kept_and_ended(tmp_path: Path) -> None:
    cfg = config(designers=(), seeds=(0,))
    run_tournament(cfg, tmp_path / "t", max_matches=2)
    path = tmp_path / "t" / MATCHES_FILE
    path.write_text(path.read_text().rstrip("\n"))  # killed between the record and its newline
    result = run_tournament(cfg, tmp_path / "t")
    assert result.complete and result.played == len(BIDDERS) - 2
    assert len(path.read_text().splitlines()) == len(BIDDERS)


def test_parallel_equals_serial_and_output_is_deterministic(tmp_path: Path) -> None:
    cfg = config(seeds=(4, 7))
    run_tournament(cfg, tmp_path / "serial", workers=1)
    run_tournament(cfg, tmp_path / "serial2", workers=1)
    run_tournament(cfg, tmp_path / "parallel", workers=2)
    assert outputs(tmp_path / "serial") == outputs(tmp_path / "serial2")
    assert outputs(tmp_path / "serial") == outputs(tmp_path / "parallel")


def test_manifest_refuses_to_mix_configurations(tmp_path: Path) -> None:
    run_tournament(config(designers=(), seeds=(0,)), tmp_path / "t")
    with pytest.raises(TournamentError, match="another configuration.*seeds"):
        run_tournament(config(designers=(), seeds=(0, 1)), tmp_path / "t")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / MATCHES_FILE).write_text("{}\n")
    with pytest.raises(TournamentError, match="manifest.json does not"):
        run_tournament(config(designers=(), seeds=(0,)), tmp_path / "bare")
    path = tmp_path / "t" / MATCHES_FILE
    path.write_text('{"id": "not a match"}\n' + path.read_text())
    with pytest.raises(TournamentError, match="not a match of this tournament"):
        run_tournament(config(designers=(), seeds=(0,)), tmp_path / "t")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"bidders": ("truthful",), "designers": ()}, "at least two agents"),
        ({"bidders": ("truthful", "truthful")}, "more than once"),
        ({"bidders": ("truthful", "fixed")}, "cannot fill a bidder seat"),
        ({"designers": ("fixed", "truthful")}, "cannot fill a designer seat"),
        ({"bidders": (), "designers": ()}, "nothing to play"),
        ({"scenario": "single_trade"}, "no designer seat"),
        ({"populations": {"p": ["fixed"]}}, "population 'p'"),
        ({"seeds": ()}, "no seed"),
    ],
)
def test_bad_configurations(kw: dict[str, object], message: str) -> None:
    with pytest.raises(TournamentError, match=message):
        plan(config(**kw))


# ------------------------------------------------------------------------- CLI


def test_cli_runs_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "tournament",
        "--bidders",
        "truthful,random_valid",
        "--designers",
        "fixed,random",
        "--seeds",
        "0:2",
        "--out",
        str(tmp_path / "t"),
        "--workers",
        "1",
    ]
    assert cli_main([*argv, "--max-matches", "3"]) == 0
    assert "partial" in capsys.readouterr().out
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "bidders" in out and "designers" in out and "rule" not in out and "complete" in out
    assert (tmp_path / "t" / "ratings.csv").read_text().startswith("role,agent,mu,sigma,ordinal")
    # every match record carries its conduct scores; the table's conduct columns count them
    records = [json.loads(x) for x in (tmp_path / "t" / "matches.jsonl").read_text().splitlines()]
    assert records and all(isinstance(r["conduct"], dict) for r in records)
    head = (tmp_path / "t" / "ratings.csv").read_text().splitlines()[0].split(",")
    assert head[-6:] == [
        "truthfulness",
        "truthfulness_n",
        "promise_keeping",
        "promise_keeping_n",
        "manipulation",
        "conduct_n",
    ]


def test_cli_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["tournament", "--help"])
    assert exc.value.code == 0
    assert "example: gpumarket tournament --bidders" in capsys.readouterr().out


class BreaksWhenAsked(TruthfulBidder):
    """Raises in reset while ``GM_TEST_BREAK_AGENT`` is set, so its matches fail."""

    name = "breaks_when_asked"

    def reset(self, seed: Any = None) -> None:
        if os.environ.get("GM_TEST_BREAK_AGENT"):
            raise RuntimeError("asked to break")
        super().reset(seed)


@pytest.mark.parametrize("workers", ["1", "2"])  # in this process, and in worker processes
def test_a_failing_match_stops_with_one_line_and_a_rerun_completes(
    workers: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = ["tournament", "--bidders", "truthful,py:test_tournament:BreaksWhenAsked"]
    argv += ["--designers", "", "--seeds", "0:2", "--workers", workers]
    monkeypatch.setenv("GM_TEST_BREAK_AGENT", "1")
    assert cli_main([*argv, "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "failed: RuntimeError: asked to break. The matches finished before it are kept" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    monkeypatch.delenv("GM_TEST_BREAK_AGENT")
    assert cli_main([*argv, "--out", str(tmp_path / "t")]) == 0
    assert cli_main([*argv, "--out", str(tmp_path / "clean")]) == 0
    assert outputs(tmp_path / "t") == outputs(tmp_path / "clean")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bidders", "truthful"], "at least two agents"),
        (["--bidders", "truthful,nope"], "unknown agent 'nope'"),
        (["--bidders", "truthful,fixed"], "cannot fill a bidder seat"),
        (["--bidders", "truthful,shader", "--seeds", "5:2"], "selects no seed"),
        (["--bidders", "truthful,shader", "--seeds", "x"], "--seeds 'x'"),
        (["--designers", "fixed,random", "--scenario", "single_trade"], "no designer seat"),
        (["--bidders", "truthful,shader", "--scenario", "no_such"], "neither a built-in"),
        (["--bidders", "truthful,shader", "--workers", "0"], "--workers"),
        (["--bidders", "truthful,shader", "--max-matches", "many"], "--max-matches"),
        (["--designers", "fixed,random", "--population", "oops"], "NAME=A,B"),
        ([], "nothing to play"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["tournament", *args, "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists()


def test_cli_refuses_a_folder_of_another_tournament(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "t")
    argv = ["tournament", "--seeds", "0", "--out", out, "--bidders"]
    assert cli_main([*argv, "truthful,shader"]) == 0
    capsys.readouterr()
    assert cli_main([*argv, "truthful,dropout"]) == 2
    err = capsys.readouterr().err
    assert "another configuration (differs in: bidders)" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_bad_scenario_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = 0\n[labs]\ncuont = 3\n")
    argv = ["tournament", "--bidders", "truthful,shader", "--scenario", str(bad)]
    assert cli_main([*argv, "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "key 'rounds'" in err and "key 'labs.cuont'" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ------------------------------------------------------------------------- edited agents
EDITED_AGENT = '''from agents.scripted import TruthfulBidder


class Steady(TruthfulBidder):
    """Bids its values."""

    name = "steady"
    margin = 0.5
'''


def test_a_tournament_resumed_after_an_agent_was_edited_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest holds every seated agent's code (market/run/agent_code.py): an edited py:
    agent is refused by name, the same code resumes."""
    src = tmp_path / "src"
    src.mkdir()
    module = src / "steady_tournament.py"
    module.write_text(EDITED_AGENT)
    monkeypatch.syspath_prepend(str(src))
    cfg = config(bidders=("truthful", "py:steady_tournament:Steady"), designers=(), seeds=(0,))
    out = tmp_path / "t"
    first = run_tournament(cfg, out, max_matches=1)
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["agent_code"]["py:steady_tournament:Steady"]["modules"]) == [
        "steady_tournament"
    ]
    module.write_text(EDITED_AGENT.replace("margin = 0.5", "margin = 0.9"))
    with pytest.raises(TournamentError) as err:
        run_tournament(cfg, out)
    assert "agent 'py:steady_tournament:Steady' has other code now" in str(err.value)
    assert "steady_tournament" in str(err.value) and "\n" not in str(err.value)
    module.write_text(EDITED_AGENT)  # the same bytes again: the same agent, it resumes
    rest = run_tournament(cfg, out)
    assert rest.total == first.total and len((out / MATCHES_FILE).read_text().splitlines()) == (
        rest.total
    )
