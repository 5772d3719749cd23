"""Shared helpers for the env API, invariant and bad-input tests: a deep state digest and a
seeded episode driver with scripted seats.

Also which built-in scenarios the per-scenario sweeps (tests parametrized over ``scenario``)
cover by default: every built-in except

* scale scenarios (more than ``SCALE_SEATS`` seats, e.g. ``large_market``): per-step checks over
  hundreds of labs take minutes per test. ``tests/test_scenarios_builtin.py`` runs them and the
  golden transcript replays them;
* population variants: a built-in that ``extends`` another and changes only its ``[agents]``
  (``mechanism_stage_1..4`` extend ``mechanism_stage_0``). It has the parent's world, and the
  sweeps mostly pick their own seats, so it would repeat the parent's checks.

``pytest --all-scenarios`` sweeps them too.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import tomllib
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import market
import scenarios
from agents.registry import make_agent

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
        return (f"{name} is {table['extends']} with other seats (run with --all-scenarios)")
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all-scenarios", action="store_true",
                     help="also sweep scale scenarios and population variants of built-ins")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--all-scenarios"):
        return
    # deselected, not skipped: they are not part of the default run at all (no skip counts)
    keep, dropped = [], []
    for item in items:
        name = getattr(getattr(item, "callspec", None), "params", {}).get("scenario")
        (dropped if isinstance(name, str) and sweep_skip_reason(name) else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def state_digest(raw: Any) -> str:
    """A hash of everything an action can change (not the turn pointer, round or phase).

    Budgets, reputations, lab status, holdings, jobs, offers, contracts, messages, pitches,
    coalitions (incl. balances), pending bids and plans, the mechanism, operator and external
    credits, and the interaction graph.
    """
    w, book, cb = raw.world, raw.book, raw.coalitions
    state = {
        "labs": [
            (lab.budget, lab.reputation, lab.active, lab.entered, lab.exit_round,
             [dataclasses.astuple(j) for j in lab.jobs])
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
            (k, c.leader, sorted(c.invited), c.purpose, c.split, c.created_round, c.term_end,
             list(c.members), sorted(c.balances.items()), sorted(c.contributed.items()), c.status)
            for k, c in cb.coalitions.items()
        ],
        "bids": sorted((k, dataclasses.astuple(e)) for k, e in raw._bids.items()),
        "coalition_bids": sorted((k, dataclasses.astuple(e)) for k, e in raw._coalition_bids.items()),
        "plans": sorted((k, sorted(p.items())) for k, p in raw._plans.items()),
        "mechanism": sorted(raw.mechanism.model_dump().items()),
        "graph": sorted((u, v, sorted(d.items())) for u, v, d in raw.graph.graph.edges(data=True)),
        "graph_messages": sorted((r, sorted(m.items())) for r, m in raw.graph._round_messages.items()),
        "results": len(raw.results),
    }
    return hashlib.sha256(repr(state).encode()).hexdigest()


def make_seats(env: Any, bidders: list[str], designer: str = "fixed") -> dict[str, Any]:
    """One agent per possible seat; the last bidder spec repeats."""
    seats = {}
    for agent in env.unwrapped.possible_agents:
        if agent == "designer_0":
            seats[agent] = make_agent(designer, role="designer")
        else:
            i = int(agent[7:])
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
        turn = {"agent": agent, "action": action, "reward": reward, "info": copy.deepcopy(info), "dead": term or trunc,
                "round": raw.round, "phase": raw.phase}
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


# --- tests write only to temporary folders --------------------------------------------------
# A test that ran a CLI command with the checkout as its working directory once left runs/ there,
# after which a user's own `gpumarket run` was refused as "a run of another configuration".
_CHECKOUT = Path(__file__).resolve().parents[1]
_CHECKOUT_OUTPUTS = ("runs", "eval", "tournament", "sft.jsonl", "report.html")


def _outputs_in_checkout() -> set[str]:
    return {name for name in _CHECKOUT_OUTPUTS if (_CHECKOUT / name).exists()}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_outputs_key] = _outputs_in_checkout()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    new = _outputs_in_checkout() - session.config.stash.get(_outputs_key, set())
    if new and not hasattr(session.config, "workerinput"):  # report once, from the controller
        print(f"\nERROR: the tests wrote {sorted(new)} into the checkout {_CHECKOUT}; tests must "
              "write only to tmp_path (pass --out / cwd=tmp_path)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_outputs_key = pytest.StashKey[set[str]]()
