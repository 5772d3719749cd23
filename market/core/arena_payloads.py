"""Block identity for GPU-arena payloads: individual block ids read against the market's state.

The GPU-arena names every block (``b_<lab>_<k>``: lab ``<lab>``'s ``k``-th block) and its actions
move named blocks. This market keeps per-round accounting: a lab holds a *count* of blocks for
each round, and blocks of one round are interchangeable. A block id here therefore names one
block slot, and a list of ids means that many blocks of the rounds they belong to. Three forms:

- ``r<round>``: one block of that round (repeat it for several);
- ``r<round>/<seat>/<k>``: slot ``k`` of ``<seat>``'s blocks for ``<round>`` (the market's own
  id, the one ``DeliveryView.failed_block_ids`` shows; ``<seat>`` may be ``lab_<i>``);
- ``b_<i>_<k>``: the arena's form: lab ``i``'s ``k``-th block, counting the lab's blocks from the
  current round on in round order (the order a lab's holdings list them: ``holdings[0]`` blocks
  of this round first, then next round's, ...). Your own ``b_`` ids are read against your
  holdings; another lab's holdings are private here, so its ``b_<j>_<k>`` names one of its blocks
  of the *current round* (whether it holds it is checked when the trade executes, as for any
  offer). Ids are positions, so a block you bought is named by its new place in *your* list.

Each arena action maps onto this market's economics (docs/actions.md shows both payloads):

- ``send_offer``: ``requested_block_ids`` (blocks the target gives you) make a **buy** offer for
  that many blocks of their round at ``price = payment``; ``block_ids`` alone (blocks you give)
  make a **sell** offer at ``price = payment``, paid by the target (here credits always flow
  against blocks; in the arena the sender pays ``payment``). Both together are a **swap**: a buy
  offer for the requested blocks whose sender also hands over ``give_blocks`` blocks of
  ``give_round`` (the ``block_ids``), paying ``payment`` on top; accepting it moves all three
  at once (later rounds as forward contracts).
- ``counter_offer``: the same fields give the counter's ``blocks`` (requested ids when the
  counter buys, ``block_ids`` when it sells) and, for a swap-shaped counter, its give leg;
  ``target_lab_id`` is dropped (a counter goes to the original offer's sender, as in the arena).
- ``reserve_capacity`` / ``release_capacity``: your ids as ``r<round>`` block ids.
- ``allocate_to_job``: your ids; all of this round: ``allocate_to_job`` with ``blocks`` = how
  many; any of a later round: ``reserve_capacity`` with ``job_id`` (reserved blocks run that job
  first when their round executes, which is what allocating a future block means).
- ``commit_to_coalition``: your ids pledge that many blocks to the pool (``pledge_blocks``).
- ``make_pitch``: ``requested_block_ids`` give ``blocks_requested`` = how many.

Refusals are one line naming the arena feature (e.g. an offer over blocks of several rounds:
an offer here trades blocks of one round). :func:`market.core.arena_actions.from_arena` is the entry point.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from market.core.seats import bidder_seat, is_bidder_seat, lab_index, seat_alias
from market.core.summation import ordered_sum

if TYPE_CHECKING:
    from market.core.world import World

_ROUND = re.compile(r"[rR](0|[1-9][0-9]*)")
_SLOT = re.compile(r"[rR](0|[1-9][0-9]*)/(?:bidder|lab)_(0|[1-9][0-9]*)/(0|[1-9][0-9]*)")
_ARENA = re.compile(r"b_(0|[1-9][0-9]*)_(0|[1-9][0-9]*)")
BLOCK_FIELDS = ("block_ids", "requested_block_ids")


@dataclass(frozen=True, slots=True)
class BlockContext:
    """What reading block ids needs: the acting lab, the current round and its own holdings
    (``holdings[0]`` blocks for this round, ``holdings[1]`` for the next, ...)."""

    me: int
    now: int
    holdings: Sequence[int]

    @classmethod
    def of_world(cls, world: World, me: int, now: int) -> BlockContext:
        return cls(me, now, world.holdings[me, now:].tolist())

    @classmethod
    def reader(cls, world: World, seat: str, now: int) -> Callable[[], BlockContext] | None:
        """What reads a seat's GPU-arena block ids against its holdings, built only when a
        payload names blocks (:func:`market.core.actions.parse_action`); None for the designer."""
        return partial(cls.of_world, world, lab_index(seat), now) if is_bidder_seat(seat) else None

    @classmethod
    def of_observation(cls, obs: Any) -> BlockContext:
        """From a bidder's :class:`~market.environment.observations.Observation`."""
        return cls(lab_index(obs.seat), int(obs.round), list(obs.holdings or []))

    def my_ids(self) -> list[str]:
        """The arena ids of this lab's blocks, in order (``b_<me>_0`` ...)."""
        return [f"b_{self.me}_{k}" for k in range(ordered_sum(int(h) for h in self.holdings))]

    def own_round(self, k: int) -> int | None:
        """The round of this lab's ``k``-th block, or None when it holds fewer."""
        for offset, held in enumerate(self.holdings):
            if k < int(held):
                return self.now + offset
            k -= int(held)
        return None


