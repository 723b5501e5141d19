"""The family registry: what distinguishes each decoder family from plain Llama, declared.

A family is a `FamilySpec` of switches the graph builder understands (norm kind, block
layout, MLP kind, q/k norms, embedding scaling, tensor names, which layers slide). The
numbers behind the switches (soft-caps, multipliers, windows, rope) are read from
config.json by `ModelConfig.from_hf`; nothing downstream looks at a family's name.

One module per kind of language model (dense, gemma, the routed-expert MoEs by how their
router chooses: moe_softmax, moe_top_k, moe_sigmoid; latent, recurrent, rwkv, kda, alibi, baichuan
(rotary or ALiBi by its config class), the GPT-2-era classic, OpenELM's layer-wise
scaling, DeciLM's KV heads per layer, Llama-Nemotron's NAS blocks, Laguna's softplus-
gated attention with heads per layer, Doge's dynamic mask attention, DiffLlama's
differential attention, ZAYA's compressed convolutional attention, Muse Glimmer's
normed embedding and gated attention, Chameleon's per-head q/k LayerNorms and masked
image tokens, Molmo 2's language model, dots.3's sparse and sliding latent attention)
and the image-text checkpoints that wrap one; `FamilySpec` and the tensor names in
`spec`. The checkpoints that wrap any text family (LLaVA's kin, `wrapped`) take the
spec of the one their text_config names: `family_spec`. LongCat-Flash's two sublayers
per layer and identity experts: `longcat`.
"""

from __future__ import annotations

from difflib import get_close_matches
from functools import cache
from typing import Any

from edgeprefill.export.families import (
    alibi,
    baichuan,
    chameleon,
    classic,
    deci,
    dense,
    diffllama,
    doge,
    dots3,
    gemma,
    image_text,
    inkling,
    jetmoe,
    kda,
    laguna,
    latent,
    longcat,
    minimax,
    minimax_m3,
    moe_sigmoid,
    moe_softmax,
    moe_top_k,
    molmo2,
    muse,
    nemotron_nas,
    not_causal,
    openelm,
    recurrent,
    rwkv,
    sparse_attention,
    step3p5,
    xlstm,
    zaya,
)
from edgeprefill.export.families.spec import BLOCKS, NORMS, FamilySpec, TensorNames
from edgeprefill.export.families.wrapped import text_type_of, wrapped_spec

__all__ = ["BLOCKS", "FAMILIES", "NORMS", "REFUSED_TYPES", "FamilySpec", "TensorNames",
           "family_spec", "refusal", "wrapped_text_type"]

