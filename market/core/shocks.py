"""Market shocks: drawn once at reset from their own RNG stream, revealed round by round.

Because the whole schedule (scenario's fixed shocks plus random ones from ``shock_rates``) is
realised at reset, nothing an agent does changes which shocks happen. A lab observes a shock when
it is public or targets it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from market.core.rng import RngStreams
from market.core.scenario_schema import SHOCK_KINDS, Scenario, ShockKind
from market.core.seats import bidder_seat
from market.core.summation import ordered_sum
from market.core.world import Job, World, draw_job, generate_world

LAB_TARGETED = ("demand_surge", "budget_cut", "windfall", "lab_exit", "lab_entry")
_RANDOM_MAGNITUDE = {
    "capacity_outage": (0.3, 0.7),
    "reliability_drop": (0.1, 0.4),
    "demand_surge": (1.5, 3.0),
    "budget_cut": (0.2, 0.5),
    "windfall": (50.0, 150.0),
    "energy_spike": (5.0, 20.0),
    "lab_exit": (0.0, 0.0),
    "lab_entry": (0.0, 0.0),
}


@dataclass(frozen=True, slots=True)
class Shock:
    kind: ShockKind
    round: int
    duration: int
    magnitude: float
    target: int | None
    public: bool

    def describe(self) -> str:
        who = f" on {bidder_seat(self.target)}" if self.target is not None else ""
        return f"{self.kind}{who} from round {self.round} for {self.duration} round(s), magnitude {self.magnitude:g}"


def draw_shocks(scenario: Scenario, rng: np.random.Generator) -> list[Shock]:
    """The episode's shock schedule: the scenario's fixed shocks, then random ones per round.

    Random shocks use a fixed number of draws per (round, kind), so the schedule depends only on
    the seed and the scenario.
    """
    n_start, n_total = scenario.labs.count, scenario.n_seats
    shocks: list[Shock] = []
    entrants = list(range(n_start, n_total))
    for spec in scenario.shocks:
        target: int | None = spec.target
        if spec.kind in LAB_TARGETED and target is None:
            if spec.kind == "lab_entry":
                target = entrants.pop(0) if entrants else None
            else:
                target = int(rng.integers(n_start))
        elif spec.kind == "lab_entry" and target in entrants:
            entrants.remove(target)
        if spec.kind == "lab_entry" and (target is None or target < n_start):
            continue  # no entrant seat left (validated scenarios always have one)
        magnitude = (
            spec.magnitude
            if spec.magnitude is not None
            else ordered_sum(_RANDOM_MAGNITUDE[spec.kind]) / 2
        )
        shocks.append(Shock(spec.kind, spec.round, spec.duration, magnitude, target, spec.public))
    rates = scenario.shock_rates
    for r in range(1, scenario.rounds):
        for kind in SHOCK_KINDS:
            u, u_mag, u_pub, u_dur = rng.random(4)
            target_draw = int(rng.integers(n_start))
            if u >= getattr(rates, kind):
                continue
            lo, hi = _RANDOM_MAGNITUDE[kind]
            magnitude = round(lo + (hi - lo) * float(u_mag), 3)
            target = target_draw if kind in LAB_TARGETED else None
            if kind == "lab_entry":
                if not entrants:
                    continue
                target = entrants.pop(0)
            duration = (
                1 + int(u_dur * 2)
                if kind in ("capacity_outage", "reliability_drop", "energy_spike")
                else 1
            )
            shocks.append(
                Shock(kind, r, duration, magnitude, target, bool(u_pub < rates.public_share))
            )
    shocks.sort(key=lambda s: (s.round, s.kind, -1 if s.target is None else s.target))
    return shocks


def apply_schedule(
    world: World, shocks: list[Shock], scenario: Scenario, rng: np.random.Generator
) -> None:
    """Write the schedule's effects that are known in advance into the world's arrays.

    Capacity, reliability and the energy floor per round; entry rounds of entrants (their jobs
    arrive when they enter); the urgent jobs of demand surges. Budget shocks and exits happen in
    the env at the start of their round.
    """
    rounds = scenario.rounds
    for s in shocks:
        end = min(rounds, s.round + s.duration)
        if s.kind == "capacity_outage":
            world.capacity[s.round : end] = np.floor(
                world.capacity[s.round : end] * (1.0 - min(1.0, s.magnitude))
            )
        elif s.kind == "reliability_drop":
            world.reliability[s.round : end] = np.clip(
                world.reliability[s.round : end] - s.magnitude, 0.0, 1.0
            )
        elif s.kind == "energy_spike":
            world.energy_floor[s.round : end] = np.maximum(
                world.energy_floor[s.round : end], s.magnitude
            )
        elif s.kind == "lab_entry" and s.target is not None:
            world.entry_round[s.target] = s.round
            world.holdings[s.target, : s.round] = 0  # an entrant owns nothing before it exists
            for job in world.labs[s.target].jobs:
                shift = max(
                    0, s.round - job.arrival
                )  # nothing arrives (or is overdue) before entry
                job.arrival = min(rounds - 1, job.arrival + shift)
                job.deadline = min(rounds - 1, max(job.deadline + shift, job.arrival))
        elif s.kind == "demand_surge" and s.target is not None:
            lab = world.labs[s.target]
            urgent: Job = draw_job(rng, scenario, s.target, len(lab.jobs), s.round)
            urgent.value = round(urgent.value * max(1.0, s.magnitude), 2)
            urgent.deadline = min(rounds - 1, s.round + 1)
            urgent.partial_credit = False
            lab.jobs.append(urgent)


def draw_market(sc: Scenario, streams: RngStreams) -> tuple[World, list[Shock]]:
    """The world and its shocks, drawn at reset in this order: the world from the ``world``
    stream, then the shock schedule and its effects on the world from the ``shocks`` stream."""
    world = generate_world(sc, streams.stream("world"))
    shock_rng = streams.stream("shocks")
    shocks = draw_shocks(sc, shock_rng)
    apply_schedule(world, shocks, sc, shock_rng)
    return world, shocks
