"""Seat names are built and read in one place."""

from __future__ import annotations

import pytest

from market.core.ledger import ActionError
from market.core.negotiation import seat_index
from market.core.seats import DESIGNER, bidder_seat, is_bidder_seat, lab_index, seat_order


def test_round_trip_and_order() -> None:
    assert bidder_seat(0) == "bidder_0" and bidder_seat(12) == "bidder_12"
    assert [lab_index(bidder_seat(i)) for i in range(30)] == list(range(30))
    seats = ["bidder_10", "bidder_2", DESIGNER, "bidder_0"]
    assert sorted(seats, key=seat_order) == ["designer_0", "bidder_0", "bidder_2", "bidder_10"]


@pytest.mark.parametrize(
    "bad", ["bidder_", "bidder_01", "bidder_-1", "designer_0", "Bidder_1", "bidder_1 ", 3, None]
)
def test_malformed_names_are_refused(bad: object) -> None:
    assert not is_bidder_seat(bad)
    with pytest.raises(ValueError, match="not a bidder seat"):
        lab_index(bad)  # type: ignore[arg-type]


def test_action_seat_fields_are_read_by_the_seat_helper() -> None:
    """``negotiation.seat_index`` accepts exactly the seat names ``market.core.seats`` builds."""
    assert seat_index(bidder_seat(2), 3, "to") == 2
    with pytest.raises(ActionError, match="must be a bidder seat such as 'bidder_1'"):
        seat_index("bidder_01", 3, "to")
    with pytest.raises(ActionError, match="does not exist; seats are bidder_0 .. bidder_2"):
        seat_index(bidder_seat(3), 3, "to")
