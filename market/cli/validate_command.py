"""``gpumarket validate``: check a scenario as ``gpumarket run`` would, before an episode runs.

What is checked, every problem reported at once, one line each (exit code 2):

* the file: TOML, ``extends``, every key and value against the schema (the lines of
  :class:`scenarios.ScenarioError`);
* the line-up: every seat's agent spec (the scenario's ``[agents]``, with ``--seat`` overrides)
  builds, as ``run`` builds it (:func:`agents.registry.make_agent`), and its agent may fill the
  seat's role (a bidder agent in ``designer_0`` is refused). Checked even when other keys are
  wrong, from the file's raw ``[agents]`` table: one spec is checked once, and its problem names
  the key and the seats it fills;
* the judges (``judge``, ``conduct_judge``) build.

Building an agent or a judge is what ``run`` does first too; one whose spec names a ``cache=``
file opens (creates) that file.

A scenario with no problem prints ``ok:``, its summary and its line-up. Text from the file is
shown with control characters as escapes (:func:`market.record.terminal.terminal_text`).
``gpumarket validate`` with no scenario lists the built-in ones.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.registry import AgentSpecError, make_agent, registered
from market.core.judge_specs import make_judge, make_reader
from market.core.seats import DESIGNER, bidder_seat
from market.record.terminal import terminal_text
from market.run.rollout import default_seats
from scenarios import Scenario, ScenarioError, builtin_names, load_scenario, read_table


@dataclass
class Checked:
    """One scenario checked: its source, the scenario (None if it does not validate), its
    line-up (seat -> spec) and every problem found."""

    name: str
    source: str
    scenario: Scenario | None = None
    lineup: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    unreadable: bool = False  # not TOML, no such file, a broken extends: one problem, no more


@dataclass
class _Spec:
    """One spec of the line-up: where it comes from, the role it fills and its seats."""

    spec: str
    role: str
    key: str
    seats: list[str] = field(default_factory=list)


def _raw_lineup(table: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(seat, spec, key) of a table that did not validate, read leniently: what can be read of
    ``[agents]`` is checked, the rest is left to the schema's problems."""
    agents = table.get("agents")
    agents = agents if isinstance(agents, dict) else {}
    out: list[tuple[str, str, str]] = []
    if table.get("designer_seat", True) is not False:
        designer = agents.get("designer", "fixed")
        if isinstance(designer, str):
            out.append((DESIGNER, designer, "agents.designer"))
    bidders = agents.get("bidders", ["truthful"])
    if not isinstance(bidders, list) or not bidders:
        return out
    labs = table.get("labs")
    labs = labs if isinstance(labs, dict) else {}
    count, entrants = labs.get("count", 3), labs.get("entrants", 0)
    seats = count + entrants if isinstance(count, int) and isinstance(entrants, int) else 0
    seats = seats if 0 < seats <= 100_000 else len(bidders)
    for i in range(seats):
        k = min(i, len(bidders) - 1)
        if isinstance(bidders[k], str):
            out.append((bidder_seat(i), bidders[k], f"agents.bidders[{k}]"))
    return out


def _lineup(scenario: Scenario) -> list[tuple[str, str, str]]:
    """(seat, spec, key) of a valid scenario: the seats ``run`` fills from ``[agents]``."""
    last = len(scenario.agents.bidders or ["truthful"]) - 1
    out = []
    for seat, spec in default_seats(scenario).items():
        if seat == DESIGNER:
            out.append((seat, spec, "agents.designer"))
        else:
            k = min(int(seat.rpartition("_")[2]), last)
            out.append((seat, spec, f"agents.bidders[{k}]"))
    return out


def seat_range(seats: list[str]) -> str:
    """Seats joined, a run of three or more consecutive bidder seats as ``bidder_1..bidder_4``."""
    runs: list[list[str]] = []
    for seat in seats:
        last = runs[-1][-1] if runs else DESIGNER
        if seat != DESIGNER and last != DESIGNER and _order(seat)[1] == _order(last)[1] + 1:
            runs[-1].append(seat)
        else:
            runs.append([seat])
    return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 2 else ", ".join(r) for r in runs)


def _agent_problem(spec: _Spec) -> str | None:
    try:
        make_agent(spec.spec, spec.role)
    except AgentSpecError as exc:
        message = str(exc).splitlines()[0]
        name = spec.spec.partition("?")[0].strip()
        if message.startswith("unknown agent"):
            close = difflib.get_close_matches(name, registered(), n=1)
            if close:  # the list of every agent follows; the likely one first
                message = (
                    f"unknown agent {name!r} (did you mean {close[0]!r}?)"
                    + message[len(f"unknown agent {name!r}") :]
                )
        return f"{_where(spec)}: {message}"
    except Exception as exc:  # an agent's constructor may raise anything: a problem, not a crash
        return f"{_where(spec)}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def _where(spec: _Spec) -> str:
    if spec.key.startswith("--seat"):
        return spec.key
    return f"key '{spec.key}' ({seat_range(spec.seats)})"


