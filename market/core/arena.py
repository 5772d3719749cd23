"""GPU-arena action payloads: its field names as documented aliases of ours.

The GPU-arena sends one flat action object for all its 14 action types, with the fields
``target_lab_id``, ``offer_id``, ``coalition_id``, ``block_ids``, ``requested_block_ids``,
``job_id``, ``payment``, ``message`` and ``conditions`` (unused ones ``null``). Its labs are
``lab_<i>``; a lab index (an integer) is also accepted. The rules (:data:`ARENA_FIELDS` is the
table, rendered into docs/actions.md by :func:`arena_table`):

- renames are pydantic ``AliasChoices`` on our fields (``payment`` -> ``price``, ...);
- lab ids map to seats through :mod:`market.core.seats` (``lab_2`` and ``2`` -> ``bidder_2``);
- an arena field set to ``null`` is the same as leaving it out;
- block ids are ours, ``r<round>`` (a lab's blocks of one round are interchangeable, so an id
  names the round); a list of them gives a block count (and, for an offer, the delivery round);
  an offer's ``block_ids`` are blocks the sender sells, ``requested_block_ids`` blocks it buys;
- ``conditions`` are kept with the offer's action in the transcript; the market does not
  enforce them, and the action's result says so (``conditions_ignored``).
"""

from __future__ import annotations

import re
from typing import Any

from market.core.seats import bidder_seat

# arena action type -> {arena field: what it becomes here}; the 14 arena action types
ARENA_FIELDS: dict[str, dict[str, str]] = {
    "send_offer": {
        "target_lab_id": "`to`",
        "block_ids": "blocks you sell: `side: sell`, `blocks` = how many, `delivery_round` = their round",
        "requested_block_ids": "blocks you buy: `side: buy`, `blocks` = how many, `delivery_round` = their round",
        "payment": "`price` (total credits)",
        "message": "`message`",
        "conditions": "kept in the transcript, not enforced (result: `conditions_ignored`)",
    },
    "accept_offer": {"offer_id": "`offer_id`"},
    "reject_offer": {"offer_id": "`offer_id`"},
    "counter_offer": {
        "offer_id": "`offer_id`",
        "block_ids": "`blocks` = how many (the direction is the original offer's, reversed)",
        "requested_block_ids": "`blocks` = how many (as `block_ids`)",
        "payment": "`price`",
        "message": "`message`",
        "conditions": "kept in the transcript, not enforced (result: `conditions_ignored`)",
    },
    "make_pitch": {
        "message": "`text`",
        "job_id": "`job_id`",
        "requested_block_ids": "`blocks_requested` = how many",
    },
    "counter_pitch": {"target_lab_id": "`target`", "message": "`text`"},
    "reserve_capacity": {"block_ids": "`block_ids`", "job_id": "`job_id`"},
    "release_capacity": {"block_ids": "`block_ids`"},
    "form_coalition": {
        "target_lab_id": "`members` = [that lab]",
        "message": "`purpose`",
        "payment": "`contribution`",
    },
    "commit_to_coalition": {"coalition_id": "`coalition_id`", "payment": "`contribution`"},
    "allocate_to_job": {"job_id": "`job_id`", "block_ids": "`blocks` = how many"},
    "send_message": {"target_lab_id": "`to` (omitted or null: `all`)", "message": "`text`"},
    "wait": {},
    "finish": {},
}
ARENA_KEYS = (
    "target_lab_id",
    "offer_id",
    "coalition_id",
    "block_ids",
    "requested_block_ids",
    "job_id",
    "payment",
    "message",
    "conditions",
)
_LAB = re.compile(r"lab_(0|[1-9][0-9]*)")
_BLOCK = re.compile(r"[rR](0|[1-9][0-9]*)")


