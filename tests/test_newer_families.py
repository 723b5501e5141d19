"""Causal LMs transformers 5.24 knows that export reads as variants of families it has:
Cohere Compass (Cohere 2's layers with a rope per layer type, null for NoPE; and its
image-text checkpoint), Emu3 (a Llama language model beside a VQ-VAE), GPT-NeoX Japanese
(GPT-NeoX's tensors as pre-norm layers, one output bias on the last layer), GPT-1
(openai-gpt: OPT-350m's post-norm layers, no final norm), CTRL (a fixed sinusoidal
position table beside XGLM's in sinusoids.py, the embedding scaled), GPT-SW3 (GPT-2 under
its own model_type) and Mllama's language model (Llama without the cross-attention layers
text skips). The fixtures (conftest.FAMILIES) also run in the generic suites:
test_exactness compares every chunk's logits with transformers in both flavours,
test_families reads their configs' defaults as transformers. Here: rows of different
lengths in one call, each family's own piece."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgeprefill.bundle import MANIFEST_FILE, load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.errors import ExportError
from edgeprefill.export.layer_attention import LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.sinusoids import ctrl_sinusoids, xglm_sinusoids
from edgeprefill.sdk import Engine
from tests.conftest import COMPASS, build_hf_model
from tests.rope_tables import assert_tables_close
from tests.test_exactness import check_together, prompt_ids, reference_logits

FLAVORS = ("ort", "standard")
NEWER = ("cohere_compass_text", "cohere_compass", "emu3", "gpt_neox_japanese", "openai-gpt",
         "ctrl", "mllama")
# The default suite batches one family per new graph piece; the rest run under slow.
QUICK = ("cohere_compass_text", "gpt_neox_japanese", "openai-gpt", "ctrl", "mllama")
BATCHED = [family if family in QUICK else pytest.param(family, marks=pytest.mark.slow)
           for family in NEWER]


def batched_decode_logits(bundle_dir, sequences: list[list[int]], steps: int) -> list:
    """Each sequence but its last `steps` tokens prefilled alone into its own KV slot (16
    tokens a call), then `steps` decode calls of all rows together, each fed its next
    token; returns the decode calls' logits [rows, vocab]."""
    backend = OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir),
                                 BackendOptions(threads=2))
    backend.allocate_kv(len(sequences), 256)
    for slot, ids in enumerate(sequences):
        for start in range(0, len(ids) - steps, 16):
            part = ids[start:min(start + 16, len(ids) - steps)]
            backend.run(StepBatch(np.array([part], np.int64), np.array([start], np.int32),
                                  np.array([len(part)], np.int32), slot))
    out = []
    for step in range(steps, 0, -1):
        at = [len(ids) - step for ids in sequences]
        tokens = np.array([[ids[i]] for ids, i in zip(sequences, at, strict=True)], np.int64)
        out.append(backend.run(StepBatch(tokens, np.array(at, np.int32),
                                         np.ones(len(sequences), np.int32), 0)).copy())
    return out


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", BATCHED)
def test_rows_of_different_lengths_decoded_in_one_call_give_transformers_logits(
        family, flavor, hf_model, bundle):
    """Two sequences (34 and 23 tokens), their last 4 tokens decoded side by side in one
    call a step: each row's logits are transformers' at its position, at 1e-4."""
    sequences = [prompt_ids(34, seed=3), prompt_ids(23, seed=4)]
    expected = [reference_logits(hf_model(family), ids) for ids in sequences]
    steps = 4
    for step, logits in enumerate(batched_decode_logits(bundle(family, flavor), sequences,
                                                        steps)):
        for row, ids in enumerate(sequences):
            at = len(ids) - steps + step
            np.testing.assert_allclose(logits[row], expected[row][at], rtol=1e-4, atol=1e-4,
                                       err_msg=f"row {row} at {at}")


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", NEWER)
def test_rows_of_different_lengths_decode_together_as_transformers(family, flavor, hf_model,
                                                                   bundle):
    engine = Engine.load(bundle(family, flavor), threads=2, background=False, chunk_size=16)
    check_together(engine, hf_model(family), 8)
    engine.close()


def test_a_null_rope_entry_leaves_its_layer_type_without_rotary():
    """Cohere Compass: the fixture's sliding layer rotates, its full layer (null entry)
    does not, whatever Cohere 2's own rule (full layers NoPE) would say elsewhere."""
    raw = {"model_type": "cohere_compass_text", "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 96,
           "vocab_size": 128, **COMPASS}
    assert [layer.rope for layer in ModelConfig.from_hf(raw).layers] == [LOCAL, None]
    both = {**raw["rope_parameters"], "full_attention": {"rope_type": "default",
                                                         "rope_theta": 500.0}}
    cfg = ModelConfig.from_hf({**raw, "rope_parameters": both})
    assert [layer.rope is not None for layer in cfg.layers] == [True, True]


