"""Shared fixtures: tiny random checkpoints of every supported family, built locally with
transformers (nothing is downloaded), and their exported bundles."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# transformers' BitNet layers are torch.compile'd: compiling them took 34 s per input shape
# on CPU. The references run the same Python eagerly.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
# `make test` runs two test processes on two cores, and the models are tiny: threads that
# wait for work cost more than they give. transformers' references (torch) and numpy run on
# one thread; the engines' compute threads (still two: the native kernels' parallel pieces
# are exercised) sleep instead of spinning (EDGEPREFILL_SPIN, engines/base.py). Measured on
# test_state_runtime.py alone: user CPU 46-52 s spinning, 39-40 s not; torch on one thread
# took test_state_runtime + test_moe from 116 to 87 s of user CPU.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("EDGEPREFILL_SPIN", "off")


@pytest.fixture(autouse=True, scope="session")
def derived_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory):
    """Load-time derived weights are cached on disk (engines/ort/derived_cache.py): the
    tests' go to a folder of their own, not the user's ~/.cache."""
    before = os.environ.get("EDGEPREFILL_DERIVED_CACHE")
    os.environ["EDGEPREFILL_DERIVED_CACHE"] = str(tmp_path_factory.mktemp("derived-cache"))
    yield
    if before is None:
        os.environ.pop("EDGEPREFILL_DERIVED_CACHE", None)
    else:
        os.environ["EDGEPREFILL_DERIVED_CACHE"] = before

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ROOT / "models" / "tiny-recall"
VOCAB = 128
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} ; {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

# Ministral 3's rope dict with an original window of 8 positions instead of 16384.
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
                   "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                   "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
APERTUS_ROPE = {"rope_type": "llama3", "rope_theta": 1.2e7, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
GRANITE4 = {"layer_types": ["attention", "attention"], "num_local_experts": 0,
            "shared_intermediate_size": 48, "embedding_multiplier": 2.0,
            "attention_multiplier": 0.1, "residual_multiplier": 0.5, "logits_scaling": 2.0}
# Granite 4.0-H: Mamba-2 layers around one attention layer (rotary, so that its ort bundle
# takes fused rows where the native kernels build; the Hub's are NoPE), 8 heads of 16 in 2
# groups of B and C, a state of 16; transformers' prompt form in chunks of 16 tokens, so
# the test prompts cross several of them.
GRANITE4_H = {**GRANITE4, "position_embedding_type": "rope", "num_hidden_layers": 4,
              "layer_types": ["mamba", "attention", "mamba", "mamba"], "mamba_n_heads": 8,
              "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
              "mamba_chunk_size": 16}
# Qwen3.5: a larger eps than the checkpoints' 1e-6 for the DeltaNet's gated RMSNorm, which
# at 1e-6 scales a value head's near-zero output (RMS 2e-6 at one token of the test
# prompts) up to unit size, and with it the rounding of that output: half the 1e-4
# tolerance then goes to rounding.
QWEN3_5 = {"num_hidden_layers": 4, "head_dim": 64,
           "layer_types": ["linear_attention", "linear_attention", "full_attention",
                           "linear_attention"],
           "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
           "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-3}
QWEN3_5_MOE = {**QWEN3_5, "num_experts": 8, "num_experts_per_tok": 2,
               "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}
# Lara Mini: Qwen3.5's DeltaNet layers (as QWEN3_5) around a sliding layer with rotary and
# a full one without; 8 experts (top 2, renormalized) beside an ungated shared expert
LARA_MINI = {**QWEN3_5_MOE, "head_dim": 32, "sliding_window": 8,
             "layer_types": ["linear_attention", "sliding_attention", "full_attention",
                             "linear_attention"]}
# OLMo Hybrid: OLMo 3's post-norm attention layers between pre-norm DeltaNet layers (two
# key heads serving four value heads each of another size, beta doubled)
OLMO_HYBRID = {"num_hidden_layers": 4,
               "layer_types": ["linear_attention", "full_attention", "linear_attention",
                               "full_attention"],
               "linear_num_key_heads": 2, "linear_num_value_heads": 4,
               "linear_key_head_dim": 16, "linear_value_head_dim": 8, "rms_norm_eps": 1e-3}
# Kimi Linear: KDA layers (4 heads of 16, each key channel decaying at its own rate) around
# one MLA layer without rotary (a dense query, as the Hub's), the last layer KDA; a dense
# MLP first, then 8 experts (top 2 by sigmoid and a random correction bias, renormalized,
# scaled) beside a shared one. The gated norm's eps as QWEN3_5's, for the same reason.
KIMI_LINEAR = {"num_hidden_layers": 4, "num_key_value_heads": 4,
               "layer_types": ["linear_attention", "full_attention", "linear_attention",
                               "linear_attention"],
               "linear_num_heads": 4, "linear_head_dim": 16, "linear_conv_kernel_dim": 4,
               "q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
               "qk_rope_head_dim": 16, "v_head_dim": 24, "num_local_experts": 8,
               "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
               "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-3}
# Bailing hybrid: KIMI_LINEAR's layers with Bailing's full-rank, bounded KDA gates and a
# gated MLA with rotary (theta 10000, so that it turns over the prompts); head_dim (KDA's
# width, 32) other than qk_rope_head_dim (16), which DeepseekV3Config saves as head_dim
# beside linear_head_dim; 8 experts in 2 groups, the best one kept.
BAILING_HYBRID = {"num_hidden_layers": 4, "num_key_value_heads": 4, "head_dim": 32,
                  "layer_types": ["linear_attention", "full_attention", "linear_attention",
                                  "linear_attention"],
                  "q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                  "qk_rope_head_dim": 16, "v_head_dim": 24, "num_local_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
                  "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
                  "routed_scaling_factor": 2.5, "rope_theta": 10000.0, "rms_norm_eps": 1e-3}
LAGUNA = {"num_hidden_layers": 4, "head_dim": 32, "sliding_window": 8,
          "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                          "full_attention"],
          "mlp_layer_types": ["dense", "sparse", "sparse", "dense"],
          "num_attention_heads_per_layer": [4, 2, 4, 6],
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5,
                                                 "partial_rotary_factor": 0.5},
                              "sliding_attention": {"rope_type": "default",
                                                    "rope_theta": 1e4}},
          "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
          "shared_expert_intermediate_size": 48, "moe_routed_scaling_factor": 1.5}
STEP3P7 = {"num_hidden_layers": 4, "head_dim": 32, "sliding_window": 8,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                           "full_attention"],
           "moe_layers_enum": "1,2", "num_sliding_attention_heads": 6,
           "rope_theta": [1e4, 5e5, 1e4, 5e5], "partial_rotary_factors": [1.0, 0.5, 1.0, 0.5],
           "moe_num_experts": 8, "moe_top_k": 2, "moe_intermediate_size": 32,
           "share_expert_dim": 48, "moe_router_scaling_factor": 1.5, "query_pre_attn_scalar": 16,
           "swiglu_limits": [0, 1.0, 0.5, 0], "swiglu_limits_shared": [0.5, 0, 1.0, 0]}
# LFM3 at head_dim 32 (its config class's 128 is not hidden / heads).
LFM3 = {"num_hidden_layers": 4, "head_dim": 32, "sliding_window": 8, "conv_L_cache": 4,
        "conv_bias": True, "layer_types": ["conv", "sliding_attention", "full_attention", "conv"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 100000.0,
                               "partial_rotary_factor": 0.5}}}
# family -> config overrides; each exercises one thing the exporter must get right. The
# key's first part (before "-") is the model_type. Windows are small so that the test
# prompts cross them several times.
GEMMA4 = {
    "num_hidden_layers": 6, "head_dim": 16, "global_head_dim": 32, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"] * 3, "num_kv_shared_layers": 2,
    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": VOCAB,
    "use_double_wide_mlp": True, "final_logit_softcapping": 10.0,
}
# Gemma 3n: sliding and full layers, the last two (one of each kind) reading the KV of
# the two before them; three AltUp streams, the second active (the Hub's is the first:
# this one tells "active" from "first" apart); activation sparsity on a layer of each
# kind and on a KV-shared one; an MLP width per layer; a per-layer table shorter than
# the vocabulary (the test prompts hold ids past it, which read its row 0).
GEMMA3N = {
    "num_hidden_layers": 6, "head_dim": 16, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"] * 3, "num_kv_shared_layers": 2,
    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 100,
    "intermediate_size": [96, 80, 96, 64, 96, 80],
    "activation_sparsity_pattern": [0.95, 0.6, 0.0, 0.0, 0.95, 0.0],
    "altup_num_inputs": 3, "altup_active_idx": 1, "laurel_rank": 8,
    "final_logit_softcapping": 10.0,
}
# Gemma 4 Unified: Gemma 4's fixture without per-layer inputs (its config has none)
GEMMA4_UNIFIED = {k: v for k, v in GEMMA4.items()
                  if k not in ("hidden_size_per_layer_input", "vocab_size_per_layer_input")}
COMPASS = {"sliding_window": 8, "logit_scale": 0.25, "attention_bias": True,
           "layer_types": ["sliding_attention", "full_attention"],
           "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                     "rope_theta": 10000.0},
                               "full_attention": None}}
# Chameleon: a VQ-VAE as small as its GroupNorms allow, and the vocabulary map whose 32
# image tokens (96..127) the model masks; the ids' names end in a character as the Hub's do
CHAMELEON = {"vq_config": {"base_channels": 32, "channel_multiplier": [1], "num_res_blocks": 1,
                           "attn_resolutions": [], "embed_dim": 4, "num_embeddings": 16,
                           "latent_channels": 4, "resolution": 16},
             "vocabulary_map": {"<s>": 1, "</s>": 2, "<image>": 3,
                                **{f"IMGIMG{chr(65 + i % 10)}{chr(65 + i // 10)}Z": 96 + i
                                   for i in range(32)}}}
LLAMA4 = {"num_hidden_layers": 4, "head_dim": 16, "num_local_experts": 8,
          "num_experts_per_tok": 1, "intermediate_size": 32, "intermediate_size_mlp": 96,
          "interleave_moe_layer_step": 2, "floor_scale": 8, "attn_scale": 0.5}

# Hy4 (its FAMILIES entry says what it holds)
HY_V4 = {"num_hidden_layers": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
         "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
         "v_head_dim": 24, "n_routed_experts": 8, "num_experts_per_tok": 3,
         "moe_intermediate_size": 32, "n_shared_experts": 1, "index_topk": 2048,
         "index_head_dim": 32, "index_n_heads": 16, "hc_mult": 3, "swiglu_limit": 1.0}
DOTS3 = {"num_hidden_layers": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
         "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 32, "head_dim": 64,
         "v_head_dim": 24, "layer_types": ["indexed_attention", "sliding_attention",
                                           "indexed_attention", "sliding_attention"],
         "sliding_window": 5, "swa_num_attention_heads": 2, "swa_num_key_value_heads": 2,
         "swa_q_lora_rank": 20, "swa_kv_lora_rank": 16, "swa_head_dim": 28,
         "swa_qk_nope_head_dim": 12, "swa_v_head_dim": 10,
         "mlp_layer_types": ["dense", "sparse", "dense", "sparse"], "n_routed_experts": 12,
         "n_group": 4, "topk_group": 3, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
         "n_shared_experts": 1, "shared_experts_intermediate_size": 24,
         "routed_scaling_factor": 1.8, "index_topk": 2048, "index_head_dim": 32,
         "index_n_heads": 16, "rms_norm_eps": 0.1}

MINIMAX_M3 = {"num_hidden_layers": 3, "head_dim": 32, "intermediate_size": 32,
              "dense_intermediate_size": 48, "shared_intermediate_size": 24,
              "num_local_experts": 8, "num_experts_per_tok": 2, "swiglu_limit": 1.0,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                  "partial_rotary_factor": 0.5},
              "layer_types": ["minimax_m3_sparse", "full_attention", "minimax_m3_sparse"],
              "mlp_layer_types": ["dense", "sparse", "sparse"], "index_n_heads": 2,
              "index_head_dim": 32, "index_block_size": 4, "index_topk_blocks": 1024,
              "index_local_blocks": 1}
FAMILIES: dict[str, dict] = {
    "llama": {},
    "llama-tied-llama3rope": {
        "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    },
    "llama-yarn": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 256}},
    "mistral": {"sliding_window": 24},  # every layer slides
    # q/k/v biases; the second layer slides (max_window_layers), written as layer_types
    "qwen2": {"use_sliding_window": True, "sliding_window": 12, "max_window_layers": 1},
    "qwen3": {"head_dim": 32},  # q/k norms, head_dim != hidden / heads
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
               "attn_logit_softcapping": 5.0, "final_logit_softcapping": 10.0},
    "gemma3_text": {
        "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
        },
    },
    # partial rotary (as Phi-4-mini), longrope whose original window is the bundle's context
    "phi3": {
        "hidden_size": 128, "partial_rotary_factor": 0.5, "max_position_embeddings": 2048,
        "original_max_position_embeddings": 512,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5,
                                                              3.0, 3.5],
                         "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 9.0]},
    },
    # Gemma3ForConditionalGeneration (a tiny vision tower beside it): these keys are its
    # text_config's; it applies no final soft-cap, the key notwithstanding.
    "gemma3": {
        "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
        "final_logit_softcapping": 10.0,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
        },
    },
    # Qwen2-VL and Qwen2.5-VL's language model (Qwen2 with M-RoPE sections over head_dim
    # 16's eight frequencies); Qwen2.5-VL's second layer slides, as qwen2's.
    "qwen2_vl": {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                     "rope_theta": 10000.0}},
    "qwen2_5_vl": {"use_sliding_window": True, "sliding_window": 12, "max_window_layers": 1,
                   "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                       "rope_theta": 10000.0}},
    # Qwen3 with interleaved M-RoPE, tied as the 2B/4B are
    "qwen3_vl": {"head_dim": 32, "tie_word_embeddings": True, "rope_parameters": {
        "rope_type": "default", "mrope_section": [8, 4, 4], "mrope_interleaved": True,
        "rope_theta": 10000.0}},
    # Phi-4-multimodal: Phi-3 beside image and audio embedders as small as their configs allow
    "phi4_multimodal": {
        "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                          "crop_size": 28, "image_token_id": 120},
        "audio_config": {"hidden_size": 16, "intermediate_size": 32, "num_blocks": 1,
                         "num_attention_heads": 2, "ext_pw_out_channel": 16,
                         "depthwise_separable_out_channel": 16, "nemo_conv_channels": 16,
                         "audio_token_id": 121, "left_chunk": 2}},
    "smollm3": {"no_rope_layer_interval": 2},  # the second layer has no rope
    "granite": {"embedding_multiplier": 2.0, "attention_multiplier": 0.1,
                "residual_multiplier": 0.5, "logits_scaling": 2.0},
    "olmo2": {},
    # a local and a global layer, each with its own rope
    "olmo3": {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
              "rope_parameters": {
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                  "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}}},
    "ernie4_5": {"head_dim": 32},  # interleaved rotary
    # the first layer slides with rotary, the second is global without (hybrid attention)
    "exaone4": {"sliding_window": 8, "sliding_window_pattern": 2},
    "arcee": {},  # ReLU-squared MLP without a gate
    # q/k norms of the rotated q and k, head_dim != hidden / heads, the Hub's fixed-alpha
    # NTK rope (written as the checkpoints write it), q/k/v and o biases
    "hunyuan_v1_dense": {"head_dim": 32, "attention_bias": True, "rope_theta": 10000.0,
                         "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}},
    # rotary on interleaved pairs of half of each head (the default partial_rotary_factor),
    # fused gate_up, q/k/v biases; GLM-4 adds norms after attention and MLP
    "glm": {"head_dim": 32},
    "glm4": {"head_dim": 32},
    # LayerNorm with bias, biases on every projection, gelu MLP, a window on every layer
    "starcoder2": {"sliding_window": 24, "tie_word_embeddings": True},
    # interleaved rotary, q/k/v biases without an o bias
    "helium": {"head_dim": 16, "attention_bias": True},
    # a sliding and a global layer
    "ministral": {"head_dim": 16, "sliding_window": 12,
                  "layer_types": ["sliding_attention", "full_attention"]},
    # Llama 4's query scale from position 8 on (the prompts cross several of its steps), a
    # yarn rope, and a window on every layer
    "ministral3": {"head_dim": 16, "sliding_window": 24, "rope_parameters": MINISTRAL3_ROPE},
    # Mistral3ForConditionalGeneration's Ministral 3 (a tiny vision tower beside it), tied
    # as the 3B is
    "mistral3": {"model_type": "ministral3", "head_dim": 16, "tie_word_embeddings": True,
                 "rope_parameters": MINISTRAL3_ROPE},
    # the Hub's tensor names, a llama3 rope whose original window the prompts cross, tied as
    # the 2.4B is
    "exaone": {"tie_word_embeddings": True, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    # q/k/v biases by default, the o bias on its own key, head_dim != hidden / heads
    "seed_oss": {"head_dim": 32, "attention_out_bias": True},
    # short-conv layers around two attention layers (the conv state beside the KV cache);
    # an MLP width from block_auto_adjust_ff_dim's rounding (2/3 x 96 x 1.3 -> 83 -> 96)
    "lfm2": {"num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv",
                                                     "full_attention"],
             "block_multiple_of": 16, "block_ffn_dim_multiplier": 1.3, "conv_bias": True},
    # Gated DeltaNet layers around one gated attention layer (rotary on a quarter of its
    # heads); two key heads serving four value heads each of another size
    "qwen3_5_text": QWEN3_5,
    # Qwen3_5ForConditionalGeneration's language model (a tiny vision tower beside it),
    # tied as the 0.8B is, with the Hub's interleaved M-RoPE sections
    "qwen3_5": {**QWEN3_5, "tie_word_embeddings": True, "rope_parameters": {
        "rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True,
        "rope_theta": 10000.0, "partial_rotary_factor": 0.25}},
    # Qwen3.5-MoE: the Qwen3.5 layers above, each with 8 routed experts (top 2, always
    # renormalized) beside a gated shared expert
    "qwen3_5_moe_text": QWEN3_5_MOE,
    # Qwen3_5MoeForConditionalGeneration's language model (a tiny vision tower beside it)
    "qwen3_5_moe": {**QWEN3_5_MOE, "rope_parameters": {
        "rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True,
        "rope_theta": 10000.0, "partial_rotary_factor": 0.25}},
    # Qwen3-VL-MoE's language model (a tiny vision tower beside it): a dense layer between
    # two of 8 experts (top 2, always renormalized), stored fused (neither I nor 2I is hidden)
    "qwen3_vl_moe": {"head_dim": 32, "num_hidden_layers": 3, "mlp_only_layers": [1],
                     "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 96,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [8, 4, 4],
                                         "mrope_interleaved": True, "rope_theta": 10000.0}},
    # Qwen3-Next: the Qwen3.5 layers above (their DeltaNet projections grouped per key
    # head), experts beside a gated shared expert on all but the last layer (dense)
    "qwen3_next": {**QWEN3_5_MOE, "mlp_only_layers": [3], "norm_topk_prob": True},
    # Lfm2VlForConditionalGeneration's LFM2 (a tiny SigLIP 2 tower beside it), tied as the
    # Hub's are
    "lfm2_vl": {"model_type": "lfm2", "num_hidden_layers": 4,
                "layer_types": ["conv", "full_attention", "conv", "full_attention"],
                "conv_bias": True, "tie_word_embeddings": True},
    # LFM3: short-conv layers beside a sliding layer (a window the prompts cross) and a
    # global one, each with its rope (the global one proportional: half of each head's
    # frequencies rotate), an output gate per head and norms after each sublayer
    "lfm3": LFM3,
    # Lfm3VlForConditionalGeneration's LFM3 (a tiny vision tower beside it), tied
    "lfm3_vl": {**LFM3, "model_type": "lfm3", "tie_word_embeddings": True},
    "phi": {"num_attention_heads": 2, "num_key_value_heads": 2, "partial_rotary_factor": 0.5},
    "stablelm": {"num_attention_heads": 2, "num_key_value_heads": 2,
                 "partial_rotary_factor": 0.5, "use_qkv_bias": True},
    "cohere": {"logit_scale": 0.25},
    # Granite 4.0 dense: attention layers (legacy names), no experts, the dense MLP narrower
    # than intermediate_size, rotary as granite-4.0-micro; the "nope" variant has none
    "granitemoehybrid": {**GRANITE4, "position_embedding_type": "rope"},
    "granitemoehybrid-nope": {**GRANITE4, "position_embedding_type": "nope"},
    # Granite 4.0-H: Mamba-2 layers (a conv and a float32 recurrent state) around attention
    "granitemoehybrid-mamba": GRANITE4_H,
    # Nemotron-H: blocks of one Mamba-2 mixer, attention (no rotary) or ReLU-squared MLP;
    # the second mamba block has no MLP after it, 8 heads of 16 in 2 groups, biases on the
    # mamba projections (use_bias)
    "nemotron_h": {"layers_block_type": ["linear_attention", "mlp", "linear_attention",
                                         "full_attention", "mlp", "linear_attention", "mlp"],
                   "head_dim": 16, "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2,
                   "ssm_state_size": 16, "conv_kernel": 4, "chunk_size": 16, "use_bias": True},
    # Bamba: Mamba-2 layers around an attention layer (rotary on half of head_dim 32, q/k/v/o
    # biases), 8 heads in 2 groups
    "bamba": {"num_hidden_layers": 3, "attn_layer_indices": [1], "head_dim": 32,
              "attention_bias": True, "mamba_n_heads": 8, "mamba_n_groups": 2,
              "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_chunk_size": 16},
    # Falcon-H1: attention and Mamba-2 side by side in each layer (KV and both states),
    # every muP multiplier away from 1, the mixer's gated RMSNorm (gate first), 8 heads of
    # 16 in 2 groups
    "falcon_h1": {"head_dim": 16, "mamba_d_ssm": 128, "mamba_n_heads": 8, "mamba_n_groups": 2,
                  "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_chunk_size": 16,
                  "mamba_rms_norm": True, "mamba_norm_before_gate": False,
                  "attention_in_multiplier": 0.7, "attention_out_multiplier": 0.9,
                  "key_multiplier": 1.3, "ssm_in_multiplier": 0.8, "ssm_out_multiplier": 1.1,
                  "ssm_multipliers": [0.5, 1.5, 0.8, 1.2, 0.9], "mlp_multipliers": [1.2, 0.8],
                  "embedding_multiplier": 2.0, "lm_head_multiplier": 0.5},
    # Mamba-2: every layer a mixer, nothing attends (a bundle without KV); 8 heads of 16 in
    # 2 groups, biases on the projections (use_bias), tied as mamba2-130m is
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 2, "state_size": 16,
               "conv_kernel": 4, "chunk_size": 16, "use_bias": True,
               "tie_word_embeddings": True},
    # Mamba-1: every layer a selective-scan mixer (128 channels, a state of 8, dt rank 6),
    # biased projections, tied as the Hub's are; Falcon-Mamba adds weightless norms on B,
    # C and dt
    "mamba": {"state_size": 8, "time_step_rank": 6, "use_bias": True,
              "tie_word_embeddings": True},
    "falcon_mamba": {"state_size": 8, "time_step_rank": 6, "mixer_rms_eps": 1e-3,
                     "tie_word_embeddings": True},
    # RWKV-4: every layer a time mix and a channel mix (no KV), the stream halved after
    # every second layer (and layers 2 and 3's output weights divided by 2); its time_*
    # parameters and LayerNorms perturbed (build_hf_model)
    "rwkv": {"num_hidden_layers": 4, "rescale_every": 2},
    # xLSTM: every layer an mLSTM cell (4 heads: q/k of 16, v of 32) and a SwiGLU of 384,
    # no KV. A chunk_size above every test prompt runs transformers' recurrent step for a
    # prompt too (its chunkwise form equals it up to rounding), in float32. Its gate
    # projections (zero at init) and LM head drawn by build_hf_model, the forget gates'
    # biases left as transformers initializes them (3 to 6: a long memory); a gate cap
    # the gates reach and a denominator eps the stabilizer's scale shows through (at the
    # Hub's 1e-6 no output depends on m: it cancels)
    "xlstm": {"hidden_size": 128, "num_heads": 4, "chunk_size": 4096,
              "autocast_kernel_dtype": "float32", "gate_soft_cap": 5.0, "eps": 0.1},
    # LayerNorm1P, ReLU-squared MLP, rotary on half of each head (head_dim 32: rotary 16)
    "nemotron": {"head_dim": 32},
    # layer 0 slides with rotary, layer 1 is global without
    "cohere2": {"logit_scale": 0.25, "sliding_window": 8, "sliding_window_pattern": 2},
    "gpt_neox": {"num_attention_heads": 2, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
    # learned absolute positions, Conv1D weights, fused qkv, tied head, an MLP n_inner wide
    "gpt2": {"n_inner": 80, "tie_word_embeddings": True},
    # GPT-2 with nn.Linear weights and one KV head (multi-query)
    "gpt_bigcode": {"n_inner": 80, "tie_word_embeddings": True},
    # BitNet: sub-norms before o_proj and down_proj, a gated ReLU-squared MLP; as float
    # weights (no quantization_config: plain projections), as the Hub's packed ternary
    # BitLinear weights with a scale each, and as master weights quantized online
    # Apertus: per-head q/k norms, xIELU with alphas of each layer's own (randomized:
    # build_hf_model), its default llama3 rope on a 64-position original window
    "apertus": {"rope_parameters": {**APERTUS_ROPE}},
    "apertus1p5_text": {"tie_word_embeddings": True, "rope_parameters": {**APERTUS_ROPE}},
    # VaultGemma: Gemma 2's soft-caps and sliding layers, pre-norm layers
    "vaultgemma": {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
                   "attn_logit_softcapping": 5.0, "final_logit_softcapping": 10.0},
    # CWM: a global layer then a sliding one (its default pattern), a llama3 rope whose
    # original window the prompts cross
    "cwm": {"head_dim": 16, "sliding_window": 12, "rope_parameters": {
        **APERTUS_ROPE, "rope_theta": 1e6, "factor": 16.0}},
    "iquestcoder": {"head_dim": 32},  # Llama, head_dim != hidden / heads
    # Jais 2: LayerNorm with bias, ReLU-squared MLP, biases everywhere (its defaults)
    "jais2": {},
    # OLMo 1: LayerNorm without weights, q/k/v clamped where they reach 1.5
    "olmo": {"clip_qkv": 1.5},
    # HyperCLOVA X: Granite's multipliers (the logits times logits_scaling), norms after
    # attention and MLP; the "pre" variant without them
    "hyperclovax": {"embedding_multiplier": 2.0, "attention_multiplier": 0.1,
                    "residual_multiplier": 0.5, "logits_scaling": 2.0},
    "hyperclovax-pre": {"use_post_norm": False, "residual_multiplier": 0.5,
                        "logits_scaling": 2.0},
    # Granite SWA: a global layer without rotary, then a sliding one with a rope base of its
    # own, each with a sink per head (randomized: build_hf_model), Granite's multipliers
    "granite_swa": {"sliding_window": 8, "layer_rope_theta": [0, 5000.0],
                    "embedding_multiplier": 2.0, "attention_multiplier": 0.1,
                    "residual_multiplier": 0.5, "logits_scaling": 2.0},
    # Granite MoE Shared: Granite MoE's experts beside a gated shared MLP (fused input_linear)
    "granitemoeshared": {"num_local_experts": 8, "num_experts_per_tok": 2,
                         "intermediate_size": 32, "shared_intermediate_size": 48,
                         "embedding_multiplier": 2.0, "residual_multiplier": 0.5},
    # Granite MoE SWA: those experts under Granite SWA's attention
    "granitemoe_swa": {"num_local_experts": 8, "num_experts_per_tok": 2,
                       "intermediate_size": 32, "shared_intermediate_size": 48,
                       "sliding_window": 8, "layer_rope_theta": [0, 5000.0],
                       "attention_multiplier": 0.1},
    # nanochat: weightless RMSNorms (the embedding's too), q/k norms after its reversed
    # rotary, ReLU-squared MLP, a final soft-cap that bites
    "nanochat": {"head_dim": 16, "final_logit_softcapping": 3.0},
    "bitnet": {},
    "bitnet-packed": {},
    "bitnet-online": {},
    # Gemma 4: sliding and full layers, the full ones with heads twice as wide under a
    # proportional rope, per-layer inputs, the last two layers (one of each kind) reading
    # the KV of the two before them, double-wide MLPs there, the final soft-cap
    "gemma4_text": GEMMA4,
    # Gemma4ForConditionalGeneration's language model (a tiny vision tower beside it), tied
    # as the Hub's are; its full layers' values are their keys (attention_k_eq_v), on one
    # KV head of their own
    "gemma4": {**GEMMA4, "tie_word_embeddings": True, "attention_k_eq_v": True,
               "num_global_key_value_heads": 1},
    # Multi-head latent attention (export/latent_attention.py): one cached head of rope 16
    # + latent 32, values (24) narrower than keys (16 + 16). MiniCPM3: a low-rank query,
    # MiniCPM's embedding, residual and logits scales (hidden / dim_model_base = 2)
    # (transformers' MLA needs as many KV heads as heads)
    "minicpm3": {"num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
                 "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 24,
                 "dim_model_base": 32},
    # Youtu-LLM: a dense q_proj, biases (attention_bias), interleaved rotary, and a yarn
    # rope with mscale_all_dim (the softmax scale times mscale^2)
    "youtu": {"num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 32,
              "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 24,
              "attention_bias": True,
              "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                  "original_max_position_embeddings": 256, "mscale": 0.707,
                                  "mscale_all_dim": 1.0}},
    # DeepSeek-V2: MLA as V2-Lite's (a dense q_proj) with DeepSeek's complex rotary; a dense
    # first layer, then 8 experts in 2 groups, the top 2 from the best group (so unlike
    # greedy's, the second expert may not be the second best), scaled, beside a shared
    # expert
    "deepseek_v2": {"num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": None,
                    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                    "v_head_dim": 24, "first_k_dense_replace": 1, "n_routed_experts": 8,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "n_shared_experts": 1, "topk_method": "group_limited_greedy",
                    "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5},
    # DeepSeek-V3: MLA as test_mla's with a low-rank query, interleaved rotary and a yarn
    # rope with mscale_all_dim; a dense first layer, then 12 experts in 3 groups, the top 3
    # from the best 2 groups chosen by a random correction bias (build_hf_model), scaled,
    # beside a shared expert
    "deepseek_v3": {"num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": 32,
                    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                    "v_head_dim": 24, "first_k_dense_replace": 1, "n_routed_experts": 12,
                    "n_group": 3, "topk_group": 2, "num_experts_per_tok": 3,
                    "moe_intermediate_size": 32, "n_shared_experts": 1,
                    "routed_scaling_factor": 2.5,
                    "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                        "rope_theta": 10000.0, "mscale": 0.707,
                                        "mscale_all_dim": 1.0,
                                        "original_max_position_embeddings": 256}},
    # Mistral Small 4: DeepSeek-V3's MLA with a softmax router (12 experts in 3 groups, the
    # best 2 kept) and Llama 4's query factor past 4 positions (beta 0.5)
    "mistral4": {"num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": 32,
                 "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                 "v_head_dim": 24, "first_k_dense_replace": 1, "n_routed_experts": 12,
                 "n_group": 3, "topk_group": 2, "num_experts_per_tok": 3,
                 "moe_intermediate_size": 32, "n_shared_experts": 1,
                 "routed_scaling_factor": 1.5,
                 "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                     "rope_theta": 10000.0, "mscale": 1.0,
                                     "mscale_all_dim": 1.0, "partial_rotary_factor": 0.5,
                                     "llama_4_scaling_beta": 0.5,
                                     "original_max_position_embeddings": 4}},
    # Sarvam: DeepSeek-V3 with a dense query, 8 experts in 4 groups (the best 2), q/k/v/o
    # biases (attention_bias)
    "sarvam_mla": {"num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": None,
                   "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                   "v_head_dim": 24, "first_k_dense_replace": 1, "n_routed_experts": 8,
                   "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "n_shared_experts": 2,
                   "attention_bias": True},
    # GLM-4.7-Flash: DeepSeek-V3's MLA, experts where mlp_layer_types says (layers 1 and 3)
    "glm4_moe_lite": {"num_hidden_layers": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
                      "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                      "v_head_dim": 24, "mlp_layer_types": ["dense", "sparse", "dense",
                                                            "sparse"],
                      "n_routed_experts": 12, "n_group": 4, "topk_group": 3,
                      "num_experts_per_tok": 3, "moe_intermediate_size": 32,
                      "n_shared_experts": 1, "routed_scaling_factor": 1.8},
    # A.X K1: the GLM-4.7-Flash fixture (experts on layers 1 and 3, 12 in 3 groups, the
    # best 2) with each expert block's output normed (post_mlp_layernorm)
    "axk1": {"num_hidden_layers": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
             "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
             "v_head_dim": 24, "mlp_layer_types": ["dense", "sparse", "dense", "sparse"],
             "n_routed_experts": 12, "n_group": 3, "topk_group": 2,
             "num_experts_per_tok": 3, "moe_intermediate_size": 32, "n_shared_experts": 1,
             "routed_scaling_factor": 2.5},
    # LongCat-Flash: 2 layers of two MLA sublayers (test_mla's shapes, low-rank query),
    # each layer's experts 4 real and 2 identity, the top 2 chosen by a random correction
    # bias (build_hf_model), scaled
    "longcat_flash": {"num_hidden_layers": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
                      "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                      "head_dim": 16, "v_head_dim": 24, "n_routed_experts": 4,
                      "zero_expert_num": 2, "moe_topk": 2, "expert_ffn_hidden_size": 32,
                      "routed_scaling_factor": 1.5},
    # DeepSeek-V3.2: GLM-4.7-Flash's MLA fixture with DSA's indexer on every layer. Its
    # index_topk is past the bundles' context (dense MLA exactly, no indexer in the bundle);
    # test_sparse_attention exports it with index_topk 8.
    "deepseek_v32": {"num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": 32,
                     "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                     "v_head_dim": 24, "first_k_dense_replace": 1, "n_routed_experts": 12,
                     "n_group": 4, "topk_group": 3, "num_experts_per_tok": 3,
                     "moe_intermediate_size": 32, "n_shared_experts": 1,
                     "index_topk": 2048, "index_head_dim": 32, "index_n_heads": 16},
    # GLM-5: the same under GLM-5's interleaved indexer rotary, its second and fourth layers
    # reusing the first and third's selection
    "glm_moe_dsa": {"num_hidden_layers": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
                    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                    "v_head_dim": 24, "first_k_dense_replace": 1, "n_routed_experts": 12,
                    "n_group": 4, "topk_group": 3, "num_experts_per_tok": 3,
                    "moe_intermediate_size": 32, "n_shared_experts": 1,
                    "index_topk": 2048, "index_head_dim": 32, "index_n_heads": 16,
                    "indexer_types": ["full", "shared", "full", "shared"]},
    # A.X K2: the DeepSeek-V3.2 fixture with gated norms and a gated query, its experts
    # ungrouped on every other layer after the first
    "axk2": {"num_hidden_layers": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
             "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
             "v_head_dim": 24, "first_k_dense_replace": 1, "moe_layer_freq": 2,
             "n_routed_experts": 12, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
             "n_shared_experts": 1, "index_topk": 2048, "index_head_dim": 32,
             "index_n_heads": 16, "gated_norm_rank": 8},
    # Hy4: the DeepSeek-V3.2 fixture (8 ungrouped experts on every layer but the first,
    # their SwiGLU clamped at 1, which the fixture's gates pass) with 3 hyper-connection
    # streams (their scales and bases perturbed: build_hf_model), per-head sinks, a gate per
    # value channel, and Hy4's indexer schedule: layers 0 and 1 full, 2 and 3 reusing 1's
    "hy_v4": HY_V4,
    # Hy4-VL's language model (in HYV4VLForConditionalGeneration, beside a tiny tower): the
    # Hy4 fixture with its 3-D rotary's sections fitting 16 rotary dims (8 pairs; text
    # positions turn them all alike) and an rms_norm_eps of 0.1, which moves its latent
    # norms' outputs (Hy4's keep 1e-6).
    "hy_v4_vl": {**HY_V4, "rms_norm_eps": 0.1, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}},
    # MiniMax-M3's language model: indexed layers (blocks of 4 keys, the index heads 2, one
    # per KV head) around a plain one, partial rotary (16 of 32), a dense MLP then experts
    # beside a shared MLP, every SwiGLU clamped at 1 (which the fixture's gates pass). Its
    # index_topk_blocks past the bundles' context (test_minimax_m3 exports it with 3).
    "minimax_m3_vl_text": MINIMAX_M3,
    # and MiniMaxM3SparseForConditionalGeneration's language model, beside tiny towers
    "minimax_m3_vl": MINIMAX_M3,
    # dots.3 Note: DSA's indexed layers (GLM-5's interleaved indexer) beside sliding layers
    # (window 5) of latent sizes of their own (2 heads, ranks 20 and 16, rope 16 of 28;
    # the indexed layers' 4 heads, ranks 32, rope 32 of 64), experts on layers 1 and 3; an
    # rms_norm_eps of 0.1, which moves its latent norms' outputs (DeepSeek's keep 1e-6).
    # Its index_topk past the bundles' context (test_dots3 exports it with index_topk 8).
    "dots3_note_text": DOTS3,
    # and Dots3NoteForConditionalGeneration's language model, beside tiny towers
    "dots3_note": DOTS3,
    # Gemma 3n (GEMMA3N), and Gemma3nForConditionalGeneration's language model, tied as
    # the Hub's are (written by hand: image_text_gemma3n)
    "gemma3n_text": GEMMA3N,
    "gemma3n": {**GEMMA3N, "tie_word_embeddings": True},
    # Gemma 4 Unified: the Gemma 4 fixture without per-layer inputs; the image-text one
    # (an encoder-free vision embedder beside it) tied, k = v on its full layers
    "gemma4_unified_text": GEMMA4_UNIFIED,
    "gemma4_unified": {**GEMMA4_UNIFIED, "tie_word_embeddings": True, "attention_k_eq_v": True,
                       "num_global_key_value_heads": 1},
    "lara_mini": LARA_MINI,
    "olmo_hybrid": OLMO_HYBRID,
    "kimi_linear": KIMI_LINEAR,
    "bailing_hybrid": BAILING_HYBRID,
    # Mixture-of-experts families (export/moe.py); 8 experts, so that in a chunk some get
    # no token. Qwen3-MoE: a dense layer between two of experts, renormalized top-k.
    "qwen3_moe": {"head_dim": 32, "num_hidden_layers": 3, "mlp_only_layers": [1],
                  "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "norm_topk_prob": True},
    # Mellum: Qwen3-MoE's layers, a sliding one (window 8) between full ones, each kind with
    # its rope base, experts on the sparse layers and a dense MLP on the first
    "mellum": {"head_dim": 32, "num_hidden_layers": 3, "sliding_window": 8,
               "layer_types": ["full_attention", "sliding_attention", "full_attention"],
               "mlp_layer_types": ["dense", "sparse", "sparse"], "num_experts": 8,
               "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "rope_parameters": {
                   "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                   "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}},
    # Flint: sinks on every layer, a sliding layer with rotary between full ones without,
    # a dense first layer, sigmoid routing (top 2 of 8, renormalized) beside an ungated
    # shared expert
    "flint": {"head_dim": 16, "num_hidden_layers": 3, "sliding_window": 8,
              "layer_types": ["full_attention", "sliding_attention", "full_attention"],
              "mlp_only_layers": [0], "num_experts": 8, "num_experts_per_tok": 2,
              "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48},
    # OLMoE: q/k norms over the whole projection; top-k weights not renormalized
    "olmoe": {"num_experts": 8, "num_experts_per_tok": 3, "intermediate_size": 32},
    # Granite MoE: the top 2 logits then softmax, Granite's multipliers, fused experts
    "granitemoe": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32,
                   "embedding_multiplier": 2.0, "attention_multiplier": 0.1,
                   "residual_multiplier": 0.5, "logits_scaling": 2.0},
    # LFM2-MoE: conv and attention layers, a dense first layer, sigmoid routing chosen by
    # an expert bias (randomized: build_hf_model), renormalized and scaled
    "lfm2_moe": {"num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv",
                                                         "full_attention"],
                 "num_dense_layers": 1, "num_experts": 8, "num_experts_per_tok": 3,
                 "moe_intermediate_size": 32, "routed_scaling_factor": 2.5,
                 "conv_bias": True},
    # Mixtral: the Hub's w1/w3/w2 experts, softmax top 2 renormalized, a window on every
    # layer
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32,
                "sliding_window": 12},
    # MiniMax-Text-01: lightning attention (linear, a decay per head) on layers 1 and 2,
    # softmax attention on 0 and 3, Mixtral's experts, residuals scaled per layer type
    # (block_size 8: transformers' prompt blocks cross within a 40-token prompt)
    "minimax": {"num_hidden_layers": 4, "head_dim": 16, "num_local_experts": 8,
                "num_experts_per_tok": 2, "intermediate_size": 32, "block_size": 8,
                "layer_types": ["full_attention", "linear_attention", "linear_attention",
                                "full_attention"],
                "full_attn_alpha_factor": 0.7, "full_attn_beta_factor": 1.3,
                "linear_attn_alpha_factor": 0.9, "linear_attn_beta_factor": 1.2,
                "mlp_alpha_factor": 1.1, "mlp_beta_factor": 0.8},
    # ERNIE-4.5-MoE: a dense first layer, softmax routing chosen by a selection bias
    # (randomized: build_hf_model), two shared experts (one ungated MLP), interleaved rotary
    "ernie4_5_moe": {"num_hidden_layers": 3, "moe_num_experts": 8, "moe_k": 2,
                     "moe_intermediate_size": 32, "moe_num_shared_experts": 2,
                     "moe_layer_start_index": 1},
    # Qwen2-MoE: q/k/v biases, a shared expert gated by a sigmoid beside the routed ones
    "qwen2_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 48},
    # DeepSeek-V3's routing (export/experts.py): sigmoid scores chosen by a random
    # correction bias (build_hf_model) within the best topk_group of n_group groups, so that
    # a wrong group rule chooses other experts; shared experts beside them.
    # GLM-4.5: a dense first layer, rotary on half of each head, q/k/v biases, q/k norms
    "glm4_moe": {"num_hidden_layers": 3, "first_k_dense_replace": 1, "head_dim": 32,
                 "attention_bias": True, "use_qk_norm": True, "n_routed_experts": 12,
                 "n_group": 3, "topk_group": 2, "num_experts_per_tok": 3,
                 "moe_intermediate_size": 32, "n_shared_experts": 1,
                 "routed_scaling_factor": 2.5, "norm_topk_prob": True},
    # Sarvam-MoE: GLM-4.5's (whole heads rotated), saved in the remote code's names; 4
    # groups of 3 experts, the best 2 (with 3 groups a chunk's tokens chose one set)
    "sarvam_moe": {"num_hidden_layers": 3, "first_k_dense_replace": 1, "head_dim": 32,
                   "attention_bias": True, "n_routed_experts": 12, "n_group": 4,
                   "topk_group": 2, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
                   "n_shared_experts": 1, "routed_scaling_factor": 2.5},
    # MiMo-V2-Flash: a full layer, then two sliding ones (window 8) with twice its KV heads
    # and sinks; value heads of 16 beside q/k heads of 32; experts (the best group of 2)
    # after a dense first layer
    "mimo_v2_flash": {"num_hidden_layers": 3, "num_key_value_heads": 1, "head_dim": 32,
                      "v_head_dim": 16, "sliding_window": 8, "n_routed_experts": 8,
                      "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
                      "moe_intermediate_size": 32, "routed_scaling_factor": 2.5,
                      "rope_parameters": {  # a half of each head: the ort flavour's 16
                          "full_attention": {"rope_type": "default", "rope_theta": 5e6,
                                             "partial_rotary_factor": 0.5},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 100.0,
                                                "partial_rotary_factor": 0.5}}},
    # GLM-4.5V's language model (its vision tower beside it): GLM-4.5's without q/k norms,
    # M-RoPE sections of the rotary half of each head
    "glm4v_moe": {"num_hidden_layers": 3, "first_k_dense_replace": 1, "head_dim": 32,
                  "attention_bias": True, "n_routed_experts": 12, "n_group": 3,
                  "topk_group": 2, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "n_shared_experts": 1, "routed_scaling_factor": 1.5,
                  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                      "partial_rotary_factor": 0.5,
                                      "mrope_section": [2, 3, 3]}},
    # dots.llm1: Qwen3's attention, sliding from layer 1; top-k weights not renormalized
    "dots1": {"num_hidden_layers": 3, "first_k_dense_replace": 1, "n_routed_experts": 8,
              "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
              "moe_intermediate_size": 32, "n_shared_experts": 2, "norm_topk_prob": False,
              "sliding_window": 12, "max_window_layers": 1},
    # EXAONE-MoE: EXAONE 4's sliding and (unrotated) global layers, experts where
    # mlp_layer_types says
    "exaone_moe": {"num_hidden_layers": 4, "sliding_window": 12, "sliding_window_pattern": 2,
                   "mlp_layer_types": ["dense", "sparse", "dense", "sparse"],
                   "num_experts": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3,
                   "moe_intermediate_size": 32, "num_shared_experts": 1},
    # Solar Open: Llama attention with q/k/v biases, experts on every layer
    "solar_open": {"head_dim": 16, "attention_bias": True, "n_routed_experts": 12,
                   "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "routed_scaling_factor": 1.5},
    # Kolibri-1: GLM-4's sandwich norms around EXAONE 4's attention; the bias chooses on
    # the router's logits, the sigmoid of the chosen logits weighs
    "kolibri1": {"num_hidden_layers": 3, "head_dim": 16, "sliding_window": 12,
                 "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                 "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "shared_expert_intermediate_size": 48, "norm_topk_prob": True},
    # gpt-oss: a sliding then a full layer, each with sinks; experts with biases and the
    # clamped SwiGLU, fused [E, in, out] as GptOssExperts saves them (gate_up [8, 64, 128]);
    # a limit low enough that the clamps bite on these weights (the Hub's is 7)
    "gpt_oss": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 64,
                "head_dim": 16, "sliding_window": 8, "swiglu_limit": 1.5,
                "swiglu_alpha": 1.5},
    # Jamba: Mamba-1 mixers (dt, B and C normed by weights) on layers 0, 2, 3, attention
    # without rotary on 1; experts (softmax top 2 of 4, not renormalized) on the attention
    # layer and a mamba one, a dense MLP on the others; biased mixer projections
    "jamba": {"num_hidden_layers": 4, "attn_layer_period": 3, "attn_layer_offset": 1,
              "expert_layer_period": 2, "expert_layer_offset": 1, "num_experts": 4,
              "num_experts_per_tok": 2, "intermediate_size": 32, "mamba_d_state": 8,
              "mamba_dt_rank": 6, "mamba_proj_bias": True},
    # Zamba2: Mamba-2 layers (8 heads of 16 in 2 groups), two shared blocks applied before
    # the mixers of layers 1, 3 and 4 (block 0, 1, 0), each application with its own
    # q/k/v and gate_up adapters and KV; rotary (use_mem_rope); heads of 2 x 64 / 4; tied
    # as the Hub's (which ties the blocks too). Weights of 0.1, not 0.2: at 0.2 the shared
    # attention (its inputs twice as wide) makes transformers' own fp32 logits drift 1e-3
    # from its fp64 ones over 100 tokens; at 0.1, 3e-6.
    "zamba2": {"num_hidden_layers": 5, "num_key_value_heads": 4, "tie_word_embeddings": True,
               "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "hybrid"],
               "num_mem_blocks": 2, "use_shared_attention_adapter": True, "adapter_rank": 8,
               "use_mem_rope": True, "n_mamba_heads": 8, "mamba_ngroups": 2,
               "mamba_d_state": 16, "chunk_size": 16, "initializer_range": 0.1},
    # Zamba: multi-head Mamba-1 layers (2 heads of 64, a state of 8), one shared block
    # before the mixers of layers 1 and 3, heads of 2 x 64 / 4 without rotary; weights of
    # 0.1 as zamba2's
    "zamba": {"num_hidden_layers": 5, "num_key_value_heads": 4, "tie_word_embeddings": True,
              "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "mamba"],
              "n_mamba_heads": 2, "mamba_d_state": 8, "mamba_proj_bias": True,
              "initializer_range": 0.1},
    # RecurrentGemma: RG-LRU blocks on layers 0, 1 and 3 (3 heads of 32), local attention
    # (a window of 12, one KV head, rotary on half of each head) on layer 2; hidden 96, so
    # that sqrt(hidden) is not a bfloat16 (the model's embedding scale is rounded to one)
    "recurrent_gemma": {"num_hidden_layers": 4, "hidden_size": 96, "num_attention_heads": 3,
                        "num_key_value_heads": 1,
                        "attention_window_size": 12, "logits_soft_cap": 5.0,
                        "attention_bias": True},
    # ALiBi: 6 heads of 16, a head count that is no power of two (whose slopes interleave);
    # BLOOM tied as the Hub's, MPT untied with its q/k/v clamped (the bound bites on these
    # weights) and an alibi table longer than the bundles' context
    "bloom": {"hidden_size": 96, "num_attention_heads": 6, "tie_word_embeddings": True},
    "mpt": {"hidden_size": 96, "num_attention_heads": 6, "max_seq_len": 1024,
            "attn_config": {"clip_qkv": 3.0}},
    # Llama 4: three rope layers (L2 q/k norm) and a NoPE one whose queries the temperature
    # scales (floor_scale 8: a step every 8 positions), experts on every second layer (a
    # dense MLP on the others) taking the token times sigmoid of its top logit, beside a
    # shared expert; chunks of 8192 (the cap is test_llama4's). The image-text fixture:
    # the top 2 experts on every layer (the ort flavour unrolls them), no q/k norm.
    "llama4_text": LLAMA4,
    "llama4": {**LLAMA4, "num_experts_per_tok": 2, "interleave_moe_layer_step": 1,
               "use_qk_norm": False},
    # PhiMoE: sparsemixer's two choices among 8 experts (a gap of 2 x 0.3 relative to the
    # best logit, so that several logits share each softmax), LayerNorms, every bias, a
    # longrope with short_mscale up to its original window (the bundle's context)
    "phimoe": {"num_local_experts": 8, "intermediate_size": 32, "router_jitter_noise": 0.3,
               "attention_bias": True, "lm_head_bias": True, "rope_parameters": {
                   "rope_type": "longrope", "rope_theta": 10000.0,
                   "short_factor": [1.0 + 0.1 * i for i in range(8)],
                   "long_factor": [1.0 + 0.5 * i for i in range(8)], "short_mscale": 1.1,
                   "long_mscale": 1.3, "original_max_position_embeddings": 1024}},
    # Hunyuan-A13B: HunYuan's attention (q/k norms of the rotated q/k, an NTK-alpha rope),
    # softmax top 2 of 8 renormalized on every layer, a shared MLP beside them
    "hunyuan_v1_moe": {"head_dim": 16, "num_experts": 8, "moe_topk": 2,
                       "intermediate_size": 32, "attention_bias": True,
                       "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0,
                                           "factor": 1.0, "rope_theta": 10000.0}},
    # DBRX: its own config keys (d_model, ...: build_hf_model's common ones go unread), q/k/v
    # clamped at 0.5, the top 2 of 8 experts renormalized, stacked [E * I, H]
    "dbrx": {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 1024,
             "attn_config": {"kv_n_heads": 2, "clip_qkv": 0.5, "rope_theta": 10000.0},
             "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 8, "moe_top_k": 2}},
    # FlexOlmo: OLMo 2's post-norm layers, OLMoE's top 3 of 8 experts renormalized
    "flex_olmo": {"num_experts": 8, "num_experts_per_tok": 3, "intermediate_size": 32,
                  "norm_topk_prob": True},
    # MiniMax-M2: q/k norms over the whole projection, rotary on half of each head, the
    # top 2 of 8 by sigmoid + a correction bias (randomized: build_hf_model), renormalized
    "minimax_m2": {"head_dim": 32, "rotary_dim": 16, "num_local_experts": 8,
                   "num_experts_per_tok": 2, "intermediate_size": 32},
    # Hy3: per-head q/k norms, q/k/v/o biases, a dense layer then one of experts: the top 2
    # of 8 by sigmoid + a correction bias (randomized: build_hf_model), renormalized and
    # scaled, beside an ungated shared MLP (with a third layer, its tokens 16-18 choose
    # the same 2 experts)
    "hy_v3": {"head_dim": 16, "attention_bias": True,
              "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "num_shared_experts": 1, "router_scaling_factor": 1.5},
    # Aria's language model: the top 2 of 8 experts (softmax over the top 2 logits) stored
    # [E, in, out], a shared MLP two experts wide, q/k/v/o biases
    "aria_text": {"moe_num_experts": 8, "moe_topk": 2, "intermediate_size": 32,
                  "moe_num_shared_experts": 2, "attention_bias": True},
    # Cohere 2 MoE: a dense prefix layer (full attention, yet rotated) then sliding and
    # full layers alternating; RMSNorm (rms_norm_eps set); the sigmoid of the top 2 of 8
    # router logits renormalized, averaged with a shared MLP (the config's default)
    "cohere2_moe": {"num_hidden_layers": 4, "head_dim": 16, "first_k_dense_replace": 1,
                    "sliding_window": 8, "sliding_window_pattern": 2, "num_experts": 8,
                    "num_experts_per_tok": 2, "intermediate_size": 32,
                    "prefix_dense_intermediate_size": 48, "num_shared_experts": 1,
                    "rms_norm_eps": 1e-6, "logit_scale": 0.25, "expert_selection_fn": "sigmoid"},
    # AFMoE: a dense layer then two of experts (the top 2 of 8 by sigmoid + a bias, both
    # randomized: build_hf_model), sliding layers then a full one without rotary, an output
    # gate of its own projection, norms around attention and MLP, muP's embedding scale
    "afmoe": {"num_hidden_layers": 3, "head_dim": 16, "sliding_window": 8,
              "global_attn_every_n_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
              "moe_intermediate_size": 32, "num_shared_experts": 1, "route_scale": 1.5,
              "mup_enabled": True},
    # Laguna: sliding (window 8, rotated whole) and full layers (rotated on half of each
    # head, another base), 4, 2, 4 and 6 query heads over 2 KV heads, a softplus output
    # gate per head; dense, sparse, sparse, dense MLPs: the top 2 of 8 by sigmoid + a
    # correction bias (randomized: build_hf_model), renormalized, scaled, beside a shared
    # MLP. Its variants: a gate per channel (gating "per-element"), and router logits
    # soft-capped at 1 (tanh bites at the fixture's logits, a few units wide).
    "laguna": LAGUNA,
    "laguna-per-element": {**LAGUNA, "gating": "per-element"},
    "laguna-softcap": {**LAGUNA, "moe_router_logit_softcapping": 1.0},
    # Step 3.7 (its step3p5 language model; the Hub's keys): Gemma's norms, a sigmoid gate
    # per head, 6 query heads on the sliding layers (window 8) and 4 on the full ones, a
    # rope base and rotated share per layer type (rope_theta, partial_rotary_factors per
    # layer), sigmoid routing with a correction bias (randomized: build_hf_model), scaled,
    # beside a shared MLP; scores scaled by 16 ** -0.5 (query_pre_attn_scalar; head_dim 32);
    # SwiGLU clamped at 1 and 0.5 (the fixture's gates and ups reach
    # a few units) on some layers' experts, shared MLPs and dense MLPs.
    "step3p7": STEP3P7,
    # ZAYA: CCA attention on every layer (q/k convolved over 2 then 3 tokens: a state of
    # 3 raw q/k beside the delayed value's), sliding (window 8) and full layers each
    # rotating half of each head at its own base, biases on q/k/v/o; 4 experts and the
    # skip expert chosen by the router carried across the 3 layers (its balancing biases,
    # the key scales and the residual scales randomized: build_hf_model)
    "zaya": {"num_hidden_layers": 3, "head_dim": 32, "sliding_window": 8,
             "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding"],
             "num_experts": 4, "moe_intermediate_size": 32, "router_hidden_size": 16,
             "cca_time0": 2, "cca_time1": 3, "attention_bias": True},
    # Inkling: layers 0 and 2 sliding (window 5, 2 heads of 32 over 1 KV head; the full
    # layers 4 of 16 over 2), their relative bias as wide as the window and the full
    # layers' 7 (rel_extent), so prompts past 7 tokens clamp and mask it; residual short
    # convolutions of 3 taps; dense MLPs on layers 0 and 3, 2 of 4 experts and 2 shared on
    # 1 and 2 (the global scales randomized: build_hf_model)
    "inkling_text": {"num_hidden_layers": 4, "head_dim": 16, "swa_num_attention_heads": 2,
                     "swa_num_key_value_heads": 1, "swa_head_dim": 32,
                     "sliding_window_size": 5, "d_rel": 4, "rel_extent": 7,
                     "local_layer_ids": [0, 2],
                     "mlp_layer_types": ["dense", "sparse", "sparse", "dense"],
                     "moe_intermediate_size": 24, "n_routed_experts": 4,
                     "num_experts_per_tok": 2, "n_shared_experts": 2, "route_scale": 1.7,
                     "logits_mup_width_multiplier": 2.0, "conv_kernel_size": 3},
    # Doge: dynamic mask attention (A and the residual weights randomized: build_hf_model),
    # per-head q/k norms; q/k/v/o, dt_proj and MLP biases. keep_window_size stays 2048, past the
    # bundles' context: its top-k over keys breaks ties in transformers' own order, and the
    # first layer's bias ties on every repeated token of these prompts (test_doge.py runs
    # the top-k on prompts without repeats).
    "doge": {"attention_bias": True, "mlp_bias": True},
    # DiffLlama: differential attention, 4 query heads over 2 KV heads (each value half
    # one head), q/k/v/o biases; the lambda vectors as initialized (std 0.1)
    "diffllama": {"attention_bias": True},
    # JetMoE: routed query/output projections (2 of 4 experts: 4 query heads over 2 KV heads
    # of 16) and routed MLP experts, each with its output bias
    "jetmoe": {"num_key_value_heads": 2, "kv_channels": 16, "num_local_experts": 4,
               "num_experts_per_tok": 2, "intermediate_size": 32,
               # far from the 1e-6 its layers' norms are built with (only the final norm
               # reads it)
               "rms_norm_eps": 0.05},
    # The GPT-2-era classics (export/families/classic.py). OPT: learned positions from row 2
    # of their table, ReLU MLP, tied as the Hub's are; OPT-350m's post-norm layers without a
    # final norm, and its narrower embedding projected in and out.
    "opt": {"ffn_dim": 80, "tie_word_embeddings": True},
    "opt-350m": {"ffn_dim": 80, "tie_word_embeddings": True, "do_layer_norm_before": False,
                 "word_embed_proj_dim": 32},
    # GPT-J: a parallel layer on one norm, rotary on interleaved pairs of 16 of the 32 head
    # dims, an LM head with a bias; CodeGen the same with its sharded fused q/k/v
    "gptj": {"n_inner": 80, "num_attention_heads": 2, "rotary_dim": 16},
    "codegen": {"n_inner": 80, "num_attention_heads": 2, "rotary_dim": 16},
    # GPT-Neo: a global then a local layer (a window of 8), q.k unscaled, tied
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": 8,
                "tie_word_embeddings": True},
    # Falcon-40B's layout: 4 heads in 2 KV groups, ln_attn and ln_mlp; Falcon-7B's: one KV
    # head, one norm for both; the old layout without multi-query (per-head q|k|v) with
    # sequential attention and MLP and biases
    "falcon": {"new_decoder_architecture": True, "num_kv_heads": 2, "ffn_hidden_size": 80},
    "falcon-7b": {"multi_query": True, "ffn_hidden_size": 80},
    "falcon-sequential": {"multi_query": False, "parallel_attn": False, "bias": True,
                          "ffn_hidden_size": 80},
    # Falcon-RW: the sequential layout with ALiBi in place of rotary; 12 heads, whose slopes
    # beyond the first 8 (2^-0.5, 2^-1.5, ...) bfloat16 rounds (tests/test_alibi.py)
    "falcon-rw": {"multi_query": False, "parallel_attn": False, "bias": True, "alibi": True,
                  "hidden_size": 192, "num_attention_heads": 12, "ffn_hidden_size": 80},
    # Beam: sliding layers (a window of 8) with rotary, NoPE full layers with scaled
    # queries, experts in 2 groups (the best one chosen) and dense MLPs; the gate biases
    # randomized (build_hf_model)
    "beam": {"head_dim": 16, "sliding_window": 8, "num_hidden_layers": 4,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                             "full_attention"],
             "mlp_layer_types": ["dense", "sparse", "sparse", "dense"], "num_experts": 8,
             "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
             "moe_intermediate_size": 32},
    # Persimmon: per-head LayerNorms of q and k, rotary on 16 of the 32 head dims
    "persimmon": {"num_attention_heads": 2},
    # XGLM: sinusoidal positions, BioGPT: learned ones, each from row 2 of its table, the
    # token embedding times sqrt(hidden)
    "xglm": {"ffn_dim": 80, "tie_word_embeddings": True},
    "biogpt": {"tie_word_embeddings": True},
    # InternLM3: Llama with the Hub's key names for its (absent) biases, head_dim 16 given
    # (its config class's default is 128)
    "internlm3": {"qkv_bias": False, "bias": False, "head_dim": 16},
    # ModernBERT decoder: a sliding (window 8 / 2 = 4), then a global layer (global every
    # other one), the first without a norm of its own; a tanh-gelu prediction head
    "modernbert-decoder": {"local_attention": 8, "global_attn_every_n_layers": 2,
                           "num_hidden_layers": 3, "attention_bias": True,
                           "classifier_activation": "gelu_new", "cls_token_id": 1,
                           "sep_token_id": 2},
    # Newer families (tests/test_newer_families.py). Cohere Compass: a sliding layer with
    # rotary, then a full one without (its rope entry null), biases, a logit scale; its
    # image-text checkpoint (a tiny Qwen3-VL tower beside it) tied.
    "cohere_compass_text": COMPASS,
    "cohere_compass": {**COMPASS, "tie_word_embeddings": True},
    # Emu3's image-text checkpoint: Llama under text_model., a tiny VQ-VAE beside it
    "emu3": {},
    # GPT-1: post-LN layers, no final norm, GPT-2's learned positions and Conv1D weights
    "openai-gpt": {"tie_word_embeddings": True},
    # CTRL: the embedding scaled, a sinusoidal position table, a ReLU MLP, a biased head
    "ctrl": {"dff": 80, "tie_word_embeddings": True},
    # Llama 3.2 Vision's language model: 4 layers, the second a cross-attention layer that
    # text skips; the embedding 8 rows taller than the head
    "mllama": {"num_hidden_layers": 4, "cross_attention_layers": [1]},
    # Chameleon: per-head q/k LayerNorms, image tokens' logits masked; its Swin-norm layers
    "chameleon": CHAMELEON,
    "chameleon-swin": {**CHAMELEON, "swin_norm": True},
    # GPT-NeoX Japanese: an MLP twice hidden wide, rotary on half of each head, the last
    # layer's output bias (randomized: build_hf_model)
    "gpt_neox_japanese": {"num_attention_heads": 2, "intermediate_multiple_size": 2,
                          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.5}},
    # Muse Glimmer's language model (a tiny vision tower beside it): three sliding layers,
    # the last full without rotary (its config class's lists); post-sublayer norms at an
    # eps large enough to matter, and a logit scale and soft-cap that bite
    "muse_glimmer": {"num_hidden_layers": 4, "head_dim": 16, "sliding_window": 8,
                     "post_norm_eps": 0.1, "output_multiplier": 0.5,
                     "final_logit_softcapping": 2.0},
    # Muse Spark's language model (tiny vision and audio towers beside it): Muse Glimmer's
    # layer shapes; layers 0 and 2 routed experts (8 of width 24, top 2, at a width of 32
    # between the projections), 1 and 3 dense; a selection bias and routing scale that
    # choose, residual gates of a temperature that makes them far from even
    "muse_spark": {"num_hidden_layers": 4, "head_dim": 16, "sliding_window": 8,
                   "post_norm_eps": 0.1, "output_multiplier": 0.5,
                   "final_logit_softcapping": 2.0, "hidden_act": "silu",
                   "mlp_layer_types": ["sparse", "dense", "sparse", "dense"],
                   "num_local_experts": 8, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 24, "moe_hidden_size": 32,
                   "routed_scaling_factor": 1.5, "residual_gate_temperature": 0.1},
    # Molmo 2's language model (a tiny vision backbone beside it): 8 extra vocabulary rows,
    # a linear rope scaling that bites on layers 0 and 2, layer 1 unscaled
    "molmo2": {"num_hidden_layers": 3, "head_dim": 16, "additional_vocab_size": 8,
               "rope_parameters": {"rope_type": "linear", "factor": 4.0,
                                   "rope_theta": 10000.0},
               "rope_scaling_layers": [0, 2]},
}
# RWKV's modules whose parameters build_hf_model perturbs: its LayerNorms (not named
# "norm") and the time mix's first-token bonus, which start as ones
RWKV_PERTURBED = ("pre_ln", "ln1", "ln2", "ln_out", "attention")
# model_types with a "-" of their own (not a fixture's variant)
HYPHENATED_TYPES = ("modernbert-decoder", "openai-gpt", "gpt-sw3")
# The fixtures stored as a BitNet quantization_config announces (tests/bitnet_checkpoints.py)
BITNET_LAYOUTS = {"bitnet-packed": "bitlinear", "bitnet-online": "online"}
# The families the default (fast) suite covers end to end; the rest run under `slow`.
FAST_FAMILIES = ("llama", "mistral", "qwen2", "gemma2", "gemma3_text", "gemma3", "qwen2_5_vl",
                 "qwen3_vl", "phi3", "smollm3", "granite", "olmo2", "olmo3", "exaone4",
                 "hunyuan_v1_dense", "glm4", "starcoder2", "phi", "gpt_neox", "ministral3",
                 "mistral3", "lfm2", "lfm3", "gpt2", "gpt_bigcode", "qwen3_5_text", "qwen3_5",
                 "gemma4_text", "gemma4", "gemma3n_text", "qwen3_moe", "lfm2_moe",
                 "granitemoehybrid-mamba", "nemotron_h", "falcon_h1", "bamba")


def write_tokenizer(path: Path, vocab: int = VOCAB, top_words: Sequence[str] = (),
                    chat_template: str = CHAT_TEMPLATE, special: Sequence[str] = ()) -> None:
    """A WordLevel tokenizer over words w0..w{vocab-1}; w1 is BOS, w2 is EOS. `top_words`
    take the last ids instead (top_word_id), for tests that script replies in words;
    those in `special` are the tokenizer's special tokens (as chat markers are)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    words = {f"w{i}": i for i in range(vocab - len(top_words))}
    words.update({w: top_word_id(top_words, w, vocab) for w in top_words})
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([AddedToken(w, special=True) for w in special])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "w1", "eos_token": "w2", "chat_template": chat_template}
    ))


