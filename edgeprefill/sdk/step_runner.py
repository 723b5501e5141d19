"""The step runner: turns a scheduled step into backend calls and keeps the books.

For each kind of call (decode rows, a prefill chunk, or the decode rows and several prompts'
chunks fused in one call) it builds the `StepBatch`, times the call, records the KV that
was written (in the `KVCache` and in each request's `kv_len`), feeds the chunk
controller and the engine counters, and appends to the trace. It never decides what
runs (the scheduler does) nor what a logit means (the engine samples and streams).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from edgeprefill.engines.base import Backend, StepBatch
from edgeprefill.sdk.chunking import ChunkController
from edgeprefill.sdk.config import StepTrace
from edgeprefill.sdk.kv_cache import KVCache
from edgeprefill.sdk.metrics import EngineCounters
from edgeprefill.sdk.request import Request
from edgeprefill.sdk.scheduler import PrefillChunk


class StepRunner:
    def __init__(
        self, backend: Backend, kv: KVCache, chunks: ChunkController,
        counters: EngineCounters, trace: list[StepTrace] | None,
    ) -> None:
        """`trace`: a list to append every call to, or None to record nothing."""
        self.backend = backend
        self.kv = kv
        self.chunks = chunks
        self.counters = counters
        self.trace = trace

    def decode(self, rows: Sequence[Request]) -> np.ndarray:
        """One call for every decoding request (rows in adjacent slots, in slot order);
        returns float32 logits [rows, vocab]."""
        last = [r.generated[-1] for r in rows]
        batch = StepBatch(
            input_ids=np.array(last, np.int64)[:, None],  # [B, 1]
            past_lens=np.array([r.kv_len for r in rows], np.int32),
            valid_lens=np.ones(len(rows), np.int32),
            first_slot=_slot(rows[0]),
        )
        logits, start, end = self._call(batch)
        self._count_decode(start, end, len(rows))
        self._record("decode", start, end, rows, len(rows))
        for request, token in zip(rows, last, strict=True):
            self._written(request, [token])
        return logits

    def prefill(self, chunk: PrefillChunk) -> np.ndarray:
        """One chunk of one prompt; returns float32 logits [1, vocab] of its last token."""
        request, start_pos, length = chunk
        ids = request.tokens[start_pos : start_pos + length]
        batch = StepBatch(
            input_ids=np.array([ids], np.int64),  # [1, length]
            past_lens=np.array([start_pos], np.int32),
            valid_lens=np.array([length], np.int32),
            first_slot=_slot(request),
        )
        logits, start, end = self._call(batch)
        self._count_prefill(start, end, length)
        self._record("prefill", start, end, [request], length)
        self._written(request, ids)
        request.metrics.chunks += 1
        return logits

    def fused(
        self, rows: Sequence[Request], chunks: Sequence[PrefillChunk],
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The decode rows and the prefill chunks (one per prompt, each its own row) in one
        call (a bundle whose graph packs its valid tokens, `GraphInfo.packed_tokens`, so a
        row's padding costs no projection): the weights are read once for all. Every
        request's slot must be adjacent to the others', `rows` in slot order (as for
        `decode`). Returns (decode logits [rows, vocab] in `rows` order, each chunk's
        logits [1, vocab] in `chunks` order)."""
        prompts = {c.request.id: c for c in chunks}
        members = sorted([*rows, *(c.request for c in chunks)], key=_slot)
        width = max(c.length for c in chunks)
        ids = np.zeros((len(members), width), np.int64)  # each row: padding after its tokens
        valid = np.ones(len(members), np.int32)
        for i, member in enumerate(members):
            chunk = prompts.get(member.id)
            if chunk is None:
                ids[i, 0] = member.generated[-1]
            else:
                ids[i, : chunk.length] = member.tokens[chunk.start : chunk.start + chunk.length]
                valid[i] = chunk.length
        first = _slot(members[0])
        assert [_slot(m) for m in members] == list(range(first, first + len(members))), \
            "a fused step's slots are adjacent"
        batch = StepBatch(
            input_ids=ids,
            past_lens=np.array([m.kv_len for m in members], np.int32),
            valid_lens=valid,
            first_slot=first,
        )
        logits, start, end = self._call(batch)
        prefilled = sum(c.length for c in chunks)
        if rows:
            self._count_decode(start, end, len(rows), observe=False)
            self.counters.fused_steps += 1
            self._record("decode", start, end, rows, len(rows), fused=True)
        self._count_prefill(start, end, prefilled, len(chunks))
        for chunk in chunks:
            self._record("prefill", start, end, [chunk.request], chunk.length, fused=True)
            chunk.request.metrics.chunks += 1
        for i, member in enumerate(members):
            self._written(member, ids[i, : valid[i]].tolist())
        at = [members.index(c.request) for c in chunks]
        return np.delete(logits, at, axis=0), [logits[i : i + 1] for i in at]

    def warm_up(self, length: int) -> None:
        """The backend's warm-up calls (`Backend.warm_up_steps`: by default one prefill
        chunk of `length` tokens and one decode step of every slot), their logits and times
        dropped, no books kept. A process's first calls pay for what ONNX Runtime sets up
        lazily (its memory arena grown to the largest activations, its threads' first
        work): on the 2-core Zen 4 VM, +8-40 ms on the first 128-token chunk and +2-10 ms
        on the first decode step of a fresh process (docs/benchmarks.md); on the CUDA
        provider 33-45 ms for each new shape (engines/ort/gpu_shapes.py). Run at load, that
        cost leaves the first requests."""
        for batch in self.backend.warm_up_steps(length, len(self.kv.slots)):
            self.backend.run(batch)

    def idle(self) -> None:
        """Nobody decodes: the next decode call starts no stall."""
        self.counters.last_decode_end = None

    def _call(self, batch: StepBatch) -> tuple[np.ndarray, float, float]:
        start = time.perf_counter()
        logits = self.backend.run(batch)
        return logits, start, time.perf_counter()

    def _written(self, request: Request, tokens: list[int]) -> None:
        self.kv.extend(_slot(request), tokens)
        request.kv_len += len(tokens)

    def _count_decode(self, start: float, end: float, rows: int, observe: bool = True) -> None:
        """`observe`: feed the chunk controller's decode estimate (not for a fused call,
        whose time the prefill chunk's estimate takes)."""
        c = self.counters
        c.decode_tokens += rows
        c.decode_seconds += end - start
        c.decode_steps += 1
        if c.last_decode_end is not None:
            c.max_decode_stall_s = max(c.max_decode_stall_s, end - c.last_decode_end)
        c.last_decode_end = end
        if observe:
            self.chunks.observe_decode(end - start)

    def _count_prefill(self, start: float, end: float, length: int, rows: int = 1) -> None:
        """`length`: the call's prefill tokens, over `rows` prompts' chunks."""
        self.counters.prefill_tokens += length
        self.counters.prefill_steps += 1
        self.counters.prefill_rows += rows
        self.counters.prefill_seconds += end - start
        self.chunks.observe_prefill(length, end - start)

    def _record(
        self, kind: str, start: float, end: float, requests: Sequence[Request], tokens: int,
        fused: bool = False,
    ) -> None:
        if self.trace is not None:
            ids = tuple(r.id for r in requests)
            self.trace.append(StepTrace(kind, start, end, ids, tokens, fused))


def _slot(request: Request) -> int:
    assert request.slot is not None, "a running request holds a slot"
    return request.slot