# model_types close to a supported family that export refuses -> why, in words.
REFUSED_TYPES: dict[str, str] = {
    # Remote-code model types (the checkpoint's own modeling code, which export never runs)
    # that users bring, with what to take instead where there is something
    "chatglm": "ChatGLM (THUDM's remote code: ChatGLM-6B's 2D positions; ChatGLM2/3's and "
               "GLM-4's first releases' fused query_key_value and tokenizer classes) is not "
               "supported; GLM-4's -hf releases (model_type glm) are",
    "qwen": "Qwen's first release (QWenLMHeadModel: remote code, a tiktoken vocabulary, "
            "logn attention scaling) is not supported; Qwen1.5 and later (model_type qwen2, "
            "qwen3) are",
    "phi3small": "Phi-3-small's block-sparse attention (dense only every "
                 "dense_attention_every_n_layers) is not supported",
    # Its processor marks every prompt token as prefix (token_type_ids 0), which its model
    # attends bidirectionally: a causal bundle computes other logits for any prompt.
    "paligemma": "PaliGemma attends its whole prompt bidirectionally (a prefix LM), which a "
                 "causal bundle cannot compute",
    # transformers 5.24's newer causal LMs that need a new state, attention or structure
    # (Inkling 1's relative bias and short convolutions are: inkling_text)
    "inkling2_text": "Inkling 2's block attention residuals (each layer's input a softmax "
                     "mix of earlier blocks' states), dynamic short convolutions and "
                     "per-token attention sinks are not supported",
    "inkling2_loop_text": "Inkling 2 Loop's looped layers (a second pass over depth, mixing "
                          "the first pass's messages) are not supported",
    "gemma4_assistant": "the Gemma 4 assistant is a drafter that reads its target model's "
                        "hidden states; it is not a language model export can run alone",
    "gemma4_unified_assistant": "the Gemma 4 Unified assistant is a drafter that reads its "
                                "target model's hidden states; it is not a language model "
                                "export can run alone",
    "hrm_text": "HRM-Text's recurrence over depth (high- and low-level cycles through its "
                "layer stacks) and prefix-LM attention are not supported",
    "blt": "BLT's byte-level patching (local byte encoder and decoder around a global "
           "patch transformer) is not supported",
    "deepseek_v4": "DeepSeek-V4's compressed sparse attention and hyper-connections are not "
                   "supported",
    "qwen4_exp_text": "Qwen4-Exp's sparse attention indexer, n-gram embeddings and gated "
                      "residuals are not supported",
    # image-text checkpoints whose language model is none export supports
    "mistral_large4": "Mistral Large 4's learned rope scaling (LeRoPE), learned position "
                      "scaling of its sparse attention's queries, NoPE layers of another "
                      "latent width and layers reading another's latent cache are not "
                      "supported",
    "molmo2_text": "molmo2_text is Molmo 2's language model without its LM head "
                   "(transformers has no causal LM of it); export the molmo2 checkpoint",
    "hy_v4_vl_text": "hy_v4_vl_text is Hy4-VL's language model without its LM head "
                     "(transformers has no causal LM of it); export the hy_v4_vl checkpoint",
    "muse_spark_text": "muse_spark_text is Muse Spark's language model without its LM head "
                       "(transformers has no causal LM of it); export the muse_spark "
                       "checkpoint",
    "unlimited_ocr": "Unlimited OCR's reference sliding-window attention (the whole prompt "
                     "kept, a window over the generated tokens) is not supported",
    # transformers 5.24's newer image-text checkpoints whose language model export refuses
    # (stop 43, first half)
    "glm5_next": "GLM-5-Next's language model (DeepSeek sparse attention, linear attention "
                 "layers with forget gates, hyper-connections) is not supported",
    # transformers 5.24's causal-LM and image-text types that are no decoder-only LM export
    # can run, or one it lacks a piece of, where config.json alone does not say so
    # (not_causal: the encoder-decoders, BERT-like encoders and audio models it does say)
    "bert-generation": "BertGeneration's BERT encoder layers (post-LayerNorm, learned "
                       "positions) used as a decoder are not supported",
    "blip": "BLIP's text decoder cross-attends to its image encoder on every layer: it is "
            "no language model of text alone",
    "blip-2": "BLIP-2's language model reads Q-Former queries over an image before every "
              "prompt (its forward requires pixel_values); it is not supported",
    "instructblip": "InstructBLIP's language model reads Q-Former queries over an image "
                    "before every prompt (its forward requires pixel_values); it is not "
                    "supported",
    "instructblipvideo": "InstructBLIP-Video's language model reads Q-Former queries over "
                         "video frames before every prompt; it is not supported",
    "cosmos3_omni": "Cosmos3's checkpoints store its Qwen3-VL language model under other "
                    "names inside each layer (self_attn.to_q, to_out, norm_q, ...; "
                    "transformers renames them at load) beside a generator's weights; not "
                    "supported",
    "cpmant": "CPM-Ant's segment and prompt embeddings and bucketed relative-position "
              "attention bias are not supported",
    "diffusion_gemma": "DiffusionGemma is a block-diffusion model (it denoises blocks of "
                       "tokens at once), not a left-to-right causal LM",
    "dory": "Dory's looped normalized-transformer layers (nGPT: hidden states kept on the "
            "unit sphere, recurrent loops over depth) are not supported",
    "evolla": "Evolla's protein-text layers (cross-attention to a protein encoder) are not "
              "supported",
    "git": "GIT's BERT-style decoder (post-LayerNorm layers, learned positions, image "
           "tokens before the text) is not supported",
    "idefics": "IDEFICS's gated cross-attention layers to a perceiver over images are not "
               "supported",
    "inkling2": "Inkling 2's language model (inkling2_text) has block attention residuals, "
                "dynamic short convolutions and per-token attention sinks, which are not "
                "supported",
    "inkling2_loop": "Inkling 2 Loop's language model (inkling2_loop_text) has looped layers "
                     "over depth, which are not supported",
    "kosmos-2": "Kosmos-2's text decoder (sinusoidal positions, LayerNorms inside attention "
                "and the MLP) is not supported",
    "kosmos-2.5": "Kosmos-2.5's text decoder (sinusoidal positions, LayerNorms inside "
                  "attention and the MLP) is not supported",
    "pi0": "PI0 is a vision-language-action model (a flow-matching action expert beside a "
           "PaliGemma), not a language model",
    "qwen4_exp": "Qwen4-Exp's language model (qwen4_exp_text) has a sparse attention "
                 "indexer, n-gram embeddings and gated residuals, which are not supported",
    "reformer": "Reformer's LSH and chunked local attention, axial positions and reversible "
                "layers are not supported",
    "trocr": "TrOCR is the decoder half of a vision encoder-decoder (its layers cross-attend "
             "to an image encoder): it is no language model of text alone",
    "xlm": "XLM's language embeddings and post-LayerNorm layers (a cross-lingual masked or "
           "causal LM) are not supported",
    "xlnet": "XLNet's permutation language modelling (two-stream relative attention with "
             "memory) is not supported",
}


