"""Quantized exports compute with exactly the weights the quantizer says they hold."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeprefill.engines import StepBatch
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import (
    QuantConfig,
    int4_blockwise,
    int4_dequantize,
    int8_per_channel,
)
from edgeprefill.sdk import Engine
from tests.conftest import load_hf_model
from tests.test_exactness import recurrent_delta_rule

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_int4_round_trip_is_within_half_a_step():
    w = np.random.default_rng(0).normal(size=(48, 100)).astype(np.float32)
    packed, scales = int4_blockwise(w, 32)
    assert packed.shape == (48, 4, 16) and scales.shape == (48 * 4,)
    back = int4_dequantize(packed, scales, 100)
    step = np.repeat(scales.reshape(48, 4), 32, axis=1)[:, :100]
    assert np.all(np.abs(back - w) <= step / 2 + 1e-6)


def test_int4_scales_are_float16_values_where_float16_keeps_them_normal():
    """half_exact: a scale is rounded to float16 when that is a normal float16 (the native
    decode kernel then reads it in 2 bytes), kept in float32 when it would overflow or
    lose precision as a subnormal; each scale moves by at most 2^-11 of itself."""
    w = np.random.default_rng(2).normal(size=(6, 64)).astype(np.float32)
    w[1] *= 1e-6  # scales ~4e-7: subnormal in float16
    w[2] *= 1e6   # scales ~4e5: past float16's largest
    _, scales = int4_blockwise(w, 32)
    exact = np.abs(w).reshape(6, 2, 32).max(axis=2).reshape(-1) / 7.0
    with np.errstate(over="ignore"):
        as_half = scales.astype(np.float16).astype(np.float32)
    kept = np.zeros(12, bool)
    kept[2:6] = True  # rows 1 and 2
    assert np.array_equal(as_half[~kept], scales[~kept])
    assert np.array_equal(scales[kept], exact[kept].astype(np.float32))
    assert np.all(np.abs(scales - exact) <= exact * 2.0**-11)


def test_int8_round_trip_is_within_half_a_step():
    w = np.random.default_rng(1).normal(size=(64, 40)).astype(np.float32)
    q, scale = int8_per_channel(w)
    assert np.all(np.abs(q * scale - w) <= scale / 2 + 1e-6)


def logits_at(bundle_dir, ids) -> np.ndarray:
    with Engine.load(bundle_dir, threads=2, background=False) as engine:
        return engine.backend.run(StepBatch(np.array([ids]), np.array([0], np.int32),
                                            np.array([len(ids)], np.int32), 0))[0]


@pytest.mark.parametrize("family", ("llama", "lfm2", "qwen3_5_text", "granitemoehybrid-mamba",
                                    "falcon_h1"))
def test_int4_graph_equals_transformers_with_dequantized_weights(hf_model, tmp_path, family):
    """Every projection of the bundle computes with its dequantized int4 weights and nothing
    else moves: the hybrids' conv, DeltaNet and Mamba-2 layers too (their logits drift further from
    fp32 than a transformer's on these fixtures; this says the drift is the model's, as
    transformers computes it, not the export's)."""
    hf_dir = hf_model(family)
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0),  # float compute: exact
    ))
    model = load_hf_model(hf_dir)
    ids = [1, 5, 9, 33, 70, 4, 18]
    with torch.no_grad(), recurrent_delta_rule():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):  # every projection and the LM head
                w = module.weight.numpy()
                packed, scales = int4_blockwise(w, 32)
                module.weight.copy_(torch.from_numpy(int4_dequantize(packed, scales, w.shape[1])))
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind, max_rel_error", [("int8", 0.05), ("int4", 0.3)])
def test_quantized_logits_stay_close_to_fp32(hf_model, bundle, tmp_path, kind, max_rel_error):
    export(hf_model("llama"), tmp_path / kind, ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig(kind),
    ))
    ids = [1, 5, 9, 33, 70, 4, 18, 99, 100, 3]
    reference = logits_at(bundle("llama"), ids)
    got = logits_at(tmp_path / kind, ids)
    assert np.abs(got - reference).max() / np.abs(reference).max() < max_rel_error
