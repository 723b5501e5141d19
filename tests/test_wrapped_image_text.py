"""Image-text checkpoints whose language model is any text family of ours (LLaVA and its kin,
families/wrapped.py), GLM-4V and ShieldGemma 2: the bundle is the language model, its logits
those of the transformers model built whole (tiny towers beside it) on text-only input_ids.
PaliGemma is refused: its prompt is a bidirectional prefix."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.families import wrapped_text_type
from edgeprefill.export.families.image_text import WRAPPERS
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES as FIXTURES
from tests.conftest import IMAGE_TEXT, TIMM_TOWERS, build_hf_model, write_tokenizer
from tests.test_cli_errors import EDGEPREFILL, assert_one_line_error, cli
from tests.test_exactness import prompt_ids, reference_logits

FLAVORS = ("ort", "standard")
# GLM-4V's text_config: its M-RoPE sections fit the fixtures' 16 rotary dims (8 pairs)
GLM4V_TEXT = {"model_type": "glm4v_text", "rope_parameters": {
    "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
# The language model keys of the image-text families declared by hand whose text_config is
# their own type: M-RoPE sections that fit the fixtures' rotary dims (8 pairs; Qwen3-MoE's
# 16), PaddleOCR's use_bias on
MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
OWN_TEXT = {
    "paddleocr_vl": {"head_dim": 16, "use_bias": True, "rope_parameters": MROPE},
    "qwen2_5_omni_thinker": {"rope_parameters": MROPE},
    "qwen3_omni_moe_thinker": {**FIXTURES["qwen3_moe"], "rope_parameters": {
        **MROPE, "mrope_section": [6, 5, 5], "mrope_interleaved": True}},
}
# The families declared by hand in image_text.FAMILIES, with their language model
BY_HAND = [("nemotron_h_omni", "nemotron_h"), ("paddleocr_vl", "paddleocr_vl_text"),
           ("qwen2_5_omni_thinker", "qwen2_5_omni_text"),
           ("qwen3_omni_moe_thinker", "qwen3_omni_moe_text")]
# The language models of a config class of their own: the fixture keys of the text family
# they are close to (Cosmos3 Edge: M-RoPE sections that fit the fixtures' 16 rotary dims)
TEXT_KEYS = {
    "cosmos3_edge_text": {"head_dim": 16, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
    **dict.fromkeys(("granite4_vision_text", "granite_docling_text"), FIXTURES["granite"]),
    # HunYuan dense's, its NTK-alpha rope written as HunyuanOCR's "xdrope" with sections
    "hunyuan_vl_text": {**FIXTURES["hunyuan_v1_dense"], "rope_scaling": None,
                        "rope_parameters": {"rope_type": "xdrope", "rope_theta": 10000.0,
                                            "alpha": 1000.0, "factor": 1.0,
                                            "xdrope_section": [4, 4, 4, 4]}},
    # ERNIE-4.5-MoE's, a width per modality; its 3-D rotary's sections fit 16 rotary dims
    "ernie4_5_vl_moe_text": {
        **FIXTURES["ernie4_5_moe"], "moe_intermediate_size": [32, 16],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "mrope_section": [3, 3, 2]}},
    # DeepSeek-V2's experts (group-limited) without its latent attention, a dense first layer
    "deepseek_ocr2_text": {
        **{k: v for k, v in FIXTURES["deepseek_v2"].items() if "lora" not in k
           and not k.endswith("head_dim") and k != "first_k_dense_replace"},
        "mlp_layer_types": ["dense", "sparse", "sparse"]},
}
# Each wrapper with its config class's default language model, and the others its Hub
# checkpoints hold (InternVL 3.5: Qwen3; InternVL 2.5: Llama-based ones; Mistral Small 3.1's
# Mistral, Ministral 3's), and LLaVA over families whose CausalLM does more than its
# wrapper's head (Gemma 2's final soft-cap, Granite's logits_scaling).
MATRIX = [(name, wrapper.default_text) for name, wrapper in sorted(WRAPPERS.items())] + [
    ("llava", "qwen2"), ("llava", "mistral"), ("llava", "gemma2"), ("llava", "granite"),
    ("llava", "qwen3"), ("internvl", "qwen3"), ("internvl", "llama"),
    ("mistral3", "ministral3"), ("llava_onevision", "qwen3")]


def build_wrapped(outer: str, text_type: str, out: Path) -> tuple[Path, Path | None]:
    """A tiny random `outer` checkpoint holding a `text_type` language model, saved by
    transformers, and where its tower is a timm model (not installed) the text model's
    folder its layout was written from (the reference), else None."""
    keys = {"model_type": text_type, **TEXT_KEYS.get(text_type, FIXTURES.get(text_type, {}))}
    if outer in TIMM_TOWERS:
        return timm_wrapped(outer, text_type, out), out.with_name(out.name + "-text")
    if outer.startswith("glm"):
        keys = {**GLM4V_TEXT, "model_type": text_type}
    keys = {**keys, **OWN_TEXT.get(outer, {})}
    hf_dir = build_hf_model(outer, out, **keys)
    if outer == "kimi_k25":
        as_kimi_k25_hub(hf_dir)
    if outer == "hunyuan_vl":
        as_hunyuan_ocr_hub(hf_dir)
    return hf_dir, None


def as_hunyuan_ocr_hub(hf_dir: Path) -> None:
    """HunyuanOCR's config.json on the Hub: flat (the language model's keys at the top
    level, no text_config), its rope the "xdrope" rope_scaling HunYuanVLTextConfig reads as
    HunYuan's NTK-alpha rope."""
    path = hf_dir / "config.json"
    raw = json.loads(path.read_text())
    text = raw.pop("text_config")
    rope = text.pop("rope_parameters")
    text["rope_scaling"] = {"type": "xdrope", "alpha": rope["alpha"], "factor": 1.0,
                            "xdrope_section": rope["mrope_section"]}
    text["rope_theta"] = rope["rope_theta"]
    path.write_text(json.dumps({**text, **raw}))


