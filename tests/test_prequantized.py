"""Pre-quantized int4 checkpoints (GPTQ, AWQ, compressed-tensors W4A16) export their layers
as they store them: MatMulNBits on the checkpoint's own codes, scales and zero points.

The checkpoints are written here from the random fixtures: each projection quantized in
numpy, then packed the way each format's reference code packs it (AutoGPTQ's and AutoAWQ's
packing loops, written out again here; compressed-tensors' own `pack_to_int32`). The
reference is transformers' float model with those dequantized weights put in (transformers
cannot run these formats' kernels on a CPU), so nothing here shares export's unpacking."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import numpy_helper

from edgeprefill.cli.main import cli as main_cli
from edgeprefill.errors import ExportError
from edgeprefill.export import act_order
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import build_hf_model, load_hf_model
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_exactness import NEW_TOKENS, model_greedy
from tests.test_families import BASE
from tests.test_int4_decode import load, needs_int_kernels
from tests.test_quantize import logits_at

IDS = [1, 5, 9, 33, 70, 4, 18]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's order_map in WQLinear_GEMM.from_linear
KEPT_FLOAT = "model.layers.1.mlp.down_proj"  # the config's modules_to_not_convert / ignore
FLOAT_TOLERANCE = dict(rtol=1e-3, atol=1e-3)  # an int4 graph at level 0 vs its own weights


class Quantized:
    """One layer's weight W [out, in] quantized: W ~ (codes - zeros) * scales per group.
    With `perm` (act-order) the groups are taken in that order of the inputs, as GPTQ's
    desc_act does (its Hessian's order), and the codes stored back in the input order
    with g_idx = invperm // group (GPTQModel's and AutoGPTQ's `g_idx[invperm]` of the
    groups' i // group, llm-compressor's actorder "group" the same)."""

    def __init__(self, w: np.ndarray, group: int, sym: bool, scale_dtype, min_zero: int = 0,
                 perm: np.ndarray | None = None):
        out, cols = w.shape
        perm = np.arange(cols) if perm is None else perm
        invperm = np.argsort(perm)
        self.g_idx = invperm // group  # [in]: each input's group
        g = np.ascontiguousarray(w[:, perm]).reshape(out, cols // group, group)
        if sym:
            scale, zero = np.abs(g).max(2) / 7, np.full((out, cols // group), 8)
        else:
            lo, hi = np.minimum(g.min(2), 0), np.maximum(g.max(2), 0)
            scale = (hi - lo) / 15
        self.scales = torch.tensor(scale).to(scale_dtype)  # as stored
        s = self.scales.float().numpy()
        if not sym:
            zero = np.clip(np.rint(-lo / s), min_zero, 15)
        self.zeros = zero.astype(np.int64)  # [out, groups]
        codes = np.clip(np.rint(g / s[:, :, None]) + self.zeros[:, :, None], 0, 15)
        self.codes = codes.reshape(out, cols)[:, invperm].astype(np.int64)  # [out, in]
        self.group = group

    def dequantized(self) -> np.ndarray:
        """(code - zero) * scale of each input's group, g_idx's (as transformers' GPTQ
        and compressed-tensors dequantize)."""
        s = self.scales.float().numpy()[:, self.g_idx]
        return ((self.codes - self.zeros[:, self.g_idx]) * s).astype(np.float32)


def _words(values: np.ndarray, order=range(8)) -> np.ndarray:
    """[rows, 8 m] 4-bit values -> int32 [rows, m]: nibble t of word c holds value
    8 c + order[t]."""
    words = np.zeros((values.shape[0], values.shape[1] // 8), np.uint32)
    for t, column in enumerate(order):
        words |= (values[:, column::8].astype(np.uint32) & 0xF) << (4 * t)
    return words.view(np.int32)


def gptq_parts(q: Quantized, v1: bool) -> dict[str, torch.Tensor]:
    """AutoGPTQ's QuantLinear.pack: qweight packs 8 inputs per word down each column,
    qzeros 8 outputs per word along each group's row, v1 storing each zero minus one."""
    return {"qweight": torch.from_numpy(np.ascontiguousarray(_words(q.codes).T)),
            "qzeros": torch.from_numpy(_words(q.zeros.T - (1 if v1 else 0))),
            "scales": q.scales.T.contiguous(),
            "g_idx": torch.tensor(q.g_idx, dtype=torch.int32)}


