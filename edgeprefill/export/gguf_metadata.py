"""What transformers' GGUF reader (5.24) leaves out of its config of a Gemma 3, Phi-3,
StarCoder2 or Falcon GGUF file, read from the file as llama.cpp computes with it and
written into the staging config.json (as gguf_rope.py does for Llama 3.1+'s rope_freqs).

Gemma 3 (`gemma3`, llama.cpp's llama-model.cpp and Gemma3Model in convert_hf_to_gguf.py):
- the attention scale: llama.cpp's is 1/sqrt(head_dim), but for the 27B (62 layers)
  1/sqrt(hidden / heads), the checkpoints' query_pre_attn_scalar; transformers keeps
  Gemma3TextConfig's default, 256 (the 27B's is 168);
- the global layers' linear rope scaling (Gemma 3 4B, 12B, 27B: factor 8), which the
  converter writes as `rope.scaling.type`/`rope.scaling.factor`; transformers drops it;
- the sliding layers' rope theta (`rope.freq_base_swa` where the converter wrote it,
  else llama.cpp's constant 10000) and the final logit soft-cap where the file has one.
Phi-3 (`phi3`: Phi-3, Phi-3.5-mini, Phi-4-mini; Phi3MiniModel):
- the rotary width (`rope.dimension_count`: Phi-4-mini rotates 3/4 of each head), the
  window (`attention.sliding_window`, 0 for none) and the original context;
- the 128k variants' longrope: the config's factor lists, written as the tensors
  `rope_factors_long.weight` and `rope_factors_short.weight` (which transformers' reader
  skips), with `rope.scaling.attn_factor` the attention factor transformers derives
  from the two contexts (checked, and kept where it is another).
Falcon (`falcon`): the new decoder architecture (Falcon-40B, 180B, 11B), which
  transformers' table does not map (its Falcon is Falcon-7B's layout whatever the file).
StarCoder2 (`starcoder2`): the rope theta (`rope.freq_base`; StarCoder2-3B's 999999.44,
  15B's 100000), which transformers' table for it does not map (Starcoder2Config's
  default, 10000, instead).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.gguf_rope import field

LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
GEMMA3_27B_LAYERS = 62  # llama.cpp's LLM_TYPE_27B: the one size scaled by hidden / heads
GEMMA3_SWA_THETA = 10000.0  # llama.cpp's rope_freq_base_train_swa for Gemma 3
ATTN_FACTOR_RTOL = 1e-6  # the file's float32 attention factor against the derived one


def write_unmapped(reader: Any, file: str, config_file: Path) -> list[str]:
    """Complete `config_file` (transformers' config of the file `reader`, a
    gguf.GGUFReader, opened; `file` names it in messages) with what transformers' reader
    left out; return the names of the file's tensors read here (for no warning)."""
    complete = COMPLETIONS.get(field(reader, "general.architecture"))
    if complete is None:
        return []
    config = json.loads(config_file.read_text())
    used = complete(reader, config, file)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return used


def _gemma3(reader: Any, config: dict[str, Any], file: str) -> list[str]:
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
    config["query_pre_attn_scalar"] = (config["hidden_size"] // heads
                                       if layers == GEMMA3_27B_LAYERS else config["head_dim"])
    full = config["rope_parameters"]["full_attention"]
    scaling = field(reader, "gemma3.rope.scaling.type")
    if scaling == "linear":
        full.update(rope_type="linear", factor=float(field(reader, "gemma3.rope.scaling.factor")))
    elif scaling not in (None, "none"):
        raise ExportError(f"{file}: gemma3.rope.scaling.type {scaling!r} is not one Gemma 3 "
                          "uses (linear) nor one this export reads")
    swa_theta = field(reader, "gemma3.rope.freq_base_swa")
    config["rope_parameters"]["sliding_attention"] = {
        "rope_type": "default", "rope_theta": float(swa_theta or GEMMA3_SWA_THETA)}
    softcap = field(reader, "gemma3.final_logit_softcapping")
    if softcap:
        config["final_logit_softcapping"] = float(softcap)
    return []