@dataclass(frozen=True, slots=True)
class Block:
    """One id read: the owner it names (None: unnamed, as ``r<round>``) and its round."""

    text: str
    owner: int | None
    round: int
    slot: tuple[int, int, int] | None  # (owner, round, k) when the id names one slot


class BlockIdError(ValueError):
    """A block id that cannot be read here; the message says why and what to send."""


def read_block(raw: object, ctx: BlockContext | None, field: str) -> Block:
    """One block id as a :class:`Block`; :class:`BlockIdError` with the fix otherwise."""
    text = str(raw).strip()
    if m := _ROUND.fullmatch(text):
        return Block(text, None, int(m.group(1)), None)
    if m := _SLOT.fullmatch(text):
        r, owner, k = (int(g) for g in m.groups())
        return Block(text, owner, r, (owner, r, k))
    if m := _ARENA.fullmatch(text):
        owner, k = int(m.group(1)), int(m.group(2))
        if ctx is None:
            raise BlockIdError(
                f"{field}: arena block id {text!r} names a position in a lab's holdings and is "
                "read against the market's state (step it through the env); without it use "
                "'r<round>' ids"
            )
        if owner != ctx.me:  # another lab's holdings are private: its current-round block
            return Block(text, owner, ctx.now, (owner, ctx.now, k))
        own = ctx.own_round(k)
        if own is None:
            held = ordered_sum(int(h) for h in ctx.holdings)
            raise BlockIdError(
                f"{field}: you have no block {text!r}: you hold {held} block(s) from this round "
                f"on, b_{ctx.me}_0 .. b_{ctx.me}_{held - 1} in round order"
                if held
                else f"{field}: you have no block {text!r}: you hold no blocks from this round on"
            )
        return Block(text, owner, own, (owner, own, k))
    raise BlockIdError(
        f"{field}: {text!r} is not a block id; use 'r<round>' (a block of that round), "
        "'r<round>/<seat>/<k>' or the arena's 'b_<lab>_<k>'"
    )


def read_blocks(ids: Any, ctx: BlockContext | None, field: str) -> list[Block]:
    """A non-empty list of ids read; a slot named twice is refused."""
    if not isinstance(ids, list) or not ids:
        raise BlockIdError(f"{field} must be a non-empty list of block ids such as ['r3', 'r3']")
    blocks = [read_block(b, ctx, field) for b in ids]
    seen: set[tuple[int, int, int]] = set()
    for b in blocks:
        if b.slot is not None and b.slot in seen:
            raise BlockIdError(f"{field} names block {b.text!r} twice; name each block once")
        if b.slot is not None:
            seen.add(b.slot)
    return blocks


def _mine(blocks: list[Block], ctx: BlockContext | None, field: str, what: str) -> None:
    me = None if ctx is None else ctx.me
    for b in blocks:
        if b.owner is not None and b.owner != me:
            raise BlockIdError(
                f"{field}: {b.text!r} is {bidder_seat(b.owner)}'s block; {what} takes blocks you "
                "hold (a block you bought is named by its place in your own list)"
            )


def _one_round(blocks: list[Block], field: str, feature: str) -> int:
    rounds = sorted({b.round for b in blocks})
    if len(rounds) > 1:
        raise BlockIdError(
            f"{field} name blocks of rounds {rounds}: the arena's {feature} over blocks of "
            "several rounds has no single offer here (an offer trades blocks of one round); "
            "send one offer per round"
        )
    return rounds[0]