def top_word_id(top_words: Sequence[str], word: str, vocab: int = VOCAB) -> int:
    return vocab - len(top_words) + list(top_words).index(word)


def word_bundle(hf_model, tmp_path_factory, name: str, top_words: Sequence[str],
                chat_template: str, special: Sequence[str] = ()) -> Path:
    """The random llama exported with write_tokenizer's words and `chat_template` (chunks
    16 and 64, 256 positions): the bundle of the server tests that script replies in
    words (follow_tokens)."""
    import shutil

    from edgeprefill.export.exporter import ExportOptions, export

    hf = tmp_path_factory.mktemp(f"hf-{name}")
    shutil.copytree(hf_model("llama"), hf, dirs_exist_ok=True)
    write_tokenizer(hf, top_words=top_words, chat_template=chat_template, special=special)
    out = tmp_path_factory.mktemp(f"bundle-{name}")
    export(hf, out, ExportOptions(chunks=(16, 64), max_context=256, show_progress=False,
                                  overwrite=True))
    return out


@contextlib.contextmanager
def scripted_server(bundle: Path, top_words: Sequence[str], script: Sequence[str]):
    """A live server (tests/test_serve.py's `serving`) of the bundle's engine whose replies
    are `script`: each word (of write_tokenizer's `top_words`) followed by the next, the
    last by EOS (w2), the first after whatever the prompt ends with."""
    from edgeprefill.sdk import Engine
    from tests.test_serve import serving

    engine = Engine.load(bundle, threads=1, kv_slots=2)
    ids = [top_word_id(top_words, w) for w in script]
    follow_tokens(engine, dict(zip(ids, [*ids[1:], 2], strict=True)), 2)
    try:
        with serving(engine) as server:
            yield server
    finally:
        engine.close()