def as_kimi_k25_hub(hf_dir: Path) -> None:
    """transformers 5.24 saves Kimi K2.5's language model as `language_model.model.blocks.`
    (its loader's rename of the tower's `blocks` to `layers`, reversed on every name); the
    Hub's checkpoints keep DeepSeek-V3's `layers.`, which that loader reads the same."""
    path = hf_dir / "model.safetensors"
    tensors = {name.replace("language_model.model.blocks.", "language_model.model.layers."): t
               for name, t in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})


def timm_wrapped(outer: str, text_type: str, out: Path) -> Path:
    """`outer`'s checkpoint layout (transformers 5's) written by hand around a random
    `text_type` model: its tensors under model.language_model. beside stand-ins for the
    tower and projector, and the outer config holding its config as text_config."""
    text_dir = build_hf_model(text_type, out.with_name(out.name + "-text"),
                              **FIXTURES.get(text_type, {}))
    tensors = {("model.language_model." + name.removeprefix("model.")
                if name.startswith("model.") else name): t
               for name, t in load_file(text_dir / "model.safetensors").items()}
    for part in ("vision_tower.timm_model.stem.weight", "multi_modal_projector.linear_1.weight"):
        tensors["model." + part] = torch.ones(4, 4)
    out.mkdir(parents=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    text = json.loads((text_dir / "config.json").read_text())
    config = transformers.AutoConfig.for_model(outer, text_config=text)
    config.save_pretrained(out)
    write_tokenizer(out)
    return out


def reference(hf_dir: Path, text_dir: Path | None, ids: list[int]) -> np.ndarray:
    """transformers' logits of `ids` alone: the model built whole, or the text model over
    the same weights where the whole one needs timm."""
    model_type = json.loads((hf_dir / "config.json").read_text())["model_type"]
    if model_type == "shieldgemma2":  # its Gemma 3 image-text model's logits
        model = transformers.ShieldGemma2ForImageClassification.from_pretrained(
            hf_dir, dtype=torch.float32).model
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].numpy()
    return reference_logits(text_dir or hf_dir, ids)