def check(name: str, seats: Mapping[str, str] | None = None) -> Checked:
    """Every problem of scenario ``name`` with the ``--seat`` overrides ``seats`` (see the
    module doc)."""
    try:
        table, source = read_table(name)
    except ScenarioError as exc:  # not TOML, no such file, a broken extends: nothing to go on
        return Checked(name, name, problems=[str(exc)], unreadable=True)
    checked = Checked(name, source)
    try:
        checked.scenario = load_scenario(name)
    except ScenarioError as exc:
        checked.problems += exc.problems
    sc = checked.scenario
    rows = _lineup(sc) if sc is not None else _raw_lineup(table)
    overrides = dict(seats or {})
    known = sorted({seat for seat, _, _ in rows}, key=_order)
    for seat in overrides:
        if known and seat not in known:
            checked.problems.append(
                f"--seat {seat}: no such seat in this scenario; its seats: {seat_range(known)}"
            )
    specs: dict[tuple[str, str, str], _Spec] = {}
    for seat, spec, key in rows:
        if seat in overrides:
            spec, key = overrides[seat], f"--seat {seat}"
        role = "designer" if seat == DESIGNER else "bidder"
        specs.setdefault((spec, role, key), _Spec(spec, role, key)).seats.append(seat)
        checked.lineup[seat] = spec
    checked.problems += [p for s in specs.values() if (p := _agent_problem(s)) is not None]
    if sc is not None:
        for key, build in (("judge", make_judge), ("conduct_judge", make_reader)):
            try:
                build(getattr(sc, key))
            except (ValueError, TypeError) as exc:
                checked.problems.append(f"key '{key}': {str(exc).splitlines()[0]}")
    return checked


def _order(seat: str) -> tuple[int, int]:
    return (0, 0) if seat == DESIGNER else (1, int(seat.rpartition("_")[2]))


def summary(sc: Scenario) -> list[str]:
    """What a scenario is, in a few lines: the figures a reader checks before a run."""
    labs = f"{sc.labs.count} labs" + (
        f" (+{sc.labs.entrants} entrants)" if sc.labs.entrants else ""
    )
    low, high = sc.capacity.blocks
    blocks = f"{low}" if low == high else f"{low}-{high}"
    if not sc.designer_seat:
        designer = "no designer seat: the scenario's mechanism throughout"
    elif sc.mechanism_every == "episode":
        designer = "designer_0 sets the mechanism once, in round 0"
    else:
        every = (
            "every round" if sc.rounds_per_design == 1 else f"every {sc.rounds_per_design} rounds"
        )
        designer = f"designer_0 sets the mechanism {every}"
    shocks = len(sc.shocks)
    timeout = "no limit" if sc.agent_timeout == 0 else f"{sc.agent_timeout:g} s"
    lines = [
        f"{sc.rounds} rounds of {sc.negotiation_turns} negotiation pass(es) and an auction; "
        f"{labs}; {blocks} GPU blocks a round",
        f"{designer}; the scenario's mechanism: {sc.mechanism.auction_type}, reserve "
        f"{sc.mechanism.reserve_price:g} credits",
        f"{shocks} scheduled shock(s); judge {sc.judge}, conduct judge {sc.conduct_judge}; "
        f"agent timeout {timeout}",
    ]
    if sc.description.strip():
        lines.insert(0, " ".join(sc.description.split()))
    return lines


def lineup_lines(lineup: Mapping[str, str], overrides: Mapping[str, str]) -> list[str]:
    """The line-up, consecutive seats of the same spec on one line."""
    groups: list[tuple[list[str], str]] = []
    for seat in sorted(lineup, key=_order):
        spec = lineup[seat]
        mark = " (--seat)" if seat in overrides else ""
        if groups and groups[-1][1] == spec + mark and seat != DESIGNER:
            groups[-1][0].append(seat)
        else:
            groups.append(([seat], spec + mark))
    labels = [seat_range(seats) for seats, _ in groups]
    width = max(len(label) for label in labels)
    return [f"{label:<{width}}  {spec}" for label, (_, spec) in zip(labels, groups, strict=True)]


def cmd_validate(args: argparse.Namespace) -> int:
    if not args.scenarios:
        print("built-in scenarios (validate one: gpumarket validate NAME, or a .toml file):")
        for name in builtin_names():
            print(f"  {name}")
        return 0
    overrides = dict(args.seat)
    failed = 0
    for name in args.scenarios:  # text from a file: control characters shown as escapes
        checked = check(name, overrides)
        if checked.problems:
            failed += 1
            if checked.unreadable:
                message = checked.problems[0]
            else:
                count = len(checked.problems)
                message = f"{checked.source}: {count} problem(s):\n" + "\n".join(
                    f"  - {p}" for p in checked.problems
                )
            print(terminal_text(f"error: {message}"), file=sys.stderr)
            continue
        sc = checked.scenario
        assert sc is not None
        print(terminal_text(f"ok: {name} ({sc.labs.count} labs, {sc.rounds} rounds)"))
        for line in summary(sc):
            print(terminal_text(f"  {line}"))
        print("  line-up:")
        for line in lineup_lines(checked.lineup, overrides):
            print(terminal_text(f"    {line}"))
    return 2 if failed else 0


__all__ = ["Checked", "check", "cmd_validate", "lineup_lines", "summary"]
