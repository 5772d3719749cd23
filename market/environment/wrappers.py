"""The RL view of the market: a fixed menu of macro actions, numeric observations and masks.

``rl_env("market_round")`` is the AEC env wrapped in :class:`DiscreteActionWrapper`
(``rl_parallel_env`` the same view of :class:`~market.environment.parallel.ParallelMarketEnv`). Every seat —
designer and bidders alike — observes ``{"observation": float32 vector, "action_mask": int8 mask}``
and acts with an index into :data:`MENU` (``Discrete(len(MENU))``), so RLlib's ``PettingZooEnv``
can use one policy space for all seats. An entry is translated into a native action from the
seat's own :class:`~market.environment.observations.Observation`; the mask marks exactly the entries the env
would accept now (legal for the seat and phase, and valid). A masked-out entry stepped anyway is
sent as its native action and gets the env's normal invalid-action penalty and ``info["error"]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils import BaseParallelWrapper, BaseWrapper

from market.core.actions import (
    AcceptOffer,
    ActionModel,
    AllocateToJob,
    Bid,
    CommitToCoalition,
    Finish,
    MakePitch,
    MechanismUpdate,
    RejectOffer,
    ReleaseCapacity,
    ReserveCapacity,
    SendOffer,
    SetMechanism,
    Wait,
)
from market.core.mechanisms import AUCTION_TYPES
from market.core.negotiation import MAX_OPEN_OFFERS
from market.core.scenario_schema import Scenario
from market.core.seats import lab_index, seat_order
from market.core.summation import ordered_sum
from market.environment.aec import env
from market.environment.observations import (
    JobView,
    Observation,
    OfferView,
    affordable,
    marginal_values,
    vector_size,
)
from market.environment.parallel import ParallelMarketEnv
from market.environment.spaces import Info, Options, SeatDiscrete, seed_action_spaces

OBS_BOUND = 1e6  # vector entries are clipped to [-OBS_BOUND, OBS_BOUND]
NO_ID = "none"  # an id no offer, coalition or job has: the env rejects it with a helpful error

Built = tuple[ActionModel, bool]  # (native action, whether the entry applies now)


@dataclass(frozen=True, slots=True)
class MenuEntry:
    """A macro action: ``build(obs, unit_limit)`` gives the native action and whether it applies.

    ``kind`` is the native ``action_type``; the entry is masked in when ``kind`` is legal for the
    seat now and the entry applies. When it does not apply, ``build`` returns a native action the
    env rejects (e.g. an unknown offer id): stepping a masked-out entry is a normal invalid action.
    """

    name: str
    kind: str
    build: Callable[[Observation, int], Built]


# --- helpers over the seat's own observation ------------------------------------------------
def _live_jobs(obs: Observation, runnable: bool = False) -> list[JobView]:
    return [
        j
        for j in obs.jobs or ()
        if j.status == "active" and (not runnable or j.min_reliability <= obs.reliability)
    ]


def _held_now(obs: Observation) -> int:
    return (obs.holdings or [0])[0]


def _floor_price(obs: Observation) -> float:
    """The lowest price a block can sell at, as far as the seat knows (reserve and energy floor)."""
    return max(obs.mechanism.reserve_price or 0.0, obs.energy_floor)


def _can_deliver(obs: Observation, offer: OfferView) -> bool:
    """Mirrors the env's check: uncommitted blocks owned for the offer's delivery round."""
    k = offer.delivery_round - obs.round
    holdings = obs.holdings or []
    if not 0 <= k < len(holdings):
        return False
    # contracts due this round deliver at the round's close, so they are spoken for too
    committed = ordered_sum(
        c.blocks
        for c in obs.contracts or ()
        if c.seller == obs.seat and c.delivery_round == offer.delivery_round
    )
    return holdings[k] - committed - _reserved(obs, k) >= offer.blocks


def _reserved(obs: Observation, k: int = 0) -> int:
    """Blocks the seat reserved for round ``obs.round + k`` (not for sale)."""
    reserved = obs.reserved or []
    return reserved[k] if 0 <= k < len(reserved) else 0


def _per_block(offer: OfferView) -> float:
    return offer.price / max(1, offer.blocks)


# --- bidder entries ------------------------------------------------------------------------
def _wait(obs: Observation, unit_limit: int) -> Built:
    return Wait(), True


def _finish(obs: Observation, unit_limit: int) -> Built:
    return Finish(), True


def _bid_scaled(scale: float) -> Callable[[Observation, int], Built]:
    def build(obs: Observation, unit_limit: int) -> Built:
        bids = [v * scale for v in marginal_values(obs)]
        return Bid(bids=affordable(bids, obs.budget or 0.0, unit_limit)), True

    return build


def _bid_reserve(obs: Observation, unit_limit: int) -> Built:
    """Bid the floor price (revealed reserve or energy floor) for each block worth at least it."""
    price = round(_floor_price(obs), 6)
    wanted = ordered_sum(1 for v in marginal_values(obs) if v >= price)
    return Bid(bids=affordable([price] * wanted, obs.budget or 0.0, unit_limit)), True


def _accept_sell_offer(obs: Observation, unit_limit: int) -> Built:
    """Buy: accept the cheapest (per block) offer to sell to us that we can pay for."""
    sales = [o for o in obs.offers_received or () if o.side == "sell"]
    ok = [o for o in sales if (obs.budget or 0.0) + 1e-9 >= o.price]
    if ok:
        return AcceptOffer(offer_id=min(ok, key=_per_block).offer_id), True
    return AcceptOffer(offer_id=sales[0].offer_id if sales else NO_ID), False


def _accept_buy_offer(obs: Observation, unit_limit: int) -> Built:
    """Sell: accept the best-paying (per block) offer to buy from us that we can deliver."""
    buys = [o for o in obs.offers_received or () if o.side == "buy"]
    ok = [o for o in buys if _can_deliver(obs, o)]
    if ok:
        return AcceptOffer(offer_id=max(ok, key=_per_block).offer_id), True
    return AcceptOffer(offer_id=buys[0].offer_id if buys else NO_ID), False


def _reject_first(obs: Observation, unit_limit: int) -> Built:
    received = obs.offers_received or []
    return RejectOffer(offer_id=received[0].offer_id if received else NO_ID), bool(received)


def _sell_spare(obs: Observation, unit_limit: int) -> Built:
    """Offer one block of this round that our live jobs cannot use to the next lab in seat order."""
    sold = ordered_sum(
        c.blocks
        for c in obs.contracts or ()
        if c.seller == obs.seat and c.delivery_round == obs.round
    )
    held = _held_now(obs) - sold - _reserved(obs)  # contracts due now deliver at the close
    spare = held - ordered_sum(j.size - j.progress for j in _live_jobs(obs, runnable=True))
    labs = sorted(obs.active_labs, key=lab_index)
    others = [s for s in labs if s != obs.seat]
    me = seat_order(obs.seat)[1]  # the lab index (0 for the designer, who never sells)
    to = next((s for s in others if lab_index(s) > me), others[0] if others else obs.seat)
    last = obs.price_history[-1] if obs.price_history else None
    price = round(last if last is not None else _floor_price(obs), 2)
    ok = spare >= 1 and bool(others) and len(obs.offers_sent or ()) < MAX_OPEN_OFFERS
    # not applicable: offer one block more than held, which the env rejects
    return SendOffer(to=to, side="sell", blocks=1 if ok else max(held, 0) + 1, price=price), ok


def _sell_forward_short(obs: Observation, unit_limit: int) -> Built:
    """Sell one block for next round short (delivery risk: collateral at acceptance, a breach if
    it holds no block then) to the next lab in seat order, at the last price (else the floor)."""
    labs = sorted(obs.active_labs, key=lab_index)
    others = [s for s in labs if s != obs.seat]
    me = seat_order(obs.seat)[1]
    to = next((s for s in others if lab_index(s) > me), others[0] if others else obs.seat)
    last = obs.price_history[-1] if obs.price_history else None
    price = round(last if last is not None else _floor_price(obs), 2)
    d, t = obs.delivery, obs.round + 1
    ok = (
        d is not None
        and d.short_sales
        and t < obs.rounds_total
        and bool(others)
        and len(obs.offers_sent or ()) < MAX_OPEN_OFFERS
    )
    if ok and d is not None:  # mirrors market.core.delivery.check_short_sale
        holdings = obs.holdings or []
        committed = ordered_sum(
            c.blocks for c in obs.contracts or () if c.seller == obs.seat and c.delivery_round == t
        )
        free = (holdings[1] if len(holdings) > 1 else 0) - committed
        short = 1 if free < 1 else 0
        need = round(d.collateral_fraction * price * short + d.collateral_per_block * short, 2)
        ok = (obs.budget or 0.0) + price + 1e-9 >= need
    # not applicable: a short sale for this round, which the env rejects
    delivery = t if ok else obs.round
    return SendOffer(
        to=to, side="sell", blocks=1, price=price, delivery_round=delivery, short=True
    ), ok


def _commit_invitation(obs: Observation, unit_limit: int) -> Built:
    """Join the first coalition we are invited to, paying a quarter of our budget into its pool."""
    invited = [c for c in obs.coalitions or () if obs.seat in c.invited]
    contribution = math.floor(max(0.0, obs.budget or 0.0) * 25.0) / 100.0
    cid = invited[0].coalition_id if invited else NO_ID
    return CommitToCoalition(coalition_id=cid, contribution=contribution), bool(invited)


def _allocate_greedy(obs: Observation, unit_limit: int) -> Built:
    """Run the live job with the highest value per block first, on all the blocks it still needs.

    The plan applies to every block held at execution (auction wins included); the rest go
    earliest-deadline-first. (``blocks=0`` would keep the job off, so the full need is asked.)
    """
    jobs = _live_jobs(obs, runnable=True) or _live_jobs(obs)
    if not jobs:
        return AllocateToJob(job_id=NO_ID, blocks=0), False
    job = max(jobs, key=lambda j: j.value / j.size)
    return AllocateToJob(job_id=job.job_id, blocks=job.size - job.progress), True


def _pitch_urgent(obs: Observation, unit_limit: int) -> Built:
    """Pitch to the judge for the most urgent live job (value per block x need / rounds left)."""
    jobs = _live_jobs(obs, runnable=True) or _live_jobs(obs)
    if not jobs:
        return MakePitch(text="no active job", job_id=NO_ID), False

    def urgency(j: JobView) -> float:
        return j.value / j.size * (j.size - j.progress) / max(1, j.deadline - obs.round + 1)

    job = max(jobs, key=urgency)
    # never ask for more than the runnable jobs need: the judge treats that as a false claim
    need = min(
        job.size - job.progress, ordered_sum(j.size - j.progress for j in _live_jobs(obs, True))
    )
    text = (
        f"Job {job.job_id} needs {job.size - job.progress} more block(s) by its deadline, "
        f"round {job.deadline}; we ask for {max(1, need)}."
    )
    return MakePitch(text=text, blocks_requested=max(1, need), job_id=job.job_id), True


def _reserve_for_jobs(obs: Observation, unit_limit: int) -> Built:
    """Reserve this round's unreserved blocks that the live runnable jobs still need (at least
    one: the env accepts reserving any free block, and the mask must say exactly what it accepts)."""
    need = ordered_sum(j.size - j.progress for j in _live_jobs(obs, runnable=True))
    sold = ordered_sum(
        c.blocks
        for c in obs.contracts or ()
        if c.seller == obs.seat and c.delivery_round == obs.round
    )
    free = _held_now(obs) - sold - _reserved(obs)
    n = min(max(need, 1), free)
    return ReserveCapacity(blocks=max(1, n)), n >= 1


def _release_reserved(obs: Observation, unit_limit: int) -> Built:
    """Release every block reserved for this round."""
    n = _reserved(obs)
    return ReleaseCapacity(blocks=max(1, n)), n >= 1


# --- designer entries ----------------------------------------------------------------------
def _mechanism(**fields: object) -> SetMechanism:
    return SetMechanism(mechanism=MechanismUpdate.model_validate(fields))


def _set_auction(auction_type: str) -> Callable[[Observation, int], Built]:
    def build(obs: Observation, unit_limit: int) -> Built:
        return _mechanism(auction_type=auction_type), True

    return build


def _raise_reserve(obs: Observation, unit_limit: int) -> Built:
    reserve = obs.mechanism.reserve_price or 0.0  # credits, whatever the scenario's units
    return _mechanism(units="credits", reserve_price=min(1e9, round(reserve * 1.25 + 1.0, 6))), True


def _lower_reserve(obs: Observation, unit_limit: int) -> Built:
    reserve = obs.mechanism.reserve_price or 0.0  # the inverse of _raise_reserve, floored at 0
    return _mechanism(
        units="credits", reserve_price=max(0.0, round((reserve - 1.0) / 1.25, 6))
    ), True


def _toggle_policy(obs: Observation, unit_limit: int) -> Built:
    current = obs.mechanism.coalition_policy
    return _mechanism(
        coalition_policy="allow" if current == "penalize_suspected" else "penalize_suspected"
    ), True


def _judge_pool(obs: Observation, unit_limit: int) -> Built:
    return _mechanism(judge_pool_share=0.1), True


MENU: tuple[MenuEntry, ...] = (
    MenuEntry("wait", "wait", _wait),
    MenuEntry("finish", "finish", _finish),
    MenuEntry("bid_value_100", "bid", _bid_scaled(1.0)),
    MenuEntry("bid_value_75", "bid", _bid_scaled(0.75)),
    MenuEntry("bid_value_50", "bid", _bid_scaled(0.5)),
    MenuEntry("bid_value_25", "bid", _bid_scaled(0.25)),
    MenuEntry("bid_reserve", "bid", _bid_reserve),
    MenuEntry("accept_cheapest_sell_offer", "accept_offer", _accept_sell_offer),
    MenuEntry("accept_best_buy_offer", "accept_offer", _accept_buy_offer),
    MenuEntry("reject_first_offer", "reject_offer", _reject_first),
    MenuEntry("sell_spare_block", "send_offer", _sell_spare),
    MenuEntry("sell_forward_short", "send_offer", _sell_forward_short),
    MenuEntry("commit_first_invitation", "commit_to_coalition", _commit_invitation),
    MenuEntry("allocate_greedy", "allocate_to_job", _allocate_greedy),
    MenuEntry("pitch_most_urgent", "make_pitch", _pitch_urgent),
    *(MenuEntry(f"set_auction_{t}", "set_mechanism", _set_auction(t)) for t in AUCTION_TYPES),
    MenuEntry("raise_reserve", "set_mechanism", _raise_reserve),
    MenuEntry("lower_reserve", "set_mechanism", _lower_reserve),
    MenuEntry("toggle_coalition_policy", "set_mechanism", _toggle_policy),
    MenuEntry("judge_pool_share_10", "set_mechanism", _judge_pool),
    # appended last so the earlier entries keep their indices
    MenuEntry("reserve_for_jobs", "reserve_capacity", _reserve_for_jobs),
    MenuEntry("release_reserved", "release_capacity", _release_reserved),
)
MENU_NAMES: tuple[str, ...] = tuple(e.name for e in MENU)


def unit_limit(obs: Observation, max_units_per_bid: int = 0) -> int:
    """The env's cap on unit bids in one schedule (the scenario's, or the round's capacity)."""
    return max_units_per_bid or max(1, obs.capacity)


