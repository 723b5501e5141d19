"""GGUF files of the tests' tiny transformers models, written with the `gguf` package the
way llama.cpp's convert_hf_to_gguf.py writes them (its TextModel.set_gguf_parameters,
LlamaModel.permute, _set_vocab_gpt2, _set_vocab_sentencepiece and prepare_tensors, read at
ggml-org/llama.cpp): llama.cpp's tensor names, the Llama family's q/k rows permuted for
its rope, a llama3 rope scaling as its per-frequency `rope_freqs` factors
(LlamaModel.generate_extra_tensors), a byte-level BPE ("gpt2") or SentencePiece ("llama")
vocabulary, F32, Q8_0 or Q4_0 weights (one-dimensional tensors stay F32); Gemma3Model's
and Phi3MiniModel's own metadata and Phi-3's longrope factor tensors; StarCoder2Model's,
LFM2Model's, GPT2Model's, FalconModel's and MambaModel's parameters and tensor steps
(_converter_tensors)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

# HF model_type -> llama.cpp's architecture, and whether its converter permutes q/k
# (LlamaModel does; Qwen2Model and Qwen3Model, whose rope is NeoX-style, do not).
ARCHS = {"llama": ("llama", True), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False),
         "gemma2": ("gemma2", False), "qwen3_moe": ("qwen3moe", False),
         "gemma3_text": ("gemma3", False), "phi3": ("phi3", False),
         "starcoder2": ("starcoder2", False), "lfm2": ("lfm2", False), "gpt2": ("gpt2", False),
         "falcon": ("falcon", False), "mamba": ("mamba", False)}
# Gemma2Model and Gemma3Model store their norms as `w + 1` (ggml multiplies by the weight
# as it is).
NORMS_PLUS_ONE = ("gemma2", "gemma3")


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """LlamaModel.permute: HF's rotate-half rows -> llama.cpp's interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(hf_dir: Path, out: Path, quant: str = "F32", name: str = "tiny",
               permute_qk: bool = True, rope_freqs: np.ndarray | None = None,
               extra: dict[str, np.ndarray] | None = None, pre: str = "gpt-2",
               eot: int | None = None, chat_template: str | None = None,
               pooling: str | None = None, labels: list[str] | None = None,
               rerank: tuple[int, ...] | None = None, rerank_template: str | None = None
               ) -> Path:
    """`hf_dir` (config.json, model.safetensors, a byte-level BPE or a Llama 2 style
    tokenizer.json) as a GGUF file `out`. `permute_qk=False` leaves out llama's q/k
    permutation (a broken converter); `rope_freqs` are factors to write instead of the
    converter's (a llama3 rope's); `extra` tensors (F32) are added as they are; `pre`, a
    byte-level vocabulary's split (llama.cpp's name for it); `eot`, an end-of-turn id
    (tokenizer.ggml.eot_token_id, as SpecialVocab writes one); `chat_template`, a
    byte-level vocabulary's tokenizer.chat_template (SpecialVocab writes the checkpoint's;
    the sentencepiece one here always does); `pooling`, a gguf.PoolingType name (LAST,
    MEAN, RANK) as _try_set_pooling_type writes a sentence-transformers model's (and
    Qwen3Model a reranker's, with its classifier `labels`); `rerank`, the (yes, no) ids of
    a reranker Qwen3Model converts (one id: a one-label head): its LM head's rows as
    `cls.output.weight` [yes, no] (an untied model's LM head then left out), pooling RANK,
    labels yes and no; `rerank_template`, the chat template named "rerank"."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    arch, permutes = ARCHS[config["model_type"]]
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                 "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(name)
    writer.add_file_type(file_type[quant])
    if arch in OWN_PARAMETERS:
        layers = OWN_PARAMETERS[arch](writer, config)
        heads = kv_heads = 0  # (no q/k permutation)
    else:
        layers, heads, kv_heads = _add_llama_family_parameters(writer, config, arch)
    _add_vocab(writer, hf_dir, config, pre)
    if eot is not None:
        writer.add_eot_token_id(eot)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    if pooling is not None:
        writer.add_pooling_type(gguf.PoolingType[pooling])
    if labels is not None:
        writer.add_classifier_output_labels(labels)
    if rerank is not None:
        writer.add_pooling_type(gguf.PoolingType.RANK)
        writer.add_classifier_output_labels(["yes", "no"][:len(rerank)])
    if rerank_template is not None:
        writer.add_chat_template([{"name": "rerank", "template": rerank_template}])

    model_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(model_arch, layers)
    tensors = _stacked_experts(load_file(str(hf_dir / "model.safetensors")))
    if rerank is not None:
        tensors = _rerank_head(tensors, rerank)
    for hf_name, data in _converter_tensors(arch, config, tensors):
        if permutes and permute_qk and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            data = permute(data, heads, heads)
        if permutes and permute_qk and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            data = permute(data, heads, kv_heads)
        if arch in NORMS_PLUS_ONE and hf_name.endswith("norm.weight"):
            data = data + 1
        new_name = hf_name if hf_name.startswith("cls.") else \
            names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert new_name is not None, hf_name
        qtype = gguf.GGMLQuantizationType.F32 if quant == "F32" or data.ndim == 1 else \
            gguf.GGMLQuantizationType[quant]
        data = gguf.quants.quantize(data.astype(np.float32), qtype)
        writer.add_tensor(new_name, data, raw_dtype=qtype)
    if rope_freqs is None:
        rope_freqs = llama3_rope_factors(config)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
    for factors_name, data in _longrope_factors(config).items():
        writer.add_tensor(factors_name, data)
    for extra_name, data in (extra or {}).items():
        writer.add_tensor(extra_name, np.asarray(data, np.float32))
    write_out(writer)
    return out


def _rerank_head(tensors: dict[str, np.ndarray], ids: tuple[int, ...]
                 ) -> dict[str, np.ndarray]:
    """Qwen3Model.modify_tensors of a reranker: the LM head's (the embeddings', tied) yes
    and no rows as cls.output.weight; an untied model's LM head is not written."""
    head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
    kept = {name: data for name, data in tensors.items() if name != "lm_head.weight"}
    return {**kept, "cls.output.weight": np.stack([head[i] for i in ids])}


