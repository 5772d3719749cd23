"""The rule-based designer (``rule_designer``), which adapts the mechanism to the market signals
in its ``designer_stats``, and ``daedalus_robust``, which plays DAEDALUS's published robust
mechanism in DAEDALUS's own units."""

from __future__ import annotations

from typing import cast

from agents.base import BaseAgent
from agents.population.common import StatefulAgent
from agents.scripted import WAIT
from market.core.actions import ActionModel, SetMechanism
from market.core.summation import ordered_sum
from market.environment import Observation

# ------------------------------------------------------------------------------------------
# Rule designer
# ------------------------------------------------------------------------------------------


class RuleDesigner(StatefulAgent):
    """Adapts the mechanism to the market signals in its ``designer_stats``.

    ``designer_stats`` has one entry per cleared round of every health signal, the suspected
    cartels of the last round and the active labs (``last_result`` shows the same last clearing
    in more detail; these rules do not need it). Rule table, read at each design turn from the
    last entry of each series (``p`` is the mean clearing price so far); every rule that fires
    contributes its fields:

    =================================  ====================================================
    signal                             change
    =================================  ====================================================
    suspected collusion                ``coalition_policy = penalize_suspected``,
    (``suspected_cartels >= 1``)       ``collusion_penalty = max(current, 25, 2 p)``
    dropouts: fewer active labs than   ``reserve_price`` halved (0 below 1 credit); and if
    before, or participation ``< 0.8`` fairness ``< 0.7`` also
    or falling                         ``auction_type = fair_share``
    price volatility                   ``reveal_clearing_price = true``,
    (stability ``< 0.7``)              ``auction_type = second_price``
    welfare shortfall                  ``auction_type = second_price``,
    (welfare_ratio ``< 0.8``)          ``reserve_price = min(current, 0.1 p)``
    =================================  ====================================================

    When both ``fair_share`` (dropouts) and ``second_price`` (volatility, welfare) fire, the
    dropout rule wins: a fair split is what brings labs back. With no signal, or before the
    first clearing, it waits (the mechanism in force stays).
    """

    name = "rule_designer"
    roles = frozenset({"designer"})

    def clear(self) -> None:
        self.active_seen: int | None = None
        self.last_decision: dict[str, object] = {}

    def decide(self, obs: Observation) -> dict[str, object]:
        stats = obs.designer_stats
        mech = obs.mechanism
        update: dict[str, object] = {}
        if stats is None or not stats.welfare_ratio:
            return update
        prices = [p for p in stats.prices if p is not None]
        mean_price = ordered_sum(prices) / len(prices) if prices else 0.0
        reserve = mech.reserve_price or 0.0
        if stats.suspected_cartels >= 1:
            update["coalition_policy"] = "penalize_suspected"
            update["collusion_penalty"] = round(
                max(mech.collusion_penalty, 25.0, 2 * mean_price), 2
            )
        part = stats.participation
        dropped = self.active_seen is not None and stats.active_labs < self.active_seen
        falling = len(part) >= 2 and part[-1] < part[-2]
        auction: str | None = None
        if dropped or part[-1] < 0.8 or falling:
            lowered = reserve / 2
            update["reserve_price"] = round(lowered, 2) if lowered >= 1.0 else 0.0
            if stats.fairness[-1] < 0.7:
                auction = "fair_share"
        if stats.stability[-1] < 0.7:
            update["reveal_clearing_price"] = True
            auction = auction or "second_price"
        if stats.welfare_ratio[-1] < 0.8:
            auction = auction or "second_price"
            reserve_now = cast("float", update.get("reserve_price", reserve))
            low = round(min(float(reserve_now), 0.1 * mean_price), 2)
            update["reserve_price"] = low
        if auction is not None:
            update["auction_type"] = auction
        return update

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase != "design":
            return WAIT
        update = self.decide(obs)
        if obs.designer_stats is not None:
            self.active_seen = obs.designer_stats.active_labs
        self.last_decision = update
        if not update:
            return WAIT
        # its amounts are credits, whatever units the scenario reads by default
        return SetMechanism.model_validate({"mechanism": {"units": "credits", **update}})


# ------------------------------------------------------------------------------------------
# DAEDALUS's robust mechanism
# ------------------------------------------------------------------------------------------

#: The robust mechanism of DAEDALUS's model card, in DAEDALUS units (``units = "daedalus"``:
#: reserve 0.18 of the highest value per block). The card shows the auction type, the reserve
#: and four reveal flags; the fields it does not show take DAEDALUS's action defaults
#: (reveal_bid_distribution false, no penalties, coalitions allowed).
DAEDALUS_ROBUST: dict[str, object] = {
    "units": "daedalus",
    "auction_type": "second_price",
    "reserve_price": 0.18,
    "reveal_reserve": False,
    "reveal_competing_bids": False,
    "reveal_winner_identity": True,
    "reveal_clearing_price": True,
    "reveal_bid_distribution": False,
    "shill_penalty": 0.0,
    "withdrawal_penalty": 0.0,
    "collusion_penalty": 0.0,
    "coalition_policy": "allow",
}


class DaedalusRobustDesigner(BaseAgent):
    """Sends :data:`DAEDALUS_ROBUST` at every design turn, as DAEDALUS's designer re-sends its
    mechanism at every step; the environment converts it to credits."""

    name = "daedalus_robust"
    roles = frozenset({"designer"})

    def act(self, obs: Observation) -> ActionModel:
        if obs.phase != "design":
            return WAIT
        return SetMechanism.model_validate({"mechanism": DAEDALUS_ROBUST})
