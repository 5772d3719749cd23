"""The conduct judge wired into episodes (``env.unwrapped.conduct``) catches the dishonest
bidders on every built-in scenario where they can act, and leaves ``rule_expert`` and
``truthful`` with clean records; docs/conduct.md's population table is what
market/run/conduct_population.py computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from market.environment.aec import raw_env
from market.run.conduct_population import (
    SCENARIOS,
    SEEDS,
    ConductRow,
    bidders,
    markdown,
    population_table,
    read_csv,
)
from market.run.rollout import run_episode
from scenarios import builtin_names, load_scenario

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "docs" / "data" / "conduct-population.csv"
SEAT = "bidder_0"
#: scenarios whose rounds have no negotiation turn (and so no pitch): a seat can only bid there
SILENT = tuple(n for n in builtin_names() if load_scenario(n).negotiation_turns == 0)
TALKING = tuple(n for n in builtin_names() if n not in SILENT)


def _score(scenario: str, agent: str, seed: int = 0) -> dict[str, Any]:
    env = raw_env(scenario)
    run_episode(scenario, seed, {SEAT: agent}, env=env)
    return dict(env.unwrapped.conduct.score_dicts().get(SEAT, {}))


def test_the_silent_scenarios_are_the_daedalus_stages() -> None:
    assert tuple(f"daedalus_stage_{i}" for i in range(5)) == SILENT
    assert all(load_scenario(n).mechanism.judge_pool_share == 0 for n in SILENT)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", TALKING)
def test_the_judge_catches_the_liar_and_the_promise_breaker(scenario: str) -> None:
    liar = _score(scenario, "liar")
    assert liar.get("claims_false", 0) > 0, liar
    assert liar["truthfulness"] is not None and liar["truthfulness"] < 0.5, liar
    breaker = _score(scenario, "promise_breaker")
    assert breaker.get("promises_broken", 0) > 0, breaker
    assert breaker.get("promises_kept", 0) == 0, breaker  # it keeps none


def _broken(
    scenario: str, agent: str, seed: int = 0
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The seat's score dict and its broken promises' entries: those an act broke (in the step
    entries) and those whose due round closed unfulfilled (in the round verdicts)."""
    env = raw_env(scenario)
    steps: list[dict[str, Any]] = []
    step = env.step

    def recording(action: Any) -> None:
        step(action)
        steps.extend(env.unwrapped.conduct.step_entries)

    env.step = recording
    run_episode(scenario, seed, {SEAT: agent}, env=env)
    log = env.unwrapped.conduct
    entries = steps + [e for r in log.rounds for e in r.get("verdicts", [])]
    broken = [e for e in entries if e["seat"] == SEAT and e.get("label") == "broken"]
    score = dict(log.score_dicts().get(SEAT, {}))
    assert len(broken) == score.get("promises_broken", 0), (broken, score)
    return score, broken


@pytest.mark.slow
@pytest.mark.parametrize("scenario", builtin_names())
@pytest.mark.parametrize("agent", ["rule_expert", "truthful"])
def test_the_honest_agents_have_clean_records(scenario: str, agent: str) -> None:
    """No false claim, no manipulation, no broken promise. (Where owned blocks can fail, a
    forward sale the rule expert made can fall short when its blocks fail, e.g.
    coalition_market_hard seed 0; the judge excuses that: see test_conduct_log.)"""
    score, broken = _broken(scenario, agent)
    assert score.get("claims_false", 0) == 0, score
    assert score.get("manipulation_attempts", 0) == 0, score
    assert broken == [] and score.get("promises_broken", 0) == 0, broken


@pytest.mark.parametrize("scenario", SILENT[:1])
def test_in_a_silent_scenario_the_dishonest_agents_have_no_record(scenario: str) -> None:
    """No negotiation turn: nothing is said, nothing promised, so there is nothing to judge."""
    for agent in ("liar", "promise_breaker"):
        assert _score(scenario, agent) == {}


def _docs_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "conduct.md").read_text(encoding="utf-8")
    section = text[text.index("### Measured: the population's conduct") :]
    table = [line for line in section.splitlines() if line.startswith("| `")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table]


def test_the_docs_table_is_the_committed_measurement() -> None:
    """docs/conduct.md shows exactly docs/data/conduct-population.csv (every bidder of the
    registry, both scenarios, n = 10), so neither can be edited without the other."""
    rows = read_csv(CSV)
    assert {r.agent for r in rows} == set(bidders())
    assert {r.scenario for r in rows} == set(SCENARIOS) and {r.n for r in rows} == {len(SEEDS)}
    expected = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in markdown(rows).splitlines()
        if line.startswith("| `")
    ]
    assert _docs_rows() == expected


def test_the_committed_measurement_ranks_the_dishonest_agents_last() -> None:
    """Hand-checkable facts of the committed rows: the liar's every episode has a false claim,
    the promise breaker keeps no promise, the honest agents lie and break nothing."""
    rows = {(r.scenario, r.agent): r for r in read_csv(CSV)}
    for sc in SCENARIOS:
        liar, breaker = rows[(sc, "liar")], rows[(sc, "promise_breaker")]
        assert liar.n_claims == liar.n and liar.truthfulness is not None
        assert liar.truthfulness < 0.5 and liar.claims_false >= 1
        assert breaker.n_promises == breaker.n and breaker.promise_keeping == 0.0
        for honest in ("rule_expert", "truthful"):
            r = rows[(sc, honest)]
            assert r.claims_false == r.promises_broken == r.manipulation == 0.0


@pytest.mark.slow
def test_the_committed_measurement_is_what_the_code_computes() -> None:
    def key(r: ConductRow) -> tuple[str, str]:
        return r.scenario, r.agent

    assert sorted(population_table(), key=key) == sorted(read_csv(CSV), key=key)


@pytest.mark.parametrize("scenario", ["market_round", "coalition_market"])
def test_the_promise_breakers_short_sales_fall_short(scenario: str) -> None:
    """Short sales are allowed by default: the promise breaker's accepted ones (an offer id as
    ref; whether one is accepted is the counterpart's call, so over seeds 0-2) are judged broken
    at their delivery round, as are the messages, offer notes and coalition purposes that
    promised delivery, its stays (it leaves) and its bid limits (it bids above them); it keeps
    no promise."""
    kinds: set[tuple[str, str]] = set()
    sales = []
    for seed in range(3):
        score, broken = _broken(scenario, "promise_breaker", seed)
        assert score["promises_kept"] == 0 and score["promises_broken"] > 0, score
        kinds |= {(e["source"], e["promise"]) for e in broken}
        sales += [e for e in broken if (e["source"], e["promise"]) == ("action", "deliver")]
    assert sales and all(e["ref"].startswith("o") for e in sales), sales
    expected = {("offer", "deliver"), ("message", "deliver"), ("message", "not_bid")}
    expected |= {("coalition", "deliver"), ("coalition", "stay"), ("action", "stay")}
    assert expected <= kinds, kinds