def _add_llama_family_parameters(writer, config: dict, arch: str) -> tuple[int, int, int]:
    """TextModel.set_gguf_parameters and the Llama family's own; (layers, heads, KV heads)."""
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if arch != "phi3":  # Phi3MiniModel writes its partial rotary width
        writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    _add_rope_scaling(writer, config)
    if arch == "gemma3":
        _add_gemma3_parameters(writer, config)
    if arch == "phi3":
        _add_phi3_parameters(writer, config)
    if arch == "gemma2":  # Gemma2Model.set_gguf_parameters
        writer.add_sliding_window(config["sliding_window"])
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    experts = config.get("num_local_experts", config.get("num_experts"))
    if experts:  # Qwen2MoeModel.set_gguf_parameters
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    return layers, heads, kv_heads


def llama3_rope_factors(config: dict) -> np.ndarray | None:
    """LlamaModel.generate_extra_tensors: a llama3 rope as the factors llama.cpp divides
    each frequency by. As there, the original context is config.json's top-level one or
    8192, not the rope dict's (Llama 3.x's are 8192 both)."""
    import torch

    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if params.get("rope_type", "").lower() != "llama3":
        return None
    base = params.get("rope_theta", 10000.0)
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = params.get("factor", 8.0)
    low_freq_factor = params.get("low_freq_factor", 1.0)
    high_freq_factor = params.get("high_freq_factor", 4.0)
    old_context_len = config.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32).numpy()


def _stacked_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Qwen2MoeModel.modify_tensors: each layer's experts' gate, up and down matrices
    stacked into one [experts, out, in] tensor, `mlp.experts.{gate,up,down}_proj.weight`."""
    out, experts = {}, {}
    for name, data in tensors.items():
        m = re.fullmatch(r"(.*\.mlp\.experts)\.(\d+)\.(\w+_proj)\.weight", name)
        if m is None:
            out[name] = data
        else:
            experts.setdefault(f"{m[1]}.{m[3]}.weight", {})[int(m[2])] = data
    for name, by_index in experts.items():
        out[name] = np.stack([by_index[i] for i in sorted(by_index)])
    return out


def _rope_params(config: dict) -> dict:
    """The converter's rope_parameters: a layer-typed rope's full_attention part."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return params.get("full_attention", params)


def _rope_theta(config: dict) -> float:
    return float(_rope_params(config).get("rope_theta", config.get("rope_theta", 10000.0)))


def _add_rope_scaling(writer, config: dict) -> None:
    """TextModel.set_gguf_parameters: a linear rope's type and factor, a sliding layers'
    own theta (Phi3MiniModel, which does not call it, writes neither)."""
    import gguf

    if config["model_type"] == "phi3":
        return
    params = _rope_params(config)
    if params.get("rope_type") == "linear" and params.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(params["factor"])
    sliding = (config.get("rope_parameters") or {}).get("sliding_attention", {})
    if sliding.get("rope_theta") is not None:
        writer.add_rope_freq_base_swa(sliding["rope_theta"])


def _add_gemma3_parameters(writer, config: dict) -> None:
    """Gemma3Model.set_gguf_parameters: the final soft-cap where set, the window (no
    pattern: llama.cpp's Gemma 3 slides 5 layers of 6)."""
    if config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    writer.add_sliding_window(config["sliding_window"])


