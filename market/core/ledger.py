"""Every movement of credits and blocks, each with its source and its sink.

See docs/design.md, section 5.1. No other module writes a lab's budget, the operator's or
external credits, a coalition's escrow balances or block holdings: they call these functions,
and ``tests/environment/test_invariants.py`` checks that statically. Each function debits one account and
credits another by the same amount, so conservation holds by construction:

- credits: lab budgets + coalition escrow + ``world.operator_credits`` equals the labs' initial
  budgets + ``world.external_credits`` (the only source and sink outside the market: windfalls
  are minted, budget cuts burnt);
- blocks: ``holdings[:, r]`` sums to the endowments for round ``r`` plus
  ``world.blocks_issued[r]`` minus ``world.blocks_failed[r]``, and the operator issues at most
  ``capacity[r]``;
- collateral of short forward sales sits in ``world.collateral_held`` (counted with the credits).

The arithmetic (operands and their order) is the one the env has always used, so episodes replay
bit for bit; keep it so.
"""

from __future__ import annotations

import numpy as np

from market.core.summation import ordered_sum
from market.core.world import World


class ActionError(ValueError):
    """An invalid action: the message says what was wrong and how to fix it. Nothing changed."""


# --- credits between labs and the operator -------------------------------------------------
def transfer_credits(world: World, payer: int, payee: int, amount: float) -> None:
    """Lab ``payer`` pays lab ``payee`` (trades, breach refunds); callers check affordability."""
    world.labs[payer].budget -= amount
    world.labs[payee].budget += amount


def pay_operator(world: World, payer: int, amount: float) -> float:
    """A penalty: charge up to ``amount``, never below a zero budget; returns what was charged."""
    lab = world.labs[payer]
    charged = min(amount, max(0.0, lab.budget))
    lab.budget -= charged
    world.operator_credits += charged
    return charged


def pay_for_blocks(world: World, payer: int, round_: int, blocks: int, payment: float) -> None:
    """An auction win: the lab pays ``payment`` in full (its bids were checked against its
    budget) and the operator issues ``blocks`` for ``round_``."""
    world.labs[payer].budget -= payment
    world.operator_credits += payment
    if blocks:  # most bidders win nothing: skip two no-op numpy writes
        issue_blocks(world, payer, round_, blocks)


def pay_for_block_rows(
    world: World, payers: list[int], round_: int, blocks: list[int], payments: list[float]
) -> None:
    """:func:`pay_for_blocks` for many auction winners at once (each payer once), with the same
    operands in the same order: each budget is debited its payment, the operator's account
    credited the payments one by one in ``payers`` order, and the blocks issued."""
    accounts = world.labs
    credits = world.operator_credits
    for payer, payment in zip(payers, payments, strict=True):
        accounts[payer].budget -= payment
        credits += payment
    world.operator_credits = credits
    won = [(payer, n) for payer, n in zip(payers, blocks, strict=True) if n]
    if won:
        rows, counts = zip(*won, strict=True)
        np.add.at(world.holdings[:, round_], list(rows), list(counts))
        world.blocks_issued[round_] += ordered_sum(counts)


# --- credits from and to outside the market -----------------------------------------------
def mint_credits(world: World, lab: int, amount: float) -> None:
    """Credits from outside (a windfall): booked as an external injection."""
    world.labs[lab].budget += amount
    world.external_credits += amount


def burn_credits(world: World, lab: int, amount: float) -> None:
    """Credits leaving the market (a budget cut): booked as a negative external injection."""
    world.labs[lab].budget -= amount
    world.external_credits -= amount


# --- coalition escrow (``balances``: a coalition's pool, per member) ---------------------
def escrow_credits(world: World, balances: dict[int, float], lab: int, amount: float) -> None:
    """A lab pays ``amount`` into a coalition pool; the balance stays its money."""
    world.labs[lab].budget -= amount
    balances[lab] = balances.get(lab, 0.0) + amount


def release_escrow(world: World, balances: dict[int, float], lab: int) -> float:
    """A lab's whole pool balance goes back to its budget; returns the amount."""
    amount = balances.pop(lab, 0.0)
    world.labs[lab].budget += amount
    return amount


def pay_operator_from_escrow(
    world: World, balances: dict[int, float], members: list[int], amount: float, pool: float
) -> dict[int, float]:
    """A coalition's auction payment: ``amount`` out of the pool, charged to the members pro
    rata to their balances (``pool`` is their sum, ``amount`` at most ``pool``); returns each
    member's share. The operator books ``amount`` itself, so the shares add up to it only to
    rounding (the conservation audit allows for that)."""
    charges: dict[int, float] = {}
    for m in members:
        share = amount * balances.get(m, 0.0) / pool
        balances[m] = balances.get(m, 0.0) - share
        charges[m] = share
    world.operator_credits += amount
    return charges


# --- blocks -------------------------------------------------------------------------------
def issue_blocks(world: World, lab: int, round_: int, blocks: int) -> None:
    """The operator hands ``blocks`` of round ``round_``'s capacity to a lab (auction sale,
    coalition share or judge grant); the only way blocks come into existence after reset."""
    world.holdings[lab, round_] += blocks
    world.blocks_issued[round_] += blocks


def move_blocks(world: World, seller: int, buyer: int, round_: int, blocks: int) -> None:
    """Blocks for ``round_`` change owner (spot trade, contract delivery); callers check the
    seller holds them."""
    world.holdings[seller, round_] -= blocks
    world.holdings[buyer, round_] += blocks


# --- delivery risk: failed blocks and short-sale collateral (market.core.delivery) ----------
def fail_blocks(world: World, lab: int, round_: int, blocks: int) -> None:
    """``blocks`` of a lab's blocks for ``round_`` fail: they leave the market (booked in
    ``world.blocks_failed``); callers check the lab holds them."""
    world.holdings[lab, round_] -= blocks
    world.blocks_failed[round_] += blocks


def post_collateral(world: World, lab: int, amount: float) -> None:
    """A short seller posts ``amount`` of its budget as collateral (escrow it cannot spend)."""
    world.labs[lab].budget -= amount
    world.collateral_held += amount


def release_collateral(world: World, lab: int, amount: float) -> None:
    """Collateral (``amount``, at most what the lab posted) goes to lab ``lab``: back to the
    seller, or to the buyer of a breached contract."""
    world.collateral_held -= amount
    world.labs[lab].budget += amount


def pay_from_escrow(
    world: World, balances: dict[int, float], payer: int, payee: int, amount: float
) -> None:
    """A coalition member's pool balance pays ``amount`` (at most the balance) to lab ``payee``'s
    budget: the compensation of a pledge default (market.core.pledges)."""
    balances[payer] = balances.get(payer, 0.0) - amount
    world.labs[payee].budget += amount
