"""The market part of the env's state digest (transcripts and replay check it step by step).

Floats enter by exact ``repr`` and arrays by their bytes, so equal digests mean bit-equal states.

The digest is SHA-256 over the ``repr`` text of each part of the state, in a fixed order.
Writing that text (float formatting above all) is what costs, so :class:`ReprMemo` keeps each
part's text and reuses it while the part's plain data is unchanged: the data's :mod:`marshal`
bytes (floats as their eight IEEE bytes, so ``0.0`` and ``-0.0`` differ) are compared with the
last ones, and equal bytes mean equal data and so equal text. The hashed bytes, and so every
digest, are the same as without it.
"""

from __future__ import annotations

import hashlib
import marshal
from collections.abc import Iterable
from typing import Any, Protocol

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


class ReprMemo:
    """The ``repr`` text of each part (a slot) of the state, reused while the part is unchanged.

    Unchanged means: the :mod:`marshal` bytes of the part equal the last ones. marshal writes
    plain data (None, bools, ints, floats as their eight IEEE bytes, strings, and tuples, lists,
    dicts and sets in their order) exactly and with its type, so equal bytes mean equal ``repr``
    text. A part marshal refuses (a model, a numpy scalar) is written with ``repr`` every time.
    The digest feeds it plain data only (numpy values would marshal as their raw bytes, which do
    not say their type).
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[Any, tuple[bytes, bytes]] = {}

    def join(self, parts: Iterable[tuple[Any, Any]]) -> bytes:
        """The concatenated ``repr(value).encode()`` of each ``(slot, value)``."""
        last, dumps, out = self._last, marshal.dumps, []
        for slot, value in parts:
            try:
                key = dumps(value, 2)
            except ValueError:  # not plain data: no reuse
                out.append(repr(value).encode())
                continue
            hit = last.get(slot)
            if hit is not None and hit[0] == key:
                out.append(hit[1])
            else:
                text = repr(value).encode()
                last[slot] = (key, text)
                out.append(text)
        return b"".join(out)

    def flags(self, terminations: dict[str, bool], truncations: dict[str, bool]) -> str:
        """``repr(sorted(terminations.items())) + ", " + repr(sorted(truncations.items()))``,
        reused while both dicts hold the same items in the same order."""
        items = (tuple(terminations.items()), tuple(truncations.items()))
        try:
            key = marshal.dumps(items, 2)
        except ValueError:
            return f"{sorted(items[0])!r}, {sorted(items[1])!r}"
        hit = self._last.get("flags")
        if hit is not None and hit[0] == key:
            return hit[1].decode()
        text = f"{sorted(items[0])!r}, {sorted(items[1])!r}"
        self._last["flags"] = (key, text.encode())
        return text


class StateDigests:
    """The env's state digest; the market part is hashed once per state version (it changes only
    when the version does, as the observation cache also assumes), from the text of the parts
    that changed (:class:`ReprMemo`), so a step costs a few microseconds. The RNG state and the
    interaction graph count only through their effects."""

    def __init__(self) -> None:
        self._cache: tuple[World, int, str] | None = None
        self._mechanism: tuple[Mechanism, str] | None = None
        self._memo = ReprMemo()

    def digest(self, env: DigestState, version: int, potential: np.ndarray) -> str:
        """SHA-256 (hex) of the ``repr`` of the tuple (market part, round, phase, turn, seat to
        act, rounds closed, sorted terminations, sorted truncations)."""
        cached = self._cache
        if cached is not None and cached[0] is env.world and cached[1] == version:
            market = cached[2]
        else:
            mechanism = self._mechanism
            if mechanism is None or mechanism[0] is not env.mechanism:
                # a Mechanism is frozen and holds only scalars: its JSON is fixed per object
                mechanism = self._mechanism = (env.mechanism, env.mechanism.model_dump_json())
            market = repr(
                market_digest(
                    env.world,
                    env.book,
                    env.coalitions,
                    env.mechanism,
                    potential,
                    env.orders,
                    mechanism_json=mechanism[1],
                    memo=self._memo,
                )
            )
            self._cache = (env.world, version, market)
        flags = self._memo.flags(env.terminations, env.truncations)
        # the text of the tuple's repr, written part by part
        text = (
            f"({market}, {env.round!r}, {env.phase!r}, {env.turn!r}, {env.agent_selection!r}, "
            f"{len(env.results)!r}, {flags})"
        )
        return hashlib.sha256(text.encode()).hexdigest()


def market_digest(
    w: World,
    book: Book,
    coalitions: CoalitionBook,
    mechanism: Mechanism,
    potential: np.ndarray,
    orders: RoundOrders,
    mechanism_json: str | None = None,
    memo: ReprMemo | None = None,
) -> bytes:
    """SHA-256 of budgets, reputations, holdings, jobs, offers, contracts, pitches, coalitions,
    this round's bids and plans, capacity reservations (when any), id counters, the message count
    and the latest message, the mechanism, operator and external credits, and the labs' settled
    job potential: the ``repr`` text of each part (arrays: their bytes), in this order.

    ``mechanism_json``: ``mechanism.model_dump_json()`` when the caller already has it.
    ``memo``: reuse the text of parts unchanged since its last call (the same digest)."""
    if mechanism_json is None:
        mechanism_json = mechanism.model_dump_json()
    join = memo.join if memo is not None else _join
    h = hashlib.sha256()
    h.update(join((("head", (w.operator_credits, w.external_credits, mechanism_json)),)))
    h.update(w.holdings.tobytes())
    h.update(w.capacity.tobytes())
    h.update(w.reliability.tobytes())
    h.update(potential.tobytes())
    parts: list[tuple[Any, Any]] = []
    if w.collateral_held or np.count_nonzero(w.blocks_failed):  # delivery risk, once it shows
        risk = [(c.contract_id, c.short, c.collateral) for c in book.contracts]
        parts.append(("risk", (w.collateral_held, w.blocks_failed.tolist(), risk)))
    parts += [
        (
            i,  # a lab's slot is its index
            (
                lab.budget,
                lab.reputation,
                lab.active,
                lab.entered,
                lab.exit_round,
                [(j.job_id, j.progress, j.status, j.realized) for j in lab.jobs],
            ),
        )
        for i, lab in enumerate(w.labs)
    ]
    offers = [
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
    contracts = [
        (c.contract_id, c.seller, c.buyer, c.blocks, c.price, c.delivery_round, c.delivered)
        for c in book.contracts
    ]
    last_message = book.messages[-1] if book.messages else None
    talk = (
        book.next_offer,
        book.next_contract,
        coalitions.next_id,
        len(book.messages),
        last_message and (last_message.sender, last_message.recipients, last_message.text),
        [(p.lab, p.text, p.blocks_requested, p.job_id, p.counters) for p in book.pitches.values()],
    )
    groups = [
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
    bids = (
        sorted((k, e.bids) for k, e in orders.bids.items()),
        sorted((k, e.lab, e.bids) for k, e in orders.coalition_bids.items()),
        sorted((k, sorted(v.items())) for k, v in orders.plans.items()),
    )
    parts += [
        ("offers", offers),
        ("contracts", contracts),
        ("talk", talk),
        ("coalitions", groups),
        ("orders", bids),
    ]
    if book.reserved.blocks_by:  # only when a lab reserved: older digests stay unchanged
        reserved = (
            sorted(book.reserved.blocks_by.items()),
            sorted((k, list(v.items())) for k, v in book.reserved.jobs_by.items()),
        )
        parts.append(("reserved", reserved))
    h.update(join(parts))
    return h.digest()


def _join(parts: Iterable[tuple[Any, Any]]) -> bytes:
    return b"".join(repr(value).encode() for _, value in parts)
