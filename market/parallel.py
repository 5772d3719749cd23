"""The parallel view of the market: one parallel step per pass of the AEC turn order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium
from pettingzoo import ParallelEnv

from market.environment import LEGAL, raw_env
from market.observations import Observation
from scenarios.schema import Scenario


def pass_seats(env: raw_env) -> list[str]:
    """The live seats still to act in the current pass of ``env``, in AEC order.

    A round's schedule is split into passes where the phase changes or a seat comes round again
    (design pass, each negotiation pass, bidding pass); the current pass is the one holding the
    env's turn, and seats before the turn in it have acted already or are dead.
    """
    if env.phase == "done" or not env.agents:
        return []
    schedule, turn = env._schedule_full, env._turn
    start, seen = 0, set()
    for k, (seat, phase) in enumerate(schedule):
        if k and (phase != schedule[k - 1][1] or seat in seen):
            if k > turn:
                return [s for s, _ in schedule[turn:k] if env._live(s)]
            start, seen = k, set()
        seen.add(seat)
    return [s for s, _ in schedule[max(start, turn) :] if env._live(s)]


class ParallelMarketEnv(ParallelEnv):
    """The market as a PettingZoo ``ParallelEnv``: one ``step`` is one pass over the seats.

    A round is the AEC schedule of DESIGN.md section 4: the design pass (``designer_0``), then
    ``negotiation_turns`` negotiation passes and one bidding pass over the active labs. Each
    ``step(actions)`` plays one pass:

    * every live agent submits an action, but only the seats that act in this pass are applied —
      the others' actions are ignored and their ``infos[a]["acted"]`` is False (e.g. bidders
      during the design pass, the designer during negotiation and bidding);
    * the observations returned by ``reset``/``step`` are taken at the start of the pass, so the
      pass is simultaneous from the agents' point of view. In them, the seats that act in the pass
      have the phase's ``legal_actions``; the others have none;
    * the actions are applied in seat order through the AEC env, each seat exactly once;
    * rewards (and ``infos[a]["reward_components"]``) sum over the pass, including the clearing,
      execution and round rewards that the pass's last action triggers; agents that finish or
      exit are reported once with ``terminations[a] = True`` and then leave ``agents``.

    Why this is sound: within a pass each seat acts exactly once and in the AEC order, so a pass
    replays exactly the AEC steps of that pass, and every rule — validation, penalties, clearing,
    RNG streams — is the AEC env's own. What differs is only what an agent has seen when it picks
    its action: the state at the pass start, not after earlier seats of the same pass (an offer
    made earlier in the pass is seen, and can be answered, in the next pass). Policies that do
    not react to other seats' moves within a pass therefore get the same episode as in the AEC
    env, and any policy gets the same episode as in the AEC env driven with pass-start
    observations. An acting seat with no entry in ``actions`` is stepped with ``None``, which the
    env reports as an invalid action.
    """

    metadata = {
        "name": "gpumarket_parallel_v0",
        "render_modes": ["ansi", "human"],
        "is_parallelizable": True,
    }

    def __init__(
        self,
        scenario: str | Path | Scenario = "market_round",
        render_mode: str | None = None,
        **overrides: Any,
    ) -> None:
        self.aec = raw_env(scenario, render_mode=render_mode, **overrides)
        self.scenario: Scenario = self.aec.scenario
        self.render_mode = render_mode
        self.possible_agents: list[str] = list(self.aec.possible_agents)
        self.observation_spaces = self.aec.observation_spaces
        self.action_spaces = self.aec.action_spaces
        self.agents: list[str] = []
        self._acting: list[str] = []

    # --- PettingZoo surface -------------------------------------------------------------
    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.action_spaces[agent]

    @property
    def acting_agents(self) -> list[str]:
        """The seats whose actions the next ``step`` applies, in order."""
        return list(self._acting)

    def seat_seed(self, agent: str) -> int:
        return self.aec.seat_seed(agent)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Observation], dict[str, dict]]:
        self.aec.reset(seed=seed, options=options)
        self._drain_dead()
        self.agents = list(self.aec.agents)
        self._acting = pass_seats(self.aec)
        info = {"round": self.aec.round, "phase": self.aec.phase}
        return {a: self._observe(a) for a in self.agents}, {a: dict(info) for a in self.agents}

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[
        dict[str, Observation], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict]
    ]:
        env = self.aec
        before = list(self.agents)
        rewards: dict[str, float] = dict.fromkeys(before, 0.0)
        components: dict[str, dict[str, float]] = {a: {} for a in before}
        own: dict[str, dict[str, Any]] = {}
        done: dict[str, tuple[bool, bool]] = {}
        played = {"round": env.round, "phase": env.phase}
        for seat in self._acting:
            if not env.agents or env.agent_selection != seat:
                continue  # cannot happen: a seat only leaves its own pass by acting
            self._step_seat(seat, actions.get(seat), rewards, components, own, done)
            self._drain_dead()
        keys = before + [a for a in env.agents if a not in before]
        self.agents = list(env.agents)
        self._acting = pass_seats(env)
        observations = {a: self._observe(a) for a in keys}
        truncations = {a: done.get(a, (False, False))[1] for a in keys}
        # a seat the AEC env removed was done; it is a termination unless it was truncated
        terminations = {
            a: done.get(a, (False, False))[0] or (a not in env.agents and not truncations[a])
            for a in keys
        }
        infos = {
            a: {
                **played,
                **own.get(a, {}),
                "acted": a in own,
                "reward_components": components.get(a, {}),
            }
            for a in keys
        }
        return (
            observations,
            {a: rewards.get(a, 0.0) for a in keys},
            terminations,
            truncations,
            infos,
        )

    def render(self) -> str | None:
        return self.aec.render()

    def close(self) -> None:
        self.aec.close()

    # --- internals ---------------------------------------------------------------------
    def _observe(self, agent: str) -> Observation:
        """``agent``'s observation now, with the phase's legal actions iff it acts in this pass."""
        obs = self.aec.observe(agent)
        legal = list(LEGAL[self.aec.phase]) if agent in self._acting else []
        return (
            obs if obs.legal_actions == legal else obs.model_copy(update={"legal_actions": legal})
        )

    def _step_seat(
        self,
        seat: str,
        action: Any,
        rewards: dict[str, float],
        components: dict[str, dict[str, float]],
        own: dict[str, dict[str, Any]],
        done: dict[str, tuple[bool, bool]],
    ) -> None:
        """One AEC step; adds every seat's reward and reward components of the step."""
        env = self.aec
        # components the env reports are accumulated since each seat's last own step
        pending = {a: dict(env.infos[a].get("reward_components", {})) for a in env.agents}
        env.step(action)
        own[seat] = {k: v for k, v in env.infos[seat].items() if k != "reward_components"}
        for a, r in env.rewards.items():
            rewards[a] = rewards.get(a, 0.0) + float(r)
        for a in env.agents:
            base = {} if a == seat else pending.get(a, {})
            mine = components.setdefault(a, {})
            for name, value in env.infos[a].get("reward_components", {}).items():
                delta = value - base.get(name, 0.0)
                if delta:
                    mine[name] = mine.get(name, 0.0) + delta
            done[a] = (bool(env.terminations[a]), bool(env.truncations[a]))

    def _drain_dead(self) -> None:
        """Step finished seats with None so the AEC env removes them (dead-agent convention)."""
        env = self.aec
        while env.agents and (
            env.terminations[env.agent_selection] or env.truncations[env.agent_selection]
        ):
            env.step(None)
