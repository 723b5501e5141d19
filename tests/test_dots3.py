"""dots.3 Note's language model (families/dots3.py, export/layer_latents.py): GLM-5's
DeepSeek sparse attention on its indexed layers beside sliding layers of latent sizes and
heads of their own, without an indexer, each head's output gated, the latents scaled and
the key part normed. Its conftest fixture (index_topk past the bundles' context) runs in
the generic suites; here, with index_topk 8 (the selection bites from the ninth key on)
and a window of 5: chunks of 1, 3 and 16 and a padded chunk in both flavours, int4, the
cache each layer holds, Hub configs as transformers reads them (written by its config
class, and in the released checkpoints' keys), dots3_note's released layout (flat
config.json, towers beside), and what export refuses. dots3_note as transformers saves it
(text_config, model.language_model.) runs in the generic suites."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.model_quirks import model_quirks
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, IMAGE_TEXT, build_hf_model, load_hf_model
from tests.flavour_bundles import check_chunks_against, hf_logits
from tests.test_exactness import FLAVORS, prompt_ids
from tests.test_mla import dequantized_int4_but_kv_b
from tests.test_openelm import check_chunks_and_padding, run_chunks

TOPK = 8
# Dots3NoteTextConfig's keys as the released checkpoints carry them (the sliding layers'
# sizes as swa_* keys, layer_types and the MoE schedule derived), a smaller shape
RELEASED = {"model_type": "dots3_note_text", "num_hidden_layers": 10, "hidden_size": 512,
            "num_attention_heads": 16, "num_key_value_heads": 16, "swa_num_attention_heads": 8,
            "swa_num_key_value_heads": 8, "swa_q_lora_rank": 256, "swa_kv_lora_rank": 128,
            "swa_head_dim": 96, "swa_qk_nope_head_dim": 64, "swa_v_head_dim": 64,
            "first_k_dense_replace": 2, "moe_shared_expert_intermediate_size": 256,
            "sliding_window_size": 1024, "swa_rope_theta": 10000.0, "rope_theta": 1e6}


@pytest.fixture(scope="module")
def dots(tmp_path_factory) -> Path:
    return build_hf_model("dots3_note_text", tmp_path_factory.mktemp("dots3-k8"),
                          index_topk=TOPK)


@pytest.fixture(scope="module")
def dots_bundle(dots, tmp_path_factory):
    made: dict[str, Path] = {}

    def get(flavor: str) -> Path:
        if flavor not in made:
            out = tmp_path_factory.mktemp(f"dots3-k8-{flavor}")
            export(dots, out, ExportOptions(flavor=flavor, chunks=(16,), max_context=128,
                                            show_progress=False))
            made[flavor] = out
        return made[flavor]

    return get


@pytest.mark.parametrize("flavor", FLAVORS)
def test_indexed_and_sliding_layers_chunked_decoded_and_padded_as_transformers(
        flavor, dots, dots_bundle):
    """A 40-token prompt (five times the keys an indexed query keeps, eight windows) in
    chunks of 1, 3 and 16 and a padded chunk: each chunk's last logits are
    transformers'."""
    ids = prompt_ids(40)
    check_chunks_and_padding(dots_bundle(flavor), ids, hf_logits(load_hf_model(dots), ids))


def test_the_selection_and_the_window_change_transformers_logits(dots):
    """What the test above checks is there to check: keeping 8 keys (against every key)
    and the sliding layers' window of 5 (against one past the prompt) each move
    transformers' own logits at the prompt's last token."""
    ids = prompt_ids(40)
    model = load_hf_model(dots)
    base = hf_logits(model, ids)[-1]
    indexers = [layer.self_attn.indexer for layer in model.model.layers
                if layer.self_attn.indexer is not None]
    assert len(indexers) == 2
    for indexer in indexers:
        indexer.index_topk = 2048
    assert np.abs(hf_logits(model, ids)[-1] - base).max() > 0.05
    for indexer in indexers:
        indexer.index_topk = TOPK
    model.config.sliding_window = 64
    assert np.abs(hf_logits(model, ids)[-1] - base).max() > 0.05


def test_each_layer_caches_its_own_latent_head(dots):
    """The indexed layers cache [k_pe 32 | latent 32 | index key 32] of their 4 heads, the
    sliding ones [k_pe 16 | latent 16] of their 2; what inspect shows says so."""
    cfg = ModelConfig.from_dir(dots).for_context(128)
    assert [cfg.layer_head_dim(i) for i in range(4)] == [96, 32, 96, 32]
    assert [cfg.layer_heads(i) for i in range(4)] == [4, 2, 4, 2]
    assert cfg.sparse_index is not None and cfg.sparse_index.plain == (1, 3)
    assert "KV cache: one head of 96 per token and layer (rotated key part 32 + latent 32 + " \
        "index key 32); dots.3's sliding layers one of 32 (16 + latent 16)" in model_quirks(cfg)


