"""Image-text Qwen (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the language model is exported alone.

The fixtures' logits in both flavours, chunked, are tests/test_exactness.py's (the families
are in conftest.FAMILIES); here: M-RoPE against the models' own rotary, the configs and
tensor layouts other transformers versions wrote, and what export refuses.
"""

from __future__ import annotations

import copy
import json
import logging

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from edgeprefill.errors import ExportError
from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import IMAGE_TEXT, build_hf_model, hf_auto_class
from tests.rope_tables import assert_tables_close
from tests.test_exactness import prompt_ids, reference_logits

FLAVORS = ("ort", "standard")
# Each family's rotary module and a rope of a published checkpoint (Qwen2-VL-7B's and
# Qwen2.5-VL's "mrope" type, Qwen2.5-VL's long-context yarn, Qwen3-VL's interleaved one).
ROTARIES = {
    "qwen2_vl": "qwen2_vl.modeling_qwen2_vl.Qwen2VLRotaryEmbedding",
    "qwen2_5_vl": "qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLRotaryEmbedding",
    "qwen3_vl": "qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding",
}
HUB_ROPES = [
    ("qwen2_vl", {"type": "mrope", "mrope_section": [16, 24, 24]}),
    ("qwen2_5_vl", {"type": "mrope", "mrope_section": [16, 24, 24]}),
    ("qwen2_5_vl", {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                    "mrope_section": [16, 24, 24]}),
    ("qwen3_vl", {"rope_type": "default", "mrope_section": [24, 20, 20],
                  "mrope_interleaved": True}),
]
HEAD_128 = {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
            "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 128,
            "max_position_embeddings": 131072}


def model_rotary(family: str, raw: dict):
    module, name = ROTARIES[family].rsplit(".", 1)
    cls = getattr(__import__(f"transformers.models.{module}", fromlist=[name]), name)
    # a copy: the config class rewrites the rope dict it is given ("mrope" -> "default")
    config = transformers.AutoConfig.for_model(family, **IMAGE_TEXT[family],
                                               **copy.deepcopy(raw))
    return cls(config.get_text_config())


@pytest.mark.parametrize("family, rope", HUB_ROPES)
def test_mrope_on_text_positions_is_the_plain_rotary(family, rope):
    """A text token's time, height and width positions are equal: whatever the sections
    and their interleaving, the model's cos/sin are the 1-D rope's over the whole head."""
    raw = {"text_config": {**HEAD_128, "rope_scaling": rope, "rope_theta": 1e6}}
    rotary = model_rotary(family, raw)
    ours = ModelConfig.from_hf({"model_type": family, **raw}).ropes[GLOBAL]
    assert ours.rotary_dim == 128
    positions = torch.arange(4096)
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1), positions[None, None].expand(3, 1, -1))
    angles = np.outer(positions.numpy().astype(np.float32), ours.inv_freq())
    scale = np.float32(ours.cos_sin_scale())
    for got, ref in ((cos, np.cos(angles)), (sin, np.sin(angles))):
        assert_tables_close(got[0].numpy(), np.tile(ref, 2) * scale, atol=2e-4, scale=scale)
    # The sections are live: positions that differ per axis (an image's) rotate otherwise.
    with torch.no_grad():
        grid, _ = rotary(torch.zeros(1), torch.stack([positions, positions // 2,
                                                      positions % 7])[:, None])
    assert not np.allclose(grid[0].numpy(), cos[0].numpy(), atol=1e-2)


def export_flavour(hf_dir, out, flavor: str):
    from edgeprefill.export.exporter import ExportOptions, export

    export(hf_dir, out, ExportOptions(flavor=flavor, chunks=(16, 64), max_context=128,
                                      show_progress=False))
    return out


def assert_chunks_match(bundle_dir, ids: list[int], expected: np.ndarray) -> float:
    """Prefill `ids` in chunks of 40, 16 and 7 tokens; each chunk's last logits must be
    `expected`'s at that position. Returns the largest difference seen."""
    from edgeprefill.engines import StepBatch
    from edgeprefill.sdk import Engine

    engine = Engine.load(bundle_dir, threads=2, background=False)
    worst = 0.0
    for chunk in (len(ids), 16, 7):
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            logits = engine.backend.run(StepBatch(
                np.array([part]), np.array([start], np.int32), np.array([len(part)], np.int32),
                0))
            want = expected[start + len(part) - 1]
            np.testing.assert_allclose(logits[0], want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"chunk {chunk} at {start}")
            worst = max(worst, float(np.abs(logits[0] - want).max()))
    engine.close()
    return worst


def move_tensors(hf_dir, moves: tuple[tuple[str, str], ...]) -> None:
    """Rewrite the checkpoint's tensor names, the first matching prefix moved."""
    tensors = load_file(hf_dir / "model.safetensors")
    moved = {}
    for name, tensor in tensors.items():
        old, new = next(((o, n) for o, n in moves if name.startswith(o)), ("", ""))
        moved[new + name[len(old):]] = tensor
    save_file(moved, hf_dir / "model.safetensors", metadata={"format": "pt"})


