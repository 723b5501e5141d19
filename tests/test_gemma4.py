"""Gemma 4 (bare `gemma4_text`, and the Hub's image-text `gemma4`): per-layer inputs,
full-attention layers with heads of their own size under a proportional rope, the last
layers reading an earlier layer's KV, k = v. The fixtures (conftest.GEMMA4: six layers
alternating sliding and full, the last two sharing KV) run in the generic suites too
(test_exactness: chunks of 100, 16 and 7 in both flavours; its greedy output under slow,
the default suite checking greedy text here)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from edgeprefill.bundle import MANIFEST_FILE, GraphInfo, Manifest, ModelInfo, TokenizerInfo
from edgeprefill.contract import check_graph_io, kv_names
from edgeprefill.engines.base import kv_slot_bytes
from edgeprefill.errors import BackendError, BundleError, ExportError
from edgeprefill.export.decoder import DecoderBuilder
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.flavors import flavor_class
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.kernels.build import library_path
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import GEMMA4, build_hf_model, load_hf_model
from tests.state_models import assert_padded_chunks_match, run_padded, variant_bundles
from tests.test_exactness import check_together, prompt_ids, reference_logits
from tests.test_families import last_logits
from tests.test_quantize import dequantize_embeddings, dequantize_linears

FLAVORS = ("ort", "standard")
# Shaped as google/gemma-4-E2B-it's config.json (its text_config; the vision and audio
# towers left out): 35 layers, four sliding to one full, the last 20 sharing KV.
HUB_E2B = {
    "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
    "tie_word_embeddings": True,
    "text_config": {
        "model_type": "gemma4_text", "attention_bias": False, "attention_k_eq_v": False,
        "enable_moe_block": False, "final_logit_softcapping": 30.0, "global_head_dim": 512,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1536,
        "hidden_size_per_layer_input": 256, "intermediate_size": 6144,
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
        "max_position_embeddings": 131072, "num_attention_heads": 8,
        "num_global_key_value_heads": None, "num_hidden_layers": 35,
        "num_key_value_heads": 1, "num_kv_shared_layers": 20, "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "sliding_window": 512, "use_double_wide_mlp": True, "vocab_size": 262144,
        "vocab_size_per_layer_input": 262144, "bos_token_id": 2, "eos_token_id": 1,
    },
}


def hub_text_config() -> transformers.Gemma4TextConfig:
    return transformers.Gemma4Config.from_dict(HUB_E2B).get_text_config()


def assert_windows_and_kv_sharing_as_transformers(ours: ModelConfig, hf, window: int) -> None:
    """Gemma 4's and Gemma 3n's sliding layers, and their KV sharing: in transformers a
    "reuse" layer reads what the last "store" layer of its type stored."""
    assert [layer.window for layer in ours.layers] == [
        window if kind == "sliding_attention" else None for kind in hf.layer_types]
    modes = hf.kv_sharing_modes
    stores = {hf.layer_types[i]: i for i, mode in enumerate(modes) if mode == "store"}
    assert ours.shared_kv == {i: stores[hf.layer_types[i]] for i, mode in enumerate(modes)
                              if mode == "reuse"}


def test_the_hub_e2b_config_reads_as_transformers_reads_it():
    ours, hf = ModelConfig.from_hf(HUB_E2B), hub_text_config()
    assert [layer.head_dim or ours.head_dim for layer in ours.layers] == [
        hf.per_layer_config[i].head_dim for i in range(35)]
    assert [ours.layer_kv_heads(i) for i in range(35)] == [
        hf.per_layer_config[i].num_key_value_heads for i in range(35)]
    assert_windows_and_kv_sharing_as_transformers(ours, hf, 512)
    assert ours.kv_layers == tuple(range(15))
    assert (ours.per_layer_input, ours.per_layer_vocab) == (256, 262144)
    assert ours.final_softcap == 30.0 and ours.attn_scale == 1.0
    assert ours.tie_embeddings and ours.eos_token_ids == (1,)
    full, local = ours.ropes[GLOBAL], ours.ropes[LOCAL]
    assert (full.kind, full.theta, full.rotary_dim, full.proportion) == (
        "proportional", 1e6, 512, 0.25)
    assert (local.kind, local.theta, local.rotary_dim) == ("default", 1e4, 256)


def test_proportional_frequencies_are_transformers():
    """The whole head's pairs: the first quarter at the head's default frequencies, the
    rest at 0 (transformers' _compute_proportional_rope_parameters)."""
    hf = hub_text_config()
    expected, _ = ROPE_INIT_FUNCTIONS["proportional"](hf, layer_type="full_attention")
    got = ModelConfig.from_hf(HUB_E2B).ropes[GLOBAL].inv_freq()
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-6)  # float32 pow: an ulp
    assert not got[64:].any() and got[:64].all()


