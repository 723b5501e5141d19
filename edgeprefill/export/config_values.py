"""How config.json holds a value, read the same way by every reader: null as absent (0
stays 0), transformers' spelling of infinity, token ids as one int or a list, a float as
torch rounds it to bfloat16."""

from __future__ import annotations

from typing import Any

import numpy as np


def json_float(value: Any) -> float:
    """A float as config.json holds it; transformers writes infinity as
    {"__float__": "Infinity"} (time_step_limit), Python's json as Infinity."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        return float(value["__float__"])
    return float(value)


def given(value: Any, default: Any) -> Any:
    """`value` unless absent or null; 0 stays 0 (and is refused), unlike `value or default`."""
    return default if value is None else value


def first_present(raw: dict[str, Any], keys: tuple[str, ...], default: Any) -> Any:
    return next((raw[k] for k in keys if raw.get(k) is not None), default)


def optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        # int(2.5) had exported token 2 as the EOS (from_hf: a "malformed value" line)
        raise ValueError(f"bos/eos token ids must be integers, got {value!r}")
    return tuple(ids)


def first_token_id(value: Any) -> int | None:
    ids = token_ids(value)
    return ids[0] if ids else None


def bfloat16(value: float) -> float:
    """`value` rounded to the nearest bfloat16 (ties to even), as torch rounds it."""
    bits = int(np.array(value, np.float32).view(np.uint32))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(np.array(bits, np.uint32).view(np.float32))