@pytest.fixture(scope="module")
def http(server):
    """An httpx client of the module's `server` fixture. One client for the module: a new
    httpx client per call costs ~50 ms of TLS setup."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture
def client(server):
    """The openai client of the module's `server` fixture, no retries."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def follow_tokens(engine, following: dict[int, int], otherwise: int) -> None:
    """Make the engine's greedy choice scripted: after token t comes following[t] (else
    `otherwise`). The real step still runs, so its KV writes stay."""
    import numpy as np

    run = engine.backend.run

    def scripted(step):
        logits = run(step)
        chosen = np.full_like(logits, -1e4)
        for row in range(step.rows):
            last = int(step.input_ids[row, step.valid_lens[row] - 1])
            chosen[row, following.get(last, otherwise)] = 0.0
        return chosen

    engine.backend.run = scripted


def build_hf_model(family: str, out: Path, seed: int = 0, dtype=None, **overrides) -> Path:
    """Save a tiny random model of `family` (a key of FAMILIES) to `out`."""
    import torch

    # a fixture's variant follows a "-" (falcon-7b), except in the model types that hold one
    model_type = family if family in HYPHENATED_TYPES else family.split("-")[0]
    if model_type == "gemma3n":
        return image_text_gemma3n(out, seed, **overrides)
    kwargs = dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=1024,
        # Wide random weights give well separated logits, so greedy choices are stable
        # against float rounding differences between runtimes.
        initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False,
    )
    kwargs.update(FAMILIES.get(family, {}))
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = hf_auto_class(model_type).from_config(hf_config_of(model_type, kwargs))
    # Biases start at zero and norm weights at one (Gemma: zero): make them matter. Norms of
    # the Llama-layout fixtures stay as they are, which other tests' tolerances were set on.
    perturb_norms = model_type not in ("llama", "mistral", "qwen2", "qwen3")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith((".bias", "dense_bias")) and "fgate_preact" not in name:
                param.normal_(0, 0.5)  # (GPT-NeoX Japanese's dense_bias; not xLSTM's forget)
            elif name.endswith(("act_fn.alpha_p", "act_fn.alpha_n")):  # Apertus's xIELU
                param.add_(torch.randn_like(param) * 0.5)
            elif name.endswith("self_attn.sinks") and not param.any():  # Granite SWA's
                param.normal_(0, 1.0)
            elif perturb_norms and "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
            elif model_type == "rwkv" and name.split(".")[-2] in RWKV_PERTURBED:
                param.add_(torch.randn_like(param) * 0.2)
            elif model_type == "xlstm" and (not param.any() or name == "lm_head.weight"):
                param.normal_(0, 0.3)  # its gates' weights, and wider logits
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):  # Gemma 4's, all ones as initialized
                buffer.uniform_(0.5, 1.5)
            elif name.endswith("expert_bias"):  # LFM2-MoE's: zero at init, chooses experts
                buffer.normal_(0, 0.5)
            elif name.endswith("e_score_correction_bias"):  # DeepSeek-V3's, as LFM2-MoE's
                buffer.normal_(0, 0.1)
        for name, param in model.named_parameters():
            if name.endswith("e_score_correction_bias"):  # ERNIE-4.5-MoE's, as LFM2-MoE's
                param.normal_(0, 0.05)
            elif name.endswith("self_attn.A"):  # Doge's: zero at init, every key's bias 1
                param.normal_(0, 1.0)
            elif name.endswith(("input_residual", "post_attention_residual")):  # Doge's: ones
                param.uniform_(0.5, 1.5)
            elif name.endswith("self_attn.gate_bias"):  # Beam's output gate: zero at init
                param.normal_(0, 0.5)
            elif name.endswith("correct_output_scale"):  # Gemma 3n's AltUp: zero at init
                param.uniform_(0.5, 1.5)
            elif name.endswith(("mlp.router.gate.weight", "mlp.expert_bias")) \
                    and not param.any():  # AFMoE's router and selection bias: zero at init
                param.normal_(0, 0.5)
            elif name.endswith("qk_norm.temp"):  # ZAYA's key scale: zero at init
                param.uniform_(0.5, 2.0)
            elif name.endswith(("_scale", "hidden_states_bias", "residual_bias")) \
                    and model_type == "zaya":  # its residual and router-state scales
                param.add_(torch.randn_like(param) * 0.3)
            elif name.endswith("global_scale"):  # Inkling's MLP and router scales: ones
                param.uniform_(0.5, 1.5)
            elif name.endswith(("_hc.scale", "hc_head.hc_scale")):  # Hy4's: 0.01 at init,
                param.uniform_(0.5, 1.5)  # which leaves the mixes nearly constant
            elif name.endswith(("_hc.base", "hc_head.hc_base")):  # Hy4's: one value at init
                param.add_(torch.randn_like(param) * 0.5)
        if model_type == "zaya":
            zaya_routers(model)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(out)
    write_tokenizer(out)
    if family in BITNET_LAYOUTS:
        from tests.bitnet_checkpoints import as_bitnet

        as_bitnet(out, BITNET_LAYOUTS[family])
    return out


