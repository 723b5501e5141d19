"""BitNet b1.58 (export/bitlinear.py): the Hub's packed ternary BitLinear weights, AutoBitLinear
offline and online, unpacked and computed as transformers computes them. The fixtures
(conftest.FAMILIES "bitnet", "bitnet-packed", "bitnet-online") run in the generic suites
too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.integrations.bitnet import unpack_weights

from edgeprefill.errors import ExportError
from edgeprefill.export.bitlinear import unpack_ternary
from edgeprefill.export.model_config import ModelConfig
from tests.bitnet_checkpoints import LAYOUTS, as_bitnet
from tests.conftest import build_hf_model
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import MINIMAL, export_small, last_logits


def test_packed_rows_unpack_as_transformers_unpacks_them():
    packed = torch.randint(0, 256, (6, 5), dtype=torch.uint8)
    expected = unpack_weights(packed, torch.float32).numpy()
    np.testing.assert_array_equal(unpack_ternary(packed.numpy()), expected)


# Not ("ort", "off"): ONNX Runtime's stock decode attention is up to 1e-5 from transformers
# (on the float fixture too), and at one decode position of this prompt that moves an
# activation across a rounding boundary of its int8 quantization (logits 0.02 apart). The
# fake quantization is discontinuous: any runtime's rounding can flip a tie somewhere.
@pytest.mark.parametrize("flavor, kernels", [("ort", "require"), ("standard", "auto")])
def test_packed_bitlinear_logits_equal_transformers_for_any_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model("bitnet-packed"), bundle("bitnet-packed", flavor))


@pytest.mark.parametrize("packed", (True, pytest.param(False, marks=pytest.mark.slow)),
                         ids=("packed", "float ternary"))
def test_autobitlinear_offline_weights_export_as_transformers_reads_them(tmp_path, packed):
    hf_dir = build_hf_model("bitnet", tmp_path / "hf")
    as_bitnet(hf_dir, "autobitlinear", packed=packed)
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


def test_the_activation_quantization_changes_transformers_logits(hf_model):
    """Guards the fixtures: the packed model's int8 activations move its logits more than
    the tolerance away from the same ternary weights on float activations."""
    from transformers.integrations import bitnet

    ids = prompt_ids(40)
    quantized = reference_logits(hf_model("bitnet-packed"), ids)
    original = bitnet.BitLinear.activation_quant
    bitnet.BitLinear.activation_quant = lambda self, x, num_bits=8: (x, torch.ones_like(x[..., :1]))
    try:
        from tests.conftest import load_hf_model

        with torch.no_grad():
            plain = load_hf_model(hf_model("bitnet-packed"))(torch.tensor([ids])).logits[0]
    finally:
        bitnet.BitLinear.activation_quant = original
    assert np.abs(quantized - plain.numpy()).max() > 1e-2


@pytest.mark.parametrize("change, message", [
    ({"use_rms_norm": True}, "use_rms_norm=true (an RMSNorm inside each BitLinear)"),
    ({"modules_to_not_convert": ["lm_head", "model.layers.0.mlp.down_proj"]},
     "modules_to_not_convert"),
    ({"linear_class": "bitlinear", "quantization_mode": "online"},
     "linear_class 'bitlinear' with quantization_mode 'online' is not supported"),
])
def test_bitnet_layouts_export_cannot_compute_are_refused_in_one_line(change, message):
    raw = {"model_type": "bitnet", **MINIMAL,
           "quantization_config": {**LAYOUTS["bitlinear"], **change}}
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf(raw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_other_families_refuse_a_bitnet_quantization_config():
    with pytest.raises(ExportError, match="llama: the checkpoint is quantized"):
        ModelConfig.from_hf({"model_type": "llama", **MINIMAL,
                             "quantization_config": LAYOUTS["bitlinear"]})
