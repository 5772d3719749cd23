"""Float sums that are the same on every Python: :func:`ordered_sum`.

Python 3.12 changed the built-in ``sum`` of floats to a compensated (Neumaier) sum, so
``sum([1.2064, ...])`` can differ in the last bit between 3.11 and 3.12, and an episode replayed on
the other version diverges (a job's value of 1.2064 against 1.2064000000000001 was the first
found). Every sum that reaches the market's state, rewards, observations or a seat's decision
adds left to right instead, as 3.11's ``sum`` does; ``math.fsum`` (correctly rounded, also the
same everywhere) is used where the exact sum is wanted. ``tests/test_architecture.py`` keeps the
built-in ``sum`` out of the market's core, environment and agents.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from functools import reduce
from typing import Any, TypeVar, overload

_T = TypeVar("_T")


@overload
def ordered_sum(values: Iterable[int]) -> int: ...
@overload
def ordered_sum(values: Iterable[float]) -> float: ...
@overload
def ordered_sum(values: Iterable[_T], start: _T) -> _T: ...
@overload
def ordered_sum(values: Iterable[Any], start: Any = 0) -> Any: ...


def ordered_sum(values: Iterable[Any], start: Any = 0) -> Any:
    """``start + v0 + v1 + ...``, added left to right: the built-in ``sum`` of Python 3.11 on any
    Python (ints stay ints; floats are rounded after every addition, in order)."""
    return reduce(operator.add, values, start)
