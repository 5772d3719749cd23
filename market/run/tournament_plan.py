"""Tournament schedules: what a tournament plays (:class:`TournamentConfig`), checked and turned
into the full list of matches (:func:`plan`): bidder lineups rotating through the bidder seats,
and every designer against the same bidder populations. :mod:`market.run.tournament` plays and
rates them.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agents.registry import AgentSpecError, make_agent
from market.core.scenario_schema import RUN_ONLY_KEYS, Scenario
from market.core.seats import DESIGNER
from market.run.agent_code import agents_code
from market.run.rollout import default_seats
from scenarios import load_scenario

if TYPE_CHECKING:
    from pydantic.main import IncEx

FORMAT = 1
#: the bidder population designers face besides the scenario's own, cycled over the bidder seats
MIXED_POPULATION = (
    "rule_expert",
    "shader",
    "greedy_hoarder",
    "random_valid",
    "colluder",
    "colluder",
    "dropout",
    "exploiter",
    "truthful",
)


class TournamentError(ValueError):
    """A tournament cannot run as asked (bad configuration or an output folder that conflicts)."""


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class TournamentConfig:
    """What to play. ``bidders``/``designers``: agent specs (see ``agents.registry``), each
    list empty or of at least two distinct agents. ``house_designer``: the designer seat in bidder
    matches (default: the scenario's ``[agents] designer``). ``populations``: name -> bidder specs
    cycled over the bidder seats, faced by every designer (default: ``default``, the scenario's
    own ``[agents] bidders``, and ``mixed``, :data:`MIXED_POPULATION`)."""

    scenario: str | Path = "market_round"
    bidders: Sequence[str] = ()
    designers: Sequence[str] = ()
    seeds: Sequence[int] = tuple(range(10))
    house_designer: str | None = None
    populations: Mapping[str, Sequence[str]] | None = None


@dataclass(frozen=True)
class Match:
    """One scheduled episode. ``kind`` is 'bidder' or 'designer'; ``rotation`` is set for
    bidder matches, ``population`` and ``designer`` for designer matches."""

    id: str
    kind: str
    seed: int
    seats: dict[str, str]
    rotation: int | None = None
    population: str | None = None
    designer: str | None = None


@dataclass
class Plan:
    """A validated configuration: the scenario, the resolved lineups and the full schedule."""

    scenario: Scenario
    bidders: tuple[str, ...]
    designers: tuple[str, ...]
    seeds: tuple[int, ...]
    house_designer: str | None
    populations: dict[str, dict[str, str]]
    matches: list[Match]

    def manifest(self) -> dict[str, Any]:
        # how long to wait for an agent is not what is played: a resume may change it
        dump = json.dumps(
            self.scenario.model_dump(mode="json", exclude=cast("IncEx", RUN_ONLY_KEYS)),
            sort_keys=True,
        )
        return {
            "format": FORMAT,
            "scenario": self.scenario.name,
            "scenario_sha256": hashlib.sha256(dump.encode()).hexdigest(),
            "bidders": list(self.bidders),
            "designers": list(self.designers),
            "seeds": list(self.seeds),
            "house_designer": self.house_designer,
            "populations": self.populations,
            "matches": len(self.matches),
            "agent_code": self.agent_code(),
        }

    def agent_code(self) -> dict[str, Any]:
        """Every agent the tournament seats, with the code it runs
        (:mod:`market.run.agent_code`): a folder resumed after an agent was edited is refused
        instead of mixing two versions of it."""
        specs = {*self.bidders, *self.designers}
        if self.house_designer:
            specs.add(self.house_designer)
        for lineup in self.populations.values():
            specs.update(lineup.values())
        try:
            types = {spec: type(make_agent(spec)) for spec in sorted(specs)}
        except AgentSpecError as exc:
            raise TournamentError(str(exc).splitlines()[0]) from None
        return agents_code({spec: spec for spec in types}, types)


def bidder_seats(scenario: Scenario) -> list[str]:
    return [s for s in default_seats(scenario) if s != DESIGNER]


def bidder_lineups(agents: Sequence[str], n_seats: int, seed: int) -> list[tuple[str, ...]]:
    """The lineups of one seed: ``len(agents)`` rotations of a seeded order of the agents.

    Rotation ``r`` puts ``order[(j + r) % len(agents)]`` in bidder seat ``j``, so over one seed
    every agent sits in every seat index exactly once. With more agents than seats each lineup is
    a different subset (who meets whom varies with the seed); with fewer, agents repeat.
    """
    order = list(agents)
    random.Random(f"gpumarket-tournament:{seed}").shuffle(order)
    n = len(order)
    return [tuple(order[(j + r) % n] for j in range(n_seats)) for r in range(n)]


def _check_agents(specs: Sequence[str], role: str, what: str) -> tuple[str, ...]:
    specs = tuple(s.strip() for s in specs)
    if len(specs) == 1:
        raise TournamentError(
            f"{what}: a tournament needs at least two agents, got only {specs[0]!r}"
        )
    dupes = sorted({s for s in specs if specs.count(s) > 1})
    if dupes:
        raise TournamentError(f"{what}: {', '.join(map(repr, dupes))} listed more than once")
    for spec in specs:
        try:
            make_agent(spec, role)
        except ValueError as exc:
            raise TournamentError(f"{what}: {exc}") from None
    return specs


def plan(config: TournamentConfig) -> Plan:
    """Validate ``config`` and build the schedule (raises :class:`TournamentError`)."""
    scenario = load_scenario(config.scenario)
    seeds = tuple(int(s) for s in config.seeds)
    if not seeds:
        raise TournamentError("seeds: no seed selected")
    if len(set(seeds)) != len(seeds):
        raise TournamentError("seeds: a seed is listed more than once")
    bidders = _check_agents(config.bidders, "bidder", "bidders")
    designers = _check_agents(config.designers, "designer", "designers")
    if not bidders and not designers:
        raise TournamentError("nothing to play: give at least two bidders or two designers")
    seats = bidder_seats(scenario)
    if not seats:
        raise TournamentError(f"scenario {scenario.name!r} has no bidder seats")
    house = None
    if scenario.designer_seat:
        house = (config.house_designer or scenario.agents.designer).strip()
        try:
            make_agent(house, "designer")
        except ValueError as exc:
            raise TournamentError(f"house designer: {exc}") from None
    elif designers:
        raise TournamentError(
            f"scenario {scenario.name!r} has no designer seat "
            "(designer_seat = false); drop the designers or pick another "
            "scenario"
        )
    elif config.house_designer:
        raise TournamentError(
            f"scenario {scenario.name!r} has no designer seat for a house designer"
        )

    populations: dict[str, dict[str, str]] = {}
    if designers:
        wanted = config.populations
        if wanted is None:
            own = default_seats(scenario)
            wanted = {"default": [own[s] for s in seats], "mixed": MIXED_POPULATION}
        if not wanted:
            raise TournamentError("populations: designers need at least one bidder population")
        for name, specs in wanted.items():
            specs = [s.strip() for s in specs if s.strip()]
            if not name or not specs:
                raise TournamentError(f"population {name!r}: give a name and at least one bidder")
            for spec in specs:
                try:
                    make_agent(spec, "bidder")
                except ValueError as exc:
                    raise TournamentError(f"population {name!r}: {exc}") from None
            populations[name] = {seat: specs[j % len(specs)] for j, seat in enumerate(seats)}

    matches: list[Match] = []
    head = {DESIGNER: house} if house is not None else {}
    if bidders:
        for seed in seeds:
            for r, lineup in enumerate(bidder_lineups(bidders, len(seats), seed)):
                matches.append(
                    Match(
                        f"bidder|seed={seed}|rot={r}",
                        "bidder",
                        seed,
                        {**head, **dict(zip(seats, lineup, strict=True))},
                        rotation=r,
                    )
                )
    for pop, pop_seats in populations.items():
        for seed in seeds:
            for d in designers:
                matches.append(
                    Match(
                        f"designer|{pop}|seed={seed}|{d}",
                        "designer",
                        seed,
                        {DESIGNER: d, **pop_seats},
                        population=pop,
                        designer=d,
                    )
                )
    return Plan(scenario, bidders, designers, seeds, house, populations, matches)


__all__ = [
    "FORMAT",
    "MIXED_POPULATION",
    "Match",
    "Plan",
    "TournamentConfig",
    "TournamentError",
    "bidder_lineups",
    "bidder_seats",
    "plan",
]
