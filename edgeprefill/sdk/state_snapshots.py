"""Snapshots of a slot's recurrent states (LFM2, Qwen3.5): what they are, how many a slot
may keep, and which go when it keeps too many. kv_cache.py takes and restores them.

A snapshot is a copy of a slot's states when it held `position` tokens
(`Backend.save_state`), taken when that length is a multiple of the slot's period; it is
never changed, so slots that share a prefix share its snapshots.

Budget: a slot's snapshots may take half the slot's KV and state bytes, and never more
than one per `align` positions (all a full slot can take), so memory grows by at most a
half (`kv_budget_bytes` counts it). A Qwen3.5-0.8B state is ~18 MB a row against ~100 MB
of KV at 4096 positions: 3 snapshots; an LFM2 state is a few hundred KB: one every
`align` positions fits. Over the budget the period doubles and the snapshots off the new
period go (`thin`): they stay spread over the whole slot at a coarser grain. Evicting the
oldest instead would keep only the last few positions, and drop first what requests share
most: the system prompt at the start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from edgeprefill.engines.base import Backend


class Snapshot(NamedTuple):
    position: int  # the slot held this many tokens when the states were copied
    states: object  # Backend.save_state's copy, never changed


def snapshot_budget(backend: Backend, capacity: int, align: int) -> int:
    """Bytes of snapshots one slot of `capacity` positions may hold (0 for a model
    without states)."""
    state = backend.state_bytes()
    if not backend.carries_state or not state:
        return 0
    half = backend.kv_slot_bytes(capacity) // 2
    return min(max(half, state), capacity // align * state)


def thin(snapshots: list[Snapshot], every: int, most: int) -> tuple[list[Snapshot], int]:
    """At most `most` snapshots: double the period `every` until the snapshots on it fit.
    Returns (the snapshots kept, the new period)."""
    while len(snapshots) > most:
        every *= 2
        snapshots = [s for s in snapshots if s.position % every == 0]
    return snapshots, every


def latest(snapshots: list[Snapshot], position: int) -> Snapshot | None:
    """The snapshot at the largest position <= `position`, if any."""
    return max((s for s in snapshots if s.position <= position),
               key=lambda s: s.position, default=None)
