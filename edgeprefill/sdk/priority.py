"""Request priority, with vLLM's meaning: a lower value is served first; 0 by default.

People type names (`high`, `normal`, `low`) where programs send integers; both are
accepted wherever a priority comes from outside (the CLI, a prompts file, the server).
"""

from __future__ import annotations

from edgeprefill.errors import RequestError
from edgeprefill.values import is_int, plain

PRIORITY_NAMES = {"high": -1, "normal": 0, "low": 1}
LIMIT = 2**31 - 1  # fits the server's and vLLM's int32 field


def parse_priority(value: object) -> int:
    """An int in [-2**31+1, 2**31-1], or one of the names (any case), or a string holding
    an int; raises RequestError otherwise."""
    value = plain(value)  # numpy's integers too
    if isinstance(value, str):
        return _from_text(value)
    if not is_int(value):
        raise RequestError(_wrong(value))
    if not -LIMIT <= value <= LIMIT:
        raise RequestError(f"priority must be in [{-LIMIT}, {LIMIT}], got {value}")
    return value


def _from_text(text: str) -> int:
    name = text.strip().lower()
    if name in PRIORITY_NAMES:
        return PRIORITY_NAMES[name]
    try:
        return parse_priority(int(name))
    except ValueError:
        raise RequestError(_wrong(text)) from None


def _wrong(value: object) -> str:
    names = ", ".join(f"{n} ({v})" for n, v in PRIORITY_NAMES.items())
    return (f"priority must be an integer (lower is served first) or one of {names}; "
            f"got {value!r}")
