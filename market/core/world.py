"""The world: labs, their private jobs, perishable GPU blocks and the ledger.

Everything here is plain dataclasses and numpy arrays (the hot loop's state); pydantic lives at the
boundaries (actions, observations, scenarios). A world is drawn from a scenario and the world RNG
stream at reset, including jobs that arrive later, so agents cannot change which jobs occur.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from market.core.scenario_schema import Scenario
from market.core.seats import bidder_seat
from market.core.summation import ordered_sum

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
JobStatus = Literal["pending", "active", "done", "expired"]


@dataclass(slots=True)
class Job:
    """A lab's private job: ``size`` blocks of progress by round ``deadline`` (inclusive)."""

    job_id: str
    owner: int
    size: int
    arrival: int
    deadline: int
    value: float
    partial_credit: bool
    min_reliability: float
    progress: int = 0
    status: JobStatus = "pending"
    realized: float = 0.0

    @property
    def remaining(self) -> int:
        return self.size - self.progress

    @property
    def unit_value(self) -> float:
        return self.value / self.size

    def potential(self) -> float:
        """Value credited so far: realised value once settled, value x progress/size while live.

        Rewards pay the change of this potential each round, so a lab's return sums to the value
        it realises (a job without partial credit that expires gives its progress value back).
        """
        if self.status in ("done", "expired"):
            return self.realized
        if self.status == "active":
            return self.unit_value * self.progress
        return 0.0


@dataclass(slots=True)
class Lab:
    index: int
    seat: str
    budget: float
    reputation: float
    jobs: list[Job] = field(default_factory=list)
    active: bool = False
    entered: bool = False
    exit_round: int | None = None

    def live_jobs(self) -> list[Job]:
        return [j for j in self.jobs if j.status == "active"]


@dataclass(slots=True)
class World:
    """All state drawn at reset plus the accounts that play changes (only through
    :mod:`market.core.ledger`)."""

    labs: list[Lab]
    holdings: IntArray  # int64 (labs, rounds): blocks each lab owns for each round
    base_capacity: IntArray  # int64 (rounds,) before shocks
    capacity: IntArray  # int64 (rounds,) after shocks
    reliability: FloatArray  # float64 (rounds,) after shocks
    energy_floor: FloatArray  # float64 (rounds,) operator's floor price after shocks
    entry_round: IntArray  # int64 (labs,): round each lab enters (-1: never)
    blocks_issued: IntArray  # int64 (rounds,): blocks the operator handed out per round
    operator_credits: float = 0.0
    external_credits: float = 0.0  # credits injected (windfalls) minus removed (budget cuts)
    # delivery risk (market.core.delivery): blocks destroyed per round, collateral in escrow
    blocks_failed: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    collateral_held: float = 0.0
    # moves whenever a lab's reputation does (lose_reputation), so views
    # built from the reputations are rebuilt only then
    reputation_version: int = 0


def _uniform_int(
    rng: np.random.Generator, bounds: tuple[int, int], size: int | None = None
) -> np.ndarray:
    return rng.integers(bounds[0], bounds[1] + 1, size=size)


def draw_job(
    rng: np.random.Generator, scenario: Scenario, owner: int, number: int, arrival: int
) -> Job:
    """One job from the scenario's job distribution arriving at ``arrival``."""
    spec = scenario.jobs
    size = int(_uniform_int(rng, spec.size))
    per_block = float(rng.uniform(*spec.value_per_block))
    slack = int(_uniform_int(rng, spec.slack))
    deadline = min(arrival + slack + max(0, (size - 1) // 4), scenario.rounds - 1)
    return Job(
        job_id=f"job{number}",
        owner=owner,
        size=size,
        arrival=arrival,
        deadline=deadline,
        value=round(per_block * size, 2),
        partial_credit=bool(rng.random() < spec.partial_credit_prob),
        min_reliability=round(float(rng.uniform(*spec.min_reliability)), 3),
    )


def generate_world(scenario: Scenario, rng: np.random.Generator) -> World:
    """Draw labs, jobs (with their arrival rounds), endowments and base capacity.

    Draw order is fixed by lab index and round, so the same seed gives the same world.
    """
    n, rounds = scenario.n_seats, scenario.rounds
    spec = scenario.labs
    labs: list[Lab] = []
    holdings = np.zeros((n, rounds), dtype=np.int64)
    for i in range(n):
        lab = Lab(
            index=i,
            seat=bidder_seat(i),
            budget=round(float(rng.uniform(*spec.budget)), 2),
            reputation=round(float(rng.uniform(*spec.reputation)), 3),
        )
        n_jobs = int(_uniform_int(rng, spec.jobs))
        lab.jobs = [draw_job(rng, scenario, i, k, 0) for k in range(n_jobs)]
        arrivals = rng.poisson(scenario.jobs.arrival_rate, size=rounds)
        for r in range(1, rounds):
            for _ in range(int(arrivals[r])):
                lab.jobs.append(draw_job(rng, scenario, i, len(lab.jobs), r))
        endowment = _uniform_int(rng, spec.endowment, size=rounds)
        k = min(spec.endowment_rounds, rounds)
        holdings[i, :k] = endowment[:k]
        labs.append(lab)
    base_capacity = _uniform_int(rng, scenario.capacity.blocks, size=rounds).astype(np.int64)
    entry_round = np.full(n, -1, dtype=np.int64)
    entry_round[: spec.count] = 0
    return World(
        labs=labs,
        holdings=holdings,
        base_capacity=base_capacity,
        capacity=base_capacity.copy(),
        reliability=np.full(rounds, scenario.capacity.reliability),
        energy_floor=np.zeros(rounds),
        entry_round=entry_round,
        blocks_issued=np.zeros(rounds, dtype=np.int64),
        blocks_failed=np.zeros(rounds, dtype=np.int64),
    )


def lose_reputation(world: World, lab: int, loss: float) -> None:
    """Lab ``lab`` loses ``loss`` reputation (the losses: :mod:`market.core.penalties`), never
    going below 0. The only write of a lab's reputation after reset: it moves
    ``world.reputation_version``, on which the observation cache keys the reputations every
    seat sees."""
    entry = world.labs[lab]
    entry.reputation = max(0.0, entry.reputation - loss)
    world.reputation_version += 1


def credit_imbalance(world: World, escrow: float, initial: float) -> float:
    """Labs + operator + ``escrow`` + collateral - ``initial`` - external injections: zero when
    credits are conserved (the ledger's audit)."""
    w = world
    total = (
        ordered_sum(lab.budget for lab in w.labs) + w.operator_credits + escrow + w.collateral_held
    )
    return float(total - initial - w.external_credits)