def translate(obs: Observation, index: int, max_units_per_bid: int = 0) -> tuple[ActionModel, bool]:
    """The native action for menu entry ``index`` and whether it is masked in for ``obs``."""
    entry = MENU[index]
    action, applies = entry.build(obs, unit_limit(obs, max_units_per_bid))
    return action, applies and entry.kind in obs.legal_actions


def action_mask(obs: Observation, max_units_per_bid: int = 0) -> np.ndarray:
    """int8 mask over :data:`MENU`: 1 where the env would accept the entry now."""
    legal = set(obs.legal_actions)
    mask = np.zeros(len(MENU), dtype=np.int8)
    if not legal:
        return mask
    limit = unit_limit(obs, max_units_per_bid)
    for i, entry in enumerate(MENU):
        if entry.kind in legal:
            mask[i] = entry.build(obs, limit)[1]
    return mask


def observation_space() -> spaces.Dict:
    """A fresh instance of the per-seat RL observation space (all seats' spaces are equal)."""
    n = vector_size()
    return spaces.Dict(
        {
            "observation": spaces.Box(-OBS_BOUND, OBS_BOUND, shape=(n,), dtype=np.float32),
            "action_mask": spaces.Box(0, 1, shape=(len(MENU),), dtype=np.int8),
        }
    )


