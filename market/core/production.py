"""Running a round's blocks: each active lab's held blocks are assigned to its jobs (its plan
first, then earliest deadline), failures are drawn from the round's generator, jobs progress."""

from __future__ import annotations

import numpy as np

from market.core import execution
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
                allocated_value[i] = sum(job.unit_value * n for job, n in assignment)
    max_used = max((sum(n for _, n in a) for a in assignments.values()), default=0)
    if max_used:
        ok = execution.failure_draws(rng, len(world.labs), max_used, reliability)
        rows = ok.tolist()  # one conversion for all labs instead of one per lab
        for i, assignment in assignments.items():
            execution.run_blocks(assignment, rows[i])
    return allocated_value
