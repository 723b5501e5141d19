"""Mixture-of-experts decoders (export/moe.py): each family's routing and experts as
transformers computes them, whatever the chunking, the padding and the rows of a call;
quantized experts; the checkpoint layouts a user may hold; configs shaped as the Hub's."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from edgeprefill.engines import StepBatch
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.families import FAMILIES as FAMILY_SPECS
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.model_quirks import model_quirks
from edgeprefill.export.quantize import QuantConfig, int4_blockwise, int4_dequantize, int8_rows
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import FAMILIES, load_hf_model
from tests.state_models import GRAPHS, assert_padded_chunks_match
from tests.test_exactness import (
    check_greedy,
    check_together,
    prompt_ids,
    recurrent_delta_rule,
    reference_logits,
)
from tests.test_families import export_small, last_logits
from tests.test_quantize import (
    check_one_token_per_call,
    dequantize_embeddings,
    int8_linear,
    native_int8,
)

MOE_FAMILIES = ("qwen3_moe", "olmoe", "granitemoe", "lfm2_moe", "qwen2_moe", "glm4_moe")
# Families whose matrix here runs under `slow` only (the default suite checks each one's chunk
# logits in both flavours: test_exactness.test_chunk_logits_match_transformers).
SLOW_MOE_FAMILIES = ("qwen3_5_moe_text", "qwen3_5_moe", "qwen3_vl_moe", "mixtral",
                     "ernie4_5_moe", "qwen3_next", "lara_mini", "mellum", "flint", "dots1",
                     "exaone_moe", "solar_open", "kolibri1", "glm4v_moe", "llama4_text",
                     "llama4", "phimoe", "hunyuan_v1_moe", "dbrx", "flex_olmo",
                     "minimax_m2", "sarvam_moe", "mimo_v2_flash", "beam",
                     "hy_v3", "aria_text", "cohere2_moe", "afmoe", "laguna", "step3p7")
# DeepSeek-V3's grouped routing (glm4_moe's fixture is the default suite's representative)
GROUPED_FAMILIES = ("glm4_moe", "dots1", "exaone_moe", "solar_open", "glm4v_moe",
                    "deepseek_v3", "glm4_moe_lite", "sarvam_mla",  # these three: MLA
                    "sarvam_moe", "mimo_v2_flash", "beam")


def slow(*params) -> list:
    return [pytest.param(*(p if isinstance(p, tuple) else (p,)), marks=pytest.mark.slow)
            for p in params]


EVERY_MOE_FAMILY = [*MOE_FAMILIES, *slow(*SLOW_MOE_FAMILIES)]


def is_router(module: torch.nn.Module) -> bool:
    # Qwen3-MoE's TopKRouter, DeepSeek-V3's TopkRouter, Llama 4's Llama4Router, Hunyuan's
    # HunYuanMoEV1Gate, AFMoE's AfmoeTokenChoiceRouter
    name = type(module).__name__.lower()
    return name.endswith("topkrouter") or name in ("llama4router", "hunyuanmoev1gate",
                                                   "dbrxrouter", "afmoetokenchoicerouter")


def router_choice(router: torch.nn.Module, out) -> np.ndarray:
    """The [tokens, k] experts a router chose, from its output: the TopKRouters' third
    output; Llama 4's router returns its scores and logits, DBRX's its logits, and both
    choose the top k logits (DBRX's k is its block's: top_k, set by chosen_experts)."""
    if type(router).__name__ == "Llama4Router":
        return torch.topk(out[1], router.top_k, dim=-1).indices.numpy()
    if type(router).__name__ == "DbrxRouter":
        return torch.topk(out, router.top_k, dim=-1).indices.numpy()
    return out[2].numpy()


def routers(model) -> list[torch.nn.Module]:
    """The router modules of a transformers MoE model, in layer order."""
    return [m for name, m in model.named_modules() if is_router(m)]


def chosen_experts(hf_dir, ids: list[int]) -> list[np.ndarray]:
    """Per MoE layer, the [tokens, k] experts transformers' routers choose for `ids`."""
    model = load_hf_model(hf_dir)
    for block in model.modules():  # DBRX: its router leaves the top k to its block
        if type(block).__name__ == "DbrxFFN":
            block.router.top_k = block.top_k
    chosen: list[np.ndarray] = []
    hooks = [r.register_forward_hook(lambda m, i, out: chosen.append(router_choice(m, out)))
             for r in routers(model)]
    with torch.no_grad(), recurrent_delta_rule():
        model(torch.tensor([ids]))
    for hook in hooks:
        hook.remove()
    return chosen


@pytest.mark.parametrize("family", EVERY_MOE_FAMILY)
def test_the_fixture_routes_a_chunks_tokens_to_different_experts_and_leaves_some_idle(
        family, hf_model):
    """What the chunked tests below rest on: within a 3-token chunk the tokens choose
    different experts, and some expert gets no token (its MatMuls run on zero rows)."""
    ids = prompt_ids(40)
    keys = FAMILIES[family].get("ffn_config", FAMILIES[family])  # DBRX's are its ffn_config's
    experts = keys.get("num_experts") or keys.get("num_local_experts") or \
        keys.get("n_routed_experts") or keys["moe_num_experts"]
    for layer in chosen_experts(hf_model(family), ids):
        chunk = layer[16:19]
        assert len(np.unique(chunk)) > chunk.shape[1]  # not all the same k experts
        assert len(np.unique(chunk)) < experts  # some expert idle


