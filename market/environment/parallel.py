"""The parallel view of the market: one parallel step per pass of the AEC turn order."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import cast

import gymnasium
from pettingzoo import ParallelEnv

from market.core.phases import LEGAL
from market.core.scenario_schema import Scenario
from market.environment.aec import raw_env
from market.environment.observations import Observation
from market.environment.spaces import Info, Options


def pass_seats(env: raw_env) -> list[str]:
    """The live seats still to act in the current pass of ``env``, in AEC order.

    A round's schedule is split into passes where the phase changes or a seat comes round again
    (design pass, each negotiation pass, bidding pass); the current pass is the one holding the
    env's turn, and seats before the turn in it have acted already or are dead.
    """
    if env.phase == "done" or not env.agents:
        return []
    schedule, turn = env.schedule, env.turn
    start, seen = 0, set[str]()
    for k, (seat, phase) in enumerate(schedule):
        if k and (phase != schedule[k - 1][1] or seat in seen):
            if k > turn:
                return [s for s, _ in schedule[turn:k] if env.is_live(s)]
            start, seen = k, set()
        seen.add(seat)
    return [s for s, _ in schedule[max(start, turn) :] if env.is_live(s)]


class ParallelMarketEnv(ParallelEnv):  # type: ignore[misc]  # pettingzoo ships no type hints
    """The market as a PettingZoo ``ParallelEnv``: one ``step`` is one pass over the seats.

    A round is the AEC schedule of docs/design.md, section 4: the design pass (``designer_0``),
    then ``negotiation_turns`` negotiation passes and one bidding pass over the active labs. Each
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
        **overrides: object,
    ) -> None:
        self.aec = raw_env(scenario, render_mode=render_mode, **overrides)
        self.scenario: Scenario = self.aec.scenario
        self.render_mode = render_mode
        self.possible_agents: list[str] = list(self.aec.possible_agents)
        self.observation_spaces = self.aec.observation_spaces
        self.action_spaces = self.aec.action_spaces
        self.agents: list[str] = []
        self._acting: list[str] = []
        self._acting_set: set[str] = set()
        # per-pass accumulators (see step) and the components last seen per seat
        self._rewards: dict[str, float] = {}
        self._components: dict[str, dict[str, float]] = {}
        self._own: dict[str, Info] = {}
        self._done: dict[str, tuple[bool, bool]] = {}
        self._seen_components: dict[str, dict[str, float]] = {}

    # --- PettingZoo surface -------------------------------------------------------------
    def observation_space(self, agent: str) -> gymnasium.spaces.Space[Observation]:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space[str]:
        return self.action_spaces[agent]

    @property
    def acting_agents(self) -> list[str]:
        """The seats whose actions the next ``step`` applies, in order."""
        return list(self._acting)

    def seat_seed(self, agent: str) -> int:
        return self.aec.seat_seed(agent)

    def reset(
        self, seed: int | None = None, options: Options | None = None
    ) -> tuple[dict[str, Observation], dict[str, Info]]:
        self.aec.reset(seed=seed, options=options)
        self._done, self._seen_components = {}, {}
        self._drain_dead()
        self.agents = list(self.aec.agents)
        self._acting = pass_seats(self.aec)
        self._acting_set = set(self._acting)
        info = {"round": self.aec.round, "phase": self.aec.phase}
        return {a: self._observe(a) for a in self.agents}, {a: dict(info) for a in self.agents}

    def step(
        self, actions: Mapping[str, object]
    ) -> tuple[
        dict[str, Observation], dict[str, float], dict[str, bool], dict[str, bool], dict[str, Info]
    ]:
        env = self.aec
        before = list(self.agents)
        self._rewards = dict.fromkeys(before, 0.0)
        self._components = {a: {} for a in before}
        self._own, self._done = {}, {}
        played = {"round": env.round, "phase": env.phase}
        for seat in self._acting:
            if not env.agents or env.agent_selection != seat:
                continue  # cannot happen: a seat only leaves its own pass by acting
            self._step_seat(seat, actions.get(seat))
            self._drain_dead()
        known = set(before)
        keys = before + [a for a in env.agents if a not in known]
        self.agents = list(env.agents)
        self._acting = pass_seats(env)
        self._acting_set = set(self._acting)
        no = (False, False)
        infos = {
            a: {
                **played,
                **self._own.get(a, {}),
                "acted": a in self._own,
                "reward_components": self._components.get(a, {}),
            }
            for a in keys
        }
        return (
            {a: self._observe(a) for a in keys},
            {a: self._rewards.get(a, 0.0) for a in keys},
            {a: self._done.get(a, no)[0] for a in keys},
            {a: self._done.get(a, no)[1] for a in keys},
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
        legal = list(LEGAL[self.aec.phase]) if agent in self._acting_set else []
        return (
            obs if obs.legal_actions == legal else obs.model_copy(update={"legal_actions": legal})
        )

    def _step_seat(self, seat: str, action: object) -> None:
        """One AEC step; adds the step's rewards and reward components to the pass totals.

        The env reports each seat's components accumulated since its own last step, and touches
        only the seats rewarded in a step, so the pass total is the change since last seen.
        """
        env = self.aec
        env.step(action)
        self._own[seat] = {k: v for k, v in env.infos[seat].items() if k != "reward_components"}
        for a in [a for a in env.rewarded if a in env.infos]:  # the seats rewarded this step
            self._rewards[a] = self._rewards.get(a, 0.0) + float(env.rewards[a])
            now = cast(dict[str, float], env.infos[a].get("reward_components", {}))
            base = {} if a == seat else self._seen_components.get(a, {})
            total = self._components.setdefault(a, {})
            for name, value in now.items():
                if delta := value - base.get(name, 0.0):
                    total[name] = total.get(name, 0.0) + delta
            self._seen_components[a] = dict(now)

    def _drain_dead(self) -> None:
        """Step finished seats with None so the AEC env removes them (dead-agent convention)."""
        env = self.aec
        while env.agents:
            agent = env.agent_selection
            done = (bool(env.terminations[agent]), bool(env.truncations[agent]))
            if not any(done):
                return
            self._done[agent] = done
            env.step(None)


def parallel_env(
    scenario: str | Path | Scenario = "market_round",
    render_mode: str | None = None,
    **overrides: object,
) -> ParallelMarketEnv:
    """The parallel view: one parallel step per pass (design, each negotiation pass, bidding)."""
    return ParallelMarketEnv(scenario, render_mode=render_mode, **overrides)
