"""A Falcon GGUF's fused qkv rows back in transformers' order.

llama.cpp's converter (FalconModel.modify_tensors in convert_hf_to_gguf.py) writes
`query_key_value` as all the queries, then the keys, then the values; transformers' Falcon
keeps them per KV group: the group's queries, its key, its value. transformers' GGUF reader
does not undo it. Falcon-7B's one group (multi-query) reads the same either way; the new
decoder architecture's several (Falcon-40B, 180B, 11B) do not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

QKV = "attn_qkv.weight"  # the fused projection's GGUF name (in every block)


def grouped_qkv(name: str, weights: np.ndarray, config: Any) -> np.ndarray:
    """`weights` of the GGUF tensor `name` as transformers' Falcon of `config` reads them."""
    if not name.endswith(QKV) or not getattr(config, "new_decoder_architecture", False):
        return weights
    heads, groups = config.num_attention_heads, config.num_kv_heads
    head_dim = weights.shape[0] // (heads + 2 * groups)
    q_rows, kv_rows = heads * head_dim, groups * head_dim
    q = weights[:q_rows].reshape(groups, heads // groups, head_dim, -1)
    k = weights[q_rows:q_rows + kv_rows].reshape(groups, 1, head_dim, -1)
    v = weights[q_rows + kv_rows:].reshape(groups, 1, head_dim, -1)
    return np.concatenate([q, k, v], axis=1).reshape(weights.shape)