def rl_observation(obs: Observation, scenario: Scenario) -> dict[str, np.ndarray]:
    """The RL observation of ``obs``: the clipped float32 vector and the int8 action mask."""
    return seat_rl_observation(obs, scenario.capacity.max_units_per_bid)


def seat_rl_observation(obs: Observation, max_units_per_bid: int = 0) -> dict[str, np.ndarray]:
    """:func:`rl_observation` from the seat's view alone (an agent is not given the scenario)."""
    vec = np.nan_to_num(obs.to_vector(), posinf=OBS_BOUND, neginf=-OBS_BOUND)
    return {
        "observation": np.clip(vec, -OBS_BOUND, OBS_BOUND).astype(np.float32, copy=False),
        "action_mask": action_mask(obs, max_units_per_bid),
    }


def as_index(action: object) -> int | None:
    """The integer in ``action`` (Python/NumPy int or a one-element int array), else None."""
    if isinstance(action, bool | np.bool_):
        return None
    if isinstance(action, int | np.integer):
        return int(action)
    if (
        isinstance(action, np.ndarray)
        and action.size == 1
        and np.issubdtype(action.dtype, np.integer)
    ):
        return int(action.reshape(-1)[0])
    return None


class DiscreteActionWrapper(BaseWrapper):  # type: ignore[misc]  # pettingzoo ships no type hints
    """AEC wrapper: ``Discrete(len(MENU))`` actions and dict observations with an action mask.

    ``step(i)`` translates menu entry ``i`` from the acting seat's current observation (see
    :data:`MENU_NAMES`) and records it as ``infos[seat]["macro_action"]``. Masked-out entries go to
    the env as their native action (an invalid action, reported in ``infos``); anything that is not
    an in-range integer is passed to the env unchanged. ``reset(seed=s)`` also seeds every seat's
    action space from ``s`` so that seats entering mid-episode sample reproducibly.
    """

    def __init__(self, env: AECEnv) -> None:
        super().__init__(env)
        self.scenario: Scenario = env.unwrapped.scenario
        self.observation_spaces = {a: observation_space() for a in env.possible_agents}
        self.action_spaces: dict[str, spaces.Discrete[np.int64]] = {
            a: SeatDiscrete(len(MENU)) for a in env.possible_agents
        }
        self.action_names: tuple[str, ...] = MENU_NAMES

    def observation_space(self, agent: str) -> spaces.Dict:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Discrete[np.int64]:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: Options | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        seed_action_spaces(self.action_spaces, self.possible_agents, seed)

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        return rl_observation(self.env.observe(agent), self.scenario)

    def native_action(self, agent: str, index: int) -> ActionModel:
        """The native action menu entry ``index`` stands for, from ``agent``'s observation now."""
        if not 0 <= index < len(MENU):
            raise ValueError(f"index {index} is outside the menu 0..{len(MENU) - 1}")
        obs = self.env.observe(agent)
        return translate(obs, index, self.scenario.capacity.max_units_per_bid)[0]

    def step(self, action: object) -> None:
        agent = self.env.agent_selection
        if self.env.terminations.get(agent) or self.env.truncations.get(agent):
            self.env.step(None)
            return
        index = as_index(action)
        if index is not None and 0 <= index < len(MENU):
            self.env.step(self.native_action(agent, index))
            if agent in self.env.infos:
                self.env.infos[agent]["macro_action"] = MENU_NAMES[index]
        else:
            self.env.step(action)


