"""The PettingZoo AEC environment: a thin orchestrator over the market modules.

A round, in turn order (docs/design.md, section 4):
1. budget shocks, exits and entries of the round apply; arrived jobs become active;
2. ``designer_0`` sets the mechanism (when the scenario gives the designer a seat);
3. ``negotiation_turns`` passes over the active labs (offers, coalitions, messages, pitches...);
4. one bidding pass over the active labs;
5. clearing, 6. contract deliveries, 7. execution, 8. rewards for every seat, 9. housekeeping,
   10. the next round's start — all inside the last bid's step.

Every step validates the action atomically: an invalid action changes nothing but the acting
seat's ``invalid_action`` reward and sets ``infos[seat]["error"]`` to what was wrong and how to
fix it. ``step`` never raises on bad input. Terminated seats are skipped per PettingZoo's
dead-agent convention (step them with ``None``).
"""

from __future__ import annotations

import hashlib
import math
import string
from collections import defaultdict
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from gymnasium.spaces import Text
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers

from agents.llm.judge import make_judge
from market.core import coalitions as coal
from market.core import execution, ledger, negotiation
from market.core.actions import (
    AcceptOffer,
    ActionParseError,
    AllocateToJob,
    Bid,
    CommitToCoalition,
    CounterOffer,
    CounterPitch,
    Finish,
    FormCoalition,
    LeaveCoalition,
    MakePitch,
    RejectOffer,
    SendMessage,
    SendOffer,
    SetMechanism,
    parse_action,
)
from market.core.collusion import SUSPECTED, InteractionGraph
from market.core.judge import JudgeHistory, with_claims
from market.core.ledger import ActionError
from market.core.mechanisms import Mechanism
from market.core.rewards import (
    bid_distribution,
    designer_composite,
    gini,
    optimal_welfare,
    stability,
)
from market.core.rng import RngStreams
from market.core.settlement import BidEntry, RoundResult, clear_round
from market.core.shocks import Shock, apply_schedule, draw_shocks
from market.core.world import World, generate_world
from market.environment.observations import (
    CoalitionView,
    ContractView,
    DesignerStats,
    JobView,
    MarketResultView,
    MechanismView,
    MessageView,
    Observation,
    OfferView,
    PitchView,
    ShockView,
    fast_model,
)
from scenarios import load_scenario
from scenarios.schema import Scenario

DESIGNER = "designer_0"
TALK_ACTIONS = frozenset({"send_offer", "counter_offer", "form_coalition", "send_message", "make_pitch", "counter_pitch"})
LEGAL: dict[str, tuple[str, ...]] = {
    "design": ("set_mechanism", "wait"),
    "negotiation": (
        "send_offer", "counter_offer", "accept_offer", "reject_offer", "form_coalition",
        "commit_to_coalition", "leave_coalition", "send_message", "make_pitch", "counter_pitch",
        "allocate_to_job", "wait", "finish",
    ),
    "bidding": ("bid", "allocate_to_job", "wait", "finish"),
    "done": (),
}
_NO_LOTTERY = np.random.Generator(np.random.PCG64(0))  # never drawn from (see _end_round)
ACTION_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "


class ObservationSpace(gymnasium.spaces.Space):
    """The space of :class:`~market.environment.observations.Observation` objects for one seat.

    Observations are structured (pydantic); RL users get fixed-size vectors and masks from
    :mod:`market.environment.wrappers`.
    """

    def __init__(self, seat: str) -> None:
        super().__init__(shape=None, dtype=None)
        self.seat = seat

    def contains(self, x: Any) -> bool:
        return isinstance(x, Observation) and x.seat == self.seat

    def sample(self, mask: Any = None, probability: Any = None) -> Observation:
        raise NotImplementedError(
            "observations are structured market states and cannot be sampled; "
            "use env.observe(agent) or the vector wrapper in market.environment.wrappers"
        )

    def __eq__(self, other: object) -> bool:
        # every seat observes the same structure; ``contains`` also checks the seat
        return isinstance(other, ObservationSpace)

    def __hash__(self) -> int:
        return hash(ObservationSpace)

    def __repr__(self) -> str:
        return f"ObservationSpace({self.seat!r})"


