"""GPU-arena action payloads: its field names as documented aliases of ours.

The GPU-arena sends one flat action object for all its 14 action types, with the fields
``target_lab_id``, ``offer_id``, ``coalition_id``, ``block_ids``, ``requested_block_ids``,
``job_id``, ``payment``, ``message`` and ``conditions`` (unused ones ``null``). Its labs are
``lab_<i>``; a lab index (an integer) is also accepted. The rules (:data:`ARENA_FIELDS` is the
table, rendered into docs/actions.md by :func:`arena_table`):

- renames are pydantic ``AliasChoices`` on our fields (``payment`` -> ``price``, ...);
- lab ids map to seats through :mod:`market.core.seats` (``lab_2`` and ``2`` -> ``bidder_2``);
- an arena field set to ``null`` is the same as leaving it out;
- block ids (the arena's ``b_<lab>_<k>``, or ours: ``r<round>``, ``r<round>/<seat>/<k>``) name
  blocks individually while the market keeps per-round counts: a list of them is that many
  blocks of their rounds (:mod:`market.core.arena_payloads` reads them and maps swaps,
  block-level reservations and allocations, and blocks pledged to coalitions);
- ``conditions`` are kept with the offer's action in the transcript; the market does not
  enforce them, and the action's result says so (``conditions_ignored``).
"""

from __future__ import annotations

from typing import Any

from market.core.arena_payloads import read_blocks, resolve_blocks

# arena action type -> {arena field: what it becomes here}; the 14 arena action types
ARENA_FIELDS: dict[str, dict[str, str]] = {
    "send_offer": {
        "target_lab_id": "`to`",
        "block_ids": "blocks you give: alone, `side: sell`, `blocks` = how many, `delivery_round` = their round; with `requested_block_ids`, a swap: `give_blocks` = how many, `give_round` = their round",
        "requested_block_ids": "blocks you get: `side: buy`, `blocks` = how many, `delivery_round` = their round",
        "payment": "`price` (total credits, paid by the side that gets the blocks; in a swap, by you)",
        "message": "`message`",
        "conditions": "kept in the transcript, not enforced (result: `conditions_ignored`)",
    },
    "accept_offer": {"offer_id": "`offer_id`"},
    "reject_offer": {"offer_id": "`offer_id`"},
    "counter_offer": {
        "target_lab_id": "dropped: a counter goes to the original offer's sender (the arena overwrites it too)",
        "offer_id": "`offer_id`",
        "block_ids": "blocks you give: `blocks` = how many when you sell; with `requested_block_ids`, the swap's `give_blocks`/`give_round`",
        "requested_block_ids": "blocks you get: `blocks` = how many (the direction is the original offer's, reversed)",
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
    "reserve_capacity": {
        "block_ids": "`block_ids` as `r<round>` (your blocks; that many of each round)",
        "job_id": "`job_id`",
    },
    "release_capacity": {"block_ids": "`block_ids` as `r<round>` (your blocks)"},
    "form_coalition": {
        "target_lab_id": "`members` = [that lab]",
        "message": "`purpose`",
        "payment": "`contribution`",
    },
    "commit_to_coalition": {
        "coalition_id": "`coalition_id`",
        "block_ids": "`pledge_blocks` = how many (your blocks, pledged to the pool)",
        "payment": "`contribution`",
    },
    "allocate_to_job": {
        "job_id": "`job_id`",
        "block_ids": "your blocks: all of this round, `blocks` = how many; any later, `reserve_capacity` with `job_id` (they run the job first in their round)",
    },
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


def block_rounds(ids: Any, name: str = "block_ids") -> list[int]:
    """The round of each block id that carries one (``'r3'``, ``'r3/bidder_1/0'``); ``ValueError``
    naming the first id that does not (see :mod:`market.core.arena_payloads`)."""
    return [b.round for b in read_blocks(ids, None, name)]


def arena_payload(data: Any, blocks: Any = None) -> Any:
    """Rewrite an arena payload (a dict) into our field names; other input is returned as is.

    Null arena fields are dropped; block id lists become counts, rounds, swap legs and pledges
    (:func:`market.core.arena_payloads.resolve_blocks`, read against ``blocks``, a
    :class:`~market.core.arena_payloads.BlockContext` or None); ``target_lab_id`` of
    ``form_coalition`` becomes ``members``. Raises ``ValueError`` with a fix when the arena
    fields cannot mean anything here.
    """
    if not isinstance(data, dict):
        return data
    out = {k: v for k, v in data.items() if not (k in ARENA_KEYS and v is None)}
    out = resolve_blocks(out, blocks)
    if out.get("action_type") == "form_coalition" and "target_lab_id" in out:
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