def _merged(*kinds: dict[str, FamilySpec]) -> dict[str, FamilySpec]:
    merged: dict[str, FamilySpec] = {}
    for kind in kinds:
        twice = merged.keys() & kind.keys()
        assert not twice, f"model types in two kinds: {sorted(twice)}"
        merged.update(kind)
    return merged


_TEXT: dict[str, FamilySpec] = _merged(
    dense.FAMILIES,
    gemma.FAMILIES,
    moe_softmax.FAMILIES,
    moe_top_k.FAMILIES,
    moe_sigmoid.FAMILIES,
    latent.FAMILIES,
    longcat.FAMILIES,
    sparse_attention.FAMILIES,
    dots3.FAMILIES,
    recurrent.FAMILIES,
    rwkv.FAMILIES,
    xlstm.FAMILIES,
    kda.FAMILIES,
    alibi.FAMILIES,
    baichuan.FAMILIES,
    classic.FAMILIES,
    openelm.FAMILIES,
    deci.FAMILIES,
    nemotron_nas.FAMILIES,
    laguna.FAMILIES,
    doge.FAMILIES,
    diffllama.FAMILIES,
    zaya.FAMILIES,
    muse.FAMILIES,
    jetmoe.FAMILIES,
    chameleon.FAMILIES,
    step3p5.FAMILIES,
    minimax.FAMILIES,
    minimax_m3.FAMILIES,
    molmo2.FAMILIES,
    inkling.FAMILIES,
)
# A wrapper's entry is the spec of its default language model (its config class's).
FAMILIES: dict[str, FamilySpec] = _merged(
    _TEXT,
    image_text.FAMILIES,
    {name: wrapped_spec(wrapper, _TEXT[wrapper.default_text])
     for name, wrapper in image_text.WRAPPERS.items()},
)


def wrapped_text_type(family: str, raw: dict[str, Any]) -> str | None:
    """The text family a wrapper's config.json (image_text.WRAPPERS) holds; None for other
    families. A ValueError says why it is none export takes, a KeyError the missing key."""
    wrapper = image_text.WRAPPERS.get(family)
    return None if wrapper is None else text_type_of(wrapper, raw, _TEXT)


def family_spec(family: str, text_type: str | None = None) -> FamilySpec:
    """The spec of `family`; of a wrapper, the spec of `text_type` as it holds it."""
    return FAMILIES[family] if text_type is None else _wrapped(family, text_type)


@cache
def _wrapped(family: str, text_type: str) -> FamilySpec:
    return wrapped_spec(image_text.WRAPPERS[family], _TEXT[text_type])

def refusal(family: str | None, raw: dict[str, Any]) -> str:
    """The one line that refuses `family`, a model_type FAMILIES lacks: why by its name
    (REFUSED_TYPES), else what config.json says it is (an encoder-decoder, an encoder, an
    audio model), else where the supported names are, with the nearest of them."""
    if family in REFUSED_TYPES:
        return f"model_type {family!r}: {REFUSED_TYPES[family]}"
    what = not_causal.what_it_is(raw)
    if what is not None:
        return f"model_type {family!r} is {what}"
    if not isinstance(family, str):  # null or absent (config_value let it through)
        return ("config.json has no model_type (a causal LM's names its family); "
                "`edgeprefill export --list-models` lists the supported ones")
    near = get_close_matches(family, FAMILIES, n=3, cutoff=0.6)
    hint = f" (nearest supported: {', '.join(near)})" if near else ""
    return (f"model_type {family!r} is not supported{hint}; `edgeprefill export "
            "--list-models` lists the supported ones, README.md's model table says more")
