"""Seat flags that remember whether any seat may be dead, so the env's end-of-step check is O(1).

PettingZoo's rule for dead seats: after every step, the first seat in ``agents`` order whose
termination or truncation flag is set takes the next (dead) step, which removes it. Scanning
every seat after every step costs O(seats) per step, which dominates a market of 1,000 labs.
:class:`SeatFlags` is the ``terminations``/``truncations`` dict with one extra bit: it is set
whenever a flag is set to a true value, and only :func:`first_dead_step` clears it, after a scan
found no dead seat. The scan, and so the seat chosen, is PettingZoo's own.

:func:`dead_step` is PettingZoo's ``_was_dead_step`` with the same effect, but O(1) per seat
when every seat is dead (the end of an episode, where each of N seats takes a dead step that
PettingZoo makes O(N)).
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
    rewards: dict[str, float]
    _cumulative_rewards: dict[str, float]
    infos: dict[str, Any]
    rewarded: set[str]


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


def dead_step(env: DeadSeatEnv) -> None:
    """The step of a dead seat, as PettingZoo's ``_was_dead_step``: remove the seat, select the
    next dead seat in ``agents`` order (else the live seat the dead steps interrupted), and zero
    every reward.

    The next dead seat is the first one the scan meets, so the scan stops there: at the end of
    an episode, where all seats are dead, that is the first seat. Only the seats in
    ``env.rewarded`` are zeroed, as the env keeps every other seat's reward at 0.0; then none
    holds a reward, so ``rewarded`` is emptied (the next dead step zeroes nothing).
    """
    agent = env.agent_selection
    for table in (env.terminations, env.truncations, env.rewards, env._cumulative_rewards):
        del table[agent]
    del env.infos[agent]
    env.agents.remove(agent)
    dead = next((a for a in env.agents if env.terminations[a] or env.truncations[a]), None)
    if dead is not None:
        if getattr(env, "_skip_agent_selection", None) is None:
            env._skip_agent_selection = env.agent_selection
        env.agent_selection = dead
    else:
        if getattr(env, "_skip_agent_selection", None) is not None:
            env.agent_selection = env._skip_agent_selection
        env._skip_agent_selection = None
    rewards = env.rewards
    for a in env.rewarded:
        if a in rewards:
            rewards[a] = 0.0
    env.rewarded = set()