def zaya_routers(model) -> None:
    """ZAYA's routers as the fixture wants them: wide MLP weights over small biases (so
    tokens differ in their choice) and balancing biases in [-0.4, 0] (so the skip expert,
    whose bias transformers sets to -1 at load, is chosen for some tokens)."""
    for layer in model.model.layers:
        gate = layer.mlp.gate
        for fc in (gate.router_mlp.fc1, gate.router_mlp.fc2):
            fc.weight.normal_(0, 1.0)
            fc.bias.normal_(0, 0.1)
        gate.down_proj.bias.normal_(0, 0.1)
        gate.balancing_biases[:-1].uniform_(-0.4, 0.0)


# The vision tower of the image-text fixtures, as small as its config allows (2 x 2 patches).
TINY_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
               "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
# The outer config's keys of each image-text family beside its text_config: a vision tower
# as small as its config allows (the Qwen towers merge into the fixtures' hidden size 64).
IMAGE_TEXT = {
    "dots3_note": {"vision_config": {"hidden_size": 32, "intermediate_size": 48,
                                     "num_hidden_layers": 1, "num_attention_heads": 2,
                                     "adapter_in_dim": 32, "adapter_out_dim": 64,
                                     "moe_intermediate_size": 16, "pyramid_num_routed": [-1]},
                   "audio_config": {"hidden_size": 32, "intermediate_size": 48,
                                    "num_hidden_layers": 1, "num_attention_heads": 2,
                                    "adapter_input_size": 32, "adapter_out_dim": 64,
                                    "downsample_hidden_size": 16}},
    "gemma3": {"vision_config": TINY_VISION, "mm_tokens_per_image": 4},
    "hy_v4_vl": {"vision_config": {"hidden_size": 16, "intermediate_size": 32,
                                   "num_hidden_layers": 1, "num_attention_heads": 2,
                                   "patch_size": 14, "out_hidden_size": 64,
                                   "max_image_size": 28}},
    "minimax_m3_vl": {"vision_config": TINY_VISION, "projector_hidden_size": 32},
    "mistral3": {"vision_config": {**TINY_VISION, "head_dim": 8}},
    "gemma4": {"vision_config": {"hidden_size": 16, "intermediate_size": 32,
                                 "num_hidden_layers": 1, "num_attention_heads": 2,
                                 "num_key_value_heads": 2, "head_dim": 8,
                                 "position_embedding_size": 64}, "audio_config": None},
    "gemma3n": {},  # its towers' default configs: image_text_gemma3n writes no tower
    "gemma4_unified": {"vision_config": {"patch_size": 4, "pooling_kernel_size": 2,
                                         "mm_embed_dim": 16, "mm_posemb_size": 8},
                       "audio_config": None},
    "lfm2_vl": {"vision_config": {**TINY_VISION, "num_patches": 16}, "projector_hidden_size": 32},
    "lfm3_vl": {"vision_config": {"hidden_size": 16, "intermediate_size": 32,
                                  "num_hidden_layers": 2, "num_attention_heads": 2,
                                  "num_key_value_heads": 2, "patch_size": 14},
                "projector_hidden_size": 32},
    "qwen2_vl": {"vision_config": {"depth": 1, "embed_dim": 16, "hidden_size": 64,
                                   "num_heads": 2, "mlp_ratio": 2, "patch_size": 14}},
    "qwen2_5_vl": {"vision_config": {
        "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 14, "window_size": 28,
        "fullatt_block_indexes": [0]}},
    "qwen3_5": {"vision_config": {
        "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 14, "num_position_embeddings": 16}},
    "qwen3_5_moe": {"vision_config": {
        "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 14, "num_position_embeddings": 16}},
    "qwen3_vl": {"vision_config": {
        "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 14, "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0]}},
    "glm4v_moe": {"vision_config": {
        "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 14, "image_size": 28}},
    "qwen3_vl_moe": {"vision_config": {
        "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 14, "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0]}},
    # The checkpoints that wrap any text family (families/wrapped.py; their text_config's
    # model_type is the test's): their towers as small as their configs allow.
    **{name: {"vision_config": {"model_type": "clip_vision_model", **TINY_VISION}}
       for name in ("llava", "video_llava")},
    **{name: {"vision_config": {"model_type": "clip_vision_model", **TINY_VISION},
              "image_grid_pinpoints": [[28, 28]]} for name in ("llava_next", "llava_next_video")},
    "llava_onevision": {"vision_config": {"model_type": "siglip_vision_model", **TINY_VISION},
                        "image_grid_pinpoints": [[28, 28]]},
    "vipllava": {"vision_config": {"model_type": "clip_vision_model", **TINY_VISION},
                 "vision_feature_layers": [-1]},
    "smolvlm": {"vision_config": TINY_VISION},
    "idefics3": {"vision_config": TINY_VISION},
    "idefics2": {"vision_config": TINY_VISION, "perceiver_config": {
        "hidden_size": 64, "resampler_n_latents": 4, "resampler_depth": 1,
        "resampler_n_heads": 2, "resampler_head_dim": 8, "num_key_value_heads": 1}},
    "deepseek_vl": {"vision_config": {"model_type": "siglip_vision_model", **TINY_VISION}},
    "video_llama_3": {"vision_config": TINY_VISION},
    "aria": {"vision_config": TINY_VISION, "projector_patch_to_query_dict": {4: 4}},
    "aya_vision": {"vision_config": {"model_type": "siglip_vision_model", **TINY_VISION}},
    "cohere2_vision": {"vision_config": {"model_type": "siglip_vision_model", **TINY_VISION},
                       "alignment_intermediate_size": 32},
    "internvl": {"vision_config": {**TINY_VISION, "image_size": [28, 28],
                                   "patch_size": [14, 14]}},
    "lighton_ocr": {"vision_config": {**TINY_VISION, "head_dim": 8}},
    **{name: {"vision_config": {"hidden_size": 16, "output_channels": 16,
                                "num_hidden_layers": 1, "num_attention_heads": 2,
                                "image_size": 32, "patch_size": 16, "mlp_dim": 32,
                                "global_attn_indexes": [0], "window_size": 2}}
       for name in ("got_ocr2", "pp_chart2table")},
    "fuyu": {"patch_size": 4},  # its tower one linear patch embedding
    "step3p7": {"vision_config": TINY_VISION},
    "moss_transcribe_diarize": {"audio_config": {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "max_source_positions": 16}},
    # their towers are timm models (not installed): the configs alone, no model
    **{name: {} for name in ("fast_vlm", "perception_lm")},
    "shieldgemma2": {"vision_config": TINY_VISION, "mm_tokens_per_image": 4},
    **{name: {"vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 32,
                                "num_heads": 2, "out_hidden_size": 64, "patch_size": 14,
                                "image_size": 28}} for name in ("glm4v", "glm46v")},
    "llama4": {"vision_config": {**TINY_VISION, "vision_output_dim": 16,
                                 "projector_input_dim": 16, "projector_output_dim": 16}},
    "cohere_compass": {"vision_config": {
        "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 14, "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0]}},
    "mllama": {"vision_config": {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_global_layers": 1, "attention_heads": 2, "image_size": 28, "patch_size": 14,
        "vision_output_dim": 32, "intermediate_layers_indices": [0], "max_num_tiles": 1,
        "supported_aspect_ratios": [[1, 1]]}},
    # transformers 5.24's newer image-text checkpoints (stop 43, first half)
    "apertus1p5": {  # its image and audio codes fill the fixtures' vocabulary's top rows
        "vision_config": {"base_channels": 32, "channel_multiplier": [1], "num_res_blocks": 1,
                          "attn_resolutions": [], "codebook_size": 8, "embed_dim": 4,
                          "latent_channels": 4},
        "audio_config": {"model_type": "wavtokenizer_encoder", "num_filters": 4,
                         "upsampling_ratios": [2], "num_lstm_layers": 1, "hidden_size": 8,
                         "codebook_size": 8, "codebook_dim": 8},
        "image_token_offset": 100, "audio_token_offset": 108, "image_token_id": 98,
        "audio_token_id": 99},
    "deepseek_vl_hybrid": {
        "vision_config": {"model_type": "siglip_vision_model", **TINY_VISION},
        "high_res_vision_config": {"hidden_size": 16, "output_channels": 16,
                                   "num_hidden_layers": 1, "num_attention_heads": 2,
                                   "image_size": 32, "patch_size": 16, "mlp_dim": 32,
                                   "global_attn_indexes": [0], "window_size": 2}},
    "ernie4_5_vl_moe": {"vision_config": {"depth": 1, "hidden_size": 16,
                                          "intermediate_size": 32, "num_heads": 2,
                                          "patch_size": 14}},
    "hunyuan_vl": {"vision_config": {"hidden_size": 16, "intermediate_size": 32,
                                     "num_hidden_layers": 1, "num_attention_heads": 2,
                                     "patch_size": 14, "out_hidden_size": 64}},
    "exaone4_5": {"vision_config": {
        "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
        "num_key_value_heads": 2, "out_hidden_size": 64, "patch_size": 14, "window_size": 28,
        "fullatt_block_indexes": [0]}},
    "hyperclovax_vision_v2": {"vision_config": {
        "model_type": "qwen2_5_vl_vision", "depth": 1, "hidden_size": 16,
        "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 64, "patch_size": 14,
        "window_size": 28, "fullatt_block_indexes": [0]}},
    **{name: {"vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 32,
                                "num_heads": 2, "out_hidden_size": 64, "patch_size": 14,
                                "image_size": 28}} for name in ("glm_ocr", "glmga")},
    "cosmos3_edge": {"vision_config": {**TINY_VISION, "num_patches": 16}},
    "deepseek_ocr2": {"vision_config": {
        "sam_config": {"hidden_size": 16, "output_channels": 16, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 16,
                       "mlp_dim": 32, "global_attn_indexes": [0], "window_size": 2},
        "encoder_config": {"hidden_size": 16, "intermediate_size": 32,
                           "num_hidden_layers": 1, "num_attention_heads": 2,
                           "num_key_value_heads": 2}}},
    "granite4_vision": {
        # (its Q-Former has vision hidden_size // 64 heads)
        "vision_config": {"model_type": "clip_vision_model", **TINY_VISION, "hidden_size": 64},
        "image_grid_pinpoints": [[28, 28]], "downsample_rate": "1/2",
        "deepstack_layer_map": [[0, 0]], "spatial_vision_layer": 0,
        "spatial_target_layers": [0, 1, 0, 1]},
    "granite_docling": {"vision_config": {**TINY_VISION, "deepstack_visual_indexes": [0],
                                          "out_hidden_size": 64}},
    "kimi_k25": {"vision_config": {"hidden_size": 16, "intermediate_size": 32,
                                   "num_hidden_layers": 1, "num_attention_heads": 2,
                                   "pos_emb_height": 4, "pos_emb_width": 4}},
    # Emu3: a VQ-VAE as small as its GroupNorms allow, and the vocabulary map it reads
    "emu3": {"vq_config": {"base_channels": 32, "channel_multiplier": [1], "num_res_blocks": 1,
                           "attn_resolutions": [], "codebook_size": 16, "embed_dim": 4,
                           "latent_channels": 4, "hidden_size": 8},
             "vocabulary_map": {"<image>": 120, "<|extra_200|>": 121}},
    # Janus: its understanding tower, and an image generator (a VQ-VAE as small as its
    # GroupNorms allow) projecting to the fixtures' hidden size
    "janus": {"vision_config": {**TINY_VISION, "projection_dim": 64, "depth": 1},
              "vq_config": {"embed_dim": 4, "num_embeddings": 16, "latent_channels": 4,
                            "base_channels": 32, "channel_multiplier": [1],
                            "num_res_blocks": 1, "projection_dim": 64,
                            "image_token_embed_dim": 64, "num_hidden_layers": 1}},
    **{name: {"vision_config": TINY_VISION, "insert_layer_id": 0}
       for name in ("minicpm_ocr", "minicpmv4_6", "minicpmv4_7")},
    # Ovis2's head is sized by the outer hidden_size and vocab_size: the language model's
    "ovis2": {"vision_config": {**TINY_VISION, "vocab_size": 16}, "hidden_size": 64,
              "vocab_size": VOCAB},
    "qianfan_ocr": {"vision_config": {**TINY_VISION, "image_size": [28, 28],
                                      "patch_size": [14, 14]}},
    "paddleocr_vl": {"vision_config": TINY_VISION},
    # The Qwen Omni thinkers: their vision and audio towers, one small layer each
    "qwen2_5_omni_thinker": {
        "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 32,
                          "num_heads": 2, "out_hidden_size": 64, "fullatt_block_indexes": [0]},
        "audio_config": {"encoder_layers": 1, "encoder_attention_heads": 2,
                         "encoder_ffn_dim": 32, "d_model": 16, "output_dim": 64}},
    "qwen3_omni_moe_thinker": {
        "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 32,
                          "num_heads": 2, "out_hidden_size": 64, "num_position_embeddings": 16,
                          "deepstack_visual_indexes": [0]},
        "audio_config": {"encoder_layers": 1, "encoder_attention_heads": 2,
                         "encoder_ffn_dim": 32, "d_model": 16, "output_dim": 64,
                         "downsample_hidden_size": 8}},
    "muse_glimmer": {"vision_config": {"hidden_size": 16, "intermediate_size": 32,
                                       "num_hidden_layers": 1, "num_attention_heads": 2},
                     "out_hidden_size": 16, "projector_hidden_size": 32},
    "muse_spark": {"vision_config": {"hidden_size": 16, "intermediate_size": 32,
                                     "num_hidden_layers": 1, "num_attention_heads": 2},
                   "audio_config": {"hidden_sizes": [8], "depths": [1], "patch_sizes": [4],
                                    "num_hidden_layers": 1, "out_hidden_size": 64},
                   "out_hidden_size": 16, "projector_hidden_size": 32},
    # Inkling's image-text checkpoint: a vision tower of three layers (fewer than its
    # scales need scipy, which is not installed) of patches of 2, and an audio embedding
    "inkling_mm_model": {"vision_config": {"hidden_size": 32, "num_hidden_layers": 3,
                                           "num_attention_heads": 2, "patch_size": 2},
                         "audio_config": {"n_mel_bins": 8, "mel_vocab_size": 16}},
    "molmo2": {"vision_config": {"hidden_size": 16, "intermediate_size": 32,
                                 "num_hidden_layers": 1, "num_attention_heads": 2,
                                 "num_key_value_heads": 2, "head_dim": 8,
                                 "image_size": [28, 28]},
               "adapter_config": {"hidden_size": 16, "num_attention_heads": 2,
                                  "num_key_value_heads": 2, "head_dim": 8,
                                  "intermediate_size": 32, "text_hidden_size": 64,
                                  "vision_feature_layer": [-1]}},
    # Nemotron 3 Nano Omni: a RADIO tower of one layer, no audio encoder
    "nemotron_h_omni": {"vision_config": {"hidden_size": 16, "num_hidden_layers": 1,
                                          "num_attention_heads": 2, "num_registers": 1,
                                          "video_temporal_patch_size": 2},
                        "vision_hidden_size": 16, "projector_hidden_size": 32,
                        "audio_config": None},
}