def _add_phi3_parameters(writer, config: dict) -> None:
    """Phi3MiniModel.set_gguf_parameters: the original context, the rotary width, the
    window (0 where none: Phi-4's), longrope's attention factor."""
    params = _rope_params(config)
    original = params.get("original_max_position_embeddings",
                          config.get("original_max_position_embeddings"))
    rotary = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_dimension_count(
        int(rotary * config["hidden_size"]) // config["num_attention_heads"])
    writer.add_sliding_window(config.get("sliding_window") or 0)
    if params.get("long_factor"):
        scale = config["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)


def _longrope_factors(config: dict) -> dict[str, np.ndarray]:
    """Phi3MiniModel.generate_extra_tensors: longrope's factor lists as two tensors."""
    params = _rope_params(config)
    if config["model_type"] != "phi3" or not params.get("long_factor"):
        return {}
    return {"rope_factors_long.weight": np.asarray(params["long_factor"], np.float32),
            "rope_factors_short.weight": np.asarray(params["short_factor"], np.float32)}


def _add_vocab(writer, hf_dir: Path, config: dict, pre: str) -> None:
    """The converter's set_vocab: a byte-fallback vocabulary as _set_vocab_sentencepiece
    writes it, any other as _set_vocab_gpt2 (its split named `pre`)."""
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    if tok["model"].get("byte_fallback"):
        _add_sentencepiece_vocab(writer, hf_dir, tok, config)
    else:
        _add_gpt2_vocab(writer, tok, config, pre)


def _add_gpt2_vocab(writer, tok: dict, config: dict, pre: str) -> None:
    """_set_vocab_gpt2: the vocabulary in id order, special tokens CONTROL, the merges."""
    import gguf

    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    by_id.update({t["id"]: t["content"] for t in tok["added_tokens"]})
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    tokens, types = [], []
    for i in range(config["vocab_size"]):
        token = by_id.get(i, f"[PAD{i}]")
        tokens.append(token)
        types.append(gguf.TokenType.CONTROL if token in special else
                     gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    merges = tok["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    if _appends_eos(tok, by_id[config["eos_token_id"]]):
        writer.add_add_eos_token(True)


def _appends_eos(tok: dict, eos: str) -> bool:
    """SpecialVocab's reading of a TemplateProcessing post-processor: add_eos_token where
    its single-text template ends with the EOS (Qwen3-Embedding's `$A <|endoftext|>`)."""
    processor = tok.get("post_processor") or {}
    if processor.get("type") != "TemplateProcessing":
        return False
    single = processor.get("single") or []
    return len(single) > 1 and single[-1].get("SpecialToken", {}).get("id") == eos


def _add_sentencepiece_vocab(writer, hf_dir: Path, tok: dict, config: dict) -> None:
    """_set_vocab_sentencepiece (_create_vocab_sentencepiece, then SpecialVocab): each
    piece with its SentencePiece score (a BPE model's: minus its merge rank; 0 for the
    special and byte pieces) and type (UNKNOWN, CONTROL, BYTE, NORMAL), no merges; the
    special ids, add_bos/add_eos and the chat template from tokenizer_config.json."""
    import gguf

    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    first_piece = 3 + 256  # after <unk>, <s>, </s> and the byte pieces
    tokens, scores, types = [], [], []
    for i in range(config["vocab_size"]):
        token = by_id.get(i, f"[PAD{i}]")
        tokens.append(token)
        scores.append(-10000.0 if i not in by_id else min(0.0, float(first_piece - i)))
        types.append(gguf.TokenType.UNKNOWN if token == "<unk>" else
                     gguf.TokenType.CONTROL if token in special else
                     gguf.TokenType.BYTE if re.fullmatch(r"<0x[0-9A-F]{2}>", token) else
                     gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    tok_config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    writer.add_bos_token_id(tok["model"]["vocab"][tok_config["bos_token"]])
    writer.add_eos_token_id(tok["model"]["vocab"][tok_config["eos_token"]])
    writer.add_unk_token_id(tok["model"]["vocab"]["<unk>"])
    writer.add_add_bos_token(tok_config.get("add_bos_token", True))
    writer.add_add_eos_token(tok_config.get("add_eos_token", False))
    if tok_config.get("add_prefix_space") is False:  # as Gemma's converter writes it
        writer.add_add_space_prefix(False)
    writer.add_chat_template(tok_config["chat_template"])


def _add_starcoder2_parameters(writer, config: dict) -> int:
    """StarCoder2Model: TextModel.set_gguf_parameters alone (LayerNorm's epsilon; no
    window: llama.cpp's StarCoder2 has none)."""
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_eps(config["norm_epsilon"])
    return config["num_hidden_layers"]


def _add_lfm2_parameters(writer, config: dict) -> int:
    """LFM2Model.set_gguf_parameters: KV heads per layer (0 on short-conv layers), the conv
    width, the MLP width as block_auto_adjust_ff_dim rounds it."""
    kv = [config["num_key_value_heads"] if t != "conv" else 0 for t in config["layer_types"]]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(kv)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_shortconv_l_cache(config["conv_L_cache"])
    writer.add_layer_norm_rms_eps(config["norm_eps"])
    ff_dim = config["intermediate_size"]
    if config["block_auto_adjust_ff_dim"]:
        ff_dim = int(2 * ff_dim / 3)
        if config["block_ffn_dim_multiplier"] is not None:
            ff_dim = int(config["block_ffn_dim_multiplier"] * ff_dim)
        multiple = config["block_multiple_of"]
        ff_dim = multiple * ((ff_dim + multiple - 1) // multiple)
    writer.add_feed_forward_length(ff_dim)
    return config["num_hidden_layers"]


def _add_gpt2_parameters(writer, config: dict) -> int:
    """GPT2Model.set_gguf_parameters (an MLP 4 x n_embd wide, as GPT-2's)."""
    writer.add_block_count(config["n_layer"])
    writer.add_context_length(config["n_positions"])
    writer.add_embedding_length(config["n_embd"])
    writer.add_feed_forward_length(4 * config["n_embd"])
    writer.add_head_count(config["n_head"])
    writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    return config["n_layer"]


def falcon_kv_heads(config: dict) -> int:
    """FalconModel's n_head_kv: num_kv_heads (Falcon-40B's), else 1 (Falcon-7B's
    config.json, multi-query, names none)."""
    if config.get("new_decoder_architecture"):
        return config["num_kv_heads"]
    return 1 if config.get("multi_query", True) else config["num_attention_heads"]


def _add_falcon_parameters(writer, config: dict) -> int:
    """FalconModel.set_gguf_parameters."""
    writer.add_context_length(2048)  # the converter's constant
    writer.add_tensor_data_layout("jploski")  # qkv in llama.cpp's order
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(4 * config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(falcon_kv_heads(config))
    writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    return config["num_hidden_layers"]


def _add_mamba_parameters(writer, config: dict) -> int:
    """MambaModel.set_gguf_parameters."""
    writer.add_context_length(2**20)  # arbitrary: the converter's
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_ssm_conv_kernel(config["conv_kernel"])
    writer.add_ssm_inner_size(config["intermediate_size"])
    writer.add_ssm_state_size(config["state_size"])
    writer.add_ssm_time_step_rank(config["time_step_rank"])
    writer.add_layer_norm_rms_eps(config["layer_norm_epsilon"])
    return config["num_hidden_layers"]


OWN_PARAMETERS = {"starcoder2": _add_starcoder2_parameters, "lfm2": _add_lfm2_parameters,
                  "gpt2": _add_gpt2_parameters, "falcon": _add_falcon_parameters,
                  "mamba": _add_mamba_parameters}


def _converter_tensors(arch: str, config: dict, tensors: dict[str, np.ndarray]):
    """(HF name, tensor) as each converter's modify_tensors hands them to the name map:
    LFM2's and Mamba's convolutions squeezed to 2-D, Mamba's A_log as A = -exp(A_log),
    GPT-2's Conv1D weights transposed (and its tied head written as `output`), Falcon's
    fused qkv in llama.cpp's order (all queries, then keys, then values)."""
    for hf_name, data in tensors.items():
        if arch in ("lfm2", "mamba") and data.ndim == 3 and "conv" in hf_name:
            data = data.squeeze(1)
        if arch == "mamba" and hf_name.endswith(".A_log"):
            data = -np.exp(data)
        if arch == "gpt2" and hf_name.endswith((".c_attn.weight", ".c_proj.weight",
                                                 ".c_fc.weight")):
            data = data.T
        if arch == "falcon" and "query_key_value" in hf_name:
            data = _falcon_qkv(data, config)
        yield hf_name, data
        if arch == "gpt2" and hf_name.endswith("wte.weight"):
            yield "lm_head.weight", data  # GPT2Model: "output is tied to (same as) wte"


def _falcon_qkv(data: np.ndarray, config: dict) -> np.ndarray:
    """FalconModel.modify_tensors: per KV group (its queries, a key, a value) -> queries,
    keys, values."""
    heads, kv = config["num_attention_heads"], falcon_kv_heads(config)
    head_dim = config["hidden_size"] // heads
    qkv = data.reshape(kv, heads // kv + 2, head_dim, -1)
    q = qkv[:, :-2].reshape(heads * head_dim, -1)
    k = qkv[:, [-2]].reshape(kv * head_dim, -1)
    v = qkv[:, [-1]].reshape(kv * head_dim, -1)
    return np.concatenate([q, k, v]).reshape(data.shape)


def write_out(writer) -> None:
    """A GGUFWriter's file written whole (header, metadata, tensors) and closed."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
