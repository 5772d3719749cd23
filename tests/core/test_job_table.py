"""The round close's job table (``market.core.job_table``) against the lab-by-lab rules it
replaces: the same demand, true needs, block assignment, failure draws, progress, settlement and
job value, bit for bit, on worlds with ties in deadline and arrival, plans, zero holdings,
unrunnable, pending, done and expired jobs. Floats are compared as ``float.hex``."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from market.core import execution
from market.core.designer_metrics import demand, table_demand
from market.core.job_table import JobTable, ordered_row_sums
from market.core.ledger import pay_for_block_rows, pay_for_blocks
from market.core.production import run_round_blocks, run_table_blocks
from market.core.settlement import true_needs
from market.core.world import World
from market.environment.aec import raw_env


def scrambled_world(seed: int) -> tuple[World, list[int], dict[int, dict[str, int]]]:
    """A world of 40 labs whose jobs are in every state, many with equal deadline and arrival
    (so the ``job_id`` tie-break, where "job10" < "job2", decides), with random holdings and a
    plan for a few labs."""
    env = raw_env(
        "market_round",
        rounds=6,
        negotiation_turns=0,
        designer_seat=False,
        labs={"count": 40, "jobs": [6, 14], "endowment": [0, 0]},
        jobs={"size": [1, 9], "slack": [0, 2]},
        shocks=[],
        shock_rates={},
    )
    env.reset(seed=seed)
    world = env.world
    rng = np.random.default_rng(seed)
    for lab in world.labs:
        lab.active = bool(rng.random() < 0.9)
        for job in lab.jobs:
            job.status = ["pending", "active", "active", "active", "done", "expired"][
                int(rng.integers(6))
            ]
            job.progress = int(rng.integers(0, job.size + 1))
            job.deadline = int(rng.integers(1, 3))
            job.arrival = int(rng.integers(0, 2))
            if job.status in ("done", "expired"):
                job.realized = float(rng.uniform(0, job.value))
    world.holdings[:, 1] = rng.integers(0, 12, size=len(world.labs)) * (
        rng.random(len(world.labs)) < 0.8
    )
    active = [i for i, lab in enumerate(world.labs) if lab.active]
    plans: dict[int, dict[str, int]] = {}
    for i in active[::7]:
        live = [j for j in world.labs[i].jobs if j.status == "active" and j.progress < j.size]
        if live:
            plans[i] = {live[-1].job_id: 1 + int(rng.integers(live[-1].size - live[-1].progress))}
    return world, active, plans


def legacy_close(
    world: World, active: list[int], plans: dict[int, dict[str, int]], rng: np.random.Generator
) -> tuple[np.ndarray, dict[int, float]]:
    """The lab-by-lab code path: run the blocks, settle every active lab's jobs, sum each lab's
    Job.potential() in job order."""
    allocated = run_round_blocks(world, active, 1, plans, float(world.reliability[1]), rng)
    potential = {}
    for i in active:
        execution.settle_jobs(world.labs[i].jobs, 1)
        potential[i] = sum(j.potential() for j in world.labs[i].jobs)
    return allocated, potential


@pytest.mark.parametrize("seed", range(12))
def test_table_close_equals_the_lab_by_lab_rules_bit_for_bit(seed: int) -> None:
    world, active, plans = scrambled_world(seed)
    world.reliability[1] = 0.85  # some jobs cannot run; failures are drawn
    twin = copy.deepcopy(world)
    rel = float(world.reliability[1])

    table = JobTable.read(twin, active)
    old_demand, new_demand = demand(world, active, rel), table_demand(table, rel)
    for old, new in zip(
        (old_demand.unit_values, old_demand.remaining, old_demand.owners),
        (new_demand.unit_values, new_demand.remaining, new_demand.owners),
        strict=True,
    ):
        assert old.dtype == new.dtype and old.tobytes() == new.tobytes()
    bidders = active[::2]
    walked, from_table = (
        true_needs(world, bidders, 1),
        true_needs(twin, bidders, 1, table.needs(rel)),
    )
    assert walked.tobytes() == from_table.tobytes() and walked[bidders].sum() > 0

    rng_old, rng_new = np.random.default_rng(seed), np.random.default_rng(seed)
    old_alloc, old_potential = legacy_close(world, active, plans, rng_old)
    new_alloc = run_table_blocks(twin, table, active, 1, plans, rel, rng_new)
    table.settle(1)
    table.write_back()
    new_potential = table.potential()

    assert old_alloc.tobytes() == new_alloc.tobytes()
    assert rng_old.random() == rng_new.random()  # the same number of draws
    assert old_alloc.sum() > 0  # blocks really ran
    for i in active:
        assert float(new_potential[i]).hex() == float(old_potential[i]).hex()
        for a, b in zip(world.labs[i].jobs, twin.labs[i].jobs, strict=True):
            assert (a.progress, a.status, a.realized.hex()) == (
                b.progress,
                b.status,
                b.realized.hex(),
            )
            assert type(b.progress) is int and type(b.realized) is float


def test_a_market_without_active_labs_gives_an_empty_table() -> None:
    world, _, _ = scrambled_world(1)
    table = JobTable.read(world, [])
    assert len(table.jobs) == 0 and table.lab.size == 0
    assert run_table_blocks(world, table, [], 1, {}, 0.9, np.random.default_rng(0)).sum() == 0
    table.settle(1)
    table.write_back()
    assert table.potential().tolist() == [0.0] * len(world.labs)
    assert table.needs(0.9).tolist() == [0] * len(world.labs)


def test_edf_tie_break_is_by_job_id_as_strings() -> None:
    world, active, _ = scrambled_world(0)
    lab = world.labs[active[0]]
    for job in lab.jobs:
        job.status, job.progress, job.deadline, job.arrival = "active", 0, 3, 0
        job.min_reliability = 0.0
    world.holdings[:, 1] = 0
    world.holdings[active[0], 1] = lab.jobs[0].size + lab.jobs[1].size
    table = JobTable.read(world, active)
    idx, give, _ = table.edf_assign(world.holdings[:, 1], 1.0, [])
    expected = execution.assign_blocks(lab.jobs, int(world.holdings[active[0], 1]), {}, 1.0)
    assert [table.jobs[k].job_id for k in idx.tolist()] == [j.job_id for j, _ in expected]
    assert give.tolist() == [n for _, n in expected]
    assert len(lab.jobs) > 10 and expected[0][0].job_id == "job0"
    assert expected[1][0].job_id == "job1" if len(expected) > 1 else True


def test_ordered_row_sums_add_left_to_right_like_python() -> None:
    # 1e16 + 1 + 1 - 1e16 is 0 left to right but 2 pairwise: the order is the rule's, not numpy's
    values = np.array([1e16, 1.0, 1.0, -1e16, 0.5, 0.25])
    rows = np.array([0, 0, 0, 0, 1, 1])
    cols = np.array([0, 1, 2, 3, 0, 1])
    sums = ordered_row_sums(rows, cols, values, 3)
    assert sums[0] == ((1e16 + 1.0) + 1.0) - 1e16 == 0.0
    assert math.fsum(values[:4]) == 2.0  # the exact sum differs: left to right is the rule
    assert sums[1] == 0.75 and sums[2] == 0.0
    rng = np.random.default_rng(5)
    values = rng.uniform(-1e6, 1e6, 400) * rng.choice([1e-9, 1.0, 1e9], 400)
    rows = np.repeat(np.arange(20), 20)
    cols = np.tile(np.arange(20), 20)
    sums = ordered_row_sums(rows, cols, values, 20)
    for r in range(20):
        assert sums[r].hex() == float(sum(values[r * 20 : (r + 1) * 20].tolist())).hex()


def test_batch_auction_payments_match_one_by_one() -> None:
    world, _, _ = scrambled_world(3)
    twin = copy.deepcopy(world)
    rng = np.random.default_rng(0)
    payers = [0, 3, 4, 9, 17]
    blocks = [2, 0, 5, 1, 0]
    payments = rng.uniform(0.1, 30.0, 5).tolist()
    for lab, n, pay in zip(payers, blocks, payments, strict=True):
        pay_for_blocks(world, lab, 2, n, pay)
    pay_for_block_rows(twin, payers, 2, blocks, payments)
    assert world.operator_credits.hex() == twin.operator_credits.hex()
    assert [lab.budget.hex() for lab in world.labs] == [lab.budget.hex() for lab in twin.labs]
    assert world.holdings.tobytes() == twin.holdings.tobytes()
    assert world.blocks_issued.tolist() == twin.blocks_issued.tolist()
    assert int(twin.blocks_issued[2]) == 8


def _play(scenario: str, seed: int) -> list[tuple[str, str, tuple[str, ...]]]:
    """Every step of a default-seat episode: the seat, the state digest after it and every
    seat's reward of the step (as float.hex)."""
    from agents.registry import make_agent
    from market.run.rollout import default_seats

    env = raw_env(scenario)
    env.reset(seed=seed)
    agents = {seat: make_agent(spec) for seat, spec in default_seats(env.scenario).items()}
    for seat, agent in agents.items():
        agent.reset(seed=env.seat_seed(seat))
    trace = []
    for seat in env.agent_iter():
        obs, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else agents[seat].act(obs))
        rewards = tuple(float(env.rewards.get(s, 0.0)).hex() for s in env.possible_agents)
        trace.append((seat, env.state_digest(), rewards))
    return trace


@pytest.mark.parametrize(
    ("scenario", "seed"),
    [
        ("single_trade", 3),
        ("market_round", 5),
        ("coalition_market", 7),
        ("shock_storm", 2),
        ("market_round_hard", 11),
        ("mechanism_stage_3", 4),
    ],
)
def test_small_closes_run_lab_by_lab_with_the_tables_results(
    scenario: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round close under ``TABLE_MIN_JOBS`` runs lab by lab on the job objects; forcing either
    path for every close gives the same episode: every step's state digest and every seat's
    reward, bit for bit."""
    from market.core import round_close

    monkeypatch.setattr(round_close, "TABLE_MIN_JOBS", 0)  # always the table
    table = _play(scenario, seed)
    monkeypatch.setattr(round_close, "TABLE_MIN_JOBS", 10**9)  # always lab by lab
    lab_by_lab = _play(scenario, seed)
    assert len(table) > 10
    assert lab_by_lab == table