def test_int4_computes_transformers_forward_with_dequantized_weights(dots, tmp_path):
    """Every projection quantized by blocks but kv_b_proj, the routers and the indexer:
    the bundle computes what transformers does with the others dequantized."""
    export(dots, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", accuracy_level=0)))
    model = load_hf_model(dots)
    dequantized_int4_but_kv_b(model, keep=("indexer",))
    check_chunks_against(tmp_path / "b", model, prompt_ids(40))


def _hub(raw: dict) -> dict:
    """config.json as transformers writes it for `raw` (its config class, no Hub)."""
    return json.loads(transformers.AutoConfig.for_model(**raw).to_json_string())


@pytest.mark.parametrize("raw", ({"model_type": "dots3_note_text"}, RELEASED),
                         ids=("defaults", "released-keys"))
@pytest.mark.parametrize("saved", (False, True), ids=("as-given", "as-saved"))
def test_a_hub_config_reads_as_transformers_builds_the_model(raw, saved):
    """Dots3NoteTextConfig's defaults (dots.3 Note's shape) and a config in the released
    checkpoints' keys, as given and as transformers saves them: each layer's heads, latent
    sizes, LoRA scales, norms, scale, rope base and rotated width, window and indexer, and
    the experts' layers, as transformers builds its modules."""
    ours = ModelConfig.from_hf(_hub(raw) if saved else raw)
    config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).model
    assert ours.latent is not None and ours.sparse_index is not None
    for i, layer in enumerate(model.layers):
        attn, mine = layer.self_attn, ours.layers[i]
        shape = mine.latent or ours.latent
        assert (ours.layer_heads(i), shape.q_lora_rank, shape.kv_lora_rank, shape.nope_dim,
                shape.rope_dim, shape.v_dim) == (
            attn.num_heads, attn.q_lora_rank, attn.kv_lora_rank, attn.qk_nope_head_dim,
            attn.qk_rope_head_dim, attn.v_head_dim)
        assert shape.q_scale == pytest.approx(attn.q_lora_scale)
        assert shape.latent_scale == pytest.approx(attn.kv_lora_scale)
        assert shape.rope_norm and shape.norm_eps == attn.kv_a_layernorm.variance_epsilon \
            == attn.q_a_layernorm.variance_epsilon \
            == attn.k_rope_only_layernorm.variance_epsilon
        assert ours.attn_scale * mine.scale == pytest.approx(attn.scaling)
        assert mine.window == attn.sliding_window
        assert (attn.indexer is None) == (i in ours.sparse_index.plain)
        kind = config.layer_types[i]
        inv_freq = getattr(model.rotary_emb, f"{kind}_inv_freq")
        rope = ours.ropes[mine.rope or GLOBAL]
        assert (rope.rotary_dim, rope.theta) == (
            2 * inv_freq.shape[0], config.rope_parameters[kind]["rope_theta"])
    assert ours.moe is not None and ours.moe.layers == tuple(
        i for i, layer in enumerate(model.layers) if hasattr(layer.mlp, "experts"))
    shared = next(layer.mlp.shared_experts for layer in model.layers
                  if hasattr(layer.mlp, "experts"))
    assert ours.moe.shared_width == shared.intermediate_size
    assert (ours.moe.groups, ours.moe.top_groups) == (config.n_group, config.topk_group)
    assert LOCAL in {layer.rope for layer in ours.layers}


@pytest.mark.parametrize("keys, message", (
    ({"use_dsa": False}, "full_attention layers (latent attention without the indexer, "
                         "use_dsa false) are not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                          "original_max_position_embeddings": 4096}},
     "rope_type 'yarn' (indexed_attention) is not supported; supported: default"),
    ({"per_layer_config": {"0": {"kv_lora_rank": 16}}},
     "per_layer_config names layer 0, which is not a sliding_attention layer"),
    ({"q_lora_rank": None}, "q_lora_rank null (a dense query) is not supported"),
))
def test_what_export_does_not_compute_is_refused_in_one_line(keys, message):
    raw = {"model_type": "dots3_note_text", **FAMILIES["dots3_note_text"], "hidden_size": 64,
           "vocab_size": 128, **keys}
    with pytest.raises(ExportError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig.from_hf(raw)


def test_a_released_checkpoint_flat_beside_its_towers_computes_its_language_model(
        dots, tmp_path):
    """dots3_note as its released checkpoints store it: config.json flat (the text keys at
    the top, no text_config, as Dots3NoteConfig reads them), the language model under
    model. and the towers' tensors at the top (vision_encoder., audio_encoder.): the
    bundle computes the language model's logits, and transformers reads the same text
    config from it."""
    text = json.loads((dots / "config.json").read_text())
    hf = tmp_path / "released"
    hf.mkdir()
    for f in dots.iterdir():  # the tokenizer's files
        if f.name not in ("model.safetensors", "config.json"):
            (hf / f.name).write_bytes(f.read_bytes())
    stored = load_file(dots / "model.safetensors")
    stored["vision_encoder.blocks.0.attn.qkv.weight"] = torch.ones(6, 4)
    stored["audio_encoder.audio_adapter.fc1.weight"] = torch.ones(4, 4)
    save_file(stored, hf / "model.safetensors")
    flat = {**{k: v for k, v in text.items() if k != "architectures"},
            "model_type": "dots3_note", "architectures": ["Dots3NoteForConditionalGeneration"],
            **IMAGE_TEXT["dots3_note"]}  # (the towers' configs: their adapters fit hidden)
    (hf / "config.json").write_text(json.dumps(flat))
    inner = transformers.AutoConfig.from_pretrained(hf).text_config
    assert (inner.layer_types, inner.per_layer_config[1].kv_lora_rank, inner.index_topk) == (
        text["layer_types"], text["per_layer_config"]["1"]["kv_lora_rank"], TOPK)
    export(hf, tmp_path / "b", ExportOptions(flavor="standard", chunks=(16,), max_context=64,
                                             show_progress=False))
    ids = prompt_ids(40)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 16)
    engine.close()
    np.testing.assert_allclose(np.stack(got), hf_logits(load_hf_model(dots), ids)[[15, 31, 39]],
                               rtol=1e-4, atol=1e-4)