def awq_parts(q: Quantized) -> dict[str, torch.Tensor]:
    """AutoAWQ's WQLinear_GEMM.from_linear: [in, out / 8] words in AWQ's column order."""
    return {"qweight": torch.from_numpy(_words(q.codes.T, AWQ_ORDER)),
            "qzeros": torch.from_numpy(_words(q.zeros.T, AWQ_ORDER)),
            "scales": q.scales.T.contiguous()}


def ct_parts(q: Quantized, sym: bool, act_order: bool) -> dict[str, torch.Tensor]:
    """compressed-tensors' own packer, as its PackedQuantizationCompressor.compress calls it."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    parts = {"weight_packed": pack_to_int32(torch.tensor(q.codes - 8, dtype=torch.int8), 4),
             "weight_scale": q.scales, "weight_shape": torch.tensor(q.codes.shape)}
    if not sym:
        zero = torch.tensor(q.zeros - 8, dtype=torch.int8)
        parts["weight_zero_point"] = pack_to_int32(zero, 4, packed_dim=0)
    if act_order:  # llm-compressor's actorder "group" keeps the weight_g_idx parameter
        parts["weight_g_idx"] = torch.tensor(q.g_idx, dtype=torch.int32)
    return parts


def quant_config(method: str, group: int, sym: bool, v1: bool, act_order: bool) -> dict:
    if method == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": sym,
                "desc_act": act_order, "checkpoint_format": "gptq" if v1 else "gptq_v2"}
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": [KEPT_FLOAT]}
    weights = {"num_bits": 4, "type": "int", "symmetric": sym, "strategy": "group",
               "group_size": group, "actorder": "group" if act_order else None,
               "dynamic": False}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head", KEPT_FLOAT],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": None,
                                          "format": "pack-quantized"}}}


def write_quantized(src: Path, out: Path, method: str, group: int, sym: bool,
                    v1: bool = False, act_order: str | None = None) -> dict[str, np.ndarray]:
    """`src` saved as a pre-quantized release: every projection but KEPT_FLOAT quantized,
    in act-order where `act_order` says ("shared": one random order per input, as GPTQ
    orders q, k and v by their one input's Hessian; "each": one per projection). Returns
    each quantized weight's dequantized values by its float name."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    for path in src.iterdir():
        if path.name != "model.safetensors":
            shutil.copy(path, out / path.name)
    tensors, dequantized = {}, {}
    scale_dtype = torch.bfloat16 if method == "compressed-tensors" else torch.float16
    for name, weight in load_file(src / "model.safetensors").items():
        module = name.removesuffix(".weight")
        if not name.endswith("_proj.weight") or module == KEPT_FLOAT:
            tensors[name] = weight
            continue
        perm = input_perm(module, weight.shape[1], act_order)
        q = Quantized(weight.float().numpy(), group, sym, scale_dtype, min_zero=int(v1),
                      perm=perm)
        parts = (gptq_parts(q, v1) if method == "gptq" else awq_parts(q) if method == "awq"
                 else ct_parts(q, sym, act_order is not None))
        tensors.update({f"{module}.{part}": t for part, t in parts.items()})
        dequantized[name] = q.dequantized()
    save_file(tensors, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = quant_config(method, group, sym, v1, act_order is not None)
    (out / "config.json").write_text(json.dumps(config))
    return dequantized


def input_perm(module: str, cols: int, act_order: str | None) -> np.ndarray | None:
    """A random order of the module's inputs, the same for the modules of one input
    where `act_order` is "shared"."""
    if act_order is None:
        return None
    key = module
    if act_order == "shared":
        key = module.replace("q_proj", "qkv").replace("k_proj", "qkv").replace(
            "v_proj", "qkv").replace("gate_proj", "gate_up").replace("up_proj", "gate_up")
    return np.random.default_rng(zlib.crc32(key.encode())).permutation(cols)


def reference_logits(src: Path, dequantized: dict[str, np.ndarray]) -> np.ndarray:
    """transformers' float model of `src` with the dequantized weights put in."""
    model = load_hf_model(src)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, w in dequantized.items():
            params[name].copy_(torch.from_numpy(w))
        return model(torch.tensor([IDS])).logits[0, -1].numpy()


def bundle_int4_weights(bundle: Path) -> dict[str, np.ndarray]:
    """Each MatMulNBits of the bundle, dequantized from its operands as the op defines them
    (per output row, blocks along K, even k low; zero points packed two a byte, default 8),
    by the checkpoint weight names it computes with (a fused node's parts, concatenated)."""
    model = onnx.load(bundle / "model.onnx")
    inits = {t.name: t for t in model.graph.initializer}
    orders = input_orders(model)
    found = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        data, scales = (numpy_helper.to_array(inits[n], bundle) for n in node.input[1:3])
        n, blocks, half = data.shape
        codes = np.empty((n, blocks * half * 2), np.float32)
        codes[:, 0::2], codes[:, 1::2] = data.reshape(n, -1) & 15, data.reshape(n, -1) >> 4
        zeros = np.full((n, blocks), 8.0, np.float32)
        if len(node.input) > 3 and node.input[3]:
            zp = numpy_helper.to_array(inits[node.input[3]], bundle)
            both = np.stack([zp & 15, zp >> 4], axis=-1).reshape(n, -1)
            zeros = both[:, :blocks].astype(np.float32)
        block = attrs["block_size"]
        w = (codes - np.repeat(zeros, block, 1)) * np.repeat(scales.reshape(n, blocks), block, 1)
        stem, last = node.input[1].removesuffix(".weight.int4").rsplit(".", 1)
        names = [f"{stem}.{p}_proj.weight" for p in last.removesuffix("_proj").split("_")]
        found[tuple(names)] = w[:, :attrs["K"]]
        order = orders.get(node.input[0])
        if order is not None:  # act-order: column j computes with input order[j]
            found[tuple(names)] = np.empty_like(w[:, :attrs["K"]])
            found[tuple(names)][:, order] = w[:, :attrs["K"]]
    return found


def input_orders(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The inputs that act-order gathers (x[..., order]: the rows of x flattened and
    transposed, Gather, Transpose back, Reshape), by name, with their order."""
    nodes = {out: node for node in model.graph.node for out in node.output}
    consts = {t.name: t for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type != "Reshape":
            continue
        back = nodes.get(node.input[0])
        gather = nodes.get(back.input[0]) if back is not None and \
            back.op_type == "Transpose" else None
        if gather is not None and gather.op_type == "Gather":
            found[node.output[0]] = numpy_helper.to_array(consts[gather.input[1]])
    return found


def expected_weights(found: dict, dequantized: dict[str, np.ndarray],
                     negated_rows: bool = False) -> None:
    """The bundle's int4 weights are exactly the checkpoint's dequantized ones, all of them
    (`negated_rows`: up to the sign of rows the family negates, which the logits check)."""
    assert sorted(n for names in found for n in names) == sorted(dequantized)
    for names, w in found.items():
        want = np.concatenate([dequantized[n] for n in names])
        if negated_rows:
            w, want = np.abs(w), np.abs(want)
        np.testing.assert_array_equal(w, want)


CASES = {  # family, method, group size, symmetric, gptq v1, act-order (write_quantized)
    "gptq-v1-asym-llama-32": ("llama", "gptq", 32, False, True, None),
    "awq-qwen3-128": ("qwen3", "awq", 128, False, False, None),
    "compressed-tensors-asym-qwen3-128": ("qwen3", "compressed-tensors", 128, False, False,
                                          None),
    "gptq-desc-act-v1-asym-llama-32": ("llama", "gptq", 32, False, True, "shared"),
    "compressed-tensors-actorder-sym-qwen3-32-each": ("qwen3", "compressed-tensors", 32, True,
                                                      False, "each"),
}
SLOW_CASES = {
    "gptq-v1-sym-qwen3-128": ("qwen3", "gptq", 128, True, True, None),
    "gptq-v2-asym-qwen3-128": ("qwen3", "gptq", 128, False, False, None),
    "awq-llama-32": ("llama", "awq", 32, False, False, None),
    "compressed-tensors-sym-llama-32": ("llama", "compressed-tensors", 32, True, False, None),
    "gptq-desc-act-v2-sym-qwen3-32-each": ("qwen3", "gptq", 32, True, False, "each"),
    "gptq-desc-act-v2-asym-qwen3-128": ("qwen3", "gptq", 128, False, False, "shared"),
    "compressed-tensors-actorder-asym-llama-32": ("llama", "compressed-tensors", 32, False,
                                                  False, "shared"),
    # q|k|v and the DeltaNet projections reordered after their split products
    "gptq-desc-act-v2-asym-qwen3_5-32-each": ("qwen3_5_text", "gptq", 32, False, False,
                                              "each"),
    # q's and k's rows of each head's rotated second half negated (its reflected rotary)
    "gptq-v2-asym-nanochat-32": ("nanochat", "gptq", 32, False, False, None),
    "gptq-desc-act-v2-sym-nanochat-32-each": ("nanochat", "gptq", 32, True, False, "each"),
}


def source_model(tmp_path: Path, family: str, group: int) -> Path:
    """The tiny random model; a group of 128 gets inputs of 128 and 256 (several groups)."""
    wide = {"hidden_size": 128, "intermediate_size": 256} if group == 128 else {}
    return build_hf_model(family, tmp_path / "src", **wide)


def check_case(tmp_path: Path, family: str, method: str, group: int, sym: bool,
               v1: bool, act_order: str | None) -> None:
    if method == "compressed-tensors":
        pytest.importorskip("compressed_tensors")
    src = source_model(tmp_path, family, group)
    dequantized = write_quantized(src, tmp_path / "q", method, group, sym, v1, act_order)
    export(tmp_path / "q", tmp_path / "b", ExportOptions(  # IDS in two chunks
        chunks=(4,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", accuracy_level=0, embeddings=False, head="float",
                          float_layers=False)))
    found = bundle_int4_weights(tmp_path / "b")
    expected_weights(found, dequantized, negated_rows=family == "nanochat")
    label = {"gptq": "GPTQ", "awq": "AWQ", "compressed-tensors": "compressed-tensors W4A16"}
    described = (f"{label[method]} int4 weights (groups of {group}, "
                 f"{'symmetric' if sym else 'asymmetric'}), kept 4-bit in the ort flavour")
    quirks = json.loads((tmp_path / "b" / "edgeprefill.json").read_text())["source"]["quirks"]
    assert any(q.startswith(described) for q in quirks), quirks
    check_input_orders(tmp_path / "b", found, act_order)
    np.testing.assert_allclose(logits_at(tmp_path / "b", IDS),
                               reference_logits(src, dequantized), **FLOAT_TOLERANCE)


def check_input_orders(bundle: Path, found: dict, act_order: str | None) -> None:
    """No Gather of the inputs without act-order; with it, each MatMulNBits of several
    groups takes its input gathered (the fixtures give each input its own orders; one
    group is in order whatever its g_idx), and q, k and v (gate and up) of one order stay
    one MatMulNBits, those of their own orders each get one."""
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    gathered = input_orders(model)
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    if act_order is None:
        assert not gathered
        assert not any(n.op_type in ("Transpose", "Flatten") for n in model.graph.node)
        return
    attrs = [{a.name: a.i for a in n.attribute} for n in nodes]
    several = [n for n, a in zip(nodes, attrs, strict=True) if a["K"] > a["block_size"]]
    taking = [n.input[0] for n in nodes if n.input[0] in gathered]
    assert sorted(taking) == sorted(n.input[0] for n in several)
    assert len(set(taking)) == len(taking)
    fused = max(len(names) for names in found)
    assert fused == (3 if act_order == "shared" else 1), list(found)


@pytest.mark.parametrize("case", CASES)
def test_int4_checkpoint_exports_its_own_weights_and_transformers_logits(tmp_path, case):
    check_case(tmp_path, *CASES[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES)
def test_int4_checkpoint_matrix(tmp_path, case):
    check_case(tmp_path, *SLOW_CASES[case])


def test_without_quantize_only_the_checkpoints_int4_layers_are_int4(tmp_path, caplog):
    """No --quantize: int4 is implied for the layers the checkpoint quantized; what it kept
    float (the LM head, the embeddings, modules_to_not_convert) stays float. Every stored
    part is read (no "tensors config.json does not use" warning)."""
    src = source_model(tmp_path, "llama", 32)
    dequantized = write_quantized(src, tmp_path / "q", "awq", 32, sym=False)
    caplog.set_level("WARNING")
    manifest = export(tmp_path / "q", tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False))
    assert manifest.graph.quantization == "int4"
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    shown = CliRunner().invoke(main_cli, ["inspect", str(tmp_path / "b")])
    assert "AWQ int4 weights (groups of 32, asymmetric)" in shown.output
    expected_weights(bundle_int4_weights(tmp_path / "b"), dequantized)
    model = onnx.load(tmp_path / "b" / "model.onnx", load_external_data=False)
    floats = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    assert {"lm_head.weight", "model.embed_tokens.weight", KEPT_FLOAT + ".weight"} <= floats
    got = logits_at(tmp_path / "b", IDS)  # accuracy level 4: int8 activations, near
    expected = reference_logits(src, dequantized)
    assert np.abs(got - expected).max() < 0.02 * np.abs(expected).max()


@pytest.mark.parametrize("act_order", [None, "each"])
def test_a_standard_bundle_reads_the_int4_layers_dequantized(tmp_path, act_order):
    """A bundle that holds no quantized weights (--flavor standard, TensorRT's) reads the
    int4 layers as float: the checkpoint's dequantized values (act-order ones in the input
    order), in its dtype."""
    src = source_model(tmp_path, "llama", 32)
    dequantized = write_quantized(src, tmp_path / "q", "gptq", 32, sym=False,
                                  act_order=act_order)
    manifest = export(tmp_path / "q", tmp_path / "b", ExportOptions(
        flavor="standard", dtype="fp16", chunks=(16,), max_context=128, show_progress=False))
    assert manifest.graph.quantization is None
    model = onnx.load(tmp_path / "b" / "model.onnx")
    weights = {t.name: numpy_helper.to_array(t, tmp_path / "b") for t in model.graph.initializer}
    down = "model.layers.0.mlp.down_proj.weight"  # [in, out], as MatMul takes it
    np.testing.assert_array_equal(weights[down], dequantized[down].T.astype(np.float16))


@pytest.mark.parametrize("act_order", [None, "each"])
def test_an_fp16_ort_bundle_keeps_the_int4_layers_with_their_float16_scales(tmp_path,
                                                                            act_order):
    """An fp16 `ort` bundle (the GPU's) of an int4 checkpoint is int4 too: MatMulNBits on
    the checkpoint's codes and zero points with its float16 scales, so exactly its weights;
    the logits are transformers' on them, to float16's rounding and the implied accuracy
    level 4's int8 activations (0.02 of the scale in a float32 bundle, above)."""
    src = source_model(tmp_path, "llama", 32)
    dequantized = write_quantized(src, tmp_path / "q", "gptq", 32, sym=False,
                                  act_order=act_order)
    manifest = export(tmp_path / "q", tmp_path / "b", ExportOptions(
        dtype="fp16", chunks=(4,), max_context=128, show_progress=False))
    assert (manifest.graph.quantization, manifest.graph.dtype) == ("int4", "float16")
    found = bundle_int4_weights(tmp_path / "b")
    expected_weights(found, dequantized)
    check_input_orders(tmp_path / "b", found, act_order)
    expected = reference_logits(src, dequantized)
    got = logits_at(tmp_path / "b", IDS)
    assert np.abs(got - expected).max() < 0.04 * np.abs(expected).max()


@needs_int_kernels
def test_act_order_bundle_greedy_on_the_int4_kernels_is_transformers(tmp_path, library,
                                                                    monkeypatch):
    """The implied int4 bundle (int8 activations) of a symmetric group-32 act-order
    checkpoint runs the native decode kernel and int4 prefill's int8 GEMMs on the gathered
    inputs, in chunks of 4 and one token at a time: transformers' greedy tokens on the
    dequantized weights."""
    src = source_model(tmp_path, "llama", 32)
    dequantized = write_quantized(src, tmp_path / "q", "gptq", 32, sym=True, act_order="each")
    export(tmp_path / "q", tmp_path / "b", ExportOptions(chunks=(4,), max_context=128,
                                                         show_progress=False))
    monkeypatch.setenv("EDGEPREFILL_KERNELS", "require")
    model = load_hf_model(src)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, w in dequantized.items():
            params[name].copy_(torch.from_numpy(w))
    with Engine.load(tmp_path / "b", threads=2, background=False) as engine:
        assert engine.backend.int4_decode.rewritten > 0
        got = engine.generate(IDS, GenerationParams(max_new_tokens=NEW_TOKENS, ignore_eos=True),
                              chunk_size=4).result()
    assert got.token_ids == model_greedy(model, IDS)


def test_act_order_groups_of_other_sizes_are_refused_in_one_line(tmp_path):
    """A g_idx whose groups are not group_size inputs each (here 33 and 31) has no plain
    grouped order for MatMulNBits' blocks: refused, where the equal-sized act-order groups
    above export."""
    src = source_model(tmp_path, "llama", 32)
    write_quantized(src, tmp_path / "q", "gptq", 32, sym=True, v1=True, act_order="shared")
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "q" / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.g_idx"
    tensors[name] = (torch.arange(64, dtype=torch.int32) > 32).int().flip(0).contiguous()
    save_file(tensors, tmp_path / "q" / "model.safetensors")
    with pytest.raises(ExportError, match="g_idx gives groups other than 32 inputs") as err:
        export(tmp_path / "q", tmp_path / "b", ExportOptions(chunks=(16,), max_context=128,
                                                            show_progress=False))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "b").exists()


def test_g_idx_of_another_length_is_refused_in_one_line():
    with pytest.raises(ExportError, match="a g_idx of shape \\[63\\] for a weight of 64") as err:
        act_order.input_order("q_proj", np.arange(63) // 32, 32, 64)
    assert "\n" not in str(err.value)


def test_quantize_int8_of_an_int4_checkpoint_is_one_line(tmp_path):
    src = source_model(tmp_path, "llama", 32)
    write_quantized(src, tmp_path / "q", "gptq", 32, sym=True, v1=True)
    assert_one_line_error(cli("export", tmp_path / "q", "-o", tmp_path / "b", "--quantize",
                              "int8", "--quiet"), "int4 (gptq)", "not int8")


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_a_quantization_config_over_float_weights_is_refused_in_one_line(tmp_path, method):
    """A float copy that kept its quantization_config had exported float, said int4 (its
    quirks, the export line): nothing is stored as the scheme's codes."""
    src = source_model(tmp_path, "llama", 32)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quant_config(method, 32, True, False, False)
    (src / "config.json").write_text(json.dumps(config))
    codes = "qweight"  # gptq's and awq's
    assert_one_line_error(cli("export", src, "-o", tmp_path / "b", "--quiet"),
                          f"says {method.upper()} int4", f"(*.{codes})",
                          "Drop quantization_config")
    assert not (tmp_path / "b").exists()


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
CT_WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
              "group_size": 128}


def ct(weights=None, **group) -> dict:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {**CT_WEIGHTS, **(weights or {})},
                                          **group}}}


