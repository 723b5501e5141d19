"""What the single-family test modules share: their family's fixture checkpoint and its
bundle of each flavour, each built once per module, and transformers' logits of a prompt."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edgeprefill.export.exporter import ExportOptions, export
from tests.conftest import build_hf_model, load_hf_model


def hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    """transformers' logits [len(ids), vocab] of the prompt `ids`."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def check_chunks_against(bundle_dir: Path, model: Any, ids: list[int], chunk: int = 16) -> None:
    """The bundle's logits of each `chunk`-token chunk's last token, prefilling `ids`,
    against transformers' `model` on the whole prompt (to 1e-3: the quantized bundles'
    tests, their model holding the bundle's weights dequantized)."""
    from edgeprefill.sdk import Engine
    from tests.test_openelm import check_chunk_ends  # it imports this module's neighbours

    engine = Engine.load(bundle_dir, threads=2, background=False)
    try:
        check_chunk_ends(engine, ids, hf_logits(model, ids), (chunk,), tolerance=1e-3)
    finally:
        engine.close()


def check_rows_of_other_lengths(bundle_dir: Path, flavor: str, prompts: list[list[int]],
                                reference: Callable[[list[int]], np.ndarray]) -> None:
    """Three rows of `prompts` (35 tokens or more) prefilled to 30, 12 and 21 tokens, then
    one call of 4-token chunks, the second row padded after 1 valid token (the ort graph's
    rows one by one: GroupQueryAttention takes one row with a past per call), then one
    decode call of the three: each row's logits are `reference`'s (transformers' logits
    [len(ids), vocab] of `ids`) of its own prompt, to 1e-4."""
    from edgeprefill.engines import StepBatch
    from edgeprefill.sdk import Engine
    from tests.test_openelm import run_chunks  # it imports this module's neighbours

    past, valid = [30, 12, 21], [4, 1, 4]
    engine = Engine.load(bundle_dir, threads=2, background=False)
    try:
        for slot, (ids, n) in enumerate(zip(prompts, past, strict=True)):
            run_chunks(engine, ids[:n], 16, slot=slot)
        chunk = np.array([ids[n:n + 4] for ids, n in zip(prompts, past, strict=True)],
                         np.int64)
        if flavor == "standard":
            logits = engine.backend.run(StepBatch(chunk, np.array(past, np.int32),
                                                  np.array(valid, np.int32),
                                                  first_slot=0)).copy()
        else:
            logits = np.stack([engine.backend.run(StepBatch(
                chunk[row:row + 1, :valid[row]], np.array(past[row:row + 1], np.int32),
                np.array(valid[row:row + 1], np.int32), first_slot=row))[0].copy()
                for row in range(3)])
        ends = [n + v for n, v in zip(past, valid, strict=True)]
        step = np.array([[ids[end]] for ids, end in zip(prompts, ends, strict=True)],
                        np.int64)
        decoded = engine.backend.run(StepBatch(step, np.array(ends, np.int32),
                                               np.ones(3, np.int32), first_slot=0))
    finally:
        engine.close()
    for row, (ids, end) in enumerate(zip(prompts, ends, strict=True)):
        want = reference(ids[:end + 1])
        np.testing.assert_allclose(logits[row], want[end - 1], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(decoded[row], want[end], rtol=1e-4, atol=1e-4)


def check_an_edit_moves_both(hf: Path, tmp_path: Path, suffix: str) -> None:
    """Every tensor named `...suffix` raised by 0.5 in a copy of the checkpoint `hf`:
    transformers' logits of a prompt move, and a bundle exported from the copy moves with
    them (equal to them again, at each 8-token chunk's last token)."""
    from safetensors.torch import load_file, save_file

    from edgeprefill.sdk import Engine
    from tests.test_exactness import prompt_ids
    from tests.test_openelm import run_chunks

    ids = prompt_ids(24, seed=7)
    before = hf_logits(load_hf_model(hf), ids)
    changed = shutil.copytree(hf, tmp_path / "hf")
    weights = load_file(str(changed / "model.safetensors"))
    edited = [name for name in weights if name.endswith(suffix)]
    assert edited, f"no tensor named ...{suffix}"
    for name in edited:
        weights[name] = weights[name] + 0.5
    save_file(weights, str(changed / "model.safetensors"), metadata={"format": "pt"})
    after = hf_logits(load_hf_model(changed), ids)
    assert np.abs(after - before).max() > 0.05
    export(changed, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                  show_progress=False))
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    try:
        got = run_chunks(engine, ids, 8)
    finally:
        engine.close()
    np.testing.assert_allclose(np.stack(got), after[[7, 15, 23]], rtol=1e-4, atol=1e-4)


def flavour_bundles(stem: str, max_context: int = 128) -> Any:
    """A module-scoped fixture `bundle` (flavor -> the module's `hf` checkpoint exported in
    that flavour: 16-token chunks, `max_context` positions, exported at first use, in a
    folder named after `stem`). Bind it to that name: `bundle = flavour_bundles(...)`."""

    @pytest.fixture(scope="module")
    def bundle(hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
        made: dict[str, Path] = {}

        def get(flavor: str) -> Path:
            if flavor not in made:
                made[flavor] = tmp_path_factory.mktemp(f"{stem}-{flavor}")
                export(hf, made[flavor], ExportOptions(flavor=flavor, chunks=(16,),
                                                       max_context=max_context,
                                                       show_progress=False))
            return made[flavor]

        return get

    return bundle


def flavour_fixtures(family: str, max_context: int = 128) -> tuple[Any, Any]:
    """Module-scoped fixtures `hf` (`family`'s fixture checkpoint, tests/conftest.py) and
    `bundle` (flavour_bundles: flavor -> its bundle of that flavour, `max_context`
    positions). Bind them to those names in the test module: `hf, bundle = ...`."""

    @pytest.fixture(scope="module")
    def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return build_hf_model(family, tmp_path_factory.mktemp(family))

    return hf, flavour_bundles(family, max_context)