@pytest.mark.parametrize("family", [GROUPED_FAMILIES[0], *slow(*GROUPED_FAMILIES[1:])])
def test_the_fixtures_groups_and_correction_bias_change_the_experts_transformers_chooses(
        family, hf_model):
    """What makes the logits tests check DeepSeek-V3's routing: transformers' routers
    choose other experts for some tokens when every group is kept, and when the correction
    bias is 0."""
    ids = prompt_ids(40)
    model = load_hf_model(hf_model(family))
    layers = routers(model)
    assert all(r.topk_group < r.num_group for r in layers)

    def chosen() -> np.ndarray:
        picked: list[np.ndarray] = []
        hooks = [r.register_forward_hook(lambda m, i, out: picked.append(out[2].numpy()))
                 for r in layers]
        with torch.no_grad():
            model(torch.tensor([ids]))
        for hook in hooks:
            hook.remove()
        return np.sort(np.concatenate(picked), axis=-1)

    routed = chosen()
    kept = [r.topk_group for r in layers]
    for r in layers:
        r.topk_group = r.num_group
    assert (chosen() != routed).any(), "every group kept"
    for r, top_groups in zip(layers, kept, strict=True):
        r.topk_group = top_groups
    with torch.no_grad():
        for r in layers:
            r.e_score_correction_bias.zero_()
    assert (chosen() != routed).any(), "no correction bias"


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
@pytest.mark.parametrize("family", EVERY_MOE_FAMILY)
def test_logits_equal_transformers_for_chunks_of_1_3_16_and_a_padded_last_chunk(
        family, flavor, kernels, hf_model, bundle, monkeypatch):
    """Every call's last-token logits equal transformers' at that position for chunks of
    1, 2, 3, 16 and 40 tokens, the last chunk before the split padded: the padding is
    routed like any token and must stay out of the result."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model(family), bundle(family, flavor))


def run_rows(backend, prompts: list[list[int]], done: list[int]) -> np.ndarray:
    """Prefill prompt r's first done[r] tokens into slot r, then the rest of every prompt
    in one call of rows of different valid lengths (padded to the longest): its logits."""
    for row, (ids, past) in enumerate(zip(prompts, done, strict=True)):
        backend.run(StepBatch(np.array([ids[:past]]), np.array([0], np.int32),
                              np.array([past], np.int32), row))
    rest = [ids[past:] for ids, past in zip(prompts, done, strict=True)]
    width = max(map(len, rest))
    batch = np.full((len(rest), width), 5, np.int64)
    for row, part in enumerate(rest):
        batch[row, : len(part)] = part
    return backend.run(StepBatch(batch, np.array(done, np.int32),
                                 np.array(list(map(len, rest)), np.int32), 0))


# Families whose attention has a window (Mixtral) or interleaved rotary (ERNIE): their
# `ort` bundles fuse a chunk with decode rows through the native kernels (which take both).
WINDOWED_OR_INTERLEAVED = ("mixtral", "ernie4_5_moe")


@pytest.mark.parametrize("family, flavor", [
    *((family, flavor) for family in ("qwen3_moe", "lfm2_moe", "qwen2_moe", "glm4_moe")
      for flavor in ("ort", "standard")),
    *slow(*((family, flavor) for family in SLOW_MOE_FAMILIES for flavor in ("ort", "standard"))),
])
def test_rows_of_different_valid_lengths_in_one_call_each_equal_transformers(
        family, flavor, hf_model, bundle):
    """One call of three rows (a 9-token chunk, a decode token, 4 tokens): their tokens
    are routed together, each row's logits are its own prompt's."""
    hf_dir = hf_model(family)
    prompts = [prompt_ids(30, seed=s) for s in (3, 4, 5)]
    done = [21, 29, 26]
    engine = Engine.load(bundle(family, flavor), threads=2, background=False, kv_slots=3)
    got = run_rows(engine.backend, prompts, done)
    engine.close()
    for row, ids in enumerate(prompts):
        np.testing.assert_allclose(got[row], reference_logits(hf_dir, ids)[-1], rtol=1e-4,
                                   atol=1e-4, err_msg=f"row {row}")


@pytest.mark.parametrize("family", ("qwen3_moe", "lfm2_moe", "gpt_oss",
                                    *slow(*WINDOWED_OR_INTERLEAVED)))
def test_concurrent_sessions_generate_transformers_greedy_text(family, hf_model, bundle):
    """Sessions decoding together (and a prompt's chunks fused with their decode rows)
    each reply as transformers' greedy decoding of their prompt."""
    engine = Engine.load(bundle(family), threads=2, background=False, chunk_size=16)
    check_together(engine, hf_model(family), 8)
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ("ort", "standard"))
@pytest.mark.parametrize("family", (*MOE_FAMILIES, *SLOW_MOE_FAMILIES))
def test_greedy_output_matches_transformers_across_chunk_sizes(family, flavor, hf_model,
                                                               bundle):
    check_greedy(hf_model(family), bundle(family, flavor), (1, 17, 100), (1, 16, None))


