"""The PettingZoo AEC environment: a thin orchestrator over the market's core.

A round's turn order is :mod:`market.core.phases` (docs/design.md, section 4): the round's shocks,
exits and entries; the design pass; ``negotiation_turns`` negotiation passes; one bidding pass;
then, inside the last bid's step, clearing, deliveries, execution, rewards, housekeeping and the
next round's start. Every step validates the action atomically: an invalid action changes nothing
but the acting seat's ``invalid_action`` reward and sets ``infos[seat]["error"]`` to what was
wrong and how to fix it; ``step`` never raises on bad input. Dead seats are stepped with ``None``
(PettingZoo's convention). The class is a thin adapter: a step's action is taken in
:mod:`market.environment.dispatch`, rewards credited in :mod:`~market.environment.seat_rewards`,
labs enter and leave in :mod:`market.core.lifecycle`, a round closes in
:mod:`~market.core.round_close`; observations: :mod:`market.environment.observe`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import gymnasium
import numpy as np
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers

from market.core import coalitions as coal
from market.core import execution, lifecycle, negotiation
from market.core.actions import ActionModel
from market.core.bidding import RoundOrders
from market.core.collusion import InteractionGraph
from market.core.judge import JudgeHistory
from market.core.judge_specs import make_judge, make_reader
from market.core.mechanisms import Mechanism
from market.core.phases import LEGAL, TALK_ACTIONS, round_turns
from market.core.rewards import RewardComponent
from market.core.rng import RngStreams
from market.core.round_close import RewardEvent, close_round, episode_over, housekeep
from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER, lab_index, seat_names
from market.core.settlement import RoundResult
from market.core.shocks import draw_market
from market.core.summation import ordered_sum
from market.core.world import credit_imbalance
from market.environment.conduct_log import ConductLog
from market.environment.digest import StateDigests
from market.environment.dispatch import apply_designer_action, apply_lab_action, take_action
from market.environment.observations import Observation
from market.environment.observe import SeatViews
from market.environment.round_log import RoundSummary, record_round, render_text
from market.environment.seat_flags import SeatFlags, dead_step, first_dead_step
from market.environment.seat_rewards import credit, seat_events
from market.environment.spaces import ObservationSpace, seed_action_spaces, text_action_spaces
from scenarios import load_scenario

__all__ = ["DESIGNER", "LEGAL", "TALK_ACTIONS", "ObservationSpace", "env", "raw_env"]
RENDER_MODES = ["ansi", "human"]


class raw_env(AECEnv):  # type: ignore[misc]  # pettingzoo ships no type hints
    """The GPU market as a PettingZoo AEC environment. See the module docstring.

    Public state (read it, do not write it): ``world``, ``book`` (offers, contracts, messages,
    pitches), ``coalitions``, ``graph`` (interactions), ``mechanism``, ``orders`` (this round's
    bids and job plans), ``results``, ``prices``, ``round_log``, ``designer_history``, ``round``,
    ``phase``, ``schedule`` (the round's (seat, phase) turns), ``turn`` (an index into it),
    ``rewarded`` (the seats the last step credited; a dead step zeroes and empties it) and
    ``conduct`` (the conduct judge's log: :mod:`market.environment.conduct_log`; never part of
    an observation).
    """

    metadata = {"name": "gpumarket_v0", "render_modes": RENDER_MODES, "is_parallelizable": False}

    def __init__(
        self,
        scenario: str | Path | Scenario = "market_round",
        render_mode: str | None = None,
        **overrides: object,
    ) -> None:
        super().__init__()
        self.scenario: Scenario = load_scenario(scenario, **overrides)
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(
                f"render_mode must be one of {RENDER_MODES} or None, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.possible_agents = seat_names(self.scenario.n_seats, self.scenario.designer_seat)
        self.observation_spaces = {a: ObservationSpace(a) for a in self.possible_agents}
        self.action_spaces = text_action_spaces(self.possible_agents)
        self._judge_spec: tuple[str, str] | None = None
        self._digests = StateDigests()

    # --- PettingZoo surface -------------------------------------------------------------
    def observation_space(self, agent: str) -> gymnasium.spaces.Space[Observation]:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space[str]:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, object] | None = None) -> None:
        sc = self.scenario
        seed_action_spaces(self.action_spaces, self.possible_agents, seed)
        self.streams = RngStreams(seed)
        self.world, self.shocks = draw_market(sc, self.streams)  # the world's, the shocks' draws
        self.book = negotiation.Book(delivery=sc.delivery)
        self.coalitions = coal.CoalitionBook()
        self.graph = InteractionGraph(sc.n_seats)
        if self._judge_spec != (sc.judge, sc.conduct_judge):  # keep LLM judges' caches
            self.judge, self._reader = make_judge(sc.judge), make_reader(sc.conduct_judge)
            self._judge_spec = (sc.judge, sc.conduct_judge)
        self.judge_history = JudgeHistory()
        self.conduct = ConductLog(self._reader)  # claims, promises, manipulation (transcripts)
        self.mechanism: Mechanism = sc.mechanism
        self._views = SeatViews()
        self._version = 0
        self.round = 0
        self.phase = "design"
        self.results: list[RoundResult] = []
        self.round_log: list[RoundSummary] = []
        self.designer_history: dict[str, list[float]] = defaultdict(list)
        self.prices: list[float] = []
        self.orders = RoundOrders()
        self._potential = np.zeros(sc.n_seats)
        self._exit_breaches: list[execution.Breach] = []  # logged with the round's summary
        self.initial_credits = ordered_sum(lab.budget for lab in self.world.labs)
        self.agents = [DESIGNER] if sc.designer_seat else []
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = SeatFlags()  # knows if a seat may be dead
        self.truncations: dict[str, bool] = SeatFlags()
        self.infos: dict[str, dict[str, object]] = {}
        self._pending: dict[str, dict[str, float]] = {}
        self.rewarded: set[str] = set()
        if sc.designer_seat:
            self._add_seat(DESIGNER)
        self._skip_agent_selection = None
        self._start_round(0)
        if not self.schedule:  # else _start_round chose the first seat to act
            self.agent_selection = self.agents[0] if self.agents else ""
        if self.render_mode == "human":
            self.render()

    def observe(self, agent: str) -> Observation:
        # rebuilt only when what the seat can see may have changed: treat it as read-only
        acting = self.agent_selection == agent and self.is_live(agent)
        return self._views.observe(self, agent, self._version, acting)

    def step(self, action: object) -> None:
        agent = self.agent_selection
        if self.terminations.get(agent) or self.truncations.get(agent):
            dead_step(self)  # PettingZoo's _was_dead_step; any action is ignored
            return
        self._cumulative_rewards[agent] = 0.0
        self._pending[agent] = {}
        # only seats that got something this step are touched: O(1) per step, not O(labs)
        for a in self.rewarded:
            if a in self.rewards:
                self.rewards[a] = 0.0
        self.rewarded = {agent}
        out = take_action(self, agent, action, self._apply)
        if out.changed:
            self._version += 1
        if out.charge is not None:
            self._reward(agent, *out.charge)
        self.infos[agent] = out.info
        self._advance()
        for seat, component, cost in self.conduct.penalties(self.scenario.rewards):
            self._reward(seat, component, -cost)  # rewards.conduct on: docs/conduct.md
        for a in self.rewarded:
            if a in self.infos:
                self.infos[a]["reward_components"] = dict(self._pending[a])
                self._cumulative_rewards[a] += self.rewards[a]
        first_dead_step(self)  # PettingZoo's _deads_step_first, without an O(seats) scan
        if self.render_mode == "human":
            self.render()

    def render(self) -> str | None:
        text = render_text(self) if hasattr(self, "world") else "gpumarket: call reset() first"
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        pass

    # --- seats -------------------------------------------------------------------------
    def _add_seat(self, agent: str) -> None:
        if agent not in self.agents:
            self.agents.append(agent)
        self.rewards[agent] = 0.0
        self._cumulative_rewards[agent] = 0.0
        self.terminations[agent] = False
        self.truncations[agent] = False
        self.infos[agent] = {"reward_components": {}}
        self._pending[agent] = {}

    def _reward(self, agent: str, component: RewardComponent, value: float) -> None:
        credit(self.rewards, self.rewarded, self._pending, ((agent, component, value),))

    def _lab_rewards(self, events: Iterable[RewardEvent]) -> None:
        labs, unit = self.world.labs, self.scenario.rewards.value_unit  # seats built at reset
        credit(self.rewards, self.rewarded, self._pending, seat_events(labs, unit, events))

    def seat_seed(self, agent: str) -> int:
        """The seed for the agent in ``agent``'s seat (derived; reveals nothing about the episode seed)."""
        return self.streams.seat_seed(self.possible_agents.index(agent))

    def is_live(self, agent: str) -> bool:
        """Whether ``agent`` has a seat now that is neither terminated nor truncated."""
        return not (self.terminations.get(agent, True) or self.truncations[agent])

    # --- rounds ------------------------------------------------------------------------
    def _start_round(self, r: int) -> None:
        world, self.round = self.world, r
        self._views.new_round()
        lifecycle.apply_round_shocks(world, self.shocks, r, lambda i: self._retire(i, False))
        for seat in lifecycle.admit_entrants(world, self.shocks, r):
            self._add_seat(seat)
        lifecycle.start_jobs(world, r)
        active = [lab.seat for lab in world.labs if lab.active]
        self.schedule: list[tuple[str, str]] = round_turns(self.scenario, r, active)
        self.turn = 0
        self._skip_to_live()

    def _skip_to_live(self) -> None:
        while self.turn < len(self.schedule) and not self.is_live(self.schedule[self.turn][0]):
            self.turn += 1
        if self.turn < len(self.schedule):
            self.agent_selection, self.phase = self.schedule[self.turn]

    def _advance(self) -> None:
        self.turn += 1
        self._skip_to_live()
        while self.turn >= len(self.schedule):
            self._end_round()
            if self.phase == "done":
                return
            self._start_round(self.round + 1)

    def _retire(self, i: int, voluntary: bool) -> None:
        """A lab leaves (finish or exit shock): live jobs settle now, offers void, pools refund."""
        self._views.new_round()
        breaches, penalties = lifecycle.retire_lab(
            self.world, self.book, self.coalitions, i, self.round, self.mechanism, voluntary
        )
        self._exit_breaches += breaches
        events = lifecycle.retirement_rewards(self.world, i, breaches, penalties, self._potential)
        self._lab_rewards(events)
        if (seat := self.world.labs[i].seat) in self.terminations:
            self.terminations[seat] = True

    # --- actions, the round's close ---------------------------------------------------
    def _apply(self, agent: str, act: ActionModel) -> dict[str, object]:
        if agent != DESIGNER:
            return apply_lab_action(self, lab_index(agent), act, self._lab_rewards, self._retire)
        self.mechanism, result = apply_designer_action(self.mechanism, act, self.scenario)
        return result

    def _end_round(self) -> None:
        self._version += 1
        close = close_round(self, self._potential)
        self._lab_rewards(close.rewards)
        close.result.breaches[:0] = self._exit_breaches  # contracts settled when a party left
        self._exit_breaches = []
        if DESIGNER in self.rewards:
            self._reward(DESIGNER, "composite", close.parts["composite"])
        record_round(self, close)
        housekeep(self.world, self.coalitions, self.book, self.round)  # for the next round
        self.orders = RoundOrders()
        if episode_over(self.world, self.round, self.scenario.rounds):
            self._finish_episode()

    def _finish_episode(self) -> None:
        for i, lab in enumerate(self.world.labs):
            if lab.active:
                self._retire(i, voluntary=False)
        for agent in self.agents:
            self.terminations[agent] = True
        self.phase = "done"
        self.schedule, self.turn = [], 0

    # --- audits (used by tests and the transcript's state digest) --------------------------
    def credit_balance(self) -> float:
        """Credits unaccounted for (:func:`~market.core.world.credit_imbalance`): 0 if conserved."""
        return credit_imbalance(self.world, self.coalitions.escrow(), self.initial_credits)

    def state_digest(self) -> str:
        """SHA-256 (hex) of the market state and the turn, for transcripts and replay (see
        :mod:`market.environment.digest`)."""
        return self._digests.digest(self, self._version, self._potential)


def env(
    scenario: str | Path | Scenario = "market_round",
    render_mode: str | None = None,
    **overrides: object,
) -> AECEnv:
    """The AEC env wrapped in PettingZoo's order-enforcing wrapper."""
    return wrappers.OrderEnforcingWrapper(raw_env(scenario, render_mode=render_mode, **overrides))