class ShapeCheckpoint:
    """A checkpoint of shapes only (a meta-device model's): enough to build a graph."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        self.adapter = None  # no LoRA adapter merged (export/lora.py)

    def has(self, name: str) -> bool:
        return name in self.shapes

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]


def meta_graph(cfg: ModelConfig, model_class, hf_config, flavor: str):
    """The graph export builds for `cfg` from a meta-device model's shapes (no weights: a
    Hub-sized model in seconds), and its inputs' shapes by name."""
    with torch.device("meta"):
        model = model_class(hf_config)
    g = DecoderBuilder(cfg, ShapeCheckpoint(model), flavor_class(flavor)(
        cfg, np.dtype(np.float32), 4096)).build()
    return g, {v.name: list(v.shape) for v in g.inputs}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_the_hub_e2b_shaped_graph_holds_kv_for_its_first_15_layers_and_its_manifest_checks(
        flavor):
    cfg = ModelConfig.from_hf(HUB_E2B)
    g, inputs = meta_graph(cfg, transformers.Gemma4ForCausalLM, hub_text_config(), flavor)
    assert [n for n in inputs if n.startswith("past_key.")] == [
        f"past_key.{i}" for i in range(15)]
    assert inputs["past_key.13"] == ["batch", 1, "capacity", 256]  # sliding
    assert inputs["past_value.14"] == ["batch", 1, "capacity", 512]  # full
    layers = [kv_names(i) for i in cfg.kv_layers]
    manifest = Manifest(
        model=ModelInfo(
            family="gemma4", num_layers=35, num_heads=8, num_kv_heads=1, head_dim=256,
            hidden_size=1536, vocab_size=262144, shared_kv_layers=list(range(15, 35)),
            layer_kv={str(i): [1, 512] for i in (4, 9, 14)}),
        graph=GraphInfo(
            file="model.onnx", data_file="model.onnx.data", flavor=flavor, dtype="float32",
            opsets={}, inputs={v.name: [v.dtype.name, list(v.shape)] for v in g.inputs},
            outputs={v.name: [v.dtype.name, list(v.shape)] for v in g.outputs},
            kv_inputs=[[n.past_key, n.past_value] for n in layers],
            kv_outputs=[[n.present_key, n.present_value] for n in layers]),
        tokenizer=TokenizerInfo(None, None, None, None), chunks=[16], max_context=4096,
        eos_token_ids=[1], bos_token_id=2)
    again = Manifest.from_dict(json.loads(manifest.to_json()))
    check_graph_io(again)
    # 12 sliding layers of one 256-wide KV head, 3 full of one 512-wide, K and V, fp32
    assert kv_slot_bytes(again.model, 4096, np.float32) == 2 * (12 * 256 + 3 * 512) * 4096 * 4