@pytest.mark.parametrize("quant, message", [
    ({**GPTQ, "bits": 3}, "gptq quantization has 3-bit weights; export reads 4-bit"),
    ({**GPTQ, "bits": 8}, "gptq quantization has 8-bit weights"),
    ({**GPTQ, "group_size": -1}, "group_size -1"),
    ({**GPTQ, "checkpoint_format": "marlin"}, "stored as 'marlin'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "exllama"},
     "awq quantization is packed for 'exllama'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"},
     "packed for 'gemv'"),
    (ct({"num_bits": 8}), "compressed-tensors quantization has 8-bit weights"),
    (ct({"strategy": "channel"}), "the 'channel' strategy"),
    (ct(format="marlin-24"), "format 'marlin-24'"),
    (ct(input_activations={"num_bits": 8}), "quantizes activations too"),
    ({"quant_method": "hqq", "nbits": 4}, "quantized (quantization_config, hqq)"),
    ({"quant_method": "exl2"}, "quantized (quantization_config, exl2)"),
])
def test_unsupported_quantization_is_refused_in_one_line_naming_it(quant, message):
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf(dict(BASE, quantization_config=quant))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_zero_pointed_layers_are_said_to_run_matmulnbits(tmp_path, monkeypatch):
    """An asymmetric checkpoint's layers (AWQ's always are) have zero points, from which
    neither the int8 prefill weights derive nor MatMulInt4 reads: the backend keeps
    MatMulNBits for both, and `inspect` and `--stats` say so rather than what a symmetric
    bundle would run on this CPU."""
    src = source_model(tmp_path, "llama", 32)
    write_quantized(src, tmp_path / "q", "awq", 32, sym=False)
    export(tmp_path / "q", tmp_path / "b", ExportOptions(chunks=(16,), max_context=128,
                                                         show_progress=False))
    backend = load(tmp_path / "b", monkeypatch)
    assert backend.int4_decode.rewritten == 0
    assert "accuracy level 0 (the weights have zero points" in backend.int4_prefill.projections
    result = CliRunner().invoke(main_cli, ["inspect", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "int4 prefill MatMulNBits accuracy level 0 (the weights have zero points" \
        in result.output
    assert "int4 decode MatMulNBits (" in result.output
