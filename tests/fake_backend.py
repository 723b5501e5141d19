"""A backend that runs no model: it records every call and answers deterministically."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from edgeprefill.bundle import GraphInfo, Manifest, ModelInfo, TokenizerInfo
from edgeprefill.engines.base import Backend, BackendOptions, StepBatch

# The history hash's base and modulus (2**31 - 1, a prime: each product fits in int64).
HASH_BASE, HASH_PRIME = 1_000_003, (1 << 31) - 1


class Call(NamedTuple):
    # "prefill" (one row of several tokens), "decode" (rows of one token) or "fused"
    # (several rows of several tokens: a prefill chunk beside decode rows)
    kind: str
    first_slot: int
    rows: int
    chunk: int
    past_lens: tuple[int, ...]
    valid_lens: tuple[int, ...]


class FakeBackend(Backend):
    name = "fake"

    def allocate_kv(self, slots: int, capacity: int) -> None:
        self.calls: list[Call] = []
        self.slots, self.capacity = slots, capacity
        # Each slot's "KV": the token written at each position (-1: nothing).
        self.kv = np.full((slots, capacity), -1, np.int64)
        # Position i's weight in the history hash: BASE**i mod PRIME (see next_token).
        self.weights = np.ones(capacity, np.int64)
        for i in range(1, capacity):
            self.weights[i] = self.weights[i - 1] * HASH_BASE % HASH_PRIME

    def run(self, step: StepBatch) -> np.ndarray:
        # Tests avoid 1-token prefills.
        kind = "decode" if step.chunk == 1 else "prefill" if step.rows == 1 else "fused"
        self.calls.append(Call(kind, step.first_slot, step.rows, step.chunk,
                               tuple(step.past_lens.tolist()), tuple(step.valid_lens.tolist())))
        vocab = self.manifest.model.vocab_size
        logits = np.zeros((step.rows, vocab), np.float32)
        for row in range(step.rows):
            slot, past = step.first_slot + row, int(step.past_lens[row])
            valid = int(step.valid_lens[row])
            assert past + step.chunk <= self.capacity
            # The KV this row attends to must be what earlier steps wrote.
            assert np.all(self.kv[slot, :past] >= 0), f"slot {slot} has holes before {past}"
            self.kv[slot, past : past + valid] = step.input_ids[row, :valid]
            logits[row, self.next_token(self.kv[slot, : past + valid])] = 1.0
        return logits

    def next_token(self, history: np.ndarray) -> int:
        """A function of the whole visible history, its order included (a polynomial hash:
        a permuted or swapped chunk changes it), never EOS (ids 0-2)."""
        weighted = history % HASH_PRIME * self.weights[: len(history)] % HASH_PRIME
        return 3 + int(weighted.sum() + len(history)) % (self.manifest.model.vocab_size - 3)

    def copy_kv(self, src_slot: int, dst_slot: int, length: int) -> None:
        self.kv[dst_slot, :length] = self.kv[src_slot, :length]

    def swap_kv(self, a: int, b: int, length: int) -> None:
        self.kv[[a, b], :length] = self.kv[[b, a], :length]

    def prefills(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "prefill"]


class FusingFakeBackend(FakeBackend):
    """The fake backend of a bundle whose graph packs its tokens: the runtime fuses."""

    name = "fake-fusing"

    @property
    def why_not_fused(self) -> str | None:
        return None


def fake_manifest(vocab: int = 128, chunks: tuple[int, ...] = (16, 64),
                  max_context: int = 512) -> Manifest:
    """The manifest of a model that was never exported: enough for the fake backend,
    the KV cache and the scheduler (no graph, no tokenizer, no torch)."""
    graph = GraphInfo(file="model.onnx", data_file="model.onnx.data", flavor="ort",
                      dtype="float32", opsets={}, inputs={}, outputs={}, kv_inputs=[],
                      kv_outputs=[])
    return Manifest(
        model=ModelInfo("llama", 1, 2, 1, 8, 16, vocab), graph=graph,
        tokenizer=TokenizerInfo(None, None, None, None), chunks=list(chunks),
        max_context=max_context, eos_token_ids=[2], bos_token_id=1,
    )


def fake_backend(**manifest_options) -> FakeBackend:
    return FakeBackend(Path("."), fake_manifest(**manifest_options), BackendOptions())


def ids(n: int, seed: int = 0) -> list[int]:
    """A prompt of n token ids inside the tiny vocabulary (no special tokens)."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, 100, size=n)]


class StatefulFakeBackend(FakeBackend):
    """The fake backend of a model whose layers carry a recurrent state: each slot's
    "state" is a hash of the tokens it was fed since position 0, and the next token is a
    function of it alone, so a wrong restored state shows in the output."""

    name = "fake-stateful"

    @property
    def carries_state(self) -> bool:
        return True

    def state_bytes(self) -> int:
        return 8

    def allocate_kv(self, slots: int, capacity: int) -> None:
        super().allocate_kv(slots, capacity)
        self.state = np.zeros(slots, np.int64)

    def run(self, step: StepBatch) -> np.ndarray:
        super().run(step)
        vocab = self.manifest.model.vocab_size
        logits = np.zeros((step.rows, vocab), np.float32)
        for row in range(step.rows):
            slot, valid = step.first_slot + row, int(step.valid_lens[row])
            state = int(self.state[slot]) if step.past_lens[row] else 0  # zeros at 0
            self.state[slot] = state_hash(state, step.input_ids[row, :valid].tolist())
            logits[row, 3 + int(self.state[slot]) % (vocab - 3)] = 1.0
        return logits

    def copy_kv(self, src_slot: int, dst_slot: int, length: int) -> None:
        super().copy_kv(src_slot, dst_slot, length)
        self.state[dst_slot] = self.state[src_slot]

    def swap_kv(self, a: int, b: int, length: int) -> None:
        super().swap_kv(a, b, length)
        self.state[[a, b]] = self.state[[b, a]]

    def save_state(self, slot: int) -> object:
        return int(self.state[slot])

    def restore_state(self, saved: object, slot: int) -> None:
        assert isinstance(saved, int)
        self.state[slot] = saved


def state_hash(state: int, tokens: list[int]) -> int:
    for token in tokens:
        state = (state * 1_000_003 + token) % (1 << 61)
    return state