# The image-text families whose vision tower is a timm model (timm is not installed):
# transformers cannot build their model, only their config.
TIMM_TOWERS = ("fast_vlm", "perception_lm")


def hf_config_of(model_type: str, kwargs: dict):
    """The transformers config of a test model; for an image-text family (a config with a
    text_config) the keys are its language model's, and the outer config ties as told."""
    import transformers

    config_cls = transformers.AutoConfig.for_model(model_type).__class__
    if "text_config" not in getattr(config_cls, "sub_configs", {}):
        return config_cls(**kwargs)
    return config_cls(text_config=kwargs, **IMAGE_TEXT[model_type],
                      tie_word_embeddings=kwargs["tie_word_embeddings"])


def hf_auto_class(model_type: str):
    """transformers' auto class that builds `model_type` whole: the causal LM, or for the
    image-text families without one (Qwen2-VL, ...) their ForConditionalGeneration."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    # transformers maps "qwen3_5" to Qwen3_5ForCausalLM, which holds the language model
    # alone; the Hub's checkpoints are the whole Qwen3_5ForConditionalGeneration (and so
    # for "qwen3_5_moe"; and Llama 4's, Emu3's and Mllama's ForConditionalGeneration).
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and \
            model_type not in ("qwen3_5", "qwen3_5_moe", "llama4", "emu3", "mllama"):
        return transformers.AutoModelForCausalLM
    return transformers.AutoModelForImageTextToText


def load_hf_model(hf_dir: Path):
    """The saved test model in `hf_dir`, loaded as transformers loads it (fp32)."""
    import torch

    model_type = json.loads((hf_dir / "config.json").read_text())["model_type"]
    if model_type == "gemma3n":
        return gemma3n_language_model(hf_dir)
    model = hf_auto_class(model_type).from_pretrained(hf_dir, dtype=torch.float32)
    if model_type == "llama4":
        # transformers 5.24's Llama4ForConditionalGeneration fails on text alone (building
        # its output it reads image_outputs the language model's lacks); on text its
        # forward is its language_model's on the embedded ids, which this runs.
        return model.language_model
    return model


GEMMA3N_LM = "model.language_model."


def image_text_gemma3n(out: Path, seed: int = 0, **overrides) -> Path:
    """Gemma3nForConditionalGeneration's checkpoint layout, written by hand: its vision
    tower is a timm model, and timm is not installed. The language model is the random
    gemma3n_text model of the same keys, its tensors under model.language_model. as the
    Hub's, beside a stand-in tensor for each part export leaves out."""
    import torch
    import transformers
    from safetensors.torch import save_file

    text = build_hf_model("gemma3n_text", out.with_name(out.name + "-text"), seed, **{
        **FAMILIES["gemma3n"], **overrides})
    model = transformers.Gemma3nForCausalLM.from_pretrained(text, dtype=torch.float32)
    tensors = {GEMMA3N_LM + name.removeprefix("model."): t.contiguous()
               for name, t in model.state_dict().items() if name != "lm_head.weight"}
    for part in ("vision_tower.stem.weight", "audio_tower.conv.weight",
                 "embed_vision.embedding.weight", "embed_audio.embedding.weight"):
        tensors["model." + part] = torch.ones(4, 4)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = transformers.Gemma3nConfig(text_config=model.config.to_dict(),
                                        tie_word_embeddings=True)
    (out / "config.json").write_text(config.to_json_string())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((text / name).read_bytes())
    return out