def dequantized_int4(model, block: int = 32, transposed: bool = False) -> None:
    """Every projection of `model` but its routers', and its (untied) embedding table, as
    the int4 bundle stores them; `transposed`: the fused experts are stored [E, in, out]
    (Llama 4's), quantized along their input as the bundle's are."""
    with torch.no_grad():
        dequantize_embeddings(model, "int4", block)
        for name, param in model.named_parameters():
            if param.dim() != 2 and "experts" not in name or "embed" in name or \
                    name.endswith(("gate.weight", "router.weight", "e_score_correction_bias",
                                   "gate.wg.weight", "router.layer.weight",
                                   "dt_proj.weight", "A_log")):
                continue  # (LFM2's depthwise conv weights are not projections, nor ERNIE's
                # [1, E] selection bias, nor Jamba's Mamba-1 A_log; its dt_proj stays float)
            weight, turned = param, transposed and param.dim() == 3
            if name.endswith("experts.mlp.w2"):  # DBRX: each expert's [I, H], in by out
                weight = param.reshape(-1, model.config.ffn_config.ffn_hidden_size,
                                       param.shape[-1])
                turned = True
            weight = weight.transpose(1, 2) if turned else weight
            flat = weight.reshape(-1, weight.shape[-1]).numpy()
            out = torch.from_numpy(int4_dequantize(
                *int4_blockwise(flat, block), flat.shape[1])).reshape(weight.shape)
            param.copy_((out.transpose(1, 2) if turned else out).reshape(param.shape))


@pytest.mark.parametrize("family, block", [
    ("qwen3_moe", 32), ("granitemoe", 32), ("lfm2_moe", 32), ("glm4_moe", 32),
    ("qwen3_moe", 64),  # blocks wider than an expert (32): the unrolled MatMulNBits
    ("qwen2_moe", 32),  # top k weights not renormalized: the op is handed chosen logits
    *slow(("olmoe", 32), ("jamba", 32),  # not renormalized either
          *((family, block) for family in SLOW_MOE_FAMILIES for block in (32, 64))),
])
def test_int4_experts_equal_transformers_with_dequantized_weights(family, block, hf_model,
                                                                  tmp_path):
    """int4 at float compute (accuracy level 0) is exact up to rounding against the model
    whose projections (each expert's included; the router stays float) are the bundle's
    dequantized int4, prefilled in chunks of 3: through QMoE, and through the unrolled
    experts' MatMulNBits where QMoE cannot take the block size."""
    hf_dir = hf_model(family)
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", block, accuracy_level=0)))
    model = load_hf_model(hf_dir)
    dequantized_int4(model, block, FAMILY_SPECS[family.split("-")[0]].moe.names.transposed)
    ids = prompt_ids(20)
    with torch.no_grad(), recurrent_delta_rule():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    for start in range(0, 20, 3):
        part = ids[start:start + 3]
        got = engine.backend.run(StepBatch(np.array([part]), np.array([start], np.int32),
                                           np.array([len(part)], np.int32), 0))
        np.testing.assert_allclose(got[0], expected[start + len(part) - 1], rtol=1e-3,
                                   atol=1e-3, err_msg=f"chunk at {start}")
    engine.close()


def int8_experts_reference(model, symmetric: bool, transposed: bool = False,
                           keep: tuple[str, ...] = ()) -> None:
    """`model` computing as the int8 bundle does: each expert's rows (fused experts' [E,
    out, in]; `transposed`: stored [E, in, out]) as the bundle's QMoE stores them, one scale
    per row, in float; every other projection as the int8 ones compute
    (test_quantize.int8_linear: per-channel weights, activations quantized on the fly,
    `symmetric` as test_quantize.native_int8 says), and the embedding table as the bundle
    stores it. Float in the bundle and here: the routers, Qwen2-MoE's shared expert gate,
    MLA's kv_b_proj (folded into the attention) and any module whose name holds a part of
    `keep`."""
    keep = ("kv_b_proj", *keep)
    with torch.no_grad():
        dequantize_embeddings(model, "int8")
        for name, param in model.named_parameters():
            if param.dim() != 3 or "experts" not in name:
                continue
            weight = param.transpose(1, 2) if transposed else param
            flat = weight.reshape(-1, weight.shape[-1]).numpy()
            data, scale = int8_rows(flat)
            out = torch.from_numpy((data.astype(np.float32) - 128) * scale)
            out = out.reshape(weight.shape)
            param.copy_(out.transpose(1, 2) if transposed else out)
        for name, module in list(model.named_modules()):
            for child, linear in list(module.named_children()):
                path = f"{name}.{child}"
                if isinstance(linear, torch.nn.Linear) and not is_router(linear) and \
                        child not in ("gate", "shared_expert_gate") and \
                        not any(part in path for part in keep):
                    quantized = int8_linear(linear.weight.numpy(), symmetric)
                    quantized.bias = linear.bias  # (Qwen2-MoE's attention's), float
                    setattr(module, child, quantized)


