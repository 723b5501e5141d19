"""bitsandbytes checkpoints (nf4 and fp4, with and without double quantization, LLM.int8)
export with bitsandbytes' own dequantized weights.

The checkpoints are made as users make them: transformers loads a float fixture with a
BitsAndBytesConfig (bitsandbytes quantizes on the CPU) and saves it. The references are
bitsandbytes' own: each layer's `dequantize_4bit` / `int8_vectorwise_dequant` of the stored
state (rebuilt by its `QuantState.from_dict`), and the quantized model's forward, so nothing
here shares export's unpacking.

Two CPU paths of bitsandbytes are not its dequantized weights, and the forwards here avoid
them: on CPUs with AVX512-BF16 a Linear4bit in eval repacks its weight and computes in
bfloat16 (`support_avx512bf16_for_cpu`, turned off here), and Linear8bitLt in eval also
quantizes its activations to int8 (in training mode on a CPU it multiplies by the
dequantized weight instead, MatMul8bitFp, which is what the int8 reference runs). Its CPU
C kernel for 4 bits takes whole blocks per row, which differs from the flat blocks the
weights are quantized in where a row is not a multiple of the block size: the fixtures'
widths are multiples of 64, and the flat layout is checked against bitsandbytes' PyTorch
implementation on its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")
pytest.importorskip("accelerate")  # transformers' bitsandbytes quantizer needs it

from bitsandbytes import functional as bnb_functional  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

from edgeprefill.errors import ExportError  # noqa: E402
from edgeprefill.export import bnb as bnb_format  # noqa: E402
from edgeprefill.export.checkpoint import Checkpoint  # noqa: E402
from edgeprefill.export.exporter import ExportOptions, export  # noqa: E402
from edgeprefill.export.model_config import ModelConfig  # noqa: E402
from edgeprefill.export.quantize import QuantConfig, int4_blockwise, int4_dequantize  # noqa: E402
from tests.conftest import build_hf_model, load_hf_model  # noqa: E402
from tests.test_cli_errors import assert_one_line_error, cli  # noqa: E402
from tests.test_families import BASE, last_logits  # noqa: E402

IDS = list(range(3, 40))
WIDTHS = {"intermediate_size": 128}  # a multiple of bitsandbytes' 64: see the docstring
FOUR_BIT = {
    "nf4-double": dict(bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    "nf4": dict(bnb_4bit_quant_type="nf4"),
    "fp4": dict(bnb_4bit_quant_type="fp4"),
}
TOLERANCE = dict(rtol=1e-4, atol=1e-4)


def save_bnb(src: Path, out: Path, kind: str, dtype=None, **extra) -> Path:
    """`src` loaded by transformers with bitsandbytes `kind` (a key of FOUR_BIT, or "int8")
    in `dtype` and saved to `out`, as a QLoRA merge or an unsloth release is."""
    config = BitsAndBytesConfig(load_in_8bit=True) if kind == "int8" else BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32, **FOUR_BIT[kind], **extra)
    model = AutoModelForCausalLM.from_pretrained(src, device_map="cpu", dtype=dtype,
                                                 quantization_config=config)
    model.save_pretrained(out)
    shutil.copy(src / "tokenizer.json", out / "tokenizer.json")
    return out


def bnb_logits(hf_dir: Path) -> np.ndarray:
    """The saved bitsandbytes model's last logits at a float32 compute dtype, the rest of it
    in float32 too."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, device_map="cpu", dtype=torch.float32)
    int8 = False
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False  # no bfloat16 repacking
        int8 |= isinstance(module, bnb.nn.Linear8bitLt)
        for param in module.parameters(recurse=False):  # a bf16 release's embeddings stay
            if param.is_floating_point() and not isinstance(  # bf16: widened, exactly
                    param, bnb.nn.Params4bit | bnb.nn.Int8Params):
                param.data = param.data.float()
    model.train(int8)  # (the fixtures have no dropout)
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0, -1].numpy()