def export_flavor(hf_dir: Path, out: Path, flavor: str) -> Path:
    export(hf_dir, out, ExportOptions(flavor=flavor, chunks=(16,), max_context=64,
                                      show_progress=False))
    return out


def assert_chunks_match(bundle_dir: Path, expected: np.ndarray, ids: list[int]) -> None:
    """Every chunk's last logits (chunks of 1, 3 and 16; the last of 16 padded) equal
    `expected` at that position."""
    from edgeprefill.engines import StepBatch

    engine = Engine.load(bundle_dir, threads=2, background=False)
    for chunk in (1, 3, 16):
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            logits = engine.backend.run(StepBatch(
                np.array([part], np.int64), np.array([start], np.int32),
                np.array([len(part)], np.int32), first_slot=0))
            np.testing.assert_allclose(logits[0], expected[start + len(part) - 1],
                                       rtol=1e-4, atol=1e-4,
                                       err_msg=f"chunk {chunk} at {start}")
    engine.close()


def check_exports_as_transformers(outer: str, text_type: str, tmp_path: Path,
                                  flavors: tuple[str, ...] = FLAVORS) -> None:
    hf_dir, text_dir = build_wrapped(outer, text_type, tmp_path / "hf")
    ids = prompt_ids(21)  # a last chunk of 16 that is padded (5 of 16)
    expected = reference(hf_dir, text_dir, ids)
    for flavor in flavors:
        assert_chunks_match(export_flavor(hf_dir, tmp_path / flavor, flavor), expected, ids)


def test_a_wrapper_exports_the_language_model_its_text_config_names(tmp_path):
    # LlavaConfig's default is Llama; this one holds a Qwen2 (q/k/v biases), and so
    # does the bundle.
    text = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}
    assert ModelConfig.from_hf({"model_type": "llava", "text_config": text}).qkv_bias
    check_exports_as_transformers("llava", "qwen2", tmp_path)


# The image-text families of a config class of their own (families/image_text.py FAMILIES)
# that stop 43 added, with their language model's type
STOP43 = [("cosmos3_edge", "cosmos3_edge_text"), ("deepseek_ocr2", "deepseek_ocr2_text"),
          ("ernie4_5_vl_moe", "ernie4_5_vl_moe_text"), ("glm_ocr", "glm_ocr_text"),
          ("glmga", "glm4v_text"), ("granite4_vision", "granite4_vision_text"),
          ("granite_docling", "granite_docling_text"), ("hunyuan_vl", "hunyuan_vl_text")]


@pytest.mark.slow
@pytest.mark.parametrize("outer, text_type", [
    *MATRIX, ("glm4v", "glm4v_text"), ("glm46v", "glm4v_text"),
    ("shieldgemma2", "gemma3_text"), *BY_HAND, *STOP43])
def test_every_wrapper_exports_its_language_model_as_transformers_runs_it(
        tmp_path, outer, text_type):
    check_exports_as_transformers(outer, text_type, tmp_path)


