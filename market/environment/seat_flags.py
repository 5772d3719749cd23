"""Seat flags that remember whether any seat may be dead, so the env's end-of-step check is O(1).

PettingZoo's rule for dead seats: after every step, the first seat in ``agents`` order whose
termination or truncation flag is set takes the next (dead) step, which removes it. Scanning
every seat after every step costs O(seats) per step, which dominates a market of 1,000 labs.
:class:`SeatFlags` is the ``terminations``/``truncations`` dict with one extra bit: it is set
whenever a flag is set to a true value, and only :func:`first_dead_step` clears it, after a scan
found no dead seat. The scan, and so the seat chosen, is PettingZoo's own.
"""

from __future__ import annotations

from typing import Any, Protocol


class SeatFlags(dict[str, bool]):
    """A seat -> flag dict whose ``maybe_set`` says whether a true flag may be present."""

    def __init__(self) -> None:
        super().__init__()
        self.maybe_set = False

    def __setitem__(self, seat: str, value: bool) -> None:
        if value:
            self.maybe_set = True
        super().__setitem__(seat, value)


class DeadSeatEnv(Protocol):
    agents: list[str]
    agent_selection: str
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    _skip_agent_selection: Any


def first_dead_step(env: DeadSeatEnv) -> str:
    """Point ``agent_selection`` at the first terminated or truncated seat, as PettingZoo's
    ``_deads_step_first`` does, scanning the seats only when a flag may be set."""
    flags = (env.terminations, env.truncations)
    if all(isinstance(f, SeatFlags) and not f.maybe_set for f in flags):
        return env.agent_selection
    dead = [a for a in env.agents if env.terminations[a] or env.truncations[a]]
    if dead:
        env._skip_agent_selection = env.agent_selection
        env.agent_selection = dead[0]
    else:
        for f in flags:
            if isinstance(f, SeatFlags):
                f.maybe_set = False
    return env.agent_selection
