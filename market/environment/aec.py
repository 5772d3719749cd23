"""The PettingZoo AEC environment: a thin orchestrator over the market's core.

A round's turn order is :mod:`market.core.phases` (docs/design.md, section 4): the round's shocks,
exits and entries; the design pass; ``negotiation_turns`` negotiation passes; one bidding pass;
then, inside the last bid's step, clearing, deliveries, execution, rewards, housekeeping and the
next round's start. Every step validates the action atomically: an invalid action changes nothing
but the acting seat's ``invalid_action`` reward and sets ``infos[seat]["error"]`` to what was
wrong and how to fix it; ``step`` never raises on bad input. Dead seats are stepped with ``None``
(PettingZoo's convention). Observations: :mod:`market.environment.observe`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import gymnasium
import numpy as np
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers

from market.core import actions, execution, negotiation, reservations
from market.core import coalitions as coal
from market.core.action_checks import check_action
from market.core.actions import ActionModel, ActionParseError, parse_action
from market.core.arena import ignored_conditions
from market.core.arena_payloads import BlockContext
from market.core.audit import audit_round
from market.core.bidding import RoundOrders
from market.core.claims import with_claims
from market.core.collusion import InteractionGraph
from market.core.judge import JudgeHistory
from market.core.judge_specs import make_judge, make_reader
from market.core.ledger import ActionError
from market.core.lifecycle import admit_entrants, apply_round_shocks, retire_lab
from market.core.mechanisms import Mechanism
from market.core.phases import LEGAL, TALK_ACTIONS, round_schedule
from market.core.rewards import LabComponent, RewardComponent
from market.core.rng import RngStreams
from market.core.round_close import RewardEvent, breach_rewards, close_round
from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER, bidder_seat, lab_index
from market.core.settlement import RoundResult
from market.core.shocks import Shock, apply_schedule, draw_shocks
from market.core.summation import ordered_sum
from market.core.world import World, credit_imbalance, generate_world
from market.environment.conduct_log import ConductLog
from market.environment.digest import StateDigests
from market.environment.observations import Observation
from market.environment.observe import SeatViews
from market.environment.round_log import RoundSummary, render_text, round_summary
from market.environment.seat_flags import SeatFlags, dead_step, first_dead_step
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
        n = self.scenario.n_seats
        self.possible_agents = ([DESIGNER] if self.scenario.designer_seat else []) + [
            bidder_seat(i) for i in range(n)
        ]
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
        self.world: World = generate_world(sc, self.streams.stream("world"))
        shock_rng = self.streams.stream("shocks")
        self.shocks: list[Shock] = draw_shocks(sc, shock_rng)
        apply_schedule(self.world, self.shocks, sc, shock_rng)
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
        info: dict[str, object] = {"round": self.round, "phase": self.phase}
        self.conduct.begin_step()
        try:
            blocks = BlockContext.reader(self.world, agent, self.round)  # GPU-arena block ids
            act = parse_action(action, designer=agent == DESIGNER, blocks=blocks)
            info["action"] = act.action_type
            check_action(act, self.observe(agent), self.scenario.capacity.max_units_per_bid)
            self.conduct.before_action(self.world, agent, act, self.round)
            result = info["result"] = self._apply(agent, act)
            self.conduct.after_action(agent, act, result, self.round, self.results)
            if act.action_type != "wait":
                self._version += 1
            if act.action_type in TALK_ACTIONS:
                self._reward(agent, "talk_cost", -self.scenario.rewards.talk_cost)
        except (ActionParseError, ActionError) as exc:
            info["error"] = str(exc)
            self._reward(agent, "invalid_action", -self.scenario.rewards.invalid_action_penalty)
        self.infos[agent] = info
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
        self._rewards(((agent, component, value),))

    def _rewards(self, events: Iterable[tuple[str, RewardComponent, float]]) -> None:
        """Credit each (seat, component, value); a zero, or a seat without a slot, is skipped."""
        rewards, rewarded, pending_of = self.rewards, self.rewarded, self._pending
        for agent, component, value in events:  # thousands in a round close at scale
            if value == 0.0 or agent not in rewards:
                continue
            rewards[agent] += value
            rewarded.add(agent)
            pending = pending_of[agent]
            pending[component] = pending.get(component, 0.0) + value

    def _lab_reward(self, lab: int, component: LabComponent, credits: float) -> None:
        self._lab_rewards([(lab, component, credits)])

    def _lab_rewards(self, events: Iterable[RewardEvent]) -> None:
        labs, unit = self.world.labs, self.scenario.rewards.value_unit  # seats built at reset
        self._rewards((labs[lab].seat, c, float(credits) / unit) for lab, c, credits in events)

    def seat_seed(self, agent: str) -> int:
        """The seed for the agent in ``agent``'s seat (derived; reveals nothing about the episode seed)."""
        return self.streams.seat_seed(self.possible_agents.index(agent))

    def is_live(self, agent: str) -> bool:
        """Whether ``agent`` has a seat now that is neither terminated nor truncated."""
        return not (self.terminations.get(agent, True) or self.truncations[agent])

    # --- rounds ------------------------------------------------------------------------
    def _start_round(self, r: int) -> None:
        world, sc = self.world, self.scenario
        self.round = r
        self._views.new_round()
        apply_round_shocks(world, self.shocks, r, lambda lab: self._retire(lab, voluntary=False))
        for seat in admit_entrants(world, self.shocks, r):
            self._add_seat(seat)
        for lab in world.labs:
            if lab.active:
                execution.activate_jobs(lab.jobs, r)
        active = [lab.seat for lab in world.labs if lab.active]
        every = sc.rounds_per_design if sc.mechanism_every == "round" else sc.rounds
        designs = sc.designer_seat and r % every == 0
        self.schedule: list[tuple[str, str]] = round_schedule(designs, sc.negotiation_turns, active)
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
        lab = self.world.labs[i]
        self._views.new_round()
        breaches, penalties = retire_lab(
            self.world, self.book, self.coalitions, i, self.round, self.mechanism, voluntary
        )
        self._lab_rewards(e for breach in breaches for e in breach_rewards(breach))
        self._exit_breaches += breaches
        self._lab_rewards((i, "withdrawal_penalty", -penalty) for penalty in penalties)
        delta = ordered_sum(j.potential() for j in lab.jobs) - self._potential[i]
        self._potential[i] += delta
        self._lab_reward(i, "job_value", delta)
        if lab.seat in self.terminations:
            self.terminations[lab.seat] = True

    # --- actions -----------------------------------------------------------------------
    def _apply(self, agent: str, act: ActionModel) -> dict[str, object]:
        if agent == DESIGNER:
            if isinstance(act, actions.SetMechanism):
                # DAEDALUS units: 1 = the highest private value per block (MechanismUpdate)
                scale = self.scenario.jobs.value_per_block[1]
                update, converted = act.mechanism.in_credits(scale, self.scenario.mechanism_units)
                self.mechanism = update.apply_to(self.mechanism)
                if not converted:
                    return {"mechanism": self.mechanism.model_dump()}
                return {
                    "mechanism": self.mechanism.model_dump(),
                    "units": "daedalus",
                    "value_scale": scale,
                    "converted": converted,
                }
            return {}
        me = lab_index(agent)
        world, now, rounds = self.world, self.round, self.scenario.rounds
        match act:
            case actions.SendOffer():
                offer = negotiation.handle_send_offer(world, self.book, me, act, now, rounds)
                return {"offer_id": offer.offer_id, **ignored_conditions(act.conditions)}
            case actions.CounterOffer():
                offer = negotiation.handle_counter(world, self.book, me, act, now, rounds)
                ignored = ignored_conditions(act.conditions)
                return {"offer_id": offer.offer_id, "countered": act.offer_id, **ignored}
            case actions.AcceptOffer():
                offer, contract = negotiation.handle_accept(world, self.book, me, act, now)
                if offer.status == "accepted":
                    self._lab_reward(offer.seller, "trade_balance", offer.price)
                    self._lab_reward(offer.buyer, "trade_balance", -offer.price)
                    self.graph.record_trade(offer.seller, offer.buyer, now)
                    self.conduct.accepted(offer, contract, now)
                return {
                    "offer_id": offer.offer_id,
                    "status": offer.status,
                    "contract_id": contract.contract_id if contract else None,
                }
            case actions.RejectOffer():
                offer = negotiation.handle_reject(self.book, me, act)
                return {"offer_id": offer.offer_id, "status": offer.status}
            case actions.FormCoalition():
                c = coal.handle_form(world, self.coalitions, me, act, now, rounds)
                return {"coalition_id": c.coalition_id}
            case actions.CommitToCoalition():
                c = coal.handle_commit(world, self.coalitions, me, act)
                if c.status == "active":
                    self.graph.record_coalition(c.members, c.coalition_id, now)
                return {"coalition_id": c.coalition_id, "status": c.status}
            case actions.LeaveCoalition():
                c, penalty = coal.handle_leave(world, self.coalitions, me, act, now, self.mechanism)
                self._lab_reward(me, "withdrawal_penalty", -penalty)
                return {"coalition_id": c.coalition_id, "breach_penalty": penalty}
            case actions.SendMessage():
                msg = negotiation.handle_message(world, self.book, me, act, now)
                for other in msg.recipients or ():
                    self.graph.record_private_message(me, other, now)
                return {
                    "delivered_to": "all"
                    if msg.recipients is None
                    else [bidder_seat(i) for i in msg.recipients]
                }
            case actions.MakePitch():
                self.book.pitches[me] = with_claims(
                    negotiation.handle_pitch(world, self.book, me, act, now), act
                )
                return {"pitched": act.blocks_requested}
            case actions.CounterPitch():
                negotiation.handle_counter_pitch(world, self.book, me, act)
                return {"countered": act.target}
            case actions.ReserveCapacity():
                got = reservations.handle_reserve(
                    world, self.book.reserved, self.book.committed, me, act, now, rounds
                )
                return {"reserved": got, "job_id": act.job_id}
            case actions.ReleaseCapacity():
                got = reservations.handle_release(self.book.reserved, me, act, now, rounds)
                return {"released": got}
            case actions.AllocateToJob():
                self.orders.allocate(world, me, act)
                return {"job_id": act.job_id, "blocks": act.blocks}
            case actions.Bid():
                cap = self.scenario.capacity.max_units_per_bid or max(1, int(world.capacity[now]))
                return dict(
                    self.orders.place_bid(world, self.coalitions, self.mechanism, me, act, cap)
                )
            case actions.Finish():
                self._retire(me, voluntary=True)
                return {"finished": True}
        return {}

    # --- clearing, execution, rewards ----------------------------------------------------
    def _end_round(self) -> None:
        self._version += 1
        world, now, sc = self.world, self.round, self.scenario
        close = close_round(self, self._potential)
        self._lab_rewards(close.rewards)
        result, parts = close.result, close.parts
        result.breaches[:0] = self._exit_breaches  # contracts settled when a party left
        self._exit_breaches = []
        for name, value in parts.items():
            self.designer_history[name].append(value)
        if DESIGNER in self.rewards:
            self._reward(DESIGNER, "composite", parts["composite"])
        self.prices.append(result.price)
        self.results.append(result)
        self.round_log.append(
            round_summary(result, parts, close.optimum, close.allocated, self.shocks)
        )
        self.conduct.round_closed(result, self.book.contracts)
        charged = {v.lab for v in result.verdicts if v.false_claims}  # by the committee
        audit_round(world, self.conduct.take_audit(), charged)  # the market's audit
        # housekeeping for the next round
        coal.end_of_round(world, self.coalitions, now)
        negotiation.expire_offers(self.book, now)
        self.book.reserved.end_of_round(world, now)
        self.book.prune()
        self.book.pitches = {}
        self.orders = RoundOrders()
        if (
            now + 1 >= sc.rounds
            or not any(lab.active for lab in world.labs)
            and not (world.entry_round > now).any()
        ):
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
