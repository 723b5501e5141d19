"""What is special about a model, in words: the manifest's `source.quirks`, which
`edgeprefill inspect` shows. The family's fixed quirks (FamilySpec.quirks), then what its
config.json chose (mixers, experts, windows, KV layout, rope), each once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.values import span

if TYPE_CHECKING:
    from edgeprefill.export.model_config import ModelConfig


def model_quirks(cfg: ModelConfig) -> list[str]:
    """What is special about this model, in words (manifest and `inspect`): the family's
    fixed quirks, then what its config chose, kind by kind, each once."""
    out = [*cfg.spec.quirks, *_weights(cfg), *_mixers(cfg), *_block(cfg), *_attention(cfg),
           *_kv_cache(cfg), *_altup(cfg), *_positions(cfg)]
    return list(dict.fromkeys(out))


def _weights(cfg: ModelConfig) -> list[str]:
    """Weights the checkpoint stored quantized (bitsandbytes, FP8: read back to float;
    int4: kept as stored where the bundle holds int4), and an LM head whose rows the model
    normalizes (Baichuan 2's NormHead)."""
    out = [scheme.describe() for scheme in (cfg.bnb, cfg.fp8, cfg.int4) if scheme is not None]
    if cfg.lm_head_normalized:
        out.append("LM head rows L2-normalized (NormHead), written so at export")
    return out


def _mixers(cfg: ModelConfig) -> list[str]:
    """The layers other than attention (short convolutions, Gated DeltaNet or Kimi's KDA,
    Mamba, RWKV, mLSTM), ZAYA's CCA states and the experts."""
    out = []
    if cfg.conv_layers:
        out.append(f"{len(cfg.conv_layers)} of {cfg.num_layers} layers gated short "
                   f"convolutions of {cfg.conv_kernel} tokens (a conv state per sequence)")
    if cfg.delta_layers:
        kind = "KDA" if cfg.spec.kda else "Gated DeltaNet"
        out.append(f"{len(cfg.delta_layers)} of {cfg.num_layers} layers {kind} "
                   "linear attention (a conv and a recurrent state per sequence)")
    if cfg.moe is not None:
        out.append(cfg.moe.describe(cfg.num_layers))
    if cfg.nas is not None:
        out.append(cfg.nas.describe())
    if cfg.cca is not None:
        out.append(f"q/k convolved over {cfg.cca.width + 1} tokens (cca_time0 "
                   f"{cfg.cca.depthwise}, cca_time1 {cfg.cca.grouped}): a conv and a "
                   "delayed-value state per sequence beside each layer's KV")
    if cfg.mamba_layers:
        kind = "Mamba-1" if cfg.selective is not None else "Mamba-2"
        out.append(f"{len(cfg.mamba_layers)} of {cfg.num_layers} layers {kind} "
                   "(a conv and a recurrent state per sequence)")
    if cfg.rwkv_layers:
        out.append(f"{len(cfg.rwkv_layers)} of {cfg.num_layers} layers RWKV-4 time and "
                   "channel mixes (token-shift and WKV states per sequence)")
    if cfg.lightning_layers:
        out.append(f"{len(cfg.lightning_layers)} of {cfg.num_layers} layers lightning "
                   "attention (a recurrent state per sequence)")
    if cfg.mlstm_layers:
        out.append(f"{len(cfg.mlstm_layers)} of {cfg.num_layers} layers mLSTM cells (a "
                   "matrix memory, normalizer and stabilizer state per sequence)")
    return out


def _block(cfg: ModelConfig) -> list[str]:
    """The residual layout where it is not pre-norm sequential (as the config chose it,
    where the family's block depends on it: Chameleon, Molmo 2)."""
    # From the config, not the family: GPT-NeoX and StableLM choose their residual.
    return {"parallel": ["parallel residual (attention and MLP each on its own norm)"],
            "shared": ["parallel attention and MLP on one norm"],
            # OLMo 2's; Chameleon's swin_norm and Molmo 2's norm_after choose it
            "post": ["norms after attention and MLP"],
            "sandwich": ["norms before and after attention and MLP"]}.get(cfg.block, [])


def _attention(cfg: ModelConfig) -> list[str]:
    """The attention's output gate, its local layers (their own rope base, the window)
    and a context cap."""
    out = []
    if cfg.head_gate:
        out.append(("a softplus" if cfg.spec.softplus_gate else "a sigmoid")
                   + " output gate per attention " + (
                       "channel (a bias per head)" if cfg.spec.channel_gate else
                       "channel" if cfg.gate_per_channel else "head"))
    if any(layer.rope == LOCAL for layer in cfg.layers) and \
            cfg.ropes[LOCAL].theta != cfg.ropes[GLOBAL].theta:
        out.append("local layers with their own rope base")
    local = sum(layer.window is not None for layer in cfg.layers)
    if local:
        out.append(f"sliding window {cfg.sliding_window} on {local} of {cfg.num_layers} "
                   "layers")
    if cfg.spec.sparse_index:  # DeepSeek sparse attention, where the bundle's context bites
        out.append(f"DeepSeek sparse attention: each query keeps its "
                   f"{cfg.sparse_index.topk} best keys by a lightning indexer"
                   if cfg.sparse_index else "DeepSeek sparse attention within its index_topk "
                   "at this context: every key kept (dense latent attention, no indexer)")
    if cfg.spec.block_index:  # MiniMax-M3's, where the bundle's context bites
        blocks = cfg.block_index
        out.append(f"block-sparse attention: each KV head's queries keep their "
                   f"{blocks.topk} best blocks of {blocks.block} keys by a lightning indexer "
                   "(its index key cached in one more KV head)" if blocks else
                   "block-sparse attention within its index_topk_blocks at this context: "
                   "every block kept (dense attention, no indexer)")
    if cfg.context_cap is not None:
        out.append(f"the context is capped at {cfg.context_cap.tokens} tokens, "
                   f"{cfg.context_cap.reason}")
    return out


def _kv_cache(cfg: ModelConfig) -> list[str]:
    """What the KV cache holds other than each layer's own keys and values of head_dim:
    layers' own head counts and sizes, narrower values, shared and k = v layers."""
    out = []
    # OpenELM's, DeciLM's counts by layer (not MiniMax-M3's index key head: its own line)
    if any(layer.heads for layer in cfg.layers) and cfg.block_index is None:
        heads = [cfg.layer_heads(i) for i in cfg.kv_layers]
        kv = [cfg.layer_kv_heads(i) for i in cfg.kv_layers]
        dims = [cfg.layer_head_dim(i) for i in cfg.kv_layers]  # dots.3's differ too
        out.append(f"{span(heads)} query heads and {span(kv)} KV heads of {span(dims)}, "
                   "by layer")
    own = {("sliding" if layer.window else "full-attention", cfg.layer_kv_heads(i),
            cfg.layer_head_dim(i)) for i, layer in enumerate(cfg.layers)
           if (layer.head_dim or layer.kv_heads) and not layer.heads}
    for kind, heads, dim in sorted(own):
        out.append(f"{kind} layers: {heads} KV heads of {dim}")
    if cfg.v_head_dim is not None:
        out.append(f"value heads of {cfg.v_head_dim}, cached padded to {cfg.head_dim}")
    if cfg.shared_kv:
        out.append(f"the last {len(cfg.shared_kv)} of {cfg.num_layers} layers read an "
                   "earlier layer's KV (no cache of their own)")
    if cfg.k_eq_v:
        out.append("full-attention layers' values are their keys' projection")
    return out


def _altup(cfg: ModelConfig) -> list[str]:
    """Gemma 3n's AltUp streams and sparse MLPs."""
    out = []
    if cfg.altup is not None:
        out.append(f"{cfg.altup.streams} AltUp streams")
    sparse = sum(s > 0 for s in cfg.sparsity)
    if sparse:
        out.append(f"activation sparsity on {sparse} of {cfg.num_layers} layers' MLPs")
    return out


def _latent_key(cfg: ModelConfig) -> str:
    """The cached key part of latent attention (k_pe): rotated, or, where its layers have
    no rope (Kimi Linear's NoPE MLA), the projection as it is."""
    if any(cfg.layers[i].rope is not None for i in cfg.kv_layers):
        return "rotated key part"
    return "NoPE key part"


def _attention_layers(cfg: ModelConfig) -> list[int]:
    """The layers with attention: those holding KV (Falcon-H1's and Zamba2's beside a
    state) and those reading another layer's."""
    return [i for i in range(cfg.num_layers)
            if i in cfg.kv_layers or i in cfg.shared_kv]


def _positions(cfg: ModelConfig) -> list[str]:
    """How positions enter: ALiBi, layers without rope, partial or latent rotary, and
    each rope type other than the default."""
    out = []
    if cfg.alibi is not None:
        rounded = ", rounded to bfloat16 as Falcon's" if cfg.alibi_bfloat16 else ""
        out.append("ALiBi: each head's scores biased by its slope times the distance "
                   f"(no rotary{rounded})")
    # Only attention takes a rope: a state layer's (KDA, Mamba) None is no news
    attending = _attention_layers(cfg)
    nope = sum(cfg.layers[i].rope is None for i in attending)
    # none attending (Mamba-2), no rope is no news; nor under ALiBi, which said it
    if nope and cfg.kv_layers and cfg.alibi is None:
        if len(attending) == cfg.num_layers:
            out.append(f"{nope} of {cfg.num_layers} layers without rope")
        else:
            out.append(f"{nope} of {len(attending)} attention layers without rope")
    if cfg.latent is not None:
        index = f" + index key {cfg.latent.index_dim}" if cfg.latent.index_dim else ""
        own = {layer.latent for layer in cfg.layers if layer.latent is not None}
        sliding = "".join(f"; dots.3's sliding layers one of {s.cache_dim} ({s.rope_dim} + "
                          f"latent {s.kv_lora_rank})" for s in own)
        out.append(f"KV cache: one head of {cfg.head_dim} per token and layer "
                   f"({_latent_key(cfg)} {cfg.latent.rope_dim} + latent "
                   f"{cfg.latent.kv_lora_rank}{index}){sliding}")
    elif cfg.spec.rotary_per_type:  # Laguna: each layer kind its own share of the head
        widths = {name: cfg.ropes[name].rotary_dim for name in (GLOBAL, LOCAL)
                  if any(layer.rope == name for layer in cfg.layers)}
        if any(width < cfg.head_dim for width in widths.values()):
            out.append("rotary on " + ", ".join(
                f"{width} of {cfg.head_dim} head dims ({name} layers)"
                for name, width in widths.items()))
    elif cfg.rotary_dim < cfg.head_dim:
        out.append(f"rotary on {cfg.rotary_dim} of {cfg.head_dim} head dims")
    for name, rope in cfg.ropes.items():
        used = any(layer.rope == name for layer in cfg.layers)
        if used and rope.kind != "default":
            out.append(f"rope ({name} layers): {rope.describe()}")
    return out
