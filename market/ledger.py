"""Credits and blocks move only through these functions, so conservation is easy to audit.

Invariant (tested after every step): lab budgets + operator credits + coalition escrow equals the
initial credits plus external injections (windfalls minus budget cuts); blocks are never created
except by the operator's capacity and never go negative.
"""

from __future__ import annotations

from market.world import World


class ActionError(ValueError):
    """An invalid action: the message says what was wrong and how to fix it. Nothing changed."""


def transfer_credits(world: World, payer: int, payee: int, amount: float) -> None:
    world.labs[payer].budget -= amount
    world.labs[payee].budget += amount


def pay_operator(world: World, payer: int, amount: float) -> float:
    """Charge up to ``amount`` (never below a zero budget); returns what was charged."""
    lab = world.labs[payer]
    charged = min(amount, max(0.0, lab.budget))
    lab.budget -= charged
    world.operator_credits += charged
    return charged


def move_blocks(world: World, seller: int, buyer: int, round_: int, blocks: int) -> None:
    world.holdings[seller, round_] -= blocks
    world.holdings[buyer, round_] += blocks