@pytest.mark.parametrize("family, keep", [
    ("qwen3_moe", ()),
    *slow(("qwen2_moe", ()),  # top k weights not renormalized: the op is handed chosen logits
          ("gpt_oss", ()),  # the experts' biases, clamped SwiGLU
          ("hy_v4", ("indexer", "_hc.", "hc_head")),  # a clamp before the activation
          ("longcat_flash", ("router.",)),  # identity experts beside the op
          ("zaya", (".mlp.gate.",)),  # its MLP router's chosen expert or skip expert
          ("llama4_text", ()),  # the token times its expert's weight
          ("olmoe", ()), ("glm4_moe", ()), ("lfm2_moe", ()), ("mixtral", ()),
          ("granitemoe", ())),
])
def test_int8_experts_equal_transformers_with_dequantized_weights(family, keep, hf_model,
                                                                  tmp_path):
    """The int8 bundle's experts (QMoE at 8 bits, one scale per row, float activations)
    compute as transformers on their dequantized weights, with the other projections as
    int8 ones compute, decoded one token per call (DynamicQuantizeMatMul quantizes a
    call's whole input at one scale, a token's own at decode)."""
    hf_dir = hf_model(family)
    out = quantized_bundle(hf_dir, tmp_path / "b", "int8")
    model = load_hf_model(hf_dir)
    int8_experts_reference(model, native_int8(out),
                           FAMILY_SPECS[family.split("-")[0]].moe.names.transposed, keep)
    ids = prompt_ids(12)
    with torch.no_grad(), recurrent_delta_rule():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    check_one_token_per_call(out, ids, expected)


def quantized_bundle(hf_dir, out, kind: str, accuracy_level: int = 4):
    export(hf_dir, out, ExportOptions(chunks=(16,), max_context=128, show_progress=False,
                                      quant=QuantConfig(kind, accuracy_level=accuracy_level)))
    return out


def relative_error(got: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(got - reference).max() / np.abs(reference).max())


