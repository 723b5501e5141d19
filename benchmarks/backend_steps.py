"""Bare backend calls the single-process benchmarks share (bundle_ab.py,
prefill_attention.py, prefill_profile.py): a prompt prefilled in chunks into slot 0, with
no engine or scheduler around it. Not a benchmark itself."""

from __future__ import annotations

import numpy as np

from edgeprefill.engines import StepBatch


def prefill(backend, ids: np.ndarray, chunk: int, pad: bool = False) -> np.ndarray:
    """`ids` in calls of `chunk` tokens into slot 0; returns a copy of the last call's
    logits. `pad`: every call `chunk` wide, the last one padded, as the engine sends a
    bundle's fixed chunks."""
    out = None
    for at in range(0, len(ids), chunk):
        piece = ids[at:at + chunk]
        tokens = np.zeros((1, chunk), np.int64) if pad else piece[None]
        if pad:
            tokens[0, :len(piece)] = piece
        out = backend.run(StepBatch(tokens, np.array([at], np.int32),
                                    np.array([len(piece)], np.int32), 0))
    return np.array(out, copy=True)
