"""Seat names: the one place that builds and reads them.

A market has one designer seat, ``designer_0``, and one bidder seat per lab, ``bidder_<i>`` for
lab index ``i`` (0-based, in lab order). Everything else in the project asks this module instead
of formatting or slicing the strings itself.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

DESIGNER = "designer_0"
BIDDER_PREFIX = "bidder_"
_BIDDER = re.compile(r"bidder_(0|[1-9][0-9]*)")


@lru_cache(maxsize=65536)  # logs and rewards name thousands of seats per round at scale
def bidder_seat(lab: int) -> str:
    """The seat of lab ``lab``: ``bidder_seat(3) == "bidder_3"``."""
    return f"{BIDDER_PREFIX}{int(lab)}"


def is_bidder_seat(seat: object) -> bool:
    """Whether ``seat`` is a well-formed bidder seat name (``bidder_0``, ``bidder_12``...)."""
    return isinstance(seat, str) and _BIDDER.fullmatch(seat) is not None


def lab_index(seat: str) -> int:
    """The lab index of a bidder seat: ``lab_index("bidder_3") == 3``.

    Raises ``ValueError`` for anything that is not a bidder seat name. Seats already read are
    remembered (the env reads the acting seat's index on every step).
    """
    index = _LAB_INDEX.get(seat) if type(seat) is str else None
    if index is not None:
        return index
    match = _BIDDER.fullmatch(seat) if isinstance(seat, str) else None
    if match is None:
        raise ValueError(f"{seat!r} is not a bidder seat (bidder_0, bidder_1, ...)")
    index = int(match.group(1))
    if type(seat) is str and len(_LAB_INDEX) < _LAB_INDEX_KEPT:
        _LAB_INDEX[seat] = index
    return index


#: bidder seat -> lab index, for the seats read so far (at most ``_LAB_INDEX_KEPT`` of them)
_LAB_INDEX: dict[str, int] = {}
_LAB_INDEX_KEPT = 100_000


def seat_order(seat: str) -> tuple[int, int]:
    """Sort key for seats: the designer first, then bidders by lab index."""
    return (0, 0) if seat == DESIGNER else (1, lab_index(seat))


_LAB = re.compile(r"lab_(0|[1-9][0-9]*)")


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


def seat_names(n_labs: int, designer: bool) -> list[str]:
    """Every seat of a market of ``n_labs`` labs, in PettingZoo's ``possible_agents`` order: the
    designer's first (if there is one), then the bidders' in lab order."""
    return ([DESIGNER] if designer else []) + [bidder_seat(i) for i in range(n_labs)]
