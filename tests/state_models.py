"""Helpers of the tests of models whose layers carry a recurrent state (LFM2, Qwen3.5):
bundles of a fixture variant, and calls with a padded last chunk checked against
transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeprefill.engines import StepBatch
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.sdk import Engine
from tests.conftest import build_hf_model
from tests.test_exactness import prompt_ids, reference_logits

# The ort flavour's attention on the native kernels (where they build) and on ONNX
# Runtime's GroupQueryAttention, and the standard flavour.
GRAPHS = [("ort", "auto"), ("ort", "off"), ("standard", "auto")]


def variant_bundles(tmp_path_factory, family: str, name: str, overrides: dict[str, Any]):
    """flavor -> (hf dir, bundle) of `family`'s fixture with `overrides` (each flavour
    exported once)."""
    hf = build_hf_model(family, tmp_path_factory.mktemp(name), **overrides)
    made: dict[str, Path] = {}

    def get(flavor: str) -> tuple[Path, Path]:
        if flavor not in made:
            out = tmp_path_factory.mktemp(f"{name}-{flavor}")
            export(hf, out, ExportOptions(flavor=flavor, chunks=(16,), max_context=128,
                                          show_progress=False, overwrite=True))
            made[flavor] = out
        return hf, made[flavor]

    return get


def run_padded(backend, ids: list[int], chunk: int, split: int) -> dict[int, np.ndarray]:
    """Prefill ids[:split] in calls of `chunk` tokens, the last one padded to `chunk` with
    junk ids, then ids[split:] in one call: {last position of each call: its logits}."""
    got, start = {}, 0
    while start < len(ids):
        end = min(start + chunk, split) if start < split else len(ids)
        part = ids[start:end]
        width = chunk if start < split else len(part)
        padded = np.full((1, width), 77, np.int64)
        padded[0, : len(part)] = part
        logits = backend.run(StepBatch(padded, np.array([start], np.int32),
                                       np.array([len(part)], np.int32), 0))
        got[end - 1] = logits[0].copy()
        start = end
    return got


CHUNKS = (1, 2, 3, 16, 40)


def assert_padded_chunks_match(hf_dir: Path, path: Path,
                               chunks: tuple[int, ...] = CHUNKS) -> None:
    """assert_engine_chunks_match on the bundle at `path`, loaded as it is."""
    assert_engine_chunks_match(Engine.load(path, threads=2, background=False), hf_dir, chunks)


def assert_engine_chunks_match(engine: Engine, hf_dir: Path,
                               chunks: tuple[int, ...] = CHUNKS) -> None:
    """Every call's last-token logits equal transformers' at that position, for calls of
    each of `chunks` tokens, the last chunk before the split padded (its padding must stay
    out of the states and caches the next call reads). Closes `engine`."""
    ids = prompt_ids(40)
    expected = reference_logits(hf_dir, ids)
    for chunk in chunks:
        for position, logits in run_padded(engine.backend, ids, chunk, split=37).items():
            np.testing.assert_allclose(logits, expected[position], rtol=1e-4, atol=1e-4,
                                       err_msg=f"chunk {chunk}, position {position}")
    engine.close()


def assert_copy_and_swap_continue(engine: Engine, hf_dir: Path) -> None:
    """Prefix lending copies a slot, keeping decode rows adjacent swaps two: the next chunk
    in the slot the content moved to continues it as transformers does (a 40-token prompt:
    20 tokens copied over another sequence's 7, then swapped with a third slot at 30)."""
    ids = prompt_ids(40)
    expected = reference_logits(hf_dir, ids)
    backend = engine.backend

    def chunk(start: int, end: int, slot: int) -> np.ndarray:
        return backend.run(StepBatch(np.array([ids[start:end]]), np.array([start], np.int32),
                                     np.array([end - start], np.int32), slot))[0]

    chunk(0, 20, 0)
    chunk(0, 7, 1)  # another sequence's cache and states in the destination
    backend.copy_kv(0, 1, 20)
    np.testing.assert_allclose(chunk(20, 30, 1), expected[29], rtol=1e-4, atol=1e-4)
    chunk(0, 5, 2)
    backend.swap_kv(1, 2, 30)
    np.testing.assert_allclose(chunk(30, 40, 2), expected[39], rtol=1e-4, atol=1e-4)
