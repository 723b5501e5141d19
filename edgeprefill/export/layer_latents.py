"""What dots.3's config adds to the latent attention (`FamilySpec.latent_layers`), read
as Dots3NoteTextConfig and Dots3NoteTextAttention read it: the attention's own traits
(its latent norms at rms_norm_eps, the shared key part RMS-normed before rotary, the
LoRA scales sqrt(hidden / rank) always on), and sliding layers whose latent attention
has sizes and heads of its own (`per_layer_config`: layer -> its num_attention_heads,
q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; the model's
where an entry leaves one out). Those layers cache their own [k_pe | c] head and have no
indexer (IndexShape.plain)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from edgeprefill.errors import ExportError
from edgeprefill.export.latent_attention import LatentShape, read_latent

if TYPE_CHECKING:
    from edgeprefill.export.layer_attention import LayerAttention

# The per_layer_config keys Dots3NoteTextAttention reads (head_dim is nope + rope there;
# num_key_value_heads must equal the query heads: one latent head is cached either way)
_SIZES = ("num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
          "head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def dots_latent(raw: dict[str, Any]) -> LatentShape:
    """The latent attention of config.json's own keys as dots.3 builds it."""
    hidden = int(raw["hidden_size"])
    shape = read_latent(raw)
    if shape.q_lora_rank is None:
        raise ExportError("config.json: q_lora_rank null (a dense query) is not supported: "
                          "dots.3's query is low-rank")
    return replace(shape, norm_eps=float(raw["rms_norm_eps"]), rope_norm=True,
                   q_scale=(hidden / shape.q_lora_rank) ** 0.5,
                   latent_scale=(hidden / shape.kv_lora_rank) ** 0.5)


def latent_layers(raw: dict[str, Any], layers: tuple[LayerAttention, ...]
                  ) -> tuple[LayerAttention, ...]:
    """Each sliding layer with its own latent sizes, heads, cached head and scale
    (qk_head_dim^-0.5 of its own heads, as a factor of the model's); the others as they
    are (per_layer_config may name sliding layers only)."""
    table = raw.get("per_layer_config") or {}
    if not isinstance(table, dict):
        raise ExportError("config.json: per_layer_config must be an object of layer -> sizes")
    sliding = {i for i, layer in enumerate(layers) if layer.window is not None}
    own_sizes: dict[int, dict[str, Any]] = {}
    for key, overrides in table.items():
        # (transformers writes the keys zero-padded to the widest layer number: "02")
        if not str(key).isdigit() or int(key) not in sliding:
            raise ExportError(f"config.json: per_layer_config names layer {key}, which is not "
                              "a sliding_attention layer; only those may have sizes of "
                              "their own")
        unknown = set(overrides) - set(_SIZES)
        if unknown:
            raise ExportError(f"config.json: per_layer_config overrides "
                              f"{', '.join(sorted(unknown))}; supported: {', '.join(_SIZES)}")
        own_sizes[int(key)] = overrides
    model = dots_latent(raw)
    out = list(layers)
    for i in sorted(sliding):
        own = {**raw, **own_sizes.get(i, {})}
        heads, kv_heads = int(own["num_attention_heads"]), int(own["num_key_value_heads"])
        if heads != kv_heads:
            raise ExportError(f"config.json: layer {i}'s num_key_value_heads ({kv_heads}) must "
                              f"be its num_attention_heads ({heads})")
        shape = dots_latent(own)
        out[i] = replace(out[i], latent=shape, heads=heads, kv_heads=1,
                         head_dim=shape.cache_dim,
                         scale=out[i].scale * (shape.qk_dim / model.qk_dim) ** -0.5)
    return tuple(out)