@pytest.mark.parametrize("kernels", ("auto", "off"))
def test_quantized_experts_stay_close(kernels, hf_model, bundle, tmp_path, monkeypatch):
    """The default int8 bundle (QMoE's 8-bit experts, the other projections on
    DynamicQuantizeMatMul or the native kernels' rewrites where they build) stays within 5%
    of fp32; the default int4 one (QMoE and MatMulNBits on int8 activations) within 15% of
    the float-compute int4 bundle, which equals transformers on the dequantized weights
    (the test above). Against fp32, int4's own rounding moves this wide random fixture's
    logits by 30-80%: routing flips."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    hf_dir = hf_model("olmoe")
    ids = prompt_ids(12)
    int8 = quantized_bundle(hf_dir, tmp_path / "int8", "int8")
    assert relative_error(last_logits(int8, ids), last_logits(bundle("olmoe"), ids)) < 0.05
    int4 = quantized_bundle(hf_dir, tmp_path / "int4", "int4")
    exact = quantized_bundle(hf_dir, tmp_path / "int4-float", "int4", accuracy_level=0)
    assert relative_error(last_logits(int4, ids), last_logits(exact, ids)) < 0.15
    for path in (int8, int4):
        with Engine.load(path, threads=2, background=False) as engine:
            reply = engine.generate(ids, GenerationParams(max_new_tokens=4, ignore_eos=True))
            assert len(reply.result().token_ids) == 4


def fused_experts(hf_dir, out, prefix: str = "mlp.experts") -> None:
    """hf_dir's checkpoint with each layer's experts stored as transformers 5's modules
    hold them: `experts.gate_up_proj` [E, 2I, H] (gate first) and `experts.down_proj`."""
    shutil.copytree(hf_dir, out)
    tensors = load_file(hf_dir / "model.safetensors")
    layers = sorted({n.split(f".{prefix}.")[0] for n in tensors if f".{prefix}." in n})
    for layer in layers:
        stem = f"{layer}.{prefix}."
        count = len({n for n in tensors if n.startswith(stem) and n.endswith("down_proj.weight")})
        parts = {kind: [tensors.pop(f"{stem}{j}.{kind}.weight") for j in range(count)]
                 for kind in ("gate_proj", "up_proj", "down_proj")}
        tensors[stem + "gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(
            parts["gate_proj"], parts["up_proj"], strict=True)])
        tensors[stem + "down_proj"] = np.stack(parts["down_proj"])
    save_file(tensors, out / "model.safetensors")


def test_fused_expert_tensors_export_as_the_per_expert_ones(hf_model, tmp_path):
    """The fused layout transformers 5's modules hold (save_pretrained writes the Hub's
    per-expert one) exports the same logits."""
    hf_dir = hf_model("qwen3_moe")
    fused_experts(hf_dir, tmp_path / "fused")
    ids = prompt_ids(20)
    np.testing.assert_allclose(last_logits(export_small(tmp_path / "fused", tmp_path / "b"),
                                           ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_mixtrals_experts_as_transformers_5_modules_hold_them_export_as_the_hubs(hf_model,
                                                                                tmp_path):
    """Mixtral's Hub layout (block_sparse_moe.experts.{j}.w1/w3/w2, the fixture's) and its
    modules' (mlp.gate, mlp.experts.gate_up_proj [E, 2I, H] gate first, down_proj)."""
    hf_dir = hf_model("mixtral")
    modules = shutil.copytree(hf_dir, tmp_path / "modules")
    tensors = load_file(hf_dir / "model.safetensors")
    for i in range(FAMILIES["mixtral"].get("num_hidden_layers", 2)):
        stem = f"model.layers.{i}."
        moe = {n: tensors.pop(n) for n in list(tensors) if n.startswith(stem + "block_sparse")}
        expert = stem + "block_sparse_moe.experts.{j}.{w}.weight"
        tensors[stem + "mlp.gate.weight"] = moe[stem + "block_sparse_moe.gate.weight"]
        tensors[stem + "mlp.experts.gate_up_proj"] = np.stack([np.concatenate(
            [moe[expert.format(j=j, w="w1")], moe[expert.format(j=j, w="w3")]])
            for j in range(8)])
        tensors[stem + "mlp.experts.down_proj"] = np.stack(
            [moe[expert.format(j=j, w="w2")] for j in range(8)])
    save_file(tensors, modules / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(20)
    np.testing.assert_allclose(last_logits(export_small(modules, tmp_path / "b"), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


def test_experts_stored_transposed_as_on_the_hub_export_as_transformers_loads_them(
        hf_model, tmp_path):
    """Qwen3-VL-MoE's Hub checkpoints store the fused experts [E, H, 2I] and [E, I, H];
    transformers transposes them as it loads (save_pretrained writes the modules' layout,
    the fixture's). Both are one model, and the bundle of either computes it."""
    hf_dir = hf_model("qwen3_vl_moe")
    hub = shutil.copytree(hf_dir, tmp_path / "hub")
    tensors = load_file(hf_dir / "model.safetensors")
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        tensors[name] = np.ascontiguousarray(tensors[name].transpose(0, 2, 1))
    save_file(tensors, hub / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(20)
    expected = reference_logits(hub, ids)[-1]
    np.testing.assert_allclose(expected, reference_logits(hf_dir, ids)[-1], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(last_logits(export_small(hub, tmp_path / "b"), ids), expected,
                               rtol=1e-4, atol=1e-4)


def test_a_checkpoint_missing_an_expert_is_refused_in_one_line(hf_model, tmp_path):
    from edgeprefill.errors import ExportError

    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_model("olmoe"), hf_dir)
    tensors = load_file(hf_dir / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, hf_dir / "model.safetensors")
    with pytest.raises(ExportError, match="experts.5.gate_proj.weight") as err:
        export_small(hf_dir, tmp_path / "b")
    assert "\n" not in str(err.value)


def test_inspect_says_the_experts_and_top_k(bundle):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    result = CliRunner().invoke(cli, ["inspect", str(bundle("qwen3_moe"))])
    assert result.exit_code == 0, result.output
    assert "mixture of experts: 8 experts of width 32, top 2 per token (softmax routing), " \
        "on 2 of 3 layers" in result.output


# Shaped as the Hub's config.json files (their routing keys, shapes and defaults).
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "attention_bias": False, "bos_token_id": 151643, "decoder_sparse_step": 1,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 151936,
}
OLMOE_1B_7B = {
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "clip_qkv": None,
    "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 1024, "max_position_embeddings": 4096, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
    "num_hidden_layers": 16, "num_key_value_heads": 16, "pad_token_id": 1,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "vocab_size": 50304,
}
GRANITE_3B_A800M = {
    "architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe",
    "attention_multiplier": 0.015625, "bos_token_id": 0, "embedding_multiplier": 12.0,
    "eos_token_id": 0, "hidden_size": 1536, "intermediate_size": 512,
    "logits_scaling": 6.0, "max_position_embeddings": 4096, "num_attention_heads": 24,
    "num_experts_per_tok": 8, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 40, "residual_multiplier": 0.22, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "tie_word_embeddings": True, "vocab_size": 49155,
}
LFM2_8B_A1B = {
    "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "conv_L_cache": 3,
    "hidden_size": 2048, "intermediate_size": 7168, "moe_intermediate_size": 1792,
    "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "conv",
                    "full_attention", "conv", "conv", "conv", "full_attention", "conv",
                    "conv", "conv", "full_attention", "conv", "conv", "conv", "full_attention",
                    "conv", "conv", "full_attention", "conv", "conv"],
    "max_position_embeddings": 128000, "norm_eps": 1e-05, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_dense_layers": 2, "num_experts": 32,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "rope_theta": 1000000.0, "routed_scaling_factor": 1.0, "use_expert_bias": True,
    "vocab_size": 65536, "tie_embedding": True,
}
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
    "decoder_sparse_step": 1, "hidden_size": 2048, "intermediate_size": 5632,
    "max_position_embeddings": 8192, "max_window_layers": 21, "moe_intermediate_size": 1408,
    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768, "tie_word_embeddings": False, "use_sliding_window": False,
    "vocab_size": 151936,
}
# Qwen3_5MoeTextConfig's defaults, which its docstring gives as Qwen3.5-35B-A3B's
QWEN3_5_35B_A3B = {
    "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048,
    "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 8, "num_experts": 256, "full_attention_interval": 4,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "vocab_size": 32000,
}
# ERNIE-4.5-21B-A3B's routing keys (Ernie4_5_MoeConfig's defaults name that model)
ERNIE_21B_A3B = {
    "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe",
    "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 28,
    "num_attention_heads": 20, "num_key_value_heads": 4, "vocab_size": 103424,
    "moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536,
    "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_interval": 1,
    "tie_word_embeddings": True, "use_bias": False,
}
# Qwen3NextConfig's defaults, which its docstring gives as Qwen3-Next-80B-A3B's
QWEN3_NEXT_80B_A3B = {
    "model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 5632, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "decoder_sparse_step": 1, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10, "num_experts": 512,
    "norm_topk_prob": True, "mlp_only_layers": [],
}
GLM_45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5,
    "intermediate_size": 10944, "max_position_embeddings": 131072,
    "moe_intermediate_size": 1408, "norm_topk_prob": True, "num_attention_heads": 96,
    "n_group": 1, "topk_group": 1, "n_routed_experts": 128, "n_shared_experts": 1,
    "routed_scaling_factor": 1.0, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
    "num_hidden_layers": 46, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "use_qk_norm": False, "vocab_size": 151552,
}
# dots.llm1's routing keys (its configs hold n_group and topk_group null, which
# transformers' router cannot run; export reads them as 1)
DOTS_LLM1 = {
    "architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "hidden_size": 4096,
    "num_hidden_layers": 62, "intermediate_size": 10944, "num_attention_heads": 32,
    "num_key_value_heads": 32, "rms_norm_eps": 1e-05, "vocab_size": 152064,
    "first_k_dense_replace": 1, "moe_intermediate_size": 1408, "n_routed_experts": 128,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "max_position_embeddings": 32768, "rope_theta": 10000000,
    "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1,
}
# The config classes' defaults, which their docstrings give as K-EXAONE-236B-A23B's,
# Solar-Open-100B's and Kolibri-1's
EXAONE_MOE = {"model_type": "exaone_moe", "vocab_size": 102400, "hidden_size": 4096,
              "intermediate_size": 16384, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 32}
