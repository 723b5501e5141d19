"""NVIDIA's Llama-Nemotron NAS models (`model_type: nemotron-nas`: Llama-3_3-Nemotron-Super-
49B-v1 and v1.5, Llama-3_1-Nemotron-51B-Instruct, Llama-3_1-Nemotron-Ultra-253B-v1; remote
code, configuration_decilm.py and modeling_decilm.py, class DeciLMForCausalLM; transformers
has no class for it): DeciLM's successor, Llama whose layers are each a NAS block of their
own (`block_configs`, export/nas_blocks.py): attention with its own KV head count, one
linear layer or none, and an MLP of its own width, one linear layer or none.

DeciLMConfig is a LlamaConfig that clears intermediate_size and num_key_value_heads (each
block has its own); its attention and MLP are Llama's with attention_bias and mlp_bias,
its rope transformers' (Super's and Ultra's llama3). The tokenizer is Llama 3's, and
Super's "detailed thinking on/off" a system prompt of its chat template.
"""

from __future__ import annotations

from typing import Any

from edgeprefill.export.families.spec import FamilySpec
from edgeprefill.export.nas_blocks import read_blocks

# The per-layer KV list export derives from block_configs (layer_heads.listed_heads reads
# it, one count for the query heads of every layer).
KV_LIST = "num_key_value_heads_per_layer"
HEAD_LISTS = ("num_attention_heads", KV_LIST)


def _nas_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The model-wide sizes DeciLMConfig clears, from the blocks: the KV heads of the first
    layer with attention (the manifest's num_kv_heads; each layer's own where it differs),
    and the widest MLP (hidden_size where every FFN is linear or left out); and the KV heads
    per layer (a layer without attention takes the first's: it holds no KV to size)."""
    blocks = read_blocks(raw)
    first = next(kv for kv in blocks.kv_heads if kv is not None)
    widths = [width for width in blocks.widths if width is not None]
    return {**raw, "num_key_value_heads": first,
            "intermediate_size": max(widths, default=int(raw["hidden_size"])),
            KV_LIST: [first if kv is None else kv for kv in blocks.kv_heads]}


FAMILIES: dict[str, FamilySpec] = {
    "nemotron-nas": FamilySpec(
        heads_per_layer=HEAD_LISTS, nas_blocks=True,
        ignores=("intermediate_size", "num_key_value_heads", KV_LIST),
        bias_key="attention_bias", o_bias=None, mlp_bias_key="mlp_bias",
        legacy=_nas_config,
        quirks=("remote-code family: no transformers class",),
    ),
}
