"""The shared type tests: a bool is no number anywhere, numpy integers are ids."""

import math

import numpy as np
import pytest

from edgeprefill.values import is_finite, is_int, is_integral, is_number


@pytest.mark.parametrize("value, int_, integral, number, finite", [
    (3, True, True, True, True),
    (True, False, False, False, False),
    (np.int64(3), False, True, False, False),
    (np.bool_(True), False, False, False, False),
    (2.5, False, False, True, True),
    (math.nan, False, False, True, False),
    (math.inf, False, False, True, False),
    (10**400, True, True, True, False),  # beyond a float: no setting
    ("3", False, False, False, False),
    (None, False, False, False, False),
])
def test_type_tests(value, int_, integral, number, finite):
    assert (is_int(value), is_integral(value), is_number(value), is_finite(value)) == \
        (int_, integral, number, finite)
