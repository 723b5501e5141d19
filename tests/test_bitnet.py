"""BitNet b1.58 (export/bitlinear.py): the Hub's packed ternary BitLinear weights, AutoBitLinear
offline and online, unpacked and computed as transformers computes them. The fixtures
(conftest.FAMILIES "bitnet", "bitnet-packed", "bitnet-online") run in the generic suites
too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from transformers.integrations.bitnet import unpack_weights

from edgeprefill.bundle import load_graph, load_manifest
from edgeprefill.errors import ExportError
from edgeprefill.export.bitlinear import stored_ternary, unpack_ternary
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from tests.bitnet_checkpoints import LAYOUTS, as_bitnet
from tests.conftest import build_hf_model
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import MINIMAL, export_small, last_logits


def test_packed_rows_unpack_as_transformers_unpacks_them():
    packed = torch.randint(0, 256, (6, 5), dtype=torch.uint8)
    expected = unpack_weights(packed, torch.float32).numpy()
    unpacked = unpack_ternary(packed.numpy())
    assert unpacked.dtype == np.int8
    np.testing.assert_array_equal(unpacked, expected)


@pytest.mark.parametrize("flavor, op", [("ort", "MatMulInteger"), ("standard", "DequantizeLinear")])
def test_ternary_projections_are_stored_as_int8_a_quarter_of_their_float_bytes(
        flavor, op, hf_model, bundle):
    """Against the same model's float export (no quantization_config: plain MatMuls), the
    weights file holds one byte per ternary weight instead of four (beside one float32
    divisor per output row), and only the integer op reads them."""
    from safetensors.numpy import load_file

    float_dir, packed_dir = bundle("bitnet", flavor), bundle("bitnet-packed", flavor)
    graph = load_graph(packed_dir, load_manifest(packed_dir)).graph
    ternary = {t.name: t for t in graph.initializer if t.name.endswith(".ternary")}
    assert len(ternary) == 4 * 2  # q/k/v packed, o, gate/up packed, down; 2 layers
    assert {t.data_type for t in ternary.values()} == {onnx.TensorProto.INT8}
    assert {n.op_type for n in graph.node if set(n.input) & set(ternary)} == {op}
    weights = [w for name, w in load_file(hf_model("bitnet") / "model.safetensors").items()
               if name.endswith("_proj.weight")]
    data = "model.onnx.data"
    expected = (load_manifest(float_dir).files[data].bytes - 3 * sum(w.size for w in weights)
                + 4 * sum(w.shape[0] for w in weights))
    assert load_manifest(packed_dir).files[data].bytes == expected


def test_an_offline_weight_stored_as_floats_must_be_ternary():
    np.testing.assert_array_equal(stored_ternary("w", np.array([[-1.0, 0.0, 1.0]])), [[-1, 0, 1]])
    with pytest.raises(ExportError, match="w: an AutoBitLinear offline weight stored as floats "
                                          "must hold only -1, 0 and 1"):
        stored_ternary("w", np.array([[0.5, 1.0]], np.float32))


def test_quantize_is_refused_on_a_bitnet_checkpoint_in_one_line(hf_model, tmp_path):
    options = ExportOptions(chunks=(16,), max_context=64, show_progress=False,
                            quant=QuantConfig("int4"))
    with pytest.raises(ExportError) as err:
        export(hf_model("bitnet-packed"), tmp_path / "b", options)
    assert "already 1.58-bit" in str(err.value) and "\n" not in str(err.value)


def test_inspect_and_stats_say_the_projections_are_int8_integer_gemms(bundle):
    from tests.test_cli_errors import cli

    shown = cli("inspect", bundle("bitnet-packed", "ort"))
    assert ("projections 8 BitNet ternary weights, int8 (0.06 MB; MatMulInteger on each "
            "token's int8 codes: exact int32 sums)") in shown.stdout, shown.stdout
    ran = cli("run", bundle("bitnet-packed", "ort"), "--prompt", "w5 w6",
              "--max-new-tokens", "2", "--stats")
    assert ran.returncode == 0, ran.stderr
    assert "8 BitNet ternary projections as int8 integer GEMMs (MatMulInteger, exact)" in (
        ran.stderr)


# Not ("ort", "off"): ONNX Runtime's stock decode attention is up to 1e-5 from transformers
# (on the float fixture too), and at one decode position of this prompt that moves an
# activation across a rounding boundary of its int8 quantization (logits 0.02 apart). The
# fake quantization is discontinuous: any runtime's rounding can flip a tie somewhere. The
# integer product changes nothing there: the tie flips in q(x), before it.
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
                               reference_logits(hf_dir, ids)[-1], rtol=1e-5, atol=1e-5)


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
