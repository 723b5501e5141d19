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


def flavour_fixtures(family: str) -> tuple[Any, Any]:
    """Module-scoped fixtures `hf` (`family`'s fixture checkpoint, tests/conftest.py) and
    `bundle` (flavor -> its bundle of that flavour: 16-token chunks, 128 positions, exported
    at first use). Bind them to those names in the test module: `hf, bundle = ...`."""

    @pytest.fixture(scope="module")
    def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return build_hf_model(family, tmp_path_factory.mktemp(family))

    @pytest.fixture(scope="module")
    def bundle(hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
        made: dict[str, Path] = {}

        def get(flavor: str) -> Path:
            if flavor not in made:
                made[flavor] = tmp_path_factory.mktemp(f"{family}-{flavor}")
                export(hf, made[flavor], ExportOptions(flavor=flavor, chunks=(16,),
                                                       max_context=128, show_progress=False))
            return made[flavor]

        return get

    return hf, bundle