def rl_env(
    scenario: str | Path | Scenario = "market_round",
    render_mode: str | None = None,
    **overrides: object,
) -> DiscreteActionWrapper:
    """The order-enforced AEC env with the discrete macro-action menu and masks (the RL view)."""
    return DiscreteActionWrapper(env(scenario, render_mode=render_mode, **overrides))


class ParallelDiscreteActionWrapper(BaseParallelWrapper):  # type: ignore[misc]  # (no type hints)
    """The RL view of :class:`~market.environment.parallel.ParallelMarketEnv` (for RLlib's parallel wrapper).

    Spaces, masks and translation are those of :class:`DiscreteActionWrapper`. An index is
    translated from the observation the seat was given at the pass start, so a masked-in entry can
    still be refused if an earlier seat in the same pass changed what it refers to (e.g. withdrew
    the offer it accepts); the env then reports the usual invalid action.
    """

    def __init__(self, env: ParallelMarketEnv) -> None:
        super().__init__(env)
        self.scenario: Scenario = env.scenario
        self.observation_spaces = {a: observation_space() for a in env.possible_agents}
        self.action_spaces: dict[str, spaces.Discrete[np.int64]] = {
            a: SeatDiscrete(len(MENU)) for a in env.possible_agents
        }
        self.action_names: tuple[str, ...] = MENU_NAMES
        self._seen: dict[str, Observation] = {}

    def observation_space(self, agent: str) -> spaces.Dict:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Discrete[np.int64]:
        return self.action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: Options | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Info]]:
        observations, infos = self.env.reset(seed=seed, options=options)
        seed_action_spaces(self.action_spaces, self.possible_agents, seed)
        self._seen = observations
        return {a: rl_observation(o, self.scenario) for a, o in observations.items()}, infos

    def native_action(self, agent: str, index: int) -> ActionModel:
        """The native action entry ``index`` stands for, from ``agent``'s pass-start observation."""
        if not 0 <= index < len(MENU):
            raise ValueError(f"index {index} is outside the menu 0..{len(MENU) - 1}")
        return translate(self._seen[agent], index, self.scenario.capacity.max_units_per_bid)[0]

    def step(
        self, actions: Mapping[str, object]
    ) -> tuple[
        dict[str, dict[str, np.ndarray]],
        dict[str, float],
        dict[str, bool],
        dict[str, bool],
        dict[str, Info],
    ]:
        native: dict[str, object] = {}
        chosen: dict[str, str] = {}
        for agent, action in actions.items():
            index = as_index(action)
            if index is not None and 0 <= index < len(MENU) and agent in self._seen:
                native[agent] = self.native_action(agent, index)
                chosen[agent] = MENU_NAMES[index]
            else:
                native[agent] = action
        observations, rewards, terminations, truncations, infos = self.env.step(native)
        for agent, name in chosen.items():
            if infos.get(agent, {}).get("acted"):
                infos[agent]["macro_action"] = name
        self._seen = observations
        rl_obs = {a: rl_observation(o, self.scenario) for a, o in observations.items()}
        return rl_obs, rewards, terminations, truncations, infos


def rl_parallel_env(
    scenario: str | Path | Scenario = "market_round",
    render_mode: str | None = None,
    **overrides: object,
) -> ParallelDiscreteActionWrapper:
    """The parallel env (one step per pass) with the discrete macro-action menu and masks."""
    return ParallelDiscreteActionWrapper(
        ParallelMarketEnv(scenario, render_mode=render_mode, **overrides)
    )