def test_the_transformers_5_layout_exports_as_the_hubs(tmp_path):
    """transformers 5.24 saves LLaVA as the Hub's (`language_model.model.`, its head
    `language_model.lm_head.`); checkpoints some tools save from memory are
    `model.language_model.` and `lm_head.`."""
    hf_dir, _ = build_wrapped("llava", "llama", tmp_path / "hf")
    tensors = load_file(hf_dir / "model.safetensors")
    assert any(n.startswith("language_model.model.layers.") for n in tensors)
    moved = {}
    for name, tensor in tensors.items():
        for old, new in (("language_model.model.", "model.language_model."),
                         ("language_model.lm_head.", "lm_head."),
                         ("vision_tower.", "model.vision_tower."),
                         ("multi_modal_projector.", "model.multi_modal_projector.")):
            if name.startswith(old):
                name = new + name.removeprefix(old)
                break
        moved[name] = tensor
    save_file(moved, hf_dir / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(21)
    assert_chunks_match(export_flavor(hf_dir, tmp_path / "b", "ort"),
                        reference_logits(hf_dir, ids), ids)


def test_a_timm_tower_wrapper_exports_as_its_text_model(tmp_path):
    # FastVLM's tower is a timm model: the reference is its Qwen2 over the same weights.
    check_exports_as_transformers("fast_vlm", "qwen2", tmp_path)


def test_glm4v_exports_its_language_model_as_transformers_runs_it(tmp_path):
    # GLM-4's layers with M-RoPE, plain rotary on text positions
    check_exports_as_transformers("glm4v", "glm4v_text", tmp_path)


def test_shieldgemma2_exports_its_gemma3_logits(tmp_path):
    # ShieldGemma2ForImageClassification reads 2 of its Gemma 3's logits; the bundle gives
    # them all, from the model saved as transformers 5 saves it (model.model.language_model.)
    cfg = transformers.ShieldGemma2Config(text_config={
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 128, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "sliding_window": 8, "initializer_range": 0.2}, **IMAGE_TEXT["shieldgemma2"])
    torch.manual_seed(0)
    model = transformers.ShieldGemma2ForImageClassification(cfg)
    hf_dir = tmp_path / "hf"
    model.save_pretrained(hf_dir)
    write_tokenizer(hf_dir)
    assert any(n.startswith("model.model.language_model.")
               for n in load_file(hf_dir / "model.safetensors"))
    ids = prompt_ids(21)
    assert_chunks_match(export_flavor(hf_dir, tmp_path / "b", "ort"),
                        reference(hf_dir, None, ids), ids)


# The tying of each wrapper's config class, for text_config's say and the outer key's
TIE_CASES = [({}, {}), ({"tie_word_embeddings": True}, {}), ({}, {"tie_word_embeddings": True}),
             ({"tie_word_embeddings": False}, {"tie_word_embeddings": True}),
             ({"tie_word_embeddings": True}, {"tie_word_embeddings": False})]


# Qwen3.5's 2 layers: one full-attention layer (its default puts the first at the fourth)
LAYER_TYPES = {"qwen3_5_text": {"layer_types": ["linear_attention", "full_attention"]},
               "nemotron_h": FIXTURES["nemotron_h"]}
# the keys a language model cannot do without, beside TIE_CASES' text_config
TIE_TEXT_KEYS = {"deepseek_ocr2": {"num_experts_per_tok": 2,
                                   "mlp_layer_types": ["dense", "sparse"]},
                 "hunyuan_vl": {"head_dim": 16},
                 # as many KV heads as query heads, in its sliding layers too
                 "dots3_note": {"num_key_value_heads": 4, "swa_num_attention_heads": 2,
                                "swa_num_key_value_heads": 2}}


@pytest.mark.parametrize("outer", [*sorted(WRAPPERS), "glm4v", "shieldgemma2",
                                   *(name for name, _ in (*BY_HAND, *STOP43))])
def test_each_wrapper_ties_as_its_config_class(outer):
    for text, top in TIE_CASES:
        text_type = WRAPPERS[outer].default_text if outer in WRAPPERS else \
            {"glm4v": "glm4v_text", "shieldgemma2": "gemma3_text", **dict(BY_HAND),
             **dict(STOP43)}[outer]
        raw = {"model_type": outer, **top, "text_config": {
            "model_type": text_type, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 128, "eos_token_id": 2, "bos_token_id": 1,
            **LAYER_TYPES.get(text_type, {}), **TIE_TEXT_KEYS.get(outer, {}), **text}}
        # (with the outer keys its config class checks against a small vocabulary: Apertus
        # 1.5's token offsets)
        hf = transformers.AutoConfig.for_model(**raw, **IMAGE_TEXT.get(outer, {}))
        # NemotronH_Omni_Reasoning_V3 ties nothing, whatever either level says (its built
        # model's lm_head is never its embedding; its config class has no such key);
        # Step3p7Config has the key only where given, and its model ties nothing without it
        tied = outer != "nemotron_h_omni" and bool(getattr(hf, "tie_word_embeddings", False))
        assert ModelConfig.from_hf(raw).tie_embeddings is tied, (text, top)


def test_the_wrappers_head_is_its_lm_head_alone():
    # Aya Vision's Cohere 2: Cohere2ForCausalLM scales its logits by logit_scale (0.0625
    # unless given), AyaVisionForConditionalGeneration does not; LLaVA's Gemma 2: no final
    # soft-cap (Gemma2ForCausalLM's).
    text = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
    aya = ModelConfig.from_hf({"model_type": "aya_vision", "text_config": {
        **text, "model_type": "cohere2", "logit_scale": 0.25}})
    assert aya.logits_multiplier == 1.0
    assert ModelConfig.from_hf({"model_type": "cohere2", **text}).logits_multiplier == 0.0625
    llava = ModelConfig.from_hf({"model_type": "llava", "text_config": {
        **text, "model_type": "gemma2"}})
    assert llava.final_softcap is None and llava.attn_softcap == 50.0


@pytest.mark.parametrize("text, fragment", [
    ({"model_type": "bert"}, "text_config model_type 'bert' is not a language model export "
                             "supports in llava checkpoints"),
    ({"model_type": "qwen2_vl"}, "'qwen2_vl' is not a language model"),  # not wrappable
])
def test_a_language_model_export_cannot_wrap_is_refused_in_one_line(text, fragment):
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf({"model_type": "llava", "text_config": {"hidden_size": 64, **text}})
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_paligemma_attends_its_prompt_bidirectionally_and_is_refused(tmp_path):
    """PaliGemma's processor marks every prompt token as prefix (token_type_ids 0), which
    its model attends bidirectionally: not the causal logits of the same ids alone. (Its
    eager attention does; in 5.24 its SDPA path loses the prefix, GemmaModel rebuilding a
    causal mask over the one it is given.)"""
    cfg = transformers.PaliGemmaConfig(text_config={
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 128}, vision_config=IMAGE_TEXT["llava"]["vision_config"] | {
        "model_type": "siglip_vision_model"})
    torch.manual_seed(0)
    model = transformers.PaliGemmaForConditionalGeneration._from_config(
        cfg, attn_implementation="eager").eval()
    ids = torch.tensor([prompt_ids(12)])
    with torch.no_grad():
        causal = model(ids).logits
        prefix = model(ids, token_type_ids=torch.zeros_like(ids)).logits
    assert not torch.allclose(causal[0, 0], prefix[0, 0], atol=1e-3)
    with pytest.raises(ExportError, match="PaliGemma attends its whole prompt bidirection"):
        ModelConfig.from_hf(cfg.to_dict())


def test_export_says_once_on_stderr_that_the_bundle_is_text_only(tmp_path):
    hf_dir = tmp_path / "hf"
    shutil.copytree(build_wrapped("vipllava", "llama", tmp_path / "src")[0], hf_dir)
    result = subprocess.run([*EDGEPREFILL, "export", str(hf_dir), "-o", str(tmp_path / "b"),
                             "--chunks", "16", "--max-context", "64", "--quiet"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "text-only" in line]
    assert len(said) == 1 and "vision_tower" in said[0] and "left out" in said[0], \
        result.stderr


def test_qianfan_ocr_exports_the_layers_transformers_saves_under_its_towers_name(tmp_path):
    """transformers 5.24 loads Qianfan-OCR renaming `encoder.layers.` (its tower's) to
    `layers.` wherever it occurs, and so saves its Qwen3's layers as
    `language_model.model.encoder.layers.`: read as the language model's (Wrapper.renames)."""
    hf_dir, _ = build_wrapped("qianfan_ocr", "qwen3", tmp_path / "hf")
    assert any(n.startswith("language_model.model.encoder.layers.")
               for n in load_file(hf_dir / "model.safetensors"))
    check_exports_as_transformers("qianfan_ocr", "qwen3", tmp_path / "x", flavors=("ort",))


# One fast check of each family image_text.FAMILIES declares by hand for them (both
# flavours: the slow matrix): Nemotron-H's blocks under a whole causal LM's
# language_model.backbone., ERNIE's layers with biases on every projection and M-RoPE,
# the thinkers' Qwen2 and Qwen3-MoE with M-RoPE beside their audio and vision towers.
@pytest.mark.parametrize("outer, text_type", BY_HAND)
def test_each_family_declared_by_hand_exports_its_language_model(tmp_path, outer, text_type):
    check_exports_as_transformers(outer, text_type, tmp_path, flavors=("ort",))


def test_paddleocr_vls_flat_hub_config_reads_as_transformers_reads_it():
    # The Hub's config.json holds the language model's keys at the top; PaddleOCRVLConfig
    # moves them into text_config and stays tied (its own default), whatever they say.
    flat = {"model_type": "paddleocr_vl", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": 128, "use_bias": True, "rope_theta": 5000.0,
            "tie_word_embeddings": False}
    hf = transformers.AutoConfig.for_model(**flat)
    ours = ModelConfig.from_hf(flat)
    assert ours.tie_embeddings is hf.tie_word_embeddings is True
    assert (ours.hidden_size, ours.head_dim) == (hf.text_config.hidden_size, 16)
    assert ours.qkv_bias and ours.o_bias and ours.mlp_bias  # use_bias: every projection
    assert ours.ropes["global"].theta == hf.text_config.rope_parameters["rope_theta"] == 5000


def test_the_qwen3_omni_thinkers_experts_are_renormalized_unless_it_says_otherwise():
    # Qwen3OmniMoeTextConfig's norm_topk_prob is true by default (Qwen3-MoE's is false)
    text = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    for keys in ({}, {"norm_topk_prob": False}):
        raw = {"model_type": "qwen3_omni_moe_thinker", "text_config": {**text, **keys}}
        hf = transformers.AutoConfig.for_model(**raw).text_config
        assert ModelConfig.from_hf(raw).moe.norm_topk is hf.norm_topk_prob, keys


def test_nemotron_h_omnis_released_configs_hold_their_language_model_as_llm_config():
    text = {"model_type": "nemotron_h", "hidden_size": 64, "intermediate_size": 96,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
            **FIXTURES["nemotron_h"]}
    raw = {"model_type": "nemotron_h_omni", "llm_config": text,
           **IMAGE_TEXT["nemotron_h_omni"]}
    hf = transformers.AutoConfig.for_model(**raw).text_config
    ours = ModelConfig.from_hf(raw)
    assert ours == ModelConfig.from_hf({**raw, "llm_config": None, "text_config": text})
    assert (ours.hidden_size, ours.vocab_size) == (hf.hidden_size, hf.vocab_size)


# The image-text types of transformers 5.24 whose language model export cannot run
REFUSED = [("mistral_large4", "learned rope scaling"),
           ("molmo2_text", "without its LM head"), ("muse_spark_text", "without its LM head"),
           ("unlimited_ocr", "reference sliding-window attention")]


@pytest.mark.parametrize("model_type, fragment", [
    REFUSED[0], *(pytest.param(*case, marks=pytest.mark.slow) for case in REFUSED[1:])])
def test_an_image_text_type_whose_language_model_export_cannot_run_is_one_line(
        model_type, fragment, hf_model, tmp_path):
    hf = shutil.copytree(hf_model("llama"), tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    assert_one_line_error(cli("export", hf, "-o", tmp_path / "b"),
                          f"model_type '{model_type}': ", fragment)


def test_hyperclovax_vision_v2s_head_multiplies_the_logits_as_its_text_model(tmp_path):
    # Unlike LLaVA's head, HyperCLOVAXVisionV2ForConditionalGeneration's multiplies the
    # logits by text_config's logits_scaling (2.0 in the fixture), as HyperCLOVAXForCausalLM
    text = {"model_type": "hyperclovax", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128,
            "logits_scaling": 2.0}
    assert ModelConfig.from_hf({"model_type": "hyperclovax_vision_v2",
                                "text_config": text}).logits_multiplier == 2.0
    assert ModelConfig.from_hf({"model_type": "llava", "text_config": text}
                               ).logits_multiplier == 1.0
    check_exports_as_transformers("hyperclovax_vision_v2", "hyperclovax", tmp_path)


def test_cosmos3_edge_exports_its_hub_layout_as_transformers_runs_it(tmp_path):
    # Llama attention named to_q/to_k/to_v/to_out, an ungated ReLU-squared MLP, M-RoPE
    check_exports_as_transformers("cosmos3_edge", "cosmos3_edge_text", tmp_path)


@pytest.mark.parametrize("outer, stored, read", [
    ("kimi_k25", "kimi_k2", "deepseek_v3"),  # the Hub's Kimi K2.5/K2.6 configs
    ("exaone4_5", "exaone4_5_text", "exaone4"),  # EXAONE 4.5's first configs
])
def test_a_text_type_its_config_class_renames_is_read_as_that_family(outer, stored, read):
    raw = {"model_type": outer, "text_config": {"model_type": stored, "hidden_size": 64,
                                                "num_attention_heads": 4,
                                                "num_hidden_layers": 2}}
    # (a copy: the config class renames the type in the dict it is given)
    assert transformers.AutoConfig.for_model(**copy.deepcopy(raw)).text_config.model_type == read
    assert wrapped_text_type(outer, raw) == read


def test_hunyuan_ocrs_flat_config_reads_its_xdrope_as_hunyuans_ntk_alpha_rope():
    # tencent/HunyuanOCR's config.json: no text_config, an "xdrope" rope_scaling
    raw = {"model_type": "hunyuan_vl", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "head_dim": 16, "intermediate_size": 96,
           "rope_theta": 10000.0, "rope_scaling": {"type": "xdrope", "alpha": 1000.0,
                                                   "factor": 1.0,
                                                   "xdrope_section": [2, 2, 2, 2]}}
    hf = transformers.AutoConfig.for_model(**copy.deepcopy(raw)).text_config
    assert hf.hidden_size == 64 and hf.rope_parameters["rope_type"] == "dynamic"
    assert ModelConfig.from_hf(raw).ropes["global"].kind == "ntk_alpha"


@pytest.mark.parametrize("model_type, fragment", [
    ("glm5_next", "GLM-5-Next's language model (DeepSeek sparse attention"),
])
def test_an_image_text_type_whose_language_model_is_refused_is_one_line(
        hf_model, tmp_path, model_type, fragment):
    hf_dir = shutil.copytree(hf_model("llama"), tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    assert_one_line_error(cli("export", hf_dir, "-o", tmp_path / "b"),
                          f"model_type {model_type!r}: {fragment}")


def test_ernie4_5_vl_reads_the_text_experts_and_leaves_the_vision_ones_out():
    # each sparse layer's list: 8 text experts, then 8 vision ones (router gate.weight_1),
    # under either stored prefix; left out, not warned of as unused
    raw = {"model_type": "ernie4_5_vl_moe", "text_config": {
        "model_type": "ernie4_5_vl_moe_text", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4, "vocab_size": 128, **TEXT_KEYS["ernie4_5_vl_moe_text"]}}
    cfg = ModelConfig.from_hf(raw)
    assert cfg.moe is not None and (cfg.moe.experts, cfg.moe.width) == (8, 32)
    assert cfg.moe.layers == (1, 2) and cfg.moe.shared_width == 2 * 32
    for base in ("model.", "model.language_model."):
        assert {f"{base}layers.1.mlp.experts.8.", f"{base}layers.2.mlp.experts.15.",
                f"{base}layers.2.mlp.gate.weight_1"} <= set(cfg.left_out)
    assert not any(".experts.7." in prefix or "layers.0." in prefix for prefix in cfg.left_out)


@pytest.mark.parametrize("outer", ["mistral3", "kimi_k25"])
def test_a_text_config_model_type_of_another_json_type_is_one_line(outer):
    """A list there had raised a TypeError in the alias lookup (the slow config sweep's
    text_config.model_type=list edit)."""
    raw = {"model_type": outer, "text_config": {"model_type": ["mistral"]}}
    with pytest.raises(ExportError, match=r"text_config model_type \['mistral'\] is not"):
        ModelConfig.from_hf(raw)