def bnb_weights(hf_dir: Path, stored_dtype: bool = False) -> dict[str, np.ndarray]:
    """Each quantized layer's weight as bitsandbytes dequantizes its stored state: a 4-bit
    one in float32, as its gemm_4bit does for a float32 compute (`stored_dtype`: in its
    quant state's dtype, dequantize_4bit's default)."""
    stored = load_file(hf_dir / "model.safetensors")
    weights = {}
    for name, tensor in stored.items():
        if name.endswith(".SCB"):
            weight = name.removesuffix("SCB") + "weight"
            weights[weight] = bnb_functional.int8_vectorwise_dequant(stored[weight], tensor)
        elif ".quant_state." in name:
            weight = name.split(".quant_state.")[0]
            state = bnb_functional.QuantState.from_dict(
                {k[len(weight) + 1:]: v for k, v in stored.items()
                 if k.startswith(weight + ".")}, torch.device("cpu"))
            if not stored_dtype:
                state.dtype = torch.float32
            weights[weight] = bnb_functional.dequantize_4bit(stored[weight], state)
    return {name: w.float().numpy() for name, w in weights.items()}


def assert_weights_are_bnb(hf_dir: Path, layers: int) -> None:
    expected = bnb_weights(hf_dir)
    assert len(expected) == layers
    ckpt = Checkpoint(hf_dir, bnb=ModelConfig.from_dir(hf_dir).bnb)
    for name, weight in expected.items():
        assert ckpt.shape(name) == weight.shape
        np.testing.assert_array_equal(ckpt.get(name), weight, err_msg=name)


def export_small(hf_dir: Path, out: Path, quant: QuantConfig | None = None) -> Path:
    export(hf_dir, out, ExportOptions(chunks=(64,), max_context=128, quant=quant,
                                      show_progress=False))
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build_hf_model("llama", tmp_path_factory.mktemp("float") / "llama", **WIDTHS)


def test_an_nf4_double_quant_checkpoint_exports_bitsandbytes_weights_and_logits(
        llama, tmp_path, caplog):
    """unsloth's -bnb-4bit releases' scheme: every projection's weight is bitsandbytes'
    own, and the bundle's logits are the quantized model's; the manifest says where the
    weights came from, and no side tensor is left unused."""
    hf_dir = save_bnb(llama, tmp_path / "nf4", "nf4-double")
    assert_weights_are_bnb(hf_dir, layers=14)
    out = export_small(hf_dir, tmp_path / "bundle")
    np.testing.assert_allclose(last_logits(out, IDS), bnb_logits(hf_dir), **TOLERANCE)
    assert "does not use" not in caplog.text  # every absmax, quant_map, ... was read
    quirks = json.loads((out / "edgeprefill.json").read_text())["source"]["quirks"]
    described = "bitsandbytes nf4 (double-quantized scales) weights, dequantized to float"
    assert described in quirks
    shown = cli("inspect", out)
    assert shown.returncode == 0 and described in shown.stdout


@pytest.mark.parametrize("kind", ["nf4", "fp4", "int8"])
def test_other_bitsandbytes_schemes_export_their_weights_and_logits(llama, tmp_path, kind,
                                                                    caplog):
    hf_dir = save_bnb(llama, tmp_path / kind, kind)
    assert_weights_are_bnb(hf_dir, layers=14)
    out = export_small(hf_dir, tmp_path / "bundle")
    np.testing.assert_allclose(last_logits(out, IDS), bnb_logits(hf_dir), **TOLERANCE)
    assert "does not use" not in caplog.text  # every SCB and weight_format was read


