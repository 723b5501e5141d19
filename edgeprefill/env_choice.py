"""The load-time switches a user sets in the environment (EDGEPREFILL_KERNELS,
EDGEPREFILL_INT8_ROWS, EDGEPREFILL_F32_PROJECTIONS, ...), read the same way by each: the
first choice when unset or empty, any other value than a choice refused in one line."""

from __future__ import annotations

import os

from edgeprefill.errors import BackendError


def env_choice(name: str, choices: tuple[str, ...]) -> str:
    """The environment variable `name`, lower-cased, one of `choices` (`choices[0]` when it is
    unset or blank)."""
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        raise BackendError(f"{name}={value!r}: choose one of {', '.join(choices)}")
    return value