def gemma3n_language_model(hf_dir: Path):
    """The language model of image_text_gemma3n's checkpoint as Gemma3nForCausalLM: what
    Gemma3nForConditionalGeneration computes on text (ids below its embedders' 262144:
    Gemma3nModel.forward hands the text model's own embeddings on, and the head and
    soft-cap are the same)."""
    import transformers
    from safetensors.torch import load_file

    config = transformers.Gemma3nConfig.from_pretrained(hf_dir).get_text_config()
    model = transformers.Gemma3nForCausalLM(config).eval()
    stored = load_file(str(hf_dir / "model.safetensors"))
    weights = {"model." + name.removeprefix(GEMMA3N_LM): t for name, t in stored.items()
               if name.startswith(GEMMA3N_LM)}
    model.load_state_dict({**weights, "lm_head.weight": weights["model.embed_tokens.weight"]})
    return model


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory):
    """family -> path of its saved tiny random checkpoint (built once per test run)."""
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = build_hf_model(family, tmp_path_factory.mktemp(family))
        return cache[family]

    return get


@pytest.fixture(scope="session")
def bundle(tmp_path_factory, hf_model):
    """(family, flavor) -> path of its exported bundle (exported once per test run)."""
    from edgeprefill.export.exporter import ExportOptions, export

    cache: dict[tuple[str, str], Path] = {}

    def get(family: str, flavor: str = "ort") -> Path:
        key = (family, flavor)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"bundle-{family}-{flavor}")
            export(hf_model(family), out, ExportOptions(
                flavor=flavor, chunks=(16, 64), max_context=512, show_progress=False,
                overwrite=True,
            ))
            cache[key] = out
        return cache[key]

    return get