SOLAR_OPEN_100B = {"model_type": "solar_open", "vocab_size": 196608, "hidden_size": 4096,
                   "num_hidden_layers": 48, "num_attention_heads": 64,
                   "num_key_value_heads": 8}
KOLIBRI_1 = {"model_type": "kolibri1", "vocab_size": 128000, "hidden_size": 2560,
             "num_hidden_layers": 50, "num_attention_heads": 48, "num_key_value_heads": 4}
HUB_CONFIGS = [QWEN3_30B_A3B, OLMOE_1B_7B, GRANITE_3B_A800M, LFM2_8B_A1B, QWEN15_MOE_A27B,
               QWEN3_5_35B_A3B, MIXTRAL_8X7B, ERNIE_21B_A3B, QWEN3_NEXT_80B_A3B, GLM_45_AIR,
               DOTS_LLM1, EXAONE_MOE, SOLAR_OPEN_100B, KOLIBRI_1]


def weights_sum_to_one(router: torch.nn.Module, config) -> bool:
    """Whether a router of `router`'s class, built on the CPU with random weights, gives
    each token top-k weights that sum to 1 (renormalized, or softmax over the top k)."""
    real = type(router)(config)
    torch.manual_seed(0)
    with torch.no_grad():
        real.weight.normal_(std=config.hidden_size ** -0.5)  # logits of unit size
        bias = (torch.zeros(real.num_experts),) if getattr(real, "use_expert_bias", 0) else ()
        _, weights, _ = real(torch.randn(6, config.hidden_size), *bias)  # LFM2-MoE's bias
    total = weights.sum(-1) / getattr(real, "routed_scaling_factor", 1.0)
    return bool(torch.allclose(total, torch.ones(6), atol=1e-5))


def hf_moe_model_shapes(raw: dict) -> tuple:
    """What transformers' model of `raw` has: experts, top-k, expert width, the layers
    with experts, the shared expert's width, the routed scaling, whether the top-k weights
    sum to 1 (before the scaling), the expert bias and the groups and groups kept (read
    off one layer's modules, built on the meta device; the router's weights run on the
    CPU)."""
    import transformers

    config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    moe_layers, block = [], None
    for i, layer in enumerate(model.model.layers):
        mlp = getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None) or \
            layer.feed_forward
        if hasattr(mlp, "experts"):
            moe_layers.append(i)
            block = mlp
    assert block is not None
    router = next(m for m in block.modules() if is_router(m))
    experts = block.experts
    shared = getattr(block, "shared_expert", None) or getattr(block, "shared_experts", None)
    return (experts.num_experts, router.top_k, experts.intermediate_dim, moe_layers,
            shared.intermediate_size if shared is not None else 0,
            float(getattr(router, "routed_scaling_factor", 1.0)),
            weights_sum_to_one(router, model.config),
            hasattr(block, "expert_bias") or hasattr(router, "moe_statics")  # LFM2, ERNIE
            or hasattr(router, "e_score_correction_bias"),  # DeepSeek-V3's
            getattr(router, "num_group", 1), getattr(router, "topk_group", 1))


@pytest.mark.parametrize("raw", HUB_CONFIGS, ids=lambda raw: raw["model_type"])
def test_a_hub_config_reads_as_transformers_builds_its_experts(raw):
    moe = ModelConfig.from_hf(raw).moe
    assert moe is not None
    sums_to_one = moe.norm_topk or moe.routing == "topk_softmax"
    assert (moe.experts, moe.top_k, moe.width, list(moe.layers), moe.shared_width,
            moe.scaling, sums_to_one, moe.expert_bias, moe.groups,
            moe.top_groups) == hf_moe_model_shapes(raw)