@pytest.fixture(scope="module")
def gemma4(bundle, hf_model):
    return lambda flavor: (hf_model("gemma4_text"), bundle("gemma4_text", flavor))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_chunks_of_1_3_and_16_the_last_padded_match_transformers_across_the_window(
        gemma4, flavor):
    """Window 8: every chunking crosses it; the producer layers' caches that the shared
    layers read hold the padding of the padded chunk, which must stay masked."""
    assert_padded_chunks_match(*gemma4(flavor), chunks=(1, 3, 16))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_the_kv_shared_layers_run_on_each_rows_last_token_only(bundle, flavor):
    """Their KV is an earlier layer's: every projection of layers 4 and 5 comes after the
    last-position gather, before which only the KV-writing layers run on every token (the
    logits stay transformers', the tests above)."""
    import onnx

    from edgeprefill.bundle import load_manifest
    from edgeprefill.engines.ort.int4_prefill import after_gather

    path = bundle("gemma4_text", flavor)
    graph = onnx.load(str(path / load_manifest(path).graph.file),
                      load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    one_row = after_gather(graph)
    projections = {i: node.input[1] for i, node in enumerate(graph.node)
                   if node.op_type in ("MatMul", "Gemm") and node.input[1] in weights}
    shared = [i for i, name in projections.items() if name.startswith(("model.layers.4.",
                                                                       "model.layers.5."))]
    assert len(shared) >= 2 * 5  # q, o, gate_up, down, the per-layer input's gate and projection
    assert all(i in one_row for i in shared)
    assert not any(i in one_row for i, name in projections.items()
                   if name.startswith("model.layers.3."))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_different_lengths_decode_together_as_transformers(gemma4, flavor):
    hf_dir, path = gemma4(flavor)
    engine = Engine.load(path, threads=2, background=False, chunk_size=16)
    check_together(engine, hf_dir, 8)
    engine.close()


def test_an_int4_bundle_equals_transformers_with_its_dequantized_weights(gemma4, tmp_path):
    """Every projection (the per-layer inputs' too), the LM head and both embedding tables
    (GatherBlockQuantized) quantized, float
    compute: transformers' logits with the weights the quantizer says they hold."""
    hf_dir, _ = gemma4("ort")
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0)))
    model = load_hf_model(hf_dir)
    with torch.no_grad():
        dequantize_linears(model)
        dequantize_embeddings(model, "int4")  # the main table and the per-layer one
        ids = prompt_ids(30)
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(last_logits(tmp_path / "b", ids), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_bundle_exports_loads_and_generates(gemma4, tmp_path, kind):
    """int4 with its default prefill, whose load puts the layers' projections in one If
    per step (engines/ort/switches.py): the shared layers' step values stay outside it; both
    embedding tables are read quantized (GatherBlockQuantized) through those rewrites."""
    hf_dir, _ = gemma4("ort")
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig(kind)))
    graph = onnx.load(tmp_path / "b" / "model.onnx", load_external_data=False).graph
    tables = [n.input[0] for n in graph.node if n.op_type == "GatherBlockQuantized"]
    assert sorted(tables) == [f"model.embed_tokens.weight.{kind}",
                              f"model.embed_tokens_per_layer.weight.{kind}"]
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = engine.generate(prompt_ids(30), GenerationParams(max_new_tokens=8, ignore_eos=True))
    assert len(got.result().token_ids) == 8
    engine.close()


