"""The KV cache manager: a fixed budget of slots, each holding one token sequence's KV.

A slot is `capacity` positions of every layer's K and V (the backend owns the memory;
this class owns the bookkeeping). Each slot records the exact tokens whose KV it holds,
which makes two kinds of reuse one mechanism, both verified by token content:

- a session's own slot keeps its conversation between turns, so a new turn prefills only
  the tokens past the common prefix;
- any retained slot (a finished session's, a shared system prompt's) can lend its
  chunk-aligned common prefix to a new request by copying that much KV.

Retained slots are evicted least recently used when a request needs room.

A model whose layers carry a recurrent state beside the KV (LFM2's short convolutions,
Qwen3.5's Gated DeltaNet: `Backend.carries_state`) cannot cut a slot back to a shorter
prefix by its KV alone: the live state is that of the slot's last token. So the cache
keeps *snapshots*, copies of a slot's states where a call ended, as vLLM keeps mamba
states at block boundaries: at positions that are multiples of the slot's snapshot
period (`align` at first; a prefill chunk that crosses one ends there, but for the
prompt's last chunk, whose cut would cost a call: `chunk_end`; a decode step that lands
on one takes it too), and at the slot's *mark*: where its prompt parts from the longest
aligned prefix it shares with a cached one that kept no snapshot that far (a system
prompt's end: the request pays one more call, the next ones sharing it reuse it). A
slot then serves a prefix whole (its live state) or up to its latest snapshot at or
before the common prefix (that snapshot's states restored into the destination slot,
whose KV is the slot's own or a copy).

A slot's snapshots past the tokens it keeps go when a request takes it (they describe
tokens about to be overwritten), all of them when it is freed or evicted; they move with
the slot (`compact`), and a copy of a slot (a lent prefix, a fork) shares those at or
before what it copied. Their budget and period: sdk/state_snapshots.py. An attention-only
model keeps none and cuts a lent prefix at any multiple of `align`.

  state     tokens        request   meaning
  FREE      []            none      no data
  RETAINED  KV's tokens   none      kept for reuse; evictable
  ACTIVE    KV's tokens   one       a request is prefilling or decoding in it
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

from edgeprefill.engines.base import Backend
from edgeprefill.sdk.state_snapshots import Snapshot, latest, snapshot_budget, thin


class SlotState(enum.Enum):
    FREE = "free"
    RETAINED = "retained"
    ACTIVE = "active"


@dataclass
class Slot:
    index: int
    state: SlotState = SlotState.FREE
    tokens: list[int] = field(default_factory=list)  # tokens whose KV is in the slot
    owner: int | None = None  # session id that keeps its conversation here
    last_used: int = 0
    snapshots: list[Snapshot] = field(default_factory=list)  # ascending positions
    every: int = 1  # snapshot period: positions that are a multiple of it get one
    mark: int = 0  # where its prompt parts from a cached one: a snapshot goes there too


class Reuse(NamedTuple):
    length: int  # leading tokens a slot can serve
    snapshot: Snapshot | None  # whose states to restore; None: the slot's live ones (or none)


class Acquired(NamedTuple):
    slot: int
    reused: int  # leading tokens whose KV is already in the slot
    copied_from: int | None  # the slot the prefix was copied from, if any


class KVUsage(NamedTuple):
    slots: int
    active: int
    retained: int
    tokens: int  # positions holding valid KV, all slots
    capacity: int  # positions per slot
    bytes_total: int


class KVCache:
    def __init__(
        self, backend: Backend, slots: int, capacity: int, align: int,
        share_prefixes: bool = True,
    ) -> None:
        """`align`: prefix reuse across slots is rounded down to a multiple of this (the
        smallest chunk bucket), so a reused prefix ends where a chunk would.
        `share_prefixes`: lend other slots' prefixes (a slot's own reuse always applies)."""
        self.share_prefixes = share_prefixes
        self.backend = backend
        self.whole_only = backend.carries_state  # reuse a slot whole or up to a snapshot
        self.capacity = capacity
        self.align = max(1, align)
        self.slots = [Slot(i, every=self.align) for i in range(slots)]
        # Snapshots one slot may hold (a model with states; else none are taken).
        budget = snapshot_budget(backend, capacity, self.align)
        self.max_snapshots = budget // max(1, backend.state_bytes()) if budget else 0
        self._clock = itertools.count(1)
        self.prefix_lookups = 0
        self.prefix_hits = 0
        backend.allocate_kv(slots, capacity)

    # -- allocation -------------------------------------------------------------------

    def acquire(self, tokens: list[int], owner: int | None) -> Acquired | None:
        """Make a slot ACTIVE for a request whose full token sequence is `tokens`, reusing
        as much KV as possible. Returns None when every slot is ACTIVE (the caller waits).
        Mutates the cache (may evict a retained slot and copy a prefix)."""
        # Never reuse the last prompt token: its logits are what the request needs.
        limit = len(tokens) - 1
        slot = (self._own_slot(owner) or self._free_slot() or self._matching(tokens, limit)
                or self._evict_lru())
        if slot is None:
            return None
        own = self._reusable(slot, tokens, limit)
        source, shared = self._best_prefix(tokens, limit, exclude=slot.index)
        self.prefix_lookups += 1
        copied_from = None
        if shared.length > own.length:
            self._lend(self.slots[source], slot, shared)
            copied_from = source
        else:
            self._cut_back(slot, own)
        reused = max(own.length, shared.length)
        if reused:
            self.prefix_hits += 1
        parting = self._parting(slot, tokens, limit) if self.max_snapshots else 0
        slot.mark = parting if parting > reused else 0
        slot.state, slot.tokens = SlotState.ACTIVE, tokens[:reused]
        if owner is not None:
            # Two requests of one session at once (Engine.submit with its id while its
            # last turn runs): its conversation is the latest one's, and the slot the
            # other holds becomes a plain entry, else the session owned two slots.
            self.forget_owner(owner)
        slot.owner = owner
        self._touch(slot)
        return Acquired(slot.index, reused, copied_from)

    def fork(self, source: int) -> int | None:
        """A new ACTIVE slot holding a copy of slot `source`'s whole KV (the n > 1 choices
        of one prompt: one prefill, n decodes). None when no slot is free or evictable.
        Mutates the cache (may evict a retained slot) and copies KV."""
        slot = self._free_slot() or self._evict_lru()
        if slot is None:
            return None
        tokens = self.slots[source].tokens
        self._lend(self.slots[source], slot, Reuse(len(tokens), None))
        slot.state, slot.tokens, slot.owner = SlotState.ACTIVE, list(tokens), None
        self._touch(slot)
        return slot.index

    def extend(self, index: int, tokens: list[int]) -> None:
        """Record that the KV of `tokens` was just written after the slot's tokens."""
        slot = self.slots[index]
        assert slot.state is SlotState.ACTIVE, slot
        slot.tokens.extend(tokens)
        assert len(slot.tokens) <= self.capacity
        length = len(slot.tokens)
        if self.max_snapshots and length and (length % slot.every == 0 or length == slot.mark):
            self._snapshot(slot)

    def chunk_end(self, index: int, start: int, end: int, finishes: bool) -> int:
        """Where a prefill chunk of slot `index` over positions [start, end) should end
        (`finishes`: it ends the prompt), so that a snapshot of the states is kept: at
        the slot's mark inside it; else, but for the prompt's last chunk (a cut there
        would cost a call), at the last multiple of the period inside it; else at `end`.
        Reads the cache only."""
        if not self.max_snapshots:
            return end
        slot = self.slots[index]
        if start < slot.mark < end:
            return slot.mark
        cut = end - end % slot.every
        return cut if cut > start and not finishes else end

    def release(self, index: int, keep: bool) -> None:
        """End a request's use of its slot: keep the KV for reuse, or free it at once."""
        slot = self.slots[index]
        if keep and slot.tokens:
            slot.state = SlotState.RETAINED
            self._touch(slot)
        else:
            self._clear(slot)

    def drop_snapshots(self) -> None:
        """Free every slot's state snapshots (the engine closes: their memory goes now, with
        the backend's, not when the cache is collected)."""
        for slot in self.slots:
            slot.snapshots, slot.every = [], self.align

    def forget_owner(self, owner: int) -> None:
        """A closed session's slot stays as a plain prefix-cache entry."""
        for slot in self.slots:
            if slot.owner == owner:
                slot.owner = None

    def cached_prefix(self, tokens: list[int]) -> int:
        """The longest prefix of `tokens` some slot's tokens share (what a request could
        reuse at most, alignment and snapshots aside). Reads the cache only."""
        return max((common_prefix(s.tokens, tokens) for s in self.slots), default=0)

    def length(self, index: int) -> int:
        return len(self.slots[index].tokens)

    # -- keeping decode rows adjacent -------------------------------------------------

    def compact(self, decoding: list[int]) -> dict[int, int]:
        """Move the slots in `decoding` into one contiguous range, so one engine call can
        bind them as a single view. Returns {old index: new index} for every slot whose
        content moved (including whatever was swapped out of the range)."""
        moved: dict[int, int] = {}
        wanted = sorted(decoding)
        lo = wanted[0]
        target = set(range(lo, lo + len(wanted)))
        outside = [i for i in wanted if i not in target]
        holes = sorted(target - set(wanted))
        for src, dst in zip(outside, holes, strict=True):
            self._swap(src, dst)
            moved[src], moved[dst] = dst, src
        return moved

    def _swap(self, a: int, b: int) -> None:
        sa, sb = self.slots[a], self.slots[b]
        longest = max(len(sa.tokens), len(sb.tokens))
        if longest:
            self.backend.swap_kv(a, b, longest)
        sa.index, sb.index = b, a
        self.slots[a], self.slots[b] = sb, sa

    # -- inspection -------------------------------------------------------------------

    def usage(self) -> KVUsage:
        states = [s.state for s in self.slots]
        return KVUsage(
            slots=len(self.slots),
            active=states.count(SlotState.ACTIVE),
            retained=states.count(SlotState.RETAINED),
            tokens=sum(len(s.tokens) for s in self.slots),
            capacity=self.capacity,
            bytes_total=self.backend.kv_slot_bytes(self.capacity) * len(self.slots),
        )

    def check_integrity(self, active_requests: dict[int, object] | None = None) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent. With
        `active_requests` ({slot: request}), also check that exactly those slots are ACTIVE."""
        for i, slot in enumerate(self.slots):
            assert slot.index == i, f"slot {i} records index {slot.index}"
            assert len(slot.tokens) <= self.capacity, f"slot {i} overflows"
            if slot.state is SlotState.FREE:
                assert not slot.tokens and slot.owner is None, f"free slot {i} holds data"
                assert not slot.snapshots, f"free slot {i} holds state snapshots"
            assert all(s.position <= len(slot.tokens) for s in slot.snapshots), \
                f"slot {i} holds a snapshot past its tokens"
            if slot.state is SlotState.RETAINED:
                assert slot.tokens, f"retained slot {i} is empty"
        owners = [s.owner for s in self.slots if s.owner is not None]
        assert len(owners) == len(set(owners)), "a session owns two slots"
        if active_requests is not None:
            active = {i for i, s in enumerate(self.slots) if s.state is SlotState.ACTIVE}
            assert active == set(active_requests), (
                f"active slots {sorted(active)} != slots of live requests "
                f"{sorted(active_requests)}"
            )

    # -- helpers ----------------------------------------------------------------------

    def _own_slot(self, owner: int | None) -> Slot | None:
        if owner is None:
            return None
        for slot in self.slots:
            if slot.owner == owner and slot.state is SlotState.RETAINED:
                return slot
        return None

    def _free_slot(self) -> Slot | None:
        return next((s for s in self.slots if s.state is SlotState.FREE), None)

    def _matching(self, tokens: list[int], limit: int) -> Slot | None:
        """With no slot free, the plain retained slot sharing the longest prefix with
        `tokens`, taken with its KV: evicting the least recently used one instead could
        evict that very prefix (an n > 1 sibling then prefilled its prompt again). Only a
        prefix worth lending (`align` tokens, as `_best_prefix` lends): every prompt
        shares a BOS or a chat header with every slot, and taking a long cached prompt's
        slot for those two tokens evicted what the next request would have reused."""
        if not self.share_prefixes:
            return None
        shared, _, best = max(((self._reusable(s, tokens, limit).length, -s.last_used,
                                s.index) for s in self.slots
                               if s.state is SlotState.RETAINED and s.owner is None),
                              default=(0, 0, -1))
        return self.slots[best] if shared >= self.align else None

    def _evict_lru(self) -> Slot | None:
        retained = [s for s in self.slots if s.state is SlotState.RETAINED]
        if not retained:
            return None
        # Prefer evicting plain prefix entries over another session's conversation.
        victim = min(retained, key=lambda s: (s.owner is not None, s.last_used))
        self._clear(victim)
        return victim

    def _clear(self, slot: Slot) -> None:
        slot.state, slot.tokens, slot.owner = SlotState.FREE, [], None
        slot.snapshots, slot.every, slot.mark = [], self.align, 0  # their memory goes now

    def _best_prefix(self, tokens: list[int], limit: int, exclude: int) -> tuple[int, Reuse]:
        best, best_reuse = -1, Reuse(0, None)
        if not self.share_prefixes:
            return best, best_reuse
        for slot in self.slots:
            if slot.index == exclude or not slot.tokens:
                continue
            reuse = self._reusable(slot, tokens, limit)
            if not self.whole_only:  # a whole slot's end is where its state is
                reuse = Reuse(reuse.length - reuse.length % self.align, None)
            if reuse.length > best_reuse.length:
                best, best_reuse = slot.index, reuse
        return best, best_reuse

    def _reusable(self, slot: Slot, tokens: list[int], limit: int) -> Reuse:
        """Leading tokens of `tokens` (at most `limit`) whose cache `slot` can serve:
        their common prefix, or with a state all of the slot's tokens (its live state) or
        up to its latest snapshot within the common prefix."""
        common = min(common_prefix(slot.tokens, tokens), limit)
        if not self.whole_only or common == len(slot.tokens):
            return Reuse(common, None)
        snapshot = latest(slot.snapshots, common)
        return Reuse(snapshot.position, snapshot) if snapshot else Reuse(0, None)

    def _lend(self, source: Slot, slot: Slot, reuse: Reuse) -> None:
        """Copy `reuse.length` positions of `source` into `slot`, with the states they
        end at, and the snapshots that describe them (shared: never changed)."""
        self.backend.copy_kv(source.index, slot.index, reuse.length)
        if reuse.snapshot is not None:  # copy_kv took the source's live states
            self.backend.restore_state(reuse.snapshot.states, slot.index)
        slot.snapshots = [s for s in source.snapshots if s.position <= reuse.length]
        slot.every = source.every

    def _cut_back(self, slot: Slot, reuse: Reuse) -> None:
        """The slot keeps its first `reuse.length` tokens' cache: restore the snapshot's
        states there, and drop the snapshots of tokens about to be overwritten."""
        if reuse.snapshot is not None:
            self.backend.restore_state(reuse.snapshot.states, slot.index)
        slot.snapshots = [s for s in slot.snapshots if s.position <= reuse.length]

    def _parting(self, slot: Slot, tokens: list[int], limit: int) -> int:
        """The longest aligned prefix `tokens` shares with the slot's old tokens or (when
        prefixes are shared) another slot's: a later request that shares it too could
        reuse that much if a snapshot were kept there (a system prompt's end, where
        requests part)."""
        slots = self.slots if self.share_prefixes else [slot]
        common = max(min(common_prefix(s.tokens, tokens), limit) for s in slots)
        return common - common % self.align

    def _snapshot(self, slot: Slot) -> None:
        """Keep the slot's states at its current length, within the budget."""
        slot.snapshots.append(Snapshot(len(slot.tokens), self.backend.save_state(slot.index)))
        slot.snapshots, slot.every = thin(slot.snapshots, slot.every, self.max_snapshots)

    def _touch(self, slot: Slot) -> None:
        slot.last_used = next(self._clock)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