def _target(out: dict[str, Any]) -> int | None:
    seat = seat_alias(out.get("to", out.get("target_lab_id")))
    try:
        return lab_index(seat) if isinstance(seat, str) else None
    except ValueError:
        return None


def resolve_blocks(data: dict[str, Any], ctx: BlockContext | None) -> dict[str, Any]:
    """``data`` (arena field names, nulls already dropped) with its block id lists rewritten
    into this market's fields, per the module docstring. Raises :class:`BlockIdError`."""
    kind = data.get("action_type")
    offered, requested = data.get("block_ids"), data.get("requested_block_ids")
    if offered is None and requested is None:
        return data
    out = {k: v for k, v in data.items() if k not in BLOCK_FIELDS}
    give = None if offered is None else read_blocks(offered, ctx, "block_ids")
    take = None if requested is None else read_blocks(requested, ctx, "requested_block_ids")
    if kind in ("send_offer", "counter_offer"):
        feature = "offer" if kind == "send_offer" else "counter-offer"
        if kind == "counter_offer":
            out.pop("target_lab_id", None)  # the arena sends the counter to the original sender
        if give is not None:
            _mine(give, ctx, "block_ids", f"{kind} block_ids (blocks you give)")
        if take is not None:
            target = _target(out) if kind == "send_offer" else None
            for b in take:
                if b.owner is not None and ctx is not None and b.owner == ctx.me:
                    raise BlockIdError(
                        f"requested_block_ids: {b.text!r} is your own block; request blocks the "
                        "other lab holds"
                    )
                if target is not None and b.owner is not None and b.owner != target:
                    raise BlockIdError(
                        f"requested_block_ids: {b.text!r} is {bidder_seat(b.owner)}'s block, "
                        f"not the target's ({bidder_seat(target)}); request the target's blocks"
                    )
        if "payment" not in out and "price" not in out:
            out["price"] = 0.0  # the arena's payment defaults to none
        if take is not None:
            out["blocks"] = len(take)
            if kind == "send_offer":
                out["delivery_round"] = _one_round(take, "requested_block_ids", "offer")
                out.setdefault("side", "buy")
            if give is not None:
                out["give_blocks"] = len(give)
                out["give_round"] = _one_round(give, "block_ids", f"swap {feature}")
        else:
            assert give is not None
            out["blocks"] = len(give)
            if kind == "send_offer":
                out["delivery_round"] = _one_round(give, "block_ids", "offer")
                out.setdefault("side", "sell")
        if kind == "send_offer" and take is not None and out.get("side") != "buy":
            raise BlockIdError(
                f"requested_block_ids are blocks you buy, but side is {out.get('side')!r}"
            )
        if kind == "send_offer" and take is None and out.get("side") != "sell":
            raise BlockIdError(f"block_ids are blocks you sell, but side is {out.get('side')!r}")
        return out
    if take is not None and kind != "make_pitch":
        raise BlockIdError(
            f"{kind} has no requested_block_ids (the arena ignores them there too); drop them"
        )
    if kind == "make_pitch":
        if give is not None:
            raise BlockIdError("make_pitch takes requested_block_ids (blocks you ask for)")
        out["blocks_requested"] = len(take or [])
        return out
    assert give is not None
    if kind in ("reserve_capacity", "release_capacity"):
        _mine(give, ctx, "block_ids", kind)
        out["block_ids"] = [f"r{b.round}" for b in give]
        return out
    if kind == "allocate_to_job":
        _mine(give, ctx, "block_ids", "allocate_to_job")
        now = None if ctx is None else ctx.now
        rounds = {b.round for b in give}
        if now is not None and rounds == {now}:
            out["blocks"] = len(give)
            return out
        if now is None and len(rounds) == 1:
            raise BlockIdError(
                "allocate_to_job block_ids: which round is 'this round' is read against the "
                "market's state (step it through the env), or send blocks = how many"
            )
        # blocks of later rounds: reserved for the job, which they run first in their round
        return {
            **{k: v for k, v in out.items() if k not in ("action_type", "blocks")},
            "action_type": "reserve_capacity",
            "block_ids": [f"r{b.round}" for b in give],
        }
    if kind == "commit_to_coalition":
        _mine(give, ctx, "block_ids", "commit_to_coalition")
        out["pledge_blocks"] = len(give)
        return out
    raise BlockIdError(f"{kind} has no block_ids (the arena ignores them there too); drop them")