def seat_alias(value: Any) -> Any:
    """An arena lab id as our seat: ``"lab_3"`` or ``3`` -> ``"bidder_3"``; anything else as is."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return bidder_seat(value)
    if isinstance(value, str) and (match := _LAB.fullmatch(value.strip())):
        return bidder_seat(int(match.group(1)))
    return value


def seats_alias(value: Any) -> Any:
    """:func:`seat_alias` over a list (or one value)."""
    return [seat_alias(v) for v in value] if isinstance(value, list) else seat_alias(value)


def block_rounds(ids: Any, name: str = "block_ids") -> list[int]:
    """The round of each block id (``'r3'`` -> 3); ``ValueError`` naming the first bad id."""
    if not isinstance(ids, list) or not ids:
        raise ValueError(f"{name} must be a non-empty list of block ids such as ['r3', 'r3']")
    rounds = []
    for k, bid in enumerate(ids):
        match = _BLOCK.fullmatch(str(bid).strip())
        if match is None:
            raise ValueError(
                f"{name}: block id {bid!r} (entry {k}) is not one of ours; block ids here are "
                "'r<round>' (a lab's blocks of one round are interchangeable, so an id names the "
                "round; repeat it for several blocks), e.g. ['r3', 'r3']"
            )
        rounds.append(int(match.group(1)))
    return rounds


def _one_round(ids: Any, name: str) -> tuple[int, int]:
    """(count, round) of a list of block ids that must all name one round."""
    rounds = block_rounds(ids, name)
    if len(set(rounds)) > 1:
        raise ValueError(
            f"{name} name rounds {sorted(set(rounds))}; one offer trades blocks of one round, "
            "so send one offer per round"
        )
    return len(rounds), rounds[0]


def arena_payload(data: Any) -> Any:
    """Rewrite an arena payload (a dict) into our field names; other input is returned as is.

    Null arena fields are dropped; block id lists become counts (and an offer's side and
    delivery round); ``target_lab_id`` of ``form_coalition`` becomes ``members``. Raises
    ``ValueError`` with a fix when the arena fields cannot mean anything here.
    """
    if not isinstance(data, dict):
        return data
    out = {k: v for k, v in data.items() if not (k in ARENA_KEYS and v is None)}
    kind = out.get("action_type")
    offered, requested = out.pop("block_ids", None), out.pop("requested_block_ids", None)
    if kind == "send_offer" and (offered is not None or requested is not None):
        if offered is not None and requested is not None:
            raise ValueError(
                "block_ids and requested_block_ids together are a swap, which this market has no "
                "single action for; send one offer to sell and one to buy"
            )
        ids, side, name = (
            (offered, "sell", "block_ids")
            if offered is not None
            else (requested, "buy", "requested_block_ids")
        )
        out["blocks"], out["delivery_round"] = _one_round(ids, name)
        if out.setdefault("side", side) != side:
            raise ValueError(f"{name} means side '{side}', but side is {out['side']!r}")
    elif kind == "counter_offer" and (offered is not None or requested is not None):
        ids = offered if offered is not None else requested
        out["blocks"] = len(block_rounds(ids, "block_ids"))
    elif kind == "make_pitch" and requested is not None:
        out["blocks_requested"] = len(block_rounds(requested, "requested_block_ids"))
    elif kind == "allocate_to_job" and offered is not None:
        out["blocks"] = len(block_rounds(offered, "block_ids"))
    elif kind in ("reserve_capacity", "release_capacity") and offered is not None:
        out["block_ids"] = offered
    elif kind == "commit_to_coalition" and offered is not None:
        raise ValueError(
            "coalition pools hold credits here, not blocks; drop block_ids and commit credits "
            "with contribution (or payment)"
        )
    else:
        out.update(
            {
                k: v
                for k, v in (("block_ids", offered), ("requested_block_ids", requested))
                if v is not None
            }
        )
    if kind == "form_coalition" and "target_lab_id" in out:
        target = out.pop("target_lab_id")
        out["members"] = target if isinstance(target, list) else [target]
    return out


def arena_table() -> str:
    """The Markdown table of :data:`ARENA_FIELDS` (docs/actions.md embeds it verbatim)."""
    rows = ["| arena action | arena field | here |", "|---|---|---|"]
    for kind, fields in ARENA_FIELDS.items():
        if not fields:
            rows.append(f"| `{kind}` | (none) | `{kind}` |")
        for name, meaning in fields.items():
            rows.append(f"| `{kind}` | `{name}` | {meaning} |")
    return "\n".join(rows) + "\n"


def ignored_conditions(conditions: dict[str, Any] | None) -> dict[str, list[str]]:
    """The action result's note that an offer's ``conditions`` were recorded but not enforced."""
    return {"conditions_ignored": sorted(conditions)} if conditions else {}