@pytest.mark.parametrize("raw", [LFM2_8B_A1B, GLM_45_AIR, DOTS_LLM1],
                         ids=lambda raw: raw["model_type"])
def test_a_routed_scaling_factor_of_0_reads_as_transformers_multiplies_by_it(raw):
    """0 zeroes the routed experts' output, as each router multiplies its weights by it (a
    `value or 1.0` had read it as 1)."""
    raw = {**raw, "routed_scaling_factor": 0.0}
    moe = ModelConfig.from_hf(raw).moe
    assert moe is not None and moe.scaling == hf_moe_model_shapes(raw)[5] == 0.0


@pytest.mark.parametrize("keys, message", [
    ({"scoring_func": "softmax"}, "scoring_func 'softmax' is not supported"),
    ({"topk_method": "group_limited_greedy"}, "topk_method 'group_limited_greedy' is not"),
    ({"n_group": 5}, r"n_group \(5\) must divide the 128 experts"),
    ({"n_group": 128, "topk_group": 64}, "fewer than 2 of the 128 experts per group"),
    ({"n_group": 8, "topk_group": 9}, r"topk_group \(9\) must be 1 to n_group \(8\)"),
    ({"n_group": 64, "topk_group": 2}, r"hold num_experts_per_tok \(8\) experts"),
])
def test_a_deepseek_routing_export_cannot_compute_is_refused_in_one_line(keys, message):
    from edgeprefill.errors import ExportError

    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf({**GLM_45_AIR, **keys})
    assert "\n" not in str(err.value)


def test_null_groups_read_as_one_group():
    """dots.llm1's configs hold n_group and topk_group null: every expert one group."""
    moe = ModelConfig.from_hf({**DOTS_LLM1, "n_group": None, "topk_group": None}).moe
    assert moe is not None and (moe.groups, moe.top_groups, moe.grouped) == (1, 1, False)


class ShapesOnly:
    """A checkpoint of the tensors transformers' model of a config has, shapes only: the
    graph of a Hub-sized model builds without its weights (none is read)."""

    def __init__(self, raw: dict) -> None:
        import transformers

        config = transformers.AutoConfig.for_model(**raw)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        self.shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        self.fp8 = None
        self.adapter = None  # no LoRA adapter merged (export/lora.py)

    def has(self, name: str) -> bool:
        return name in self.shapes

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def is_int4(self, name: str) -> bool:
        return False  # a float checkpoint's


def built_graph(raw: dict, flavor: str, quant: QuantConfig | None = None):
    from edgeprefill.export.decoder import DecoderBuilder
    from edgeprefill.export.flavors import flavor_class

    cfg = ModelConfig.from_hf(raw)
    builder = DecoderBuilder(cfg, ShapesOnly(raw), flavor_class(flavor)(cfg, np.float32, 4096),
                             quant)  # type: ignore[arg-type]
    return cfg, builder.build()


def test_a_hub_sized_graph_unrolls_one_projection_pair_per_expert_in_the_standard_flavour():
    """OLMoE-1B-7B's graph without its weights: 16 layers x 64 experts, each a gate/up and
    a down MatMul, read expert by expert from the fused layout transformers' modules hold;
    one ScatterND per layer combines them (Qwen3-30B-A3B's 48 x 128 take 16 s to build)."""
    cfg, g = built_graph(OLMOE_1B_7B, "standard")
    experts = {w.name for w in g.weights if ".experts." in w.name}
    assert cfg.moe is not None and len(experts) == 2 * cfg.num_layers * cfg.moe.experts
    assert sum(n.op_type == "ScatterND" for n in g.nodes) == cfg.num_layers
    assert json.dumps(model_quirks(cfg))  # the manifest's quirks serialize


@pytest.mark.parametrize("quant, op", [(None, "MoE"), (QuantConfig("int4"), "QMoE"),
                                       (QuantConfig("int8"), "QMoE")])
def test_the_ort_flavour_runs_a_hub_sized_mixture_as_one_op_per_layer(quant, op):
    cfg, g = built_graph(QWEN3_30B_A3B, "ort", quant)
    assert sum(n.op_type == op for n in g.nodes) == cfg.num_layers == 48
    assert not any(n.op_type == "ScatterND" for n in g.nodes)
    assert len(g.nodes) < 40 * cfg.num_layers  # not a dozen nodes per expert


