"""The market part of the env's state digest (transcripts and replay check it step by step).

Floats enter by exact ``repr`` and arrays by their bytes, so equal digests mean bit-equal states.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import numpy as np

from market.core.bidding import RoundOrders
from market.core.coalitions import CoalitionBook
from market.core.mechanisms import Mechanism
from market.core.negotiation import Book
from market.core.settlement import RoundResult
from market.core.world import World


class DigestState(Protocol):
    """What the state digest reads of the env (``raw_env`` provides it)."""

    world: World
    book: Book
    coalitions: CoalitionBook
    mechanism: Mechanism
    orders: RoundOrders
    round: int
    phase: str
    turn: int
    agent_selection: str
    results: list[RoundResult]
    terminations: dict[str, bool]
    truncations: dict[str, bool]


class StateDigests:
    """The env's state digest; the market part is hashed once per state version (it changes only
    when the version does, as the observation cache also assumes), so a step costs a few
    microseconds. The RNG state and the interaction graph count only through their effects."""

    def __init__(self) -> None:
        self._cache: tuple[World, int, bytes] | None = None
        self._mechanism: tuple[Mechanism, str] | None = None

    def digest(self, env: DigestState, version: int, potential: np.ndarray) -> str:
        """SHA-256 (hex) of the market part, round, phase, turn and the seats' terminations."""
        cached = self._cache
        if cached is not None and cached[0] is env.world and cached[1] == version:
            market = cached[2]
        else:
            mechanism = self._mechanism
            if mechanism is None or mechanism[0] is not env.mechanism:
                # a Mechanism is frozen and holds only scalars: its JSON is fixed per object
                mechanism = self._mechanism = (env.mechanism, env.mechanism.model_dump_json())
            market = market_digest(
                env.world,
                env.book,
                env.coalitions,
                env.mechanism,
                potential,
                env.orders,
                mechanism_json=mechanism[1],
            )
            self._cache = (env.world, version, market)
        turn = (
            market,
            env.round,
            env.phase,
            env.turn,
            env.agent_selection,
            len(env.results),
            sorted(env.terminations.items()),
            sorted(env.truncations.items()),
        )
        return hashlib.sha256(repr(turn).encode()).hexdigest()


def market_digest(
    w: World,
    book: Book,
    coalitions: CoalitionBook,
    mechanism: Mechanism,
    potential: np.ndarray,
    orders: RoundOrders,
    mechanism_json: str | None = None,
) -> bytes:
    """SHA-256 of budgets, reputations, holdings, jobs, offers, contracts, pitches, coalitions,
    this round's bids and plans, capacity reservations (when any), id counters, the message count and the latest message, the
    mechanism, operator and external credits, and the labs' settled job potential.

    ``mechanism_json``: ``mechanism.model_dump_json()`` when the caller already has it."""
    if mechanism_json is None:
        mechanism_json = mechanism.model_dump_json()
    h = hashlib.sha256()
    h.update(repr((w.operator_credits, w.external_credits, mechanism_json)).encode())
    h.update(w.holdings.tobytes())
    h.update(w.capacity.tobytes())
    h.update(w.reliability.tobytes())
    h.update(potential.tobytes())
    if w.collateral_held or w.blocks_failed.any():  # delivery risk (hashed once it shows)
        h.update(
            repr(
                (
                    w.collateral_held,
                    w.blocks_failed.tolist(),
                    [(c.contract_id, c.short, c.collateral) for c in book.contracts],
                )
            ).encode()
        )
    for lab in w.labs:
        h.update(
            repr(
                (
                    lab.budget,
                    lab.reputation,
                    lab.active,
                    lab.entered,
                    lab.exit_round,
                    [(j.job_id, j.progress, j.status, j.realized) for j in lab.jobs],
                )
            ).encode()
        )
    h.update(
        repr(
            [
                (
                    o.offer_id,
                    o.sender,
                    o.recipient,
                    o.side,
                    o.blocks,
                    o.price,
                    o.delivery_round,
                    o.expires_round,
                    o.status,
                )
                for o in book.offers.values()
            ]
        ).encode()
    )
    h.update(
        repr(
            [
                (c.contract_id, c.seller, c.buyer, c.blocks, c.price, c.delivery_round, c.delivered)
                for c in book.contracts
            ]
        ).encode()
    )
    last_message = book.messages[-1] if book.messages else None
    h.update(
        repr(
            (
                book.next_offer,
                book.next_contract,
                coalitions.next_id,
                len(book.messages),
                last_message and (last_message.sender, last_message.recipients, last_message.text),
                [
                    (p.lab, p.text, p.blocks_requested, p.job_id, p.counters)
                    for p in book.pitches.values()
                ],
            )
        ).encode()
    )
    h.update(
        repr(
            [
                (
                    c.coalition_id,
                    c.leader,
                    c.members,
                    sorted(c.invited),
                    c.status,
                    c.term_end,
                    sorted(c.balances.items()),
                    sorted(c.contributed.items()),
                )
                for c in coalitions.coalitions.values()
            ]
        ).encode()
    )
    h.update(
        repr(
            (
                sorted((k, e.bids) for k, e in orders.bids.items()),
                sorted((k, e.lab, e.bids) for k, e in orders.coalition_bids.items()),
                sorted((k, sorted(v.items())) for k, v in orders.plans.items()),
            )
        ).encode()
    )
    if book.reserved.blocks_by:  # only when a lab reserved: older digests stay unchanged
        h.update(
            repr(
                (
                    sorted(book.reserved.blocks_by.items()),
                    sorted((k, list(v.items())) for k, v in book.reserved.jobs_by.items()),
                )
            ).encode()
        )
    return h.digest()