def _phi3(reader: Any, config: dict[str, Any], file: str) -> list[str]:
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    rotary = field(reader, "phi3.rope.dimension_count") or head_dim
    params = config.setdefault("rope_parameters", {"rope_type": "default"})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if rotary != head_dim:  # Phi-4-mini's 3/4
        config["partial_rotary_factor"] = params["partial_rotary_factor"] = rotary / head_dim
    window = field(reader, "phi3.attention.sliding_window")
    config["sliding_window"] = window or None  # the converter writes 0 for none
    original = field(reader, "phi3.rope.scaling.original_context_length")
    if original:
        config["original_max_position_embeddings"] = int(original)
    factors = _longrope_factors(reader, file)
    if factors is None:
        return []
    if not original:
        raise ExportError(f"{file}: longrope factors ({', '.join(LONGROPE_TENSORS)}) without "
                          "phi3.rope.scaling.original_context_length: their window is unknown")
    long_factor, short_factor = factors
    if len(long_factor) != rotary // 2 or len(short_factor) != rotary // 2:
        raise ExportError(f"{file}: {len(long_factor)} long and {len(short_factor)} short "
                          f"longrope factors for {rotary} rotary dimensions (needs "
                          f"{rotary // 2} each)")
    params.update(rope_type="longrope", long_factor=long_factor, short_factor=short_factor,
                  original_max_position_embeddings=int(original))
    attn_factor = field(reader, "phi3.rope.scaling.attn_factor")
    derived = _longrope_attention_factor(config["max_position_embeddings"], int(original))
    if attn_factor is not None and not math.isclose(attn_factor, derived,
                                                    rel_tol=ATTN_FACTOR_RTOL):
        params["attention_factor"] = float(attn_factor)
    return list(LONGROPE_TENSORS)


def _starcoder2(reader: Any, config: dict[str, Any], file: str) -> list[str]:
    theta = field(reader, "starcoder2.rope.freq_base")
    if theta is not None:
        params = config.setdefault("rope_parameters", {"rope_type": "default"})
        params["rope_theta"] = float(theta)
    return []


def _falcon(reader: Any, config: dict[str, Any], file: str) -> list[str]:
    """llama.cpp tells Falcon's two layouts by their KV heads: one, Falcon-7B's multi-query
    (transformers' defaults); more, the new decoder architecture, its fused qkv per KV
    group (gguf_falcon.py), with ln_attn and ln_mlp where the file has `attn_norm_2`
    (Falcon-40B, 180B), one norm where not (Falcon-11B)."""
    kv_heads = field(reader, "falcon.attention.head_count_kv") or 1
    if kv_heads > 1:
        two_norms = any(t.name.endswith("attn_norm_2.weight") for t in reader.tensors)
        config.update(new_decoder_architecture=True, num_kv_heads=int(kv_heads),
                      num_ln_in_parallel_attn=2 if two_norms else 1)
    return []


COMPLETIONS = {"gemma3": _gemma3, "phi3": _phi3, "starcoder2": _starcoder2,
               "falcon": _falcon}


def _longrope_factors(reader: Any, file: str) -> tuple[list[float], list[float]] | None:
    """The long and short factor lists; None where the file has neither tensor."""
    found = {t.name: t for t in reader.tensors if t.name in LONGROPE_TENSORS}
    if not found:
        return None
    if len(found) == 1:
        raise ExportError(f"{file} has {next(iter(found))} alone: longrope needs both "
                          "factor lists")
    return _factor_list(found[LONGROPE_TENSORS[0]]), _factor_list(found[LONGROPE_TENSORS[1]])


def _factor_list(tensor: Any) -> list[float]:
    """float32's shortest decimals (1.1, not 1.100000023841858): the config's own values
    where it wrote them so, the same float32 factors transformers computes with."""
    from gguf import dequantize

    return [float(str(np.float32(x))) for x in dequantize(tensor.data, tensor.tensor_type).ravel()]


def _longrope_attention_factor(max_positions: int, original: int) -> float:
    """transformers' (and the converter's) longrope attention factor."""
    scale = max_positions / original
    return math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