# transformers 5 saves Qwen2-VL and Qwen2.5-VL in the Hub's layout (`model.layers.`,
# `visual.`) and loads the one it holds in memory; Qwen3-VL's Hub and saved layout is that
# one, and the other is built by renaming (transformers loads it for Qwen2-VL only).
STORED = {"qwen2_vl": "model.layers.", "qwen2_5_vl": "model.layers.",
          "qwen3_vl": "model.language_model.layers."}
TO_NESTED = (("model.", "model.language_model."), ("visual.", "model.visual."))
TO_FLAT = (("model.language_model.", "model."), ("model.visual.", "visual."))


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", sorted(STORED))
def test_the_other_tensor_layout_exports_the_same_logits(family, flavor, tmp_path):
    hf_dir = build_hf_model(family, tmp_path / "hf")
    names = load_file(hf_dir / "model.safetensors")
    assert any(n.startswith(STORED[family]) for n in names)
    assert any("visual." in n for n in names)  # a real vision tower beside it
    ids = prompt_ids(40)
    expected = reference_logits(hf_dir, ids)  # transformers, on the layout it saved
    move_tensors(hf_dir, TO_FLAT if family == "qwen3_vl" else TO_NESTED)
    assert_chunks_match(export_flavour(hf_dir, tmp_path / "b", flavor), ids, expected)


def flat_hub_config(config: dict) -> dict:
    """Qwen2.5-VL's config.json as the Hub has it: text keys at the top level, the rope
    as `rope_scaling` of type "mrope" and a top-level `rope_theta`."""
    text = dict(config.pop("text_config"))
    params = text.pop("rope_parameters")
    for key in ("model_type", "layer_types", "dtype"):
        text.pop(key, None)
    rope = {"type": "mrope", "mrope_section": params["mrope_section"]}
    return {**config, **text, "rope_scaling": rope, "rope_theta": params["rope_theta"]}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_hub_qwen2_5_vl_config_without_text_config_exports_as_transformers_reads_it(
        flavor, tmp_path):
    hf_dir = build_hf_model("qwen2_5_vl", tmp_path / "hf", rope_parameters={
        "rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 5e5})
    path = hf_dir / "config.json"
    flat = flat_hub_config(json.loads(path.read_text()))
    path.write_text(json.dumps(flat))
    text = transformers.AutoConfig.from_pretrained(hf_dir).get_text_config()
    assert (text.hidden_size, text.rope_parameters["rope_theta"]) == (64, 5e5)
    assert text.layer_types == ["full_attention", "sliding_attention"]
    ids = prompt_ids(40)
    assert_chunks_match(export_flavour(hf_dir, tmp_path / "b", flavor), ids,
                        reference_logits(hf_dir, ids))


TIES = [({"tie_word_embeddings": True}, {}), ({}, {"tie_word_embeddings": True}),
        ({"tie_word_embeddings": False}, {"tie_word_embeddings": True}),
        ({"tie_word_embeddings": True}, {"tie_word_embeddings": False}), ({}, {})]


@pytest.mark.parametrize("outer, text", TIES)
@pytest.mark.parametrize("family", sorted(STORED))
def test_the_tying_and_token_ids_are_the_models(family, outer, text):
    """Qwen2-VL's config class ties when either level says so, Qwen3-VL's by the outer
    config alone; both generate with the outer config's EOS where it has one."""
    keys = {**HEAD_128, "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
            "eos_token_id": 9, "bos_token_id": 8, **text}
    raw = {"text_config": keys, **outer, "eos_token_id": 7}
    config = transformers.AutoConfig.for_model(family, **IMAGE_TEXT[family],
                                               **copy.deepcopy(raw))
    model = hf_auto_class(family).from_config(config)
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    ours = ModelConfig.from_hf({"model_type": family, **raw})
    assert ours.tie_embeddings == tied
    assert ours.eos_token_ids == (model.generation_config.eos_token_id,) == (7,)


@pytest.mark.parametrize("family", sorted(STORED))
def test_the_vision_tower_is_left_out_in_one_line(family, tmp_path, caplog):
    hf_dir = build_hf_model(family, tmp_path / "hf")
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        export_flavour(hf_dir, tmp_path / "b", "ort")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages  # no unused-tensor warning listing vision tensors
    assert "language model only" in messages[0] and "visual" in messages[0]


def test_a_qwen3_vl_mrope_type_is_refused_in_one_line():
    # Qwen3VLConfig keeps a "mrope" rope type (Qwen2-VL's reads it as the default rope),
    # and its model fails to build on it.
    raw = {"model_type": "qwen3_vl", "text_config": {
        **HEAD_128, "rope_scaling": {"type": "mrope", "mrope_section": [24, 20, 20]}}}
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf(raw)
    assert "rope type 'mrope' is not supported" in str(err.value)
    assert "\n" not in str(err.value)