def test_cohere_compass_without_a_rope_per_layer_type_is_refused_in_one_line():
    raw = {"model_type": "cohere_compass_text", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "vocab_size": 128,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    with pytest.raises(ExportError, match=r"^cohere_compass_text: config.json needs "
                                          r"rope_parameters per layer type \(full_attention"):
        ModelConfig.from_hf(raw)


@pytest.mark.parametrize("family, left_out", [("cohere_compass", "model.visual."),
                                              ("emu3", "vqmodel.")])
def test_image_text_checkpoints_export_their_language_model_alone(family, left_out, bundle,
                                                                  hf_model):
    from safetensors import safe_open

    with safe_open(str(hf_model(family) / "model.safetensors"), "pt") as f:
        assert any(name.startswith(left_out) for name in f.keys())  # noqa: SIM118
    raw = json.loads((bundle(family) / MANIFEST_FILE).read_text())
    assert any("left out" in quirk for quirk in raw["source"]["quirks"])


def test_gpt_neox_japanese_reads_its_mlp_width_and_tying_as_transformers():
    import transformers

    raw = {"model_type": "gpt_neox_japanese", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "vocab_size": 128, "intermediate_size": 7,
           "num_key_value_heads": 1}
    cfg = ModelConfig.from_hf(raw)
    hf = transformers.AutoConfig.for_model(**raw)
    assert cfg.intermediate_size == int(hf.hidden_size * hf.intermediate_multiple_size) == 256
    assert cfg.num_kv_heads == 4  # its fused qkv is 3 x hidden whatever the key says
    assert cfg.tie_embeddings is hf.tie_word_embeddings is True


@pytest.mark.parametrize("width", [64, 63])
def test_ctrls_and_xglms_sinusoid_tables_are_transformers(width):
    """One module, two tables: both sin | cos halves, but CTRL's frequencies are
    10000 ** (-2k / width) and XGLM's exp(-k ln(10000) / (width / 2 - 1)), an odd width
    gives CTRL one sine more and XGLM a zero column, and XGLM zeroes its padding row."""
    from transformers.models.ctrl.modeling_ctrl import positional_encoding
    from transformers.models.xglm.modeling_xglm import XGLMSinusoidalPositionalEmbedding

    ctrl = positional_encoding(1024, width, torch.float).numpy()
    assert_tables_close(ctrl_sinusoids(1024, width), ctrl, atol=2e-6)
    xglm = XGLMSinusoidalPositionalEmbedding.get_embedding(1024, width, 1).numpy()
    assert_tables_close(xglm_sinusoids(1024, width, 1), xglm, atol=2e-6)
    assert np.abs(ctrl - xglm).max() > 0.1  # not one table


def test_a_ctrl_config_with_another_norm_epsilon_is_refused_in_one_line():
    raw = {"model_type": "ctrl", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 128,
           "layer_norm_epsilon": 1e-5}
    with pytest.raises(ExportError, match=r"^ctrl: layer_norm_epsilon other than its "
                                          r"layers' fixed 1e-6 is not supported$"):
        ModelConfig.from_hf(raw)


@pytest.mark.parametrize("afn, activation", [("gelu", "gelu_tanh"), ("relu", "relu"),
                                             ("swish", "silu")])
def test_gpt1_reads_afn_as_its_model_does(afn, activation):
    raw = {"model_type": "openai-gpt", "n_embd": 64, "n_head": 4, "n_layer": 2,
           "vocab_size": 128, "afn": afn}
    assert ModelConfig.from_hf(raw).activation == activation


def test_a_gpt_sw3_config_exports_as_gpt2(tmp_path, hf_model):
    """GPT-SW3's model_type names GPT2Config and GPT2LMHeadModel in transformers: a config
    that says "gpt-sw3" exports GPT-2's graph, whose logits are transformers'."""
    from edgeprefill.export.exporter import ExportOptions, export

    hf_dir = build_hf_model("gpt2", tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "model_type": "gpt-sw3"}))
    ids = prompt_ids(40)
    expected = reference_logits(hf_dir, ids)
    out = tmp_path / "bundle"
    export(hf_dir, out, ExportOptions(flavor="standard", chunks=(16,), max_context=128,
                                      show_progress=False, overwrite=True))
    engine = Engine.load(out, threads=2, background=False)
    logits = engine.backend.run(StepBatch(np.array([ids], np.int64), np.array([0], np.int32),
                                          np.array([len(ids)], np.int32), first_slot=0))
    np.testing.assert_allclose(logits[0], expected[-1], rtol=1e-4, atol=1e-4)
    engine.close()


def test_mllama_leaves_out_the_cross_attention_layers_text_skips(hf_model, bundle):
    """The fixture's 4 layers: the second attends to an image only; the other three are
    exported as layers 0-2 (their logits are transformers': test_exactness)."""
    cfg = ModelConfig.from_dir(hf_model("mllama"))
    assert cfg.num_layers == 3
    assert cfg.left_out == ("language_model.model.layers.1.", "model.language_model.layers.1.")
    assert ("language_model.model.layers.2.", "model.layers.1.") in cfg.renames
    raw = json.loads((bundle("mllama") / MANIFEST_FILE).read_text())
    assert "cross-attention layers left out (text skips them)" in raw["source"]["quirks"]


@pytest.mark.parametrize("family", ["emu3", "mllama"])
def test_the_language_model_saved_alone_by_transformers_exports(tmp_path, family):
    """The image-text checkpoint loaded with AutoModelForCausalLM (as fine-tuning scripts
    load it) and saved: transformers 5 writes the text model's config (emu3_text_model,
    mllama_text_model) with plain `model.` names, which export had refused as an unknown
    model type. Mllama's saved text model still holds its cross-attention layer (the
    fixture's second): left out, as from the image-text checkpoint."""
    from tests.test_families import export_small, last_logits, saved_alone

    text, expected = saved_alone(family, tmp_path)
    assert json.loads((text / "config.json").read_text())["model_type"] == \
        f"{family}_text_model"
    out = export_small(text, tmp_path / "b")
    np.testing.assert_allclose(last_logits(out, prompt_ids(40)), expected, rtol=1e-4,
                               atol=1e-4)
