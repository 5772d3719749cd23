"""A designer's mechanism update: the mechanism fields to change, and the units its amounts are in.

The designer's ``set_mechanism`` action carries one (:class:`market.core.actions.SetMechanism`);
it is also the DAEDALUS designer's flat mechanism JSON, read in DAEDALUS units where the
scenario says so (``mechanism_units``, docs/mechanisms.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from market.core.mechanisms import (
    DAEDALUS_AUCTION_TYPES,
    AuctionType,
    CoalitionPolicy,
    Mechanism,
)


class ActionParseError(ValueError):
    """The action could not be understood; the message says what to send instead (defined here,
    the lowest module that raises it, and re-exported by :mod:`market.core.actions`)."""


MechanismUnits = Literal["credits", "daedalus"]
#: the mechanism fields that are amounts of money (credits per block, or credits per breach)
MONEY_FIELDS = ("reserve_price", "shill_penalty", "withdrawal_penalty", "collusion_penalty")
#: DAEDALUS's penalty range: its designer sends every penalty in [0, 3]
DAEDALUS_PENALTY_MAX = 3.0


class MechanismUpdate(BaseModel):
    """Mechanism fields to change; omitted fields keep the mechanism in force.

    Units. Money fields (:data:`MONEY_FIELDS`) are in the units of ``units``, or, when it is
    left out, in the scenario's ``mechanism_units`` (credits, except in the daedalus scenario
    family, which reads DAEDALUS units). In DAEDALUS units they are on DAEDALUS's normalised value scale, where a bidder's private value lies in
    [0, 1] and 1 is the highest value a bidder can hold. The conversion is a ratio-scale
    (linear, zero-preserving) change of unit: ``credits = v * V``, with ``V`` the scenario's
    highest private value per block, ``jobs.value_per_block[1]`` (45 credits in the built-in
    scenarios, so DAEDALUS's reserve 0.18 is 8.1 credits per block). ``V`` is the top of the
    value range because that is what 1 means on the normalised scale; the map fixes 0 so "no
    reserve" stays no reserve, and it keeps every ratio of reserve to value, which is what
    decides who clears a reserve. See :meth:`in_credits`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    units: MechanismUnits | None = Field(
        None,
        description="Unit of reserve_price and the penalties: 'credits' or 'daedalus' (default: "
        "the scenario's mechanism_units, credits outside the daedalus family) "
        "(DAEDALUS's normalised value scale, 1 = the highest value per block; converted to "
        "credits by multiplying by the scenario's jobs.value_per_block high end).",
    )
    auction_type: AuctionType | None = None
    reserve_price: float | None = Field(None, ge=0.0, le=1e9)
    reveal_reserve: bool | None = None
    reveal_competing_bids: bool | None = None
    reveal_winner_identity: bool | None = None
    reveal_clearing_price: bool | None = None
    reveal_bid_distribution: bool | None = None
    shill_penalty: float | None = Field(None, ge=0.0, le=1e9)
    withdrawal_penalty: float | None = Field(None, ge=0.0, le=1e9)
    collusion_penalty: float | None = Field(None, ge=0.0, le=1e9)
    coalition_policy: CoalitionPolicy | None = None
    judge_pool_share: float | None = Field(None, ge=0.0, le=1.0)

    def apply_to(self, current: Mechanism) -> Mechanism:
        """``current`` with this update's fields; money fields must already be in credits."""
        return current.model_copy(update=self.model_dump(exclude_none=True, exclude={"units"}))

    def daedalus_signature(self) -> bool:
        """Whether this update, sent without ``units``, looks like a DAEDALUS designer's JSON.

        The signature: no ``units``, a reserve strictly between 0 and 1 credit (meaningless here,
        where values are tens of credits per block), all three penalties given, each within
        DAEDALUS's range [0, 3], no ``judge_pool_share`` (a field DAEDALUS lacks), and an auction
        type DAEDALUS knows (first_price, second_price or vcg) if one is given.
        """
        penalties = (self.shill_penalty, self.withdrawal_penalty, self.collusion_penalty)
        return (
            self.units is None
            and self.reserve_price is not None
            and 0.0 < self.reserve_price < 1.0
            and all(p is not None and p <= DAEDALUS_PENALTY_MAX for p in penalties)
            and self.judge_pool_share is None
            and (self.auction_type is None or self.auction_type in DAEDALUS_AUCTION_TYPES)
        )

    def in_credits(
        self, value_scale: float, default_units: MechanismUnits = "credits"
    ) -> tuple[MechanismUpdate, dict[str, list[float]]]:
        """This update with its money fields in credits, and ``{field: [sent, credits]}`` for
        each field converted (empty unless the units in force are ``"daedalus"``).

        ``value_scale`` is ``V`` of the class docstring. ``default_units`` is the scenario's
        ``mechanism_units``: the units of an update that sends no ``units`` (the daedalus
        family reads DAEDALUS units, so its designer's JSON runs unchanged). Raises
        :class:`ActionParseError` with a one-line hint for a value that only makes sense in the
        other units: a bare DAEDALUS JSON (:meth:`daedalus_signature`) where credits are the
        default, a normalised reserve above 1, or (DAEDALUS units by default) a penalty above
        DAEDALUS's range.
        """
        units = self.units or default_units
        if units == "credits" and self.daedalus_signature():
            reserve = float(self.reserve_price or 0.0)
            raise ActionParseError(
                f"reserve_price {reserve:g} with DAEDALUS-range penalties and no 'units' looks like "
                "DAEDALUS's normalised value scale, but reserves here are credits per block; add "
                f'"units": "daedalus" to convert ({reserve:g} -> {reserve * value_scale:.2f} '
                f'credits on this scenario\'s value scale of {value_scale:g}), or "units": '
                '"credits" if you mean credits'
            )
        if units != "daedalus":
            return self.model_copy(update={"units": None}), {}
        by_default = self.units is None
        why = (
            " (this scenario reads mechanism JSON in DAEDALUS units: mechanism_units)"
            if by_default
            else ""
        )
        if self.reserve_price is not None and self.reserve_price > 1.0:
            raise ActionParseError(
                f"reserve_price {self.reserve_price:g} is above 1 on DAEDALUS's normalised value "
                f"scale (1 = the highest value a bidder can hold){why}; send a value in [0, 1] or "
                f'add "units": "credits" to give credits'
            )
        if by_default:
            for name in MONEY_FIELDS[1:]:
                sent = getattr(self, name)
                if sent is not None and sent > DAEDALUS_PENALTY_MAX:
                    raise ActionParseError(
                        f"{name} {sent:g} is above DAEDALUS's penalty range [0, "
                        f"{DAEDALUS_PENALTY_MAX:g}]{why}; send a value in that range or add "
                        '"units": "credits" to give credits'
                    )
        converted: dict[str, list[float]] = {}
        update: dict[str, object] = {"units": None}
        for name in MONEY_FIELDS:
            sent = getattr(self, name)
            if sent is not None:
                credits = round(float(sent) * value_scale, 6)
                converted[name] = [float(sent), credits]
                update[name] = credits
        return self.model_copy(update=update), converted
