"""A GPU-arena action payload as this market's action: the entry point for the arena's clients.

Block ids are read as :mod:`market.core.arena_payloads` says; everything else as
:func:`market.core.actions.parse_action` reads any payload.
"""

from __future__ import annotations

from typing import Any

from market.core.actions import ActionModel, ActionParseError, parse_action
from market.core.arena_payloads import BlockContext


def from_arena(payload: dict[str, Any], context: Any = None) -> ActionModel:
    """A GPU-arena action payload (compact or ``model_dump`` with nulls) as this market's action.

    ``context`` reads block ids: a :class:`BlockContext`, a bidder's Observation, or None (then
    only ids that carry their round, ``r<round>`` and ``r<round>/<seat>/<k>``, can be read).
    Raises :class:`~market.core.actions.ActionParseError` with a one-line message.
    """
    if context is not None and not isinstance(context, BlockContext):
        try:
            context = BlockContext.of_observation(context)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ActionParseError(
                f"from_arena: context must be a BlockContext or a bidder's Observation ({exc})"
            ) from None
    if not isinstance(payload, dict):
        raise ActionParseError(
            f"an arena action must be a JSON object, got {type(payload).__name__}"
        )
    return parse_action(payload, blocks=context)
