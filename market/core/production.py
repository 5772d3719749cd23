"""Running a round's blocks: each active lab's held blocks are assigned to its jobs (its plan
first, then earliest deadline), failures are drawn from the round's generator, jobs progress."""

from __future__ import annotations

import numpy as np

from market.core import execution
from market.core.job_table import JobTable, ordered_row_sums
from market.core.summation import ordered_sum
from market.core.world import Job, World


def run_round_blocks(
    world: World,
    active: list[int],
    now: int,
    plans: dict[int, dict[str, int]],
    reliability: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Run the blocks held for round ``now``; returns each lab's allocated value (before failures)."""
    allocated_value = np.zeros(len(world.labs))
    assignments: dict[int, list[tuple[Job, int]]] = {}
    held = world.holdings[:, now].tolist()
    for i in active:
        if held[i] > 0:
            assignment = execution.assign_blocks(
                world.labs[i].jobs, held[i], plans.get(i, {}), reliability
            )
            if assignment:
                assignments[i] = assignment
                allocated_value[i] = ordered_sum(job.unit_value * n for job, n in assignment)
    max_used = max((ordered_sum(n for _, n in a) for a in assignments.values()), default=0)
    if max_used:
        ok = execution.failure_draws(rng, len(world.labs), max_used, reliability)
        rows = ok.tolist()  # one conversion for all labs instead of one per lab
        for i, assignment in assignments.items():
            execution.run_blocks(assignment, rows[i])
    return allocated_value


def run_table_blocks(
    world: World,
    table: JobTable,
    active: list[int],
    now: int,
    plans: dict[int, dict[str, int]],
    reliability: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """:func:`run_round_blocks` over a :class:`~market.core.job_table.JobTable`: labs without a
    plan are assigned and run all at once, labs with one lab by lab (on the job objects, then
    re-read into the table). Same draws, same progress, same allocated values, bit for bit."""
    n = len(world.labs)
    allocated_value = np.zeros(n)
    held_row = world.holdings[:, now]
    held = held_row.tolist()
    planned = [i for i in active if held[i] > 0 and plans.get(i)]
    assignments: dict[int, list[tuple[Job, int]]] = {}
    for i in planned:
        assignment = execution.assign_blocks(world.labs[i].jobs, held[i], plans[i], reliability)
        if assignment:
            assignments[i] = assignment
            allocated_value[i] = ordered_sum(job.unit_value * k for job, k in assignment)
    idx, give, offset = table.edf_assign(np.asarray(held_row), reliability, planned)
    lab = table.lab[idx]
    used = np.bincount(lab, weights=give, minlength=n) if idx.size else np.zeros(n)
    if idx.size:  # each lab's allocated value, summed in assignment order
        first = np.searchsorted(lab, lab, side="left")
        rank = np.arange(idx.size) - first
        unit = table.value[idx] / table.size[idx] * give
        sums = ordered_row_sums(lab, rank, unit, n)
        labs_run = np.unique(lab)
        allocated_value[labs_run] = sums[labs_run]
    max_used = max(
        int(used.max()) if n else 0,
        max((ordered_sum(k for _, k in a) for a in assignments.values()), default=0),
    )
    if max_used:
        ok = execution.failure_draws(rng, n, max_used, reliability)
        if assignments:
            rows = ok.tolist()
            for i, assignment in assignments.items():
                execution.run_blocks(assignment, rows[i])
            table.refresh(list(assignments))
        table.run(idx, give, offset, ok)
    return allocated_value