class raw_env(AECEnv):
    """The GPU market as a PettingZoo AEC environment. See the module docstring."""

    metadata = {"name": "gpumarket_v0", "render_modes": ["ansi", "human"], "is_parallelizable": False}

    def __init__(self, scenario: str | Path | Scenario = "market_round", render_mode: str | None = None, **overrides: Any) -> None:
        super().__init__()
        self.scenario: Scenario = load_scenario(scenario, **overrides)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.render_mode = render_mode
        n = self.scenario.n_seats
        self.possible_agents = ([DESIGNER] if self.scenario.designer_seat else []) + [f"bidder_{i}" for i in range(n)]
        self.observation_spaces = {a: ObservationSpace(a) for a in self.possible_agents}
        # seeded per seat so that seats entering mid-episode also sample reproducibly
        self.action_spaces = {a: Text(max_length=200, min_length=0, charset=ACTION_CHARSET, seed=k)
                              for k, a in enumerate(self.possible_agents)}
        self._seed: int | None = None

    # --- PettingZoo surface -------------------------------------------------------------
    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        sc = self.scenario
        if seed is not None:  # seats entering mid-episode must sample reproducibly too (seed_test)
            for i, a in enumerate(self.possible_agents):
                self.action_spaces[a].seed(int(np.random.SeedSequence([seed, 7, i]).generate_state(1)[0]))
        self.streams = RngStreams(seed)
        self.world: World = generate_world(sc, self.streams.stream("world"))
        shock_rng = self.streams.stream("shocks")
        self.shocks: list[Shock] = draw_shocks(sc, shock_rng)
        apply_schedule(self.world, self.shocks, sc, shock_rng)
        self.book = negotiation.Book()
        self.coalitions = coal.CoalitionBook()
        self.graph = InteractionGraph(sc.n_seats)
        if getattr(self, "_judge_spec", None) != sc.judge:  # keep an LLM judge's cache across resets
            self.judge, self._judge_spec = make_judge(sc.judge), sc.judge
        self.judge_history = JudgeHistory()
        self.mechanism: Mechanism = sc.mechanism
        self._mech_views: dict[bool, tuple[Mechanism, MechanismView]] = {}
        self._obs_cache: dict[str, tuple[tuple[int, str, bool], Observation]] = {}
        self._version = 0
        self.round = 0
        self.phase = "design"
        self.results: list[RoundResult] = []
        self.round_log: list[dict[str, Any]] = []
        self.designer_history: dict[str, list[float]] = defaultdict(list)
        self._prices: list[float] = []
        self._bids: dict[int, BidEntry] = {}
        self._coalition_bids: dict[str, BidEntry] = {}
        self._plans: dict[int, dict[str, int]] = {}
        self._potential = np.zeros(sc.n_seats)
        self._initial_credits = sum(lab.budget for lab in self.world.labs)
        self.agents = [DESIGNER] if sc.designer_seat else []
        self.rewards, self._cumulative_rewards = {}, {}
        self.terminations, self.truncations, self.infos = {}, {}, {}
        self._pending: dict[str, dict[str, float]] = {}
        self._rewarded: set[str] = set()
        if sc.designer_seat:
            self._add_seat(DESIGNER)
        self._skip_agent_selection = None
        self._start_round(0)
        self.agent_selection = self._schedule[self._turn] if self._schedule else (self.agents[0] if self.agents else "")
        if self.render_mode == "human":
            self.render()

    def observe(self, agent: str) -> Observation:
        # Observations are rebuilt only when the state a seat can see may have changed: after any
        # valid action other than wait, and at round boundaries. Treat them as read-only.
        key = (self._version, self.phase, self.agent_selection == agent and self._live(agent))
        cached = self._obs_cache.get(agent)
        if cached is not None and cached[0] == key:
            return cached[1]
        obs = self._observation(agent)
        self._obs_cache[agent] = (key, obs)
        return obs

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations.get(agent) or self.truncations.get(agent):
            self._was_dead_step(None)  # any action from a dead seat is ignored
            return
        self._cumulative_rewards[agent] = 0.0
        self._pending[agent] = {}
        # rewards/infos are touched only for seats that got something this step: O(1) per step
        # in a market of thousands of labs, not O(labs)
        for a in self._rewarded:
            if a in self.rewards:
                self.rewards[a] = 0.0
        self._rewarded = {agent}
        info: dict[str, Any] = {"round": self.round, "phase": self.phase}
        try:
            act = parse_action(action, designer=agent == DESIGNER)
            if act.agent is not None and act.agent != agent:
                raise ActionError(f"this action is addressed to {act.agent!r} but it is {agent}'s turn; drop 'agent' or set it to {agent!r}")
            legal = LEGAL[self.phase]
            if act.action_type not in legal:
                raise ActionError(f"{act.action_type} is not allowed in the {self.phase} phase; legal now: {', '.join(legal)}")
            info["action"] = act.action_type
            info["result"] = self._apply(agent, act)
            if act.action_type != "wait":
                self._version += 1
            if act.action_type in TALK_ACTIONS:
                self._reward(agent, "talk_cost", -self.scenario.rewards.talk_cost)
        except (ActionParseError, ActionError) as exc:
            info["error"] = str(exc)
            self._reward(agent, "invalid_action", -self.scenario.rewards.invalid_action_penalty)
        self.infos[agent] = info
        self._advance()
        for a in self._rewarded:
            if a in self.infos:
                self.infos[a]["reward_components"] = dict(self._pending[a])
                self._cumulative_rewards[a] += self.rewards[a]
        self._deads_step_first()
        if self.render_mode == "human":
            self.render()

    def render(self) -> str | None:
        text = self._render_text()
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

    def _reward(self, agent: str, component: str, value: float) -> None:
        if agent not in self.rewards or value == 0.0:
            return
        self.rewards[agent] += value
        self._rewarded.add(agent)
        pending = self._pending[agent]
        pending[component] = pending.get(component, 0.0) + value

    def _clear_rewards(self) -> None:
        for agent in self.rewards:  # PettingZoo's version (used by dead steps) writes int 0
            self.rewards[agent] = 0.0

    def _lab_reward(self, lab: int, component: str, credits: float) -> None:
        self._reward(f"bidder_{lab}", component, float(credits) / self.scenario.rewards.value_unit)

    def seat_seed(self, agent: str) -> int:
        """The seed for the agent in ``agent``'s seat (derived; reveals nothing about the episode seed)."""
        return self.streams.seat_seed(self.possible_agents.index(agent))

    def _live(self, agent: str) -> bool:
        return agent in self.terminations and not self.terminations[agent] and not self.truncations[agent]

    # --- rounds ------------------------------------------------------------------------
    def _start_round(self, r: int) -> None:
        world = self.world
        self.round = r
        self._round_cache: dict[Any, Any] = {}
        for shock in self.shocks:
            if shock.round != r or shock.target is None:
                continue
            lab = world.labs[shock.target]
            if shock.kind == "budget_cut" and lab.active:
                ledger.burn_credits(world, shock.target, lab.budget * min(1.0, shock.magnitude))
            elif shock.kind == "windfall" and lab.active:
                ledger.mint_credits(world, shock.target, shock.magnitude)
            elif shock.kind == "lab_exit" and lab.active:
                self._retire(shock.target, voluntary=False)
        for i, lab in enumerate(world.labs):
            if world.entry_round[i] == r and not lab.entered and not any(
                s.kind == "lab_exit" and s.target == i and s.round <= r for s in self.shocks
            ):
                lab.entered = lab.active = True
                self._add_seat(lab.seat)
            if lab.active:
                execution.activate_jobs(lab.jobs, r)
        active = [lab.seat for lab in world.labs if lab.active]
        schedule: list[tuple[str, str]] = []
        if self.scenario.designer_seat and (self.scenario.mechanism_every == "round" or r == 0):
            schedule.append((DESIGNER, "design"))
        for _ in range(self.scenario.negotiation_turns):
            schedule += [(a, "negotiation") for a in active]
        schedule += [(a, "bidding") for a in active]
        self._schedule_full = schedule
        self._schedule = [a for a, _ in schedule]
        self._turn = 0
        self._skip_to_live()

    def _skip_to_live(self) -> None:
        while self._turn < len(self._schedule) and not self._live(self._schedule[self._turn]):
            self._turn += 1
        if self._turn < len(self._schedule):
            self.phase = self._schedule_full[self._turn][1]
            self.agent_selection = self._schedule[self._turn]

    def _advance(self) -> None:
        self._turn += 1
        self._skip_to_live()
        while self._turn >= len(self._schedule):
            self._end_round()
            if self.phase == "done":
                return
            self._start_round(self.round + 1)

    def _retire(self, lab_index: int, voluntary: bool) -> None:
        """A lab leaves (finish or exit shock): live jobs settle now, offers void, pools refund."""
        lab = self.world.labs[lab_index]
        lab.active = False
        lab.exit_round = self.round
        self._round_cache = {}
        for job in lab.jobs:
            if job.status == "active":
                job.status = "expired"
                job.realized = job.unit_value * job.progress if job.partial_credit else 0.0
        negotiation.void_offers_of(self.book, lab_index)
        # forward contracts it sold settle now, while its seat can still be charged: it delivers
        # what it holds for the delivery round and is in breach for the rest (as at delivery)
        for contract in self.book.contracts:
            if contract.seller == lab_index and contract.delivered < 0:
                breach = execution.deliver_contract(self.world, contract, self.mechanism.withdrawal_penalty)
                if breach is not None:
                    self._record_breach(breach)
        for c in list(self.coalitions.of(lab_index)):
            _, penalty = coal.handle_leave(
                self.world, self.coalitions, lab_index, LeaveCoalition(coalition_id=c.coalition_id),
                self.round, self.mechanism, forced=not voluntary,
            )
            self._lab_reward(lab_index, "withdrawal_penalty", -penalty)
        delta = sum(j.potential() for j in lab.jobs) - self._potential[lab_index]
        self._potential[lab_index] += delta
        self._lab_reward(lab_index, "job_value", delta)
        if lab.seat in self.terminations:
            self.terminations[lab.seat] = True

    def _record_breach(self, breach: execution.Breach) -> None:
        self._lab_reward(breach.contract.seller, "withdrawal_penalty", -breach.penalty)
        self._lab_reward(breach.contract.seller, "trade_balance", -breach.refund)
        self._lab_reward(breach.contract.buyer, "trade_balance", breach.refund)

    # --- actions -----------------------------------------------------------------------
    def _apply(self, agent: str, act: Any) -> dict[str, Any]:
        if agent == DESIGNER:
            if isinstance(act, SetMechanism):
                self.mechanism = act.mechanism.apply_to(self.mechanism)
                return {"mechanism": self.mechanism.model_dump()}
            return {}
        me = int(agent[7:])
        world, now, rounds = self.world, self.round, self.scenario.rounds
        match act:
            case SendOffer():
                offer = negotiation.handle_send_offer(world, self.book, me, act, now, rounds)
                return {"offer_id": offer.offer_id}
            case CounterOffer():
                offer = negotiation.handle_counter(world, self.book, me, act, now, rounds)
                return {"offer_id": offer.offer_id, "countered": act.offer_id}
            case AcceptOffer():
                offer, contract = negotiation.handle_accept(world, self.book, me, act, now)
                if offer.status == "accepted":
                    self._lab_reward(offer.seller, "trade_balance", offer.price)
                    self._lab_reward(offer.buyer, "trade_balance", -offer.price)
                    self.graph.record_trade(offer.seller, offer.buyer, now)
                return {"offer_id": offer.offer_id, "status": offer.status,
                        "contract_id": contract.contract_id if contract else None}
            case RejectOffer():
                offer = negotiation.handle_reject(self.book, me, act)
                return {"offer_id": offer.offer_id, "status": offer.status}
            case FormCoalition():
                c = coal.handle_form(world, self.coalitions, me, act, now, rounds)
                return {"coalition_id": c.coalition_id}
            case CommitToCoalition():
                c = coal.handle_commit(world, self.coalitions, me, act)
                if c.status == "active":
                    self.graph.record_coalition(c.members, c.coalition_id, now)
                return {"coalition_id": c.coalition_id, "status": c.status}
            case LeaveCoalition():
                c, penalty = coal.handle_leave(world, self.coalitions, me, act, now, self.mechanism)
                self._lab_reward(me, "withdrawal_penalty", -penalty)
                return {"coalition_id": c.coalition_id, "breach_penalty": penalty}
            case SendMessage():
                msg = negotiation.handle_message(world, self.book, me, act, now)
                for other in msg.recipients or ():
                    self.graph.record_private_message(me, other, now)
                return {"delivered_to": "all" if msg.recipients is None else [f"bidder_{i}" for i in msg.recipients]}
            case MakePitch():
                self.book.pitches[me] = with_claims(negotiation.handle_pitch(world, self.book, me, act, now), act)
                return {"pitched": act.blocks_requested}
            case CounterPitch():
                negotiation.handle_counter_pitch(world, self.book, me, act)
                return {"countered": act.target}
            case AllocateToJob():
                self._check_allocation(me, act)
                self._plans.setdefault(me, {})[act.job_id] = act.blocks
                return {"job_id": act.job_id, "blocks": act.blocks}
            case Bid():
                return self._place_bid(me, act)
            case Finish():
                self._retire(me, voluntary=True)
                return {"finished": True}
        return {}

    def _check_allocation(self, me: int, act: AllocateToJob) -> None:
        job = next((j for j in self.world.labs[me].jobs if j.job_id == act.job_id and j.status != "pending"), None)
        if job is None:
            raise ActionError(f"job_id {act.job_id!r} is not one of your jobs; use a job_id from your jobs")
        if job.status != "active":
            raise ActionError(f"job {act.job_id} is {job.status}; allocate blocks to an active job")
        if act.blocks > job.remaining:
            raise ActionError(f"job {act.job_id} needs only {job.remaining} more block(s); allocate at most that")

    def _place_bid(self, me: int, act: Bid) -> dict[str, Any]:
        cap = self.scenario.capacity.max_units_per_bid or max(1, int(self.world.capacity[self.round]))
        if len(act.bids) > cap:
            raise ActionError(f"{len(act.bids)} unit bids exceed the limit of {cap} this round; bid for at most {cap} blocks")
        total = float(sum(act.bids))
        if act.coalition_id is None:
            budget = self.world.labs[me].budget
            if total > budget + 1e-9:
                raise ActionError(f"your bids add up to {total:.2f} credits but you have {budget:.2f}; bid less so you can pay for every block you might win")
            self._bids[me] = BidEntry(me, list(act.bids))
            return {"units": len(act.bids)}
        c = self.coalitions.coalitions.get(act.coalition_id)
        if c is None or c.status != "active" or me not in c.members:
            raise ActionError(f"{act.coalition_id!r} is not an active coalition you belong to")
        if c.leader != me:
            raise ActionError(f"only the leader bidder_{c.leader} bids for {c.coalition_id}")
        if self.mechanism.coalition_policy == "restrict":
            raise ActionError("the coalition policy is 'restrict': joint bids are forbidden; bid for yourself")
        if total > c.pool + 1e-9:
            raise ActionError(f"the bids add up to {total:.2f} but the pool of {c.coalition_id} holds {c.pool:.2f}")
        self._coalition_bids[c.coalition_id] = BidEntry(me, list(act.bids), c.coalition_id)
        return {"units": len(act.bids), "coalition_id": c.coalition_id}

    # --- clearing, execution, rewards ----------------------------------------------------
    def _end_round(self) -> None:
        self._version += 1
        world, now, sc = self.world, self.round, self.scenario
        active = [i for i, lab in enumerate(world.labs) if lab.active]
        reliability = float(world.reliability[now])
        blocks_total = int(world.capacity[now]) + int(world.holdings[active, now].sum()) if active else 0
        entries = [self._bids[i] for i in sorted(self._bids) if world.labs[i].active]
        entries += [e for cid, e in sorted(self._coalition_bids.items())
                    if self.coalitions.coalitions[cid].status == "active"]
        # One generator per round: the tie-break priority is drawn first (a fixed number of
        # draws), then execution failures, so neither depends on what agents did.
        round_rng = self.streams.stream("clearing", now)
        priority = round_rng.permutation(len(world.labs))
        # only posted_price draws a lottery; skip building its generator otherwise
        lottery = self.streams.stream("clearing", now, 1) if self.mechanism.auction_type == "posted_price" else _NO_LOTTERY
        result = clear_round(world, self.book, self.coalitions, self.graph, entries, self.mechanism, now,
                             priority, lottery, self.judge, self.judge_history)
        for lab, paid in result.paid.items():
            self._lab_reward(lab, "auction_payments", -paid)
        for lab, penalty in result.shill.items():
            self._lab_reward(lab, "shill_penalty", -penalty)
        for lab, penalty in result.collusion.items():
            self._lab_reward(lab, "collusion_penalty", -penalty)
        for breach in execution.settle_contracts(world, self.book, now, self.mechanism.withdrawal_penalty):
            self._record_breach(breach)
        # optimal welfare over every live runnable job's remaining units, before execution
        unit_values, remaining, owners = [], [], []
        allocated_value = np.zeros(len(world.labs))
        assignments = {}
        held = world.holdings[:, now].tolist()
        for i in active:
            jobs = world.labs[i].jobs
            for job in jobs:
                if job.status == "active" and job.min_reliability <= reliability and job.progress < job.size:
                    unit_values.append(job.value / job.size)
                    remaining.append(job.size - job.progress)
                    owners.append(i)
            if held[i] > 0:
                assignment = execution.assign_blocks(jobs, held[i], self._plans.get(i, {}), reliability)
                if assignment:
                    assignments[i] = assignment
                    allocated_value[i] = sum(job.unit_value * n for job, n in assignment)
        uv, rem, own = np.array(unit_values), np.array(remaining, dtype=np.int64), np.array(owners, dtype=np.int64)
        optimum = optimal_welfare(uv, rem, blocks_total)
        max_used = max((sum(n for _, n in a) for a in assignments.values()), default=0)
        if max_used:
            ok = execution.failure_draws(round_rng, len(world.labs), max_used, reliability)
            for i, assignment in assignments.items():
                execution.run_blocks(assignment, ok[i])
        for i in active:  # retired labs settled their potential when they left
            jobs = world.labs[i].jobs
            execution.settle_jobs(jobs, now)
            value = sum(j.potential() for j in jobs)
            self._lab_reward(i, "job_value", value - self._potential[i])
            self._potential[i] = value
        # designer's composite
        satisfaction = self._satisfaction(active, allocated_value, uv, rem, own, blocks_total)
        bidders = {e.lab for e in entries if e.bids}
        for e in entries:
            if e.coalition_id is not None and e.bids:
                bidders.update(self.coalitions.coalitions[e.coalition_id].members)
        demanders = set(own.tolist())
        allocated = math.fsum(allocated_value.tolist())  # exact: order-free
        parts = {
            "welfare_ratio": 1.0 if optimum <= 0 else min(1.0, allocated / optimum),
            "fairness": 1.0 - gini(np.array(satisfaction)),
            # share of the labs that still need blocks who bid (alone or through a coalition)
            "participation": len(bidders & demanders) / len(demanders) if demanders else 1.0,
            "stability": stability(result.price, self._prices[-1] if self._prices else None),
            "revenue": result.revenue / max(1.0, result.capacity * sc.rewards.value_unit),
        }
        parts["composite"] = designer_composite(
            parts["welfare_ratio"], parts["fairness"], parts["participation"], parts["stability"],
            dict(sc.rewards.designer_weights), parts["revenue"], sc.rewards.designer_revenue_weight,
        )
        for name, value in parts.items():
            self.designer_history[name].append(value)
        if DESIGNER in self.rewards:
            self._reward(DESIGNER, "composite", parts["composite"])
        self._prices.append(result.price)
        self.results.append(result)
        self.round_log.append(self._summary(result, parts, optimum, allocated))
        # housekeeping for the next round
        coal.end_of_round(world, self.coalitions, now)
        negotiation.expire_offers(self.book, now)
        self.book.prune()
        self.book.pitches = {}
        self._bids, self._coalition_bids, self._plans = {}, {}, {}
        if now + 1 >= sc.rounds or not any(lab.active for lab in world.labs) and not (world.entry_round > now).any():
            self._finish_episode()

    @staticmethod
    def _satisfaction(active: list[int], allocated: np.ndarray, uv: np.ndarray, rem: np.ndarray,
                      own: np.ndarray, blocks: int) -> np.ndarray:
        """Each lab's allocated value over the most its jobs could use of this round's blocks."""
        n = len(allocated)
        demand = np.bincount(own, weights=rem, minlength=n) if own.size else np.zeros(n)
        best = np.bincount(own, weights=uv * rem, minlength=n) if own.size else np.zeros(n)
        for i in np.flatnonzero(demand > blocks):  # rare: one lab could absorb every block
            best[i] = optimal_welfare(uv[own == i], rem[own == i], blocks)
        labs = [i for i in active if best[i] > 0]
        return allocated[labs] / best[labs]

    def _finish_episode(self) -> None:
        for i, lab in enumerate(self.world.labs):
            if lab.active:
                self._retire(i, voluntary=False)
        for agent in self.agents:
            self.terminations[agent] = True
        self.phase = "done"
        self._schedule, self._schedule_full, self._turn = [], [], 0

    def _summary(self, result: RoundResult, parts: dict[str, float], optimum: float, allocated: float) -> dict[str, Any]:
        return {
            "round": result.round,
            "mechanism": result.mechanism.model_dump(),
            "reserve": result.reserve,
            "capacity": result.capacity,
            "auctioned": result.auctioned,
            "price": result.price,
            "sold": result.sold,
            "revenue": result.revenue,
            "bids": {(f"bidder_{e.lab}" if e.coalition_id is None else e.coalition_id): e.bids for e in result.bids},
            "won": {f"bidder_{k}": v for k, v in sorted(result.won.items())},
            "paid": {f"bidder_{k}": v for k, v in sorted(result.paid.items())},
            "judge": [v.to_log() for v in result.verdicts],
            "shill_penalties": {f"bidder_{k}": v for k, v in result.shill.items()},
            "collusion_penalties": {f"bidder_{k}": v for k, v in result.collusion.items()},
            "suspected_cartels": [{"members": [f"bidder_{m}" for m in ms], "score": s} for ms, s in result.suspected],
            "optimal_welfare": optimum,
            "allocated_welfare": allocated,
            "designer": parts,
            "shocks": [s.describe() for s in self.shocks if s.round == result.round],
        }

    # --- observations ------------------------------------------------------------------
    def _per_round(self, key: Any, build: Any) -> Any:
        """A view that cannot change before the round ends, built once per round and seat."""
        cache = self._round_cache
        if key not in cache:
            cache[key] = build()
        return cache[key]

    def _observation(self, agent: str) -> Observation:
        world, now = self.world, self.round
        is_designer = agent == DESIGNER
        me = -1 if is_designer else int(agent[7:])
        seat_of = self.world.labs
        active_labs = self._per_round("active", lambda: [lab.seat for lab in seat_of if lab.active])
        messages = [
            fast_model(MessageView, sender=seat_of[m.sender].seat,
                       to="all" if m.recipients is None else [seat_of[i].seat for i in m.recipients],
                       text=m.text, round=m.round)
            for m in self.book.messages[-20:]
            if m.recipients is None or m.sender == me or me in m.recipients
        ]
        pitches = [
            fast_model(PitchView, lab=seat_of[p.lab].seat, text=p.text, blocks_requested=p.blocks_requested,
                       counters=[f"{seat_of[c].seat}: {t}" for c, t in p.counters])
            for p in self.book.pitches.values()
        ]
        public_coalitions = [self._coalition_view(c, me, private=False)
                             for c in self.coalitions.coalitions.values() if c.status != "dissolved"]
        phase = self.phase
        legal = list(LEGAL[phase]) if self.agent_selection == agent and self._live(agent) else []
        fields: dict[str, Any] = dict(
            seat=agent, role="designer" if is_designer else "bidder", round=now,
            rounds_total=self.scenario.rounds, value_unit=self.scenario.rewards.value_unit,
            phase=phase, legal_actions=legal,
            mechanism=self._mechanism_view(is_designer),
            capacity=int(world.capacity[now]), reliability=float(world.reliability[now]),
            energy_floor=float(world.energy_floor[now]), active_labs=active_labs,
            reputations={lab.seat: lab.reputation for lab in seat_of if lab.active},
            public_coalitions=public_coalitions, messages=messages, pitches=pitches,
            shocks=self._per_round(("shocks", me), lambda: self._shock_views(me)),
            price_history=self._per_round(("prices", is_designer), lambda: [
                p if (r.mechanism.reveal_clearing_price and (r.sold or r.mechanism.reveal_reserve) or is_designer) else None
                for p, r in zip(self._prices, self.results, strict=True)]),
            last_result=self._per_round(("result", me), lambda: self._result_view(me, is_designer)),
        )
        if is_designer:
            h = self.designer_history
            fields["designer_stats"] = self._per_round("stats", lambda: fast_model(
                DesignerStats, welfare_ratio=list(h["welfare_ratio"]), fairness=list(h["fairness"]),
                participation=list(h["participation"]), stability=list(h["stability"]),
                revenue=[r.revenue for r in self.results], prices=list(self._prices),
                suspected_cartels=sum(1 for _, score in self.results[-1].suspected if score >= SUSPECTED)
                if self.results else 0,
                active_labs=len(active_labs)))
        else:
            lab = world.labs[me]
            book = self.book
            fields.update(
                budget=lab.budget, reputation=lab.reputation,
                holdings=world.holdings[me, now:].tolist(),
                jobs=self._per_round(("jobs", me), lambda: [
                    fast_model(JobView, job_id=j.job_id, size=j.size, progress=j.progress, deadline=j.deadline,
                               value=j.value, partial_credit=j.partial_credit,
                               min_reliability=j.min_reliability, status=j.status)
                    for j in lab.jobs if j.status != "pending"]),
                offers_received=[self._offer_view(o) for o in book.offers.values()
                                 if o.recipient == me and o.status == "open"],
                offers_sent=[self._offer_view(o) for o in book.offers.values() if o.sender == me and o.status == "open"],
                contracts=[fast_model(ContractView, contract_id=c.contract_id, seller=seat_of[c.seller].seat,
                                      buyer=seat_of[c.buyer].seat, blocks=c.blocks, price=c.price,
                                      delivery_round=c.delivery_round)
                           for c in book.contracts if c.delivered < 0 and me in (c.seller, c.buyer)],
                coalitions=[self._coalition_view(c, me, private=True) for c in self.coalitions.of(me)],
            )
        return fast_model(Observation, **fields)

    def _shock_views(self, me: int) -> list[ShockView]:
        labs, now = self.world.labs, self.round
        return [
            fast_model(ShockView, kind=s.kind, round=s.round, duration=s.duration, magnitude=s.magnitude,
                       target=None if s.target is None else labs[s.target].seat, public=s.public)
            for s in self.shocks if s.round <= now and (s.public or (s.target == me and me >= 0))
        ]

    def _mechanism_view(self, is_designer: bool) -> MechanismView:
        """The mechanism as a seat sees it (the reserve hidden unless revealed); cached per mechanism."""
        cached = self._mech_views.get(is_designer)
        if cached is not None and cached[0] is self.mechanism:
            return cached[1]
        mech = self.mechanism
        fields = mech.model_dump()
        if not (mech.reveal_reserve or is_designer):
            fields["reserve_price"] = None
        view = fast_model(MechanismView, **fields)
        self._mech_views[is_designer] = (mech, view)
        return view

    def _offer_view(self, o: negotiation.Offer) -> OfferView:
        labs = self.world.labs
        return fast_model(OfferView, offer_id=o.offer_id, sender=labs[o.sender].seat, recipient=labs[o.recipient].seat,
                                         side=o.side, blocks=o.blocks, price=o.price, delivery_round=o.delivery_round,
                                         expires_round=o.expires_round, status=o.status, message=o.message)

    def _coalition_view(self, c: coal.Coalition, me: int, private: bool) -> CoalitionView:
        labs = self.world.labs
        member = private and me in c.members
        return fast_model(CoalitionView,
            coalition_id=c.coalition_id, leader=labs[c.leader].seat, members=[labs[m].seat for m in c.members],
            invited=[labs[m].seat for m in sorted(c.invited)], purpose=c.purpose, split=c.split,
            term_end=c.term_end, status=c.status, pool=c.pool if member else None,
            my_balance=c.balances.get(me) if member else None,
        )

    def _result_view(self, me: int, is_designer: bool) -> MarketResultView | None:
        if not self.results:
            return None
        r = self.results[-1]
        m = r.mechanism
        labs = self.world.labs
        show_ids = m.reveal_winner_identity or is_designer
        view: dict[str, Any] = dict(round=r.round, auction_type=m.auction_type, blocks_sold=r.sold,
                                    my_won=r.won.get(me, 0), my_paid=r.paid.get(me, 0.0))
        # with nothing sold the 'price' is the reserve: shown only where the reserve is
        if m.reveal_clearing_price and (r.sold or m.reveal_reserve) or is_designer:
            view["clearing_price"] = r.price
        if m.reveal_reserve or is_designer:
            view["reserve"] = r.reserve
        if show_ids:
            view["winners"] = {labs[k].seat: v for k, v in sorted(r.won.items()) if v}
            view["judge_grants"] = {labs[v.lab].seat: v.granted for v in r.verdicts if v.granted}
        if m.reveal_competing_bids:
            schedules = [list(e.bids) for e in r.bids]
            view["competing_bids"] = schedules if show_ids else sorted(schedules, reverse=True)
        if m.reveal_bid_distribution:
            flat = sorted(b for e in r.bids for b in e.bids)
            view["bid_distribution"] = bid_distribution(flat) if flat else {"count": 0.0}
        return fast_model(MarketResultView, **view)

    # --- rendering ---------------------------------------------------------------------
    def _render_text(self) -> str:
        if not hasattr(self, "world"):
            return "gpumarket: call reset() first"
        w, m = self.world, self.mechanism
        lines = [
            f"round {self.round + 1}/{self.scenario.rounds}  phase {self.phase}  turn {self.agent_selection}",
            f"mechanism {m.auction_type} reserve {m.reserve_price:g} policy {m.coalition_policy} judge_pool {m.judge_pool_share:g}",
            f"capacity {int(w.capacity[min(self.round, self.scenario.rounds - 1)])}  operator credits {w.operator_credits:.2f}",
        ]
        for lab in w.labs:
            if not lab.entered:
                continue
            live = sum(1 for j in lab.jobs if j.status == "active")
            done = sum(1 for j in lab.jobs if j.status == "done")
            lines.append(f"  {lab.seat:<10} {'active' if lab.active else 'gone':<6} budget {lab.budget:9.2f} "
                         f"rep {lab.reputation:.2f} jobs live {live} done {done}")
        if self.results:
            r = self.results[-1]
            lines.append(f"last clearing: round {r.round + 1} price {r.price:.2f} sold {r.sold} revenue {r.revenue:.2f}")
        return "\n".join(lines)

    # --- audits (used by tests and the transcript's state digest) --------------------------
    def credit_balance(self) -> float:
        """Labs + operator + escrow - initial - external injections: zero when credits are conserved."""
        w = self.world
        total = sum(lab.budget for lab in w.labs) + w.operator_credits + self.coalitions.escrow()
        return total - self._initial_credits - w.external_credits

    def state_digest(self) -> str:
        """SHA-256 (hex) of the market state, for transcripts and replay (floats by exact repr).

        Covers round/phase/turn, mechanism, budgets, reputations, holdings, job progress/status,
        offers, contracts, pitches, coalitions, this round's bids and plans, id counters, the message
        count and the latest message, operator credits and seat terminations. The market part is
        hashed once per state version (it changes only when ``_version`` does, as the observation
        cache also assumes), so a step costs a few microseconds; the RNG state and interaction
        graph count only through their effects.
        """
        cached = getattr(self, "_digest_cache", None)
        if cached is not None and cached[0] is self.world and cached[1] == self._version:
            market = cached[2]
        else:
            market = self._market_digest()
            self._digest_cache = (self.world, self._version, market)
        turn = (market, self.round, self.phase, self._turn, self.agent_selection, len(self.results),
                sorted(self.terminations.items()), sorted(self.truncations.items()))
        return hashlib.sha256(repr(turn).encode()).hexdigest()

    def _market_digest(self) -> bytes:
        w, book = self.world, self.book
        h = hashlib.sha256()
        h.update(repr((w.operator_credits, w.external_credits, self.mechanism.model_dump_json())).encode())
        h.update(w.holdings.tobytes())
        h.update(w.capacity.tobytes())
        h.update(w.reliability.tobytes())
        h.update(self._potential.tobytes())
        for lab in w.labs:
            h.update(repr((lab.budget, lab.reputation, lab.active, lab.entered, lab.exit_round,
                           [(j.job_id, j.progress, j.status, j.realized) for j in lab.jobs])).encode())
        h.update(repr([(o.offer_id, o.sender, o.recipient, o.side, o.blocks, o.price, o.delivery_round,
                        o.expires_round, o.status) for o in book.offers.values()]).encode())
        h.update(repr([(c.contract_id, c.seller, c.buyer, c.blocks, c.price, c.delivery_round, c.delivered)
                       for c in book.contracts]).encode())
        last_message = book.messages[-1] if book.messages else None
        h.update(repr((book.next_offer, book.next_contract, self.coalitions.next_id, len(book.messages),
                       last_message and (last_message.sender, last_message.recipients, last_message.text),
                       [(p.lab, p.text, p.blocks_requested, p.job_id, p.counters)
                        for p in book.pitches.values()])).encode())
        h.update(repr([(c.coalition_id, c.leader, c.members, sorted(c.invited), c.status, c.term_end,
                        sorted(c.balances.items()), sorted(c.contributed.items()))
                       for c in self.coalitions.coalitions.values()]).encode())
        h.update(repr((sorted((k, e.bids) for k, e in self._bids.items()),
                       sorted((k, e.lab, e.bids) for k, e in self._coalition_bids.items()),
                       sorted((k, sorted(v.items())) for k, v in self._plans.items()))).encode())
        return h.digest()


def env(scenario: str | Path | Scenario = "market_round", render_mode: str | None = None, **overrides: Any) -> AECEnv:
    """The AEC env wrapped in PettingZoo's order-enforcing wrapper."""
    return wrappers.OrderEnforcingWrapper(raw_env(scenario, render_mode=render_mode, **overrides))


def parallel_env(scenario: str | Path | Scenario = "market_round", render_mode: str | None = None, **overrides: Any) -> Any:
    """The parallel view: one parallel step per pass (design, each negotiation pass, bidding)."""
    from market.environment.parallel import ParallelMarketEnv

    return ParallelMarketEnv(scenario, render_mode=render_mode, **overrides)
