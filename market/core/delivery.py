"""Delivery risk: owned blocks that fail, and short forward sales backed by collateral.

**Failures** (docs/world.md, Delivery risk). At the close of round ``r``, after the auction and
before forward contracts are delivered, every block a lab holds for ``r`` fails independently with
probability ``p_r`` (:class:`~market.core.scenario_schema.DeliverySpec`: a base rate plus exposures to the
round's outage and reliability drop, both fixed by the shock schedule at reset). A failed block
leaves the market (``ledger.fail_blocks``): it neither runs a job nor can be delivered.

Common random numbers: block ``k`` of lab ``i``'s holdings for round ``r`` (its slot, id
``r{r}/{seat}/{k}``) fails iff ``u[k] < p_r``, where ``u`` is drawn from the ``failures`` stream
keyed ``(r, i)``. The ``k``-th draw of a generator does not depend on how many draws follow it, so
the fate of every slot is fixed by the seed whatever the agents do; what agents decide is only
which slots are filled.

**Short forward sales.** A ``send_offer`` with ``side="sell"``, a later ``delivery_round`` and
``short=true`` may promise more blocks than the seller owns uncommitted for that round. When it is
accepted, the uncovered part (``short`` blocks of ``blocks``) is backed by collateral taken from
the seller's budget (after it has been paid)::

    collateral = collateral_fraction x price x short / blocks + collateral_per_block x short

At delivery the seller must hold the blocks (bought at auction or from others). If it holds them
all, the collateral comes back. If it is short by ``s``, the buyer is refunded
``price x s / blocks`` out of the collateral first and then out of the seller's budget (never below
zero), and gets a compensation of ``breach_compensation x price x s / blocks`` out of what is left
of the collateral only; the rest of the collateral returns to the seller, which also pays the
withdrawal penalty per missing block and loses reputation (``market.core.penalties``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from market.core.ledger import ActionError, fail_blocks
from market.core.rng import RngStreams
from market.core.scenario_schema import DeliverySpec
from market.core.seats import bidder_seat
from market.core.world import World


@dataclass(frozen=True, slots=True)
class BlockFailure:
    """Lab ``lab`` held ``held`` blocks for ``round``; the blocks in ``slots`` failed."""

    round: int
    lab: int
    held: int
    slots: tuple[int, ...]

    def block_ids(self) -> list[str]:
        return [f"r{self.round}/{bidder_seat(self.lab)}/{k}" for k in self.slots]

    def to_log(self) -> dict[str, object]:
        return {
            "seat": bidder_seat(self.lab),
            "held": self.held,
            "failed": len(self.slots),
            "block_ids": self.block_ids(),
        }


def failure_rate(world: World, spec: DeliverySpec, base_reliability: float, r: int) -> float:
    """``p_r``: the probability that an owned block for round ``r`` fails (see the module doc)."""
    base = int(world.base_capacity[r])
    outage = 0.0 if base <= 0 else max(0.0, 1.0 - int(world.capacity[r]) / base)
    drop = max(0.0, base_reliability - float(world.reliability[r]))
    p = spec.owned_failure_rate + spec.outage_exposure * outage + spec.reliability_exposure * drop
    return min(1.0, max(0.0, p))


def failed_slots(streams: RngStreams, r: int, lab: int, held: int, rate: float) -> np.ndarray:
    """The slots among ``held`` whose block fails: slot ``k`` fails iff draw ``k`` of the
    ``failures`` stream keyed ``(r, lab)`` is below ``rate``."""
    if held <= 0 or rate <= 0.0:
        return np.zeros(0, dtype=np.int64)
    u = streams.stream("failures", r, lab).random(held)
    return np.flatnonzero(u < rate).astype(np.int64)


def fail_owned_blocks(
    world: World, streams: RngStreams, spec: DeliverySpec, base_reliability: float, r: int
) -> list[BlockFailure]:
    """Destroy the failing blocks every lab holds for round ``r``; returns the failures."""
    rate = failure_rate(world, spec, base_reliability, r)
    if rate <= 0.0:
        return []
    failures = []
    for lab, held in enumerate(world.holdings[:, r].tolist()):
        slots = failed_slots(streams, r, lab, int(held), rate)
        if slots.size:
            fail_blocks(world, lab, r, int(slots.size))
            failures.append(BlockFailure(r, lab, int(held), tuple(slots.tolist())))
    return failures


def short_part(owned: int, committed: int, blocks: int) -> int:
    """Blocks of a sale of ``blocks`` not covered by the seller's uncommitted holdings."""
    return max(0, blocks - max(0, owned - committed))


def collateral(spec: DeliverySpec, price: float, blocks: int, short: int) -> float:
    """The collateral backing ``short`` of ``blocks`` blocks sold for ``price`` in total."""
    if short <= 0:
        return 0.0
    return round(
        spec.collateral_fraction * price * short / blocks + spec.collateral_per_block * short, 2
    )


def check_short_sale(
    world: World,
    spec: DeliverySpec,
    seller: int,
    blocks: int,
    price: float,
    delivery: int,
    now: int,
    committed: int,
    who: str,
) -> tuple[int, float]:
    """Check a short forward sale; returns its short blocks and collateral. Raises ActionError."""
    if not spec.short_sales:
        raise ActionError(
            "short sales are off in this scenario (delivery.short_sales = false); "
            "offer only blocks you own, without 'short'"
        )
    if delivery <= now:
        raise ActionError(
            f"a short sale must be forward: set delivery_round after the current round {now}"
        )
    short = short_part(int(world.holdings[seller, delivery]), committed, blocks)
    need = collateral(spec, price, blocks, short)
    budget = world.labs[seller].budget
    if budget + price + 1e-9 < need:
        raise ActionError(
            f"{who} would post {need:.2f} credits of collateral for {short} short block(s) but "
            f"{'have' if who == 'you' else 'has'} {budget:.2f} (plus the price {price:.2f}); "
            "sell fewer blocks or at a lower price"
        )
    return short, need
