"""The built-in scenarios of docs/design.md, section 8: the DAEDALUS curriculum, shock_storm and
large_market load, are composed as documented, and run an episode each."""

from __future__ import annotations

import time
import tomllib
from collections import Counter
from importlib import resources

import pytest

from market.core.scenario_schema import SHOCK_KINDS
from market.environment.aec import raw_env
from market.review.mechanism_comparison import ROBUST
from market.run.rollout import default_seats, run_episode
from scenarios import builtin_names, load_scenario

STAGES = [f"mechanism_stage_{k}" for k in range(5)]
DAEDALUS = [f"daedalus_stage_{k}" for k in range(5)]
ARENA = [
    f"{t}_{d}"
    for t in ("single_trade", "market_round", "coalition_market")
    for d in ("easy", "medium", "hard")
]
NEW = [*STAGES, *DAEDALUS, "shock_storm", "large_market", *ARENA]
#: DAEDALUS's own curriculum: the seats (its agent positions) each stage turns strategic
DAEDALUS_SEATS = {
    1: ("shader", (2, 3)),
    2: ("dropout", (1, 6)),
    3: ("colluder", (4, 5)),
    4: ("exploiter", (0, 7)),
}
#: the DAEDALUS curriculum: each stage swaps two more truthful bidders for the next type
SWAPS = ("shader", "dropout", "colluder", "exploiter")


def raw_table(name: str) -> dict:
    return tomllib.loads(resources.files("scenarios").joinpath(f"{name}.toml").read_text())


def test_every_builtin_of_the_design_is_shipped() -> None:
    assert set(builtin_names()) == {"single_trade", "market_round", "coalition_market", *NEW}


def _honest(spec: str) -> str:
    return "truthful" if spec == "reciprocal" else spec


@pytest.mark.parametrize("stage", range(5))
def test_curriculum_composition(stage: int) -> None:
    sc = load_scenario(f"mechanism_stage_{stage}")
    seats = default_seats(sc)
    # an honest seat is truthful or reciprocal (it bids as truthful does and reads the table)
    bidders = [_honest(seats[f"bidder_{i}"]) for i in range(8)]
    assert sc.labs.count == 8 and sc.labs.entrants == 0 and len(seats) == 9
    assert sc.designer_seat and seats["designer_0"] == "fixed"
    expected = Counter({"truthful": 8 - 2 * stage, **{t: 2 for t in SWAPS[:stage]}})
    assert Counter(bidders) == +expected
    if stage:  # each stage keeps the previous stage's strategic pairs and swaps two truthful
        before = [
            _honest(default_seats(load_scenario(f"mechanism_stage_{stage - 1}"))[f"bidder_{i}"])
            for i in range(8)
        ]
        changed = [i for i in range(8) if before[i] != bidders[i]]
        assert len(changed) == 2
        assert all(before[i] == "truthful" and bidders[i] == SWAPS[stage - 1] for i in changed)


@pytest.mark.parametrize("stage", range(5))
def test_daedalus_family_composition(stage: int) -> None:
    sc = load_scenario(f"daedalus_stage_{stage}")
    seats = default_seats(sc)
    types = [seats[f"bidder_{i}"].partition("?")[0] for i in range(8)]
    expected = ["truthful"] * 8
    for k in range(1, stage + 1):
        kind, where = DAEDALUS_SEATS[k]
        for i in where:
            expected[i] = kind
    assert types == expected
    assert sc.labs.count == 8 and sc.rounds_per_design == 5 and sc.rounds % 5 == 0
    assert sc.negotiation_turns == 0 and seats["designer_0"] == "fixed"
    # the cartel's members name each other: no negotiation turn to find partners in
    if stage >= 3:
        assert seats["bidder_4"] == "colluder?partners=bidder_5"
        assert seats["bidder_5"] == "colluder?partners=bidder_4"
    # the designer's reward is the unweighted composite welfare x fairness x participation x stability
    assert sc.rewards.designer_weights == dict.fromkeys(
        ("welfare_ratio", "fairness", "participation", "stability"), 1.0
    )
    assert sc.rewards.designer_revenue_weight == 0.0
    # DAEDALUS's default mechanism in credits: reserve 0.10 x the value scale of 45
    assert sc.mechanism.reserve_price == pytest.approx(0.10 * sc.jobs.value_per_block[1])


def test_stages_extend_one_base_and_differ_only_in_their_bidders() -> None:
    assert "extends" not in raw_table("mechanism_stage_0")
    assert "extends" not in raw_table("daedalus_stage_0")
    own = ("name", "description", "agents")

    def shared(name: str) -> dict:
        return {k: v for k, v in load_scenario(name).model_dump().items() if k not in own}

    for family in (STAGES, DAEDALUS):
        for name in family[1:]:
            table = raw_table(name)
            assert table["extends"] == family[0]
            assert set(table) <= {"extends", "description", "agents"}
            assert shared(name) == shared(family[0])


def test_curriculum_mechanism_is_the_robust_fixed_mechanism() -> None:
    mech = load_scenario("mechanism_stage_0").mechanism
    assert mech.model_dump() == mech.model_copy(update=ROBUST).model_dump()
    assert mech.auction_type == "second_price" and mech.reserve_price <= 5
    assert mech.reveal_clearing_price and mech.coalition_policy == "penalize_suspected"


def test_shock_storm_schedules_every_kind_and_draws_them_at_random() -> None:
    sc = load_scenario("shock_storm")
    assert {s.kind for s in sc.shocks} == set(SHOCK_KINDS)
    assert any(s.public for s in sc.shocks) and any(not s.public for s in sc.shocks)
    rates = sc.shock_rates.model_dump()
    # every kind also arrives at random, except entry: the entrants enter on schedule, so that
    # every seat plays in every episode (PettingZoo's parallel API expects that)
    assert all(rates[k] > 0 for k in SHOCK_KINDS if k != "lab_entry")
    assert sum(s.kind == "lab_entry" for s in sc.shocks) == sc.labs.entrants
    env = raw_env("shock_storm")
    drawn: Counter[str] = Counter()
    for seed in range(5):
        env.reset(seed=seed)
        assert all(int(r) > 0 for r in env.world.entry_round[sc.labs.count :])
        drawn.update(s.kind for s in env.shocks)
    assert set(drawn) == set(SHOCK_KINDS)
    assert sum(drawn.values()) > 5 * len(sc.shocks)  # random shocks on top of the schedule


@pytest.mark.parametrize("name", [n for n in NEW if n != "large_market"])
def test_new_builtins_run_an_episode(name: str) -> None:
    for seed in range(2):
        result = run_episode(name, seed)
        assert result.steps > 0 and len(result.round_log) == load_scenario(name).rounds
        assert sum(result.agent_errors.values()) == 0, result.last_agent_error
        assert all(0 <= r["designer"]["welfare_ratio"] <= 1 + 1e-9 for r in result.round_log)


def test_large_market_has_hundreds_of_labs_and_runs_in_seconds() -> None:
    sc = load_scenario("large_market")
    assert sc.labs.count >= 200
    began = time.perf_counter()
    result = run_episode("large_market", 0)
    seconds = time.perf_counter() - began
    print(f"\nlarge_market: {sc.labs.count} labs, {result.steps} steps in {seconds:.2f}s")
    assert seconds < 10, seconds  # about 0.3 s on a free core
    assert sum(result.agent_errors.values()) == 0, result.last_agent_error
    assert sum(result.invalid_actions.values()) == 0
    assert sum(sum(r["won"].values()) for r in result.round_log) > 100