@pytest.fixture
def fake_engine(bundle, monkeypatch):
    """make(backend="fake", **options): Engine.load of the llama bundle on a fake backend of
    tests/fake_backend.py ("fake" or "fake-fusing"), closed after the test. Without the
    load's warm-up calls unless `warm_up=True`: the tests read the recorded calls."""
    from edgeprefill import engines
    from edgeprefill.sdk import Engine

    monkeypatch.setitem(engines.BACKENDS, "fake", "tests.fake_backend:FakeBackend")
    monkeypatch.setitem(engines.BACKENDS, "fake-fusing", "tests.fake_backend:FusingFakeBackend")
    made = []

    def make(backend: str = "fake", **options) -> Engine:
        engine = Engine.load(bundle("llama"), backend=backend, **{"warm_up": False, **options})
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


@pytest.fixture(scope="session")
def quantized(hf_model, tmp_path_factory):
    """kind ("int8", "int4"; "int4/int8": an int8 LM head) -> the llama test model exported
    with those weights (chunks 16 and 64, 512 positions), once per run."""
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig

    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            weights, _, head = kind.partition("/")
            made[kind] = tmp_path_factory.mktemp(f"bundle-llama-{weights}-{head}")
            export(hf_model("llama"), made[kind], ExportOptions(
                chunks=(16, 64), max_context=512, show_progress=False, overwrite=True,
                quant=QuantConfig(weights, head=head or None)))
        return made[kind]

    return get


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory):
    """The shipped tiny model (models/tiny-recall), exported once."""
    from edgeprefill.export.exporter import ExportOptions, export

    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"the shipped tiny model is missing from {TINY_MODEL}")
    out = tmp_path_factory.mktemp("tiny-recall")
    export(TINY_MODEL, out, ExportOptions(show_progress=False, overwrite=True))
    return out


