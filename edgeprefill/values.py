"""Type tests for values read from JSON, the command line or a caller.

Here a bool is never a number (JSON's `true` is no count, though Python's bool is an int),
and NaN or infinity is never a setting (Python's JSON parser accepts both). Beside them,
`span`: counts said as their range (the export's quirks and `inspect` both say them),
and `plain`: a numpy scalar as the Python value it holds.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import TypeGuard

import numpy as np


def is_int(value: object) -> TypeGuard[int]:
    """A Python int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def span(counts: Collection[int]) -> str:
    """Counts as their range, "2-6", or the one count they all are."""
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}-{high}"


def is_integral(value: object) -> bool:
    """An integer of any kind (numpy's too: token ids often come as arrays), not a bool."""
    # `type(...) is int` first: the ABC check costs ~1 us, and prompts of token ids are
    # checked id by id (60,000 ids had taken 0.3 s of the server's event loop).
    return type(value) is int or (isinstance(value, numbers.Integral)
                                  and not isinstance(value, bool))


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, not a bool; NaN and infinity included."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_finite(value: object) -> TypeGuard[int | float]:
    """An int or a float that is finite as a float, not a bool (10**400 is not)."""
    try:
        return is_number(value) and math.isfinite(value)
    except OverflowError:  # an int beyond the float range
        return False


def plain(value: object) -> object:
    """A numpy integer, float or bool as the Python int, float or bool it holds; anything
    else as it is. An app's counts and settings often come from numpy (an array's element,
    a computed size); the SDK's checks (is_int, is_finite) take Python's types only, and
    would refuse np.int64(5) as "not an integer". JSON and the CLI never give numpy."""
    if isinstance(value, np.integer | np.floating | np.bool_):
        return value.item()
    return value