def test_a_bfloat16_qwen2_release_reads_bitsandbytes_float32_weights(tmp_path):
    """A bf16 model saved in nf4 (its quant state's dtype bfloat16, as unsloth's releases),
    a family with q/k/v biases (left float) and the packed codes stored as bfloat16
    (bnb_4bit_quant_storage): the weights are bitsandbytes' float32 ones, which
    dequantize_4bit's default rounds to bfloat16."""
    src = build_hf_model("qwen2", tmp_path / "float", dtype=torch.bfloat16, **WIDTHS)
    hf_dir = save_bnb(src, tmp_path / "nf4", "nf4-double", dtype=torch.bfloat16,
                      bnb_4bit_quant_storage=torch.bfloat16)
    state = load_file(hf_dir / "model.safetensors")
    assert state["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert state["model.layers.0.self_attn.q_proj.bias"].dtype == torch.bfloat16
    assert_weights_are_bnb(hf_dir, layers=14)
    ckpt = Checkpoint(hf_dir, bnb=ModelConfig.from_dir(hf_dir).bnb)
    for name, rounded in bnb_weights(hf_dir, stored_dtype=True).items():
        ours = torch.from_numpy(ckpt.get(name))
        assert not torch.equal(ours, torch.from_numpy(rounded))
        assert torch.equal(ours.bfloat16().float(), torch.from_numpy(rounded))
    out = export_small(hf_dir, tmp_path / "bundle")
    np.testing.assert_allclose(last_logits(out, IDS), bnb_logits(hf_dir), **TOLERANCE)


@pytest.mark.parametrize("kind", ["nf4-double", "int8"])
def test_a_pytorch_bin_save_reads_as_its_safetensors(llama, tmp_path, kind):
    """The same tensors in a pytorch_model.bin (older saves), the 4-bit codes stored as
    bfloat16 (their bytes are read, not their values)."""
    extra = {"bnb_4bit_quant_storage": torch.bfloat16} if kind != "int8" else {}
    hf_dir = save_bnb(llama, tmp_path / "saved", kind, **extra)
    expected = last_logits(export_small(hf_dir, tmp_path / "from-safetensors"), IDS)
    torch.save(load_file(hf_dir / "model.safetensors"), hf_dir / "pytorch_model.bin")
    (hf_dir / "model.safetensors").unlink()
    got = last_logits(export_small(hf_dir, tmp_path / "from-bin"), IDS)
    np.testing.assert_array_equal(got, expected)


def test_gpt2_conv1d_layers_are_read_as_bitsandbytes_quantized_them(tmp_path):
    """GPT-2's Conv1D weights are stored [in, out] in float, but bitsandbytes quantizes them
    as [out, in]: read as they are, not transposed again."""
    src = build_hf_model("gpt2", tmp_path / "float", n_inner=128)
    hf_dir = save_bnb(src, tmp_path / "nf4", "nf4")
    assert_weights_are_bnb(hf_dir, layers=8)
    out = export_small(hf_dir, tmp_path / "bundle")
    np.testing.assert_allclose(last_logits(out, IDS), bnb_logits(hf_dir), **TOLERANCE)


def test_flat_blocks_are_bitsandbytes_pytorch_dequantization():
    """A weight whose rows are no multiple of the block size: blocks run over the
    flattened weight, the last one short, as bitsandbytes' PyTorch implementation (and its
    quantizer) has them."""
    default_ops = pytest.importorskip("bitsandbytes.backends.default.ops")
    weight = torch.randn(6, 40)  # 240 values: 3 blocks of 64 and one of 48
    packed, state = bnb_functional.quantize_4bit(weight, blocksize=64, quant_type="nf4",
                                                 compress_statistics=True)
    expected = default_ops._dequantize_4bit_compute(
        packed.reshape(-1), bnb_functional.dequantize_blockwise(state.absmax, state.state2)
        + state.offset, state.code, 64, state.shape, torch.float32)
    stored = {"w.quant_map": state.code, "w.absmax": state.absmax,
              "w.nested_absmax": state.state2.absmax,
              "w.nested_quant_map": state.state2.code}
    ours = bnb_format.dequantize_4bit(
        packed.reshape(-1).numpy(),
        bnb_format.QuantState("nf4", 64, "float32", (6, 40), 256, float(state.offset)),
        lambda name: stored[name].numpy(), "w")
    np.testing.assert_array_equal(ours, expected.numpy())
    assert np.abs(ours - weight.numpy()).max() < 0.5  # nf4's error, not a shuffle


def test_quantize_int4_requantizes_bitsandbytes_weights(llama, tmp_path):
    """--quantize int4 on an nf4 checkpoint quantizes bitsandbytes' dequantized weights as
    any float checkpoint's: the bundle computes with int4 blocks of exactly those (its
    MatMulNBits in float: accuracy level 0), and stays near the float bundle."""
    hf_dir = save_bnb(llama, tmp_path / "nf4", "nf4-double")
    int4 = last_logits(export_small(hf_dir, tmp_path / "int4", QuantConfig(
        "int4", 32, accuracy_level=0, embeddings=False)), IDS)
    model = load_hf_model(llama)
    weights = bnb_weights(hf_dir)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):  # the projections and the float head
                w = weights.get(name + ".weight", module.weight.numpy())
                packed, scales = int4_blockwise(w, 32)
                module.weight.copy_(torch.from_numpy(int4_dequantize(packed, scales,
                                                                     w.shape[1])))
        expected = model(torch.tensor([IDS])).logits[0, -1].numpy()
    np.testing.assert_allclose(int4, expected, rtol=1e-3, atol=1e-3)
    # near: int4 moves nf4's logits about as far as it moves the float model's (0.54 and
    # 0.40 of the largest logit on this wide random fixture; nf4 itself moved them 0.42)
    drift = np.abs(int4 - last_logits(export_small(hf_dir, tmp_path / "nf4-float"), IDS))
    float_int4 = last_logits(export_small(llama, tmp_path / "float-int4", QuantConfig(
        "int4", 32, accuracy_level=0, embeddings=False)), IDS)
    float_drift = np.abs(float_int4 - last_logits(export_small(llama, tmp_path / "float"),
                                                  IDS))
    assert drift.max() < 2 * float_drift.max()


