"""What the single-family test modules share: their family's fixture checkpoint and its
bundle of each flavour, each built once per module, and transformers' logits of a prompt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edgeprefill.export.exporter import ExportOptions, export
from tests.conftest import build_hf_model


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
