"""The tests' one support module: crafted worlds, seeded episode drivers, tiny agents, a deep
state digest, and which built-in scenarios the per-scenario sweeps cover.

``make_env`` builds a ``market.raw_env`` on a small scenario with shocks, arrivals, endowments and
block failures switched off, so a test can write a hand-computable world into it right after
``reset`` (``craft``). ``run_episode`` drives every seat with the given agent objects and returns
the returns, the decomposed reward components, a per-step record and (optionally) every seat's
observation at every step. ``play`` runs one seeded episode of a wrapped env with scripted seats.

The per-scenario sweeps (tests parametrized over ``scenario``) cover every built-in except scale
scenarios (more than ``SCALE_SEATS`` seats, e.g. ``large_market``: per-step checks over hundreds
of labs take minutes per test; ``tests/environment/test_scenarios_builtin.py`` and the golden
replays run them) and population variants (a built-in that ``extends`` another and changes only
its ``[agents]``). ``pytest --all-scenarios`` sweeps them too.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import tomllib
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import market
import scenarios
from agents.base import BaseAgent
from agents.registry import make_agent
from agents.scripted import TruthfulBidder
from market.core.actions import Bid, Finish, Wait
from market.core.scenario_schema import SHOCK_KINDS
from market.core.seats import DESIGNER, lab_index
from market.core.world import Job
from market.environment.observations import Observation

ROOT = Path(__file__).resolve().parents[1]  # the checkout
TESTS = ROOT / "tests"
SCALE_SEATS = 50


@cache
def sweep_skip_reason(name: str) -> str | None:
    """Why the per-scenario sweeps leave out built-in ``name`` by default (None: they cover it)."""
    if name not in scenarios.builtin_names():
        return None
    if scenarios.load_scenario(name).n_seats > SCALE_SEATS:
        return f"{name} is a scale scenario (run with --all-scenarios)"
    text = resources.files("scenarios").joinpath(f"{name}.toml").read_text(encoding="utf-8")
    table = tomllib.loads(text)
    if "extends" in table and set(table) <= {"extends", "name", "description", "agents"}:
        return f"{name} is {table['extends']} with other seats (run with --all-scenarios)"
    return None


NO_SHOCK_RATES: dict[str, float] = dict.fromkeys(SHOCK_KINDS, 0.0)

# A quiet base on top of the single_trade scenario: no shocks, no arrivals, no endowments,
# perfectly reliable blocks, no designer seat.
QUIET: dict[str, Any] = {
    "rounds": 1,
    "labs__count": 2,
    "labs__entrants": 0,
    "labs__endowment": [0, 0],
    "jobs__arrival_rate": 0.0,
    "capacity__reliability": 1.0,
    "shocks": [],
    "shock_rates": NO_SHOCK_RATES,
}


def make_env(scenario: str = "single_trade", **overrides: Any) -> Any:
    """A raw env on ``scenario`` with :data:`QUIET` applied first, then ``overrides``."""
    return market.raw_env(scenario, **{**QUIET, **overrides})


def job(
    owner: int,
    size: int,
    value: float,
    deadline: int,
    job_id: str | None = None,
    partial: bool = False,
    min_reliability: float = 0.0,
    arrival: int = 0,
) -> Job:
    """A job already active (arrival 0) or pending (later arrival)."""
    return Job(
        job_id=job_id or f"j{owner}",
        owner=owner,
        size=size,
        arrival=arrival,
        deadline=deadline,
        value=value,
        partial_credit=partial,
        min_reliability=min_reliability,
        status="active" if arrival == 0 else "pending",
    )


def craft(
    env: Any,
    *,
    budgets: list[float] | None = None,
    jobs: Mapping[int, list[Job]] | None = None,
    holdings: Mapping[tuple[int, int], int] | None = None,
    capacity: int | list[int] | None = None,
    reliability: float | None = None,
    reputations: list[float] | None = None,
) -> None:
    """Overwrite the world drawn at reset (call right after ``env.reset``).

    Unlisted labs keep no jobs when ``jobs`` is given; holdings start at zero when ``holdings`` is
    given. The credit audit's baseline follows the new budgets.
    """
    w = env.world
    if budgets is not None:
        for lab, b in zip(w.labs, budgets, strict=True):
            lab.budget = float(b)
        env.initial_credits = sum(lab.budget for lab in w.labs)
    if reputations is not None:
        for lab, r in zip(w.labs, reputations, strict=True):
            lab.reputation = float(r)
        w.reputation_version += 1  # as lose_reputation() does: views rebuild the reputations
    if jobs is not None:
        for i, lab in enumerate(w.labs):
            lab.jobs = list(jobs.get(i, []))
    if holdings is not None:
        w.holdings[:] = 0
        for (i, r), n in holdings.items():
            w.holdings[i, r] = n
    if capacity is not None:
        w.capacity[:] = capacity
        w.base_capacity[:] = capacity
    if reliability is not None:
        w.reliability[:] = reliability
    w.energy_floor[:] = 0.0


# --------------------------------------------------------------------------------------------
# Tiny agents
# --------------------------------------------------------------------------------------------

Entry = Any  # an action (model, dict or JSON text) or a callable Observation -> action


class WaitAgent(BaseAgent):
    """Always waits (never bids, never talks)."""

    name = "wait"
    roles = frozenset({"bidder", "designer"})

    def act(self, obs: Observation) -> Any:
        return Wait()


class FinishAgent(BaseAgent):
    """Leaves the market on its first turn."""

    name = "finish_now"

    def act(self, obs: Observation) -> Any:
        return Finish() if "finish" in obs.legal_actions else Wait()


class ScriptedAgent(BaseAgent):
    """Plays ``plan[(round, phase, k)]`` on its ``k``-th turn of ``phase`` in ``round`` (or
    ``plan[(round, phase)]`` on every such turn); otherwise asks ``fallback`` (default: wait).

    A plan entry is an action or a callable ``obs -> action``.
    """

    name = "scripted"
    roles = frozenset({"bidder", "designer"})

    def __init__(
        self, plan: Mapping[tuple, Entry] | None = None, fallback: BaseAgent | None = None
    ) -> None:
        super().__init__()
        self.plan = dict(plan or {})
        self.fallback = fallback or WaitAgent()
        self._turns: dict[tuple[int, str], int] = {}
        self.seen: list[Observation] = []

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.fallback.reset(seed)
        self._turns = {}
        self.seen = []

    def act(self, obs: Observation) -> Any:
        self.seen.append(obs)
        key = (obs.round, obs.phase)
        k = self._turns.get(key, 0)
        self._turns[key] = k + 1
        entry = self.plan.get((obs.round, obs.phase, k), self.plan.get(key))
        if entry is None:
            return self.fallback.act(obs)
        return entry(obs) if callable(entry) else entry


def bidder(
    schedules: Mapping[int, list[float]] | list[float], fallback: BaseAgent | None = None
) -> ScriptedAgent:
    """Bids ``schedules[round]`` (or the same list every round) and waits otherwise."""
    if isinstance(schedules, Mapping):
        plan = {(r, "bidding"): Bid(bids=list(b)) for r, b in schedules.items()}
        return ScriptedAgent(plan, fallback)
    return ScriptedAgent({}, fallback=_ConstantBid(list(schedules)))


class _ConstantBid(BaseAgent):
    name = "constant_bid"

    def __init__(self, bids: list[float]) -> None:
        super().__init__()
        self.bids = bids

    def act(self, obs: Observation) -> Any:
        return Bid(bids=self.bids) if obs.phase == "bidding" else Wait()


def population(
    env: Any, default: str = "truthful", designer: str = "fixed", **seats: Any
) -> dict[str, Any]:
    """An agent per possible seat: ``seats[seat]`` (an agent or a registry spec) or the default."""
    out: dict[str, Any] = {}
    for seat in env.possible_agents:
        spec = seats.get(seat, designer if seat == DESIGNER else default)
        out[seat] = make_agent(spec) if isinstance(spec, str) else spec
    return out


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------


@dataclass
class Episode:
    returns: dict[str, float]
    components: dict[str, dict[str, float]]
    steps: list[dict[str, Any]] = field(default_factory=list)
    observations: list[tuple[str, Observation]] = field(default_factory=list)


def run_episode(
    env: Any,
    agents: Mapping[str, Any],
    seed: int | None = 0,
    setup: Callable[[Any], None] | None = None,
    observe_all: bool = False,
    on_step: Callable[[Any, dict[str, Any]], None] | None = None,
    max_steps: int = 50_000,
) -> Episode:
    """Reset with ``seed``, apply ``setup(env)``, then play until every seat is done.

    Every seat in ``env.possible_agents`` needs an agent in ``agents`` (seats without one wait).
    ``returns[seat]`` sums the seat's rewards over all steps; ``components[seat]`` sums its
    decomposed reward components (``infos[seat]["reward_components"]`` holds what accrued since the
    seat last acted, so it is read just before each of the seat's turns and dead steps).
    With ``observe_all`` every live seat's observation is recorded after every step.
    """
    env.reset(seed=seed)
    if setup is not None:
        setup(env)
    for seat, agent in agents.items():
        agent.reset(env.seat_seed(seat))
    returns = {a: 0.0 for a in env.possible_agents}
    components: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    ep = Episode(returns, components)
    waiter = WaitAgent()

    def snapshot() -> None:
        for a in env.agents:
            ep.observations.append((a, env.observe(a)))

    if observe_all:
        snapshot()
    for _ in range(max_steps):
        if not env.agents:
            break
        seat = env.agent_selection
        for k, v in env.infos.get(seat, {}).get("reward_components", {}).items():
            components[seat][k] += v
        record: dict[str, Any] = {"seat": seat, "round": env.round, "phase": env.phase}
        if env.terminations[seat] or env.truncations[seat]:
            env.step(None)
            record["dead"] = True
        else:
            obs = env.observe(seat)
            action = agents.get(seat, waiter).act(obs)
            record["action"] = (
                action.model_dump_json() if hasattr(action, "model_dump_json") else action
            )
            env.step(action)
            record["info"] = copy.deepcopy(env.infos.get(seat, {}))
        record["rewards"] = dict(env.rewards)
        for a, r in env.rewards.items():
            returns[a] += r
        ep.steps.append(record)
        if on_step is not None:
            on_step(env, record)
        if observe_all:
            snapshot()
    else:  # pragma: no cover - a hung episode is a failure
        raise AssertionError(f"episode did not end within {max_steps} steps")
    ep.components = {a: dict(c) for a, c in components.items()}
    return ep


def errors(ep: Episode, seat: str | None = None) -> list[tuple[str, str]]:
    """(seat, error) for every invalid action in the episode."""
    return [
        (s["seat"], s["info"]["error"])
        for s in ep.steps
        if "info" in s and "error" in s["info"] and (seat is None or s["seat"] == seat)
    ]


__all__ = [
    "NO_SHOCK_RATES",
    "QUIET",
    "Episode",
    "FinishAgent",
    "ScriptedAgent",
    "TruthfulBidder",
    "WaitAgent",
    "bidder",
    "craft",
    "errors",
    "job",
    "make_env",
    "population",
    "run_episode",
]


def state_digest(raw: Any) -> str:
    """A hash of everything an action can change (not the turn pointer, round or phase).

    Budgets, reputations, lab status, holdings, jobs, offers, contracts, messages, pitches,
    coalitions (incl. balances), pending bids and plans (``raw.orders``), the mechanism, operator
    and external credits, and the interaction graph (its edges count every private message).
    """
    w, book, cb = raw.world, raw.book, raw.coalitions
    state = {
        "labs": [
            (
                lab.budget,
                lab.reputation,
                lab.active,
                lab.entered,
                lab.exit_round,
                [dataclasses.astuple(j) for j in lab.jobs],
            )
            for lab in w.labs
        ],
        "holdings": w.holdings.tolist(),
        "credits": (w.operator_credits, w.external_credits),
        "offers": [(k, dataclasses.astuple(o)) for k, o in book.offers.items()],
        "contracts": [dataclasses.astuple(c) for c in book.contracts],
        "messages": [dataclasses.astuple(m) for m in book.messages],
        "pitches": sorted((k, dataclasses.astuple(p)) for k, p in book.pitches.items()),
        "book_ids": (book.next_offer, book.next_contract, cb.next_id),
        "coalitions": [
            (
                k,
                c.leader,
                sorted(c.invited),
                c.purpose,
                c.split,
                c.created_round,
                c.term_end,
                list(c.members),
                sorted(c.balances.items()),
                sorted(c.contributed.items()),
                c.status,
            )
            for k, c in cb.coalitions.items()
        ],
        "bids": sorted((k, dataclasses.astuple(e)) for k, e in raw.orders.bids.items()),
        "coalition_bids": sorted(
            (k, dataclasses.astuple(e)) for k, e in raw.orders.coalition_bids.items()
        ),
        "plans": sorted((k, sorted(p.items())) for k, p in raw.orders.plans.items()),
        "mechanism": sorted(raw.mechanism.model_dump().items()),
        "graph": sorted((u, v, sorted(d.items())) for u, v, d in raw.graph.graph.edges(data=True)),
        "results": len(raw.results),
    }
    return hashlib.sha256(repr(state).encode()).hexdigest()


def make_seats(env: Any, bidders: list[str], designer: str = "fixed") -> dict[str, Any]:
    """One agent per possible seat; the last bidder spec repeats."""
    seats = {}
    for agent in env.unwrapped.possible_agents:
        if agent == DESIGNER:
            seats[agent] = make_agent(designer, role="designer")
        else:
            i = lab_index(agent)
            seats[agent] = make_agent(bidders[min(i, len(bidders) - 1)], role="bidder")
    return seats


def play(
    env: Any,
    seats: dict[str, Any],
    seed: int,
    after_step: Callable[[dict[str, Any]], None] | None = None,
    before_step: Callable[[dict[str, Any]], None] | None = None,
    max_steps: int = 20_000,
) -> list[dict[str, Any]]:
    """Run one seeded episode; returns one record per turn (agent, action, reward, info from last()).

    ``before_step(turn)`` runs after the action is chosen and before ``env.step``;
    ``after_step(turn)`` right after it. A dead seat is stepped with ``None``.
    """
    env.reset(seed=seed)
    raw = env.unwrapped
    for agent, policy in seats.items():
        policy.reset(raw.seat_seed(agent))
    turns: list[dict[str, Any]] = []
    for agent in env.agent_iter(max_steps):
        obs, reward, term, trunc, info = env.last()
        action = None if term or trunc else seats[agent].act(obs)
        turn = {
            "agent": agent,
            "action": action,
            "reward": reward,
            "info": copy.deepcopy(info),
            "dead": term or trunc,
            "round": raw.round,
            "phase": raw.phase,
        }
        if before_step is not None:
            before_step(turn)
        env.step(action)
        if after_step is not None:
            after_step(turn)
        turns.append(turn)
    assert not env.agents, "episode did not end within max_steps"
    return turns


def new_env(scenario: str = "market_round", wrapped: bool = True, **overrides: Any) -> Any:
    return (market.env if wrapped else market.raw_env)(scenario=scenario, **overrides)


def ctrl_c_able() -> dict[str, Any]:
    """``subprocess.Popen`` arguments that let a child take Ctrl-C (SIGINT) even where this
    process was started with SIGINT ignored (a job put in the background by a shell without job
    control ignores it, and children inherit that): the child then starts with the default
    disposition, as from a terminal. Elsewhere nothing is changed."""
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return {}
    return {"preexec_fn": lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)}