def _rewrite(hf_dir: Path, change) -> None:
    """The checkpoint's tensors through `change` (a dict edited in place), saved again."""
    tensors = load_file(hf_dir / "model.safetensors")
    change(tensors)
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})


STATE = "model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4"


def _edit_state(tensors: dict, **fields) -> None:
    state = json.loads(bytes(tensors[STATE].tolist()))
    state.update(fields)
    state = {k: v for k, v in state.items() if v is not None}
    tensors[STATE] = torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)


@pytest.mark.parametrize("change, fragment", [
    (lambda t: _edit_state(t, blocksize=None), f"{STATE} lacks 'blocksize'"),
    (lambda t: _edit_state(t, nested_offset=None), f"{STATE} lacks 'nested_offset'"),
    (lambda t: _edit_state(t, quant_type="nf3"), f"{STATE} has quant_type 'nf3'"),
    (lambda t: _edit_state(t, shape=[64, 32]),
     "model.layers.0.self_attn.q_proj.weight.absmax holds 64 values; its quant_state"),
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight.absmax"),
     "'model.layers.1.mlp.up_proj.weight' has no 'model.layers.1.mlp.up_proj.weight.absmax'"),
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight.quant_state.bitsandbytes__nf4"),
     "'model.layers.1.mlp.up_proj.weight' has no"),
    # a fused layer transformers split on load and saved joined back (Sarvam-MoE's
    # query_key_value): its parts' quant states one after another
    (lambda t: t.update({STATE: torch.cat([t[STATE], t[STATE]])}),
     f"{STATE} holds several quant states one after another"),
])
def test_a_damaged_quant_state_is_one_line_naming_the_tensor(llama, tmp_path, change,
                                                             fragment):
    hf_dir = save_bnb(llama, tmp_path / "nf4", "nf4-double")
    _rewrite(hf_dir, change)
    assert_one_line_error(cli("export", hf_dir, "-o", tmp_path / "out"), fragment)


def test_int8_layers_need_their_scales_and_the_config(llama, tmp_path):
    hf_dir = save_bnb(llama, tmp_path / "int8", "int8")
    config_path = hf_dir / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({k: v for k, v in config.items()
                                       if k != "quantization_config"}))
    assert_one_line_error(cli("export", hf_dir, "-o", tmp_path / "out"),
                          "is stored by bitsandbytes", "config.json has no bitsandbytes")
    config_path.write_text(json.dumps(config))
    _rewrite(hf_dir, lambda t: t.pop("model.layers.0.mlp.up_proj.SCB"))
    assert_one_line_error(cli("export", hf_dir, "-o", tmp_path / "out"),
                          "'model.layers.0.mlp.up_proj.weight' has no "
                          "'model.layers.0.mlp.up_proj.SCB'")


@pytest.mark.parametrize("quant, scheme", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
      "bnb_4bit_use_double_quant": True}, bnb_format.BnbScheme(4, "nf4", True)),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, bnb_format.BnbScheme(4, "fp4")),
    ({"quant_method": "bitsandbytes", "_load_in_8bit": True}, bnb_format.BnbScheme(8)),
    ({"load_in_8bit": True}, bnb_format.BnbScheme(8)),  # before quant_method was written
])
def test_bitsandbytes_configs_are_read(quant, scheme):
    assert ModelConfig.from_hf(dict(BASE, quantization_config=quant)).bnb == scheme


@pytest.mark.parametrize("quant, fragment", [
    ({"quant_method": "bitsandbytes"}, "must load in 4 or in 8 bits"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": True},
     "must load in 4 or in 8 bits"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "int4"},
     "bnb_4bit_quant_type 'int4' is not nf4 or fp4"),
    ({"quant_method": "hqq"}, "the checkpoint is quantized (quantization_config, hqq)"),
])
def test_configs_export_cannot_read_are_one_line(quant, fragment):
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf(dict(BASE, quantization_config=quant))
    assert fragment in str(err.value) and "\n" not in str(err.value)