@pytest.mark.parametrize("family, flavor, quant, op", [
    ("qwen3_moe", "ort", None, "MoE"), ("granitemoe", "ort", "int4", "QMoE"),
    ("qwen2_moe", "ort", None, "MoE"), ("lfm2_moe", "ort", "int4", "QMoE"),
    ("qwen3_5_moe_text", "ort", "int4", "QMoE"), ("glm4_moe", "ort", "int4", "QMoE"),
    # int8 at 8 bits, one scale per row; the standard flavour is stock ops only
    ("qwen3_moe", "ort", "int8", "QMoE"), ("lfm2_moe", "standard", None, "ScatterND"),
    # Llama 4's input-scaled experts: the op for one expert per token, unrolled for two
    ("llama4_text", "ort", None, "MoE"), ("llama4_text", "ort", "int4", "QMoE"),
    ("llama4", "ort", None, "ScatterND"),
    # ZAYA's skip expert: its rows weigh the op's output 0 (test_longcat: identity experts)
    ("zaya", "ort", None, "MoE"), ("zaya", "ort", "int4", "QMoE"),
    # Inkling's routed experts (its shared ones, weighed by the same softmax, beside the op)
    ("inkling_text", "ort", None, "MoE"),
])
def test_each_bundle_gets_the_op_or_the_unrolled_experts(family, flavor, quant, op, hf_model):
    from edgeprefill.export.checkpoint import Checkpoint
    from edgeprefill.export.decoder import DecoderBuilder
    from edgeprefill.export.flavors import flavor_class

    cfg = ModelConfig.from_dir(hf_model(family))
    g = DecoderBuilder(cfg, Checkpoint(hf_model(family), cfg.spec.renames, cfg.spec.left_out),
                       flavor_class(flavor)(cfg, np.float32, 128),
                       QuantConfig(quant) if quant else None).build()
    assert sum(n.op_type == op for n in g.nodes) == len(cfg.moe.layers)


@pytest.mark.parametrize("flavor, quant, warned", [
    ("ort", QuantConfig("int4", 64), True), ("ort", None, False),
    ("ort", QuantConfig("int4"), False), ("ort", QuantConfig("int8"), False),
    ("standard", None, False),  # stock ops by design: nothing to warn of
])
def test_an_ort_bundle_whose_experts_miss_the_op_says_so_and_why(flavor, quant, warned,
                                                                 hf_model, caplog):
    from edgeprefill.export.checkpoint import Checkpoint
    from edgeprefill.export.decoder import DecoderBuilder
    from edgeprefill.export.flavors import flavor_class

    hf_dir = hf_model("qwen3_moe")
    cfg = ModelConfig.from_dir(hf_dir)
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        DecoderBuilder(cfg, Checkpoint(hf_dir), flavor_class(flavor)(cfg, np.float32, 128),
                       quant).build()
    messages = [r.getMessage() for r in caplog.records if "experts per layer" in r.getMessage()]
    assert messages == (["the 8 experts per layer are written out one by one, not as ONNX "
                         "Runtime's MoE op: hidden 64 and expert width 32 are not multiples of "
                         "the int4 block size 64; decode runs several times slower than an "
                         "fp32, int8 or int4 `ort` bundle"] if warned else [])


# tencent/Hunyuan-A13B-Instruct's config.json (its keys transformers' model reads): top 8 of
# 64 experts as wide as intermediate_size on every layer, moe_topk given per layer
HUNYUAN_A13B = {"model_type": "hunyuan_v1_moe", "vocab_size": 128167, "hidden_size": 4096,
                "intermediate_size": 3072, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "num_experts": 64, "moe_topk": [8] * 32, "attention_bias": False,
                "max_position_embeddings": 32768, "rope_theta": 10000.0,
                "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}}


def test_hunyuans_per_layer_top_k_reads_as_its_one_value_and_several_are_refused():
    moe = ModelConfig.from_hf(HUNYUAN_A13B).moe
    assert (moe.experts, moe.top_k, moe.width, moe.shared_width, moe.layers, moe.norm_topk) \
        == (64, 8, 3072, 3072, tuple(range(32)), True)
    with pytest.raises(ExportError, match=r"^hunyuan_v1_moe: num_experts_per_tok per layer "
                                          r"\(\[8, 4\]\) is not supported; export takes one "
                                          r"value$"):
        ModelConfig.from_hf({**HUNYUAN_A13B, "num_hidden_layers": 2, "moe_topk": [8, 4]})


def test_dbrxs_top_k_weights_over_another_norm_than_their_sum_are_refused_in_one_line():
    raw = {"model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2,
           "ffn_config": {"moe_num_experts": 8, "moe_top_k": 2,
                          "moe_normalize_expert_weights": 2.0}}
    with pytest.raises(ExportError, match=r"^dbrx: moe_normalize_expert_weights 2.0 \(the "
                                          r"top-k weights over their 2.0-norm\) is not "
                                          r"supported; export divides them by their sum "
                                          r"\(1\)$"):
        ModelConfig.from_hf(raw)
    raw["ffn_config"]["moe_normalize_expert_weights"] = None  # not renormalized at all
    assert not ModelConfig.from_hf(raw).moe.norm_topk


def test_minimax_m2s_correction_bias_changes_the_experts_transformers_chooses(hf_model):
    """What makes the logits tests check MiniMax-M2's biased choice: without the bias
    transformers' routers choose other experts for some tokens."""
    model = load_hf_model(hf_model("minimax_m2"))
    ids = torch.tensor([prompt_ids(40)])

    def chosen() -> np.ndarray:
        picked: list[np.ndarray] = []
        hooks = [r.register_forward_hook(lambda m, i, out: picked.append(out[2].numpy()))
                 for r in routers(model)]
        with torch.no_grad():
            model(ids)
        for hook in hooks:
            hook.remove()
        return np.sort(np.concatenate(picked), axis=-1)

    routed = chosen()
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.zero_()
    assert (chosen() != routed).any()