@pytest.mark.skipif(not library_path().is_file(), reason="native kernels not built")
def test_the_native_kernels_take_a_full_layer_head_size_they_have_no_vector_path_for(
        tmp_path_factory, monkeypatch):
    """Heads of 48 (a multiple of 16 outside the kernels' vector sizes) run their portable
    loops: the same logits as transformers."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", "require")
    hf_dir, path = variant_bundles(tmp_path_factory, "gemma4_text", "g4-head48",
                                   {"global_head_dim": 48})("ort")
    ids = prompt_ids(30)
    expected = reference_logits(hf_dir, ids)
    engine = Engine.load(path, threads=2, background=False)
    assert engine.backend.kernels.described.startswith("native")
    got = run_padded(engine.backend, ids, 16, split=30)
    for position, logits in got.items():
        np.testing.assert_allclose(logits, expected[position], rtol=1e-4, atol=1e-4)
    engine.close()


def test_the_image_text_checkpoint_exports_its_language_model(bundle):
    raw = json.loads((bundle("gemma4") / MANIFEST_FILE).read_text())
    assert raw["model"]["shared_kv_layers"] == [4, 5]
    assert raw["model"]["layer_kv"] == {"1": [1, 32], "3": [1, 32]}  # k = v, one KV head
    assert any("vision tower left out" in q for q in raw["source"]["quirks"])


def test_other_families_manifests_carry_no_gemma4_fields(bundle):
    raw = json.loads((bundle("llama") / MANIFEST_FILE).read_text())
    assert not {"shared_kv_layers", "layer_kv"} & set(raw["model"])


@pytest.mark.parametrize("change, message", [
    ({"layer_kv": {}}, r"past_key\.1 is .* expected"),
    ({"layer_kv": {"1": [3, 32], "3": [2, 32]}}, r"layer_kv\['1'\] must be a layer's"),
    ({"shared_kv_layers": [5]}, "pair per layer with KV .* model.shared_kv_layers"),
    ({"shared_kv_layers": [0, 4, 5]}, "shared_kv_layers .* must be distinct layers after"),
])
def test_a_manifest_whose_layer_kv_disagrees_with_its_graph_is_refused(
        bundle, tmp_path, change, message):
    path = shutil.copytree(bundle("gemma4_text"), tmp_path / "b")
    raw = json.loads((path / MANIFEST_FILE).read_text())
    raw["model"].update(change)
    (path / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=message) as err:
        Engine.load(path, threads=2, background=False)
    assert "\n" not in str(err.value)


def test_tensorrt_refuses_per_layer_kv_shapes_in_one_line(bundle):
    from edgeprefill.engines.trt.build import BuildOptions, prepare_build

    with pytest.raises(BackendError, match="KV caches differ in shape") as err:
        prepare_build(bundle("gemma4_text", "standard"), BuildOptions(precision="fp32"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("change, message", [
    ({"enable_moe_block": True}, "mixture-of-experts block .* not supported"),
    ({"use_bidirectional_attention": "all"}, "not a causal LM"),
    ({"num_kv_shared_layers": 6}, "leaves no layer to hold KV"),
    ({"per_layer_config": {"1": {"intermediate_size": 8}}}, "only head_dim and"),
    ({"rope_parameters": {"full_attention": {"rope_type": "proportional"},
                          "sliding_attention": {"rope_type": "default"}},
      "global_head_dim": 40}, "multiple of 16"),
])
def test_what_export_cannot_honour_is_refused_in_one_line(hf_model, change, message):
    raw = {**json.loads((hf_model("gemma4_text") / "config.json").read_text()), **change}
    if "global_head_dim" in change:
        raw.pop("per_layer_config")
    with pytest.raises(ExportError, match=message) as err:
        cfg = ModelConfig.from_hf(raw)
        flavor_class("ort")(cfg.for_layer(1), np.dtype(np.float32), 128)
    assert "\n" not in str(err.value)


def test_a_vision_only_bidirectional_setting_leaves_text_causal(hf_model):
    raw = json.loads((hf_model("gemma4_text") / "config.json").read_text())
    assert ModelConfig.from_hf({**raw, "use_bidirectional_attention": "vision"}).num_layers == 6


def test_the_fixture_exercises_what_gemma4_adds():
    """Guards the fixture: a change to conftest.GEMMA4 must keep every feature on."""
    hf = build_hf_model.__globals__["hf_config_of"]("gemma4_text", {
        **GEMMA4, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 128})
    assert hf.kv_sharing_modes == [None, None, "store", "store", "reuse", "reuse"]
    assert hf.per_layer_config[1].head_dim == 32 != hf.per_layer_config[0].head_dim
    assert hf.hidden_size_per_layer_input and hf.use_double_wide_mlp