TINY_INT4_CONTEXT = 64


@pytest.fixture(scope="session")
def tiny_int4_bundle(tmp_path_factory):
    """The shipped tiny model as an int4 bundle (16-token chunks, TINY_INT4_CONTEXT
    positions), exported once: the load-time int4 rewrites' tests share it."""
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig

    out = tmp_path_factory.mktemp("tiny-int4") / "b"
    export(TINY_MODEL, out, ExportOptions(chunks=(16,), max_context=TINY_INT4_CONTEXT,
                                          show_progress=False, quant=QuantConfig("int4")))
    return out


@pytest.fixture
def library(monkeypatch):
    """The native kernel library (edgeprefill/kernels), built once per run; the test is
    skipped, saying why, only where it cannot be built (no g++, or no way to get ONNX
    Runtime's headers). A test that asks for it runs the kernels on any CPU: on one without
    AVX-512 or AVX2 + FMA `auto` would pick the stock graph (kernels/select.py), but their
    portable loops must compute the same there (tests/test_kernel_choice.py tests that choice)."""
    from edgeprefill.kernels import build, select

    try:
        path = build.build()
    except build.KernelBuildError as err:
        pytest.skip(f"native kernels cannot be built here: {err}")
    monkeypatch.setattr(select, "cpu_has_vector_kernels", lambda: True)
    return path


@pytest.fixture(scope="session")
def wide_llama(tmp_path_factory):
    """kind ("float", "int8", "int4") -> a llama bundle whose MLP fills whole 64-column
    panels (intermediate 128; the shared test model's 96 does not: the projections'
    gated=1, tests/test_gated_projection.py), exported once per run."""
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig

    hf = build_hf_model("llama", tmp_path_factory.mktemp("llama-128"), intermediate_size=128)
    made = {}

    def get(kind: str):
        if kind not in made:
            made[kind] = tmp_path_factory.mktemp(f"llama-128-{kind}")
            export(hf, made[kind], ExportOptions(
                chunks=(16, 64), max_context=256, show_progress=False, overwrite=True,
                quant=QuantConfig(kind) if kind != "float" else None))
        return made[kind]

    return get
