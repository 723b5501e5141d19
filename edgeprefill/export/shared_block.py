"""Zamba2's shared transformer blocks, applied between its Mamba-2 layers.

Every layer of Zamba2 is a Mamba-2 mixer after an RMSNorm, added to the residual. Before
the mixer of each layer in `hybrid_layer_ids` (an "application" of a shared block), as
transformers' Zamba2HybridLayer computes it:

  t   = input_layernorm(concat(x, embeddings))      [2H]: x beside the token embeddings
  q   = q_proj(t) + q_adapter_k(t)                   (k, v alike; adapters only with
                                                     use_shared_attention_adapter)
  a   = o_proj(attention(q, k, v))                   head_dim 2H / heads, scale
                                                     (head_dim / 2)^-0.5, rotary only with
                                                     use_mem_rope; its own KV cache
  t   = down(act(gate) * up), gate|up = gate_up_proj(pre_ff_layernorm(a)) + adapter_k(..)
  x   = x + mamba(input_layernorm(x + linear(t)))    `linear` is the layer's own

Application k runs block k % num_mem_blocks, whose weights are stored once, under the
first hybrid layer that runs it (layers.{that layer}.shared_transformer.); its adapters
(LoRA: rank `adapter_rank`, down then up) are application k's own, stored in that block as
`..._adapter_list.{k}.`. transformers 5 ties the blocks only where tie_word_embeddings is
true (its tied-weights mapping is off otherwise): untied, each hybrid layer runs the block
stored under its own name. The KV cache is each application's own: the hybrid layer's KV
entry, beside its mixer's states (ModelConfig.kv_state_layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeprefill.contract import kv_names
from edgeprefill.errors import ExportError

if TYPE_CHECKING:
    from edgeprefill.export.decoder import DecoderBuilder
    from edgeprefill.export.flavors import StepTensors


@dataclass(frozen=True)
class SharedBlockShape:
    layers: tuple[int, ...]  # the hybrid layers, one application each, in order
    blocks: int  # num_mem_blocks: application k runs block k % blocks
    attention_adapters: bool  # use_shared_attention_adapter (the MLP's always has them)
    bias: bool  # add_bias_linear: the MLP's gate_up and down biases
    tied: bool  # tie_word_embeddings: the applications of a block share its weights
    # Zamba (v1)'s block instead: stored as `shared_transf.`, its MLP's gate and up apart and
    # without adapters
    module: str = "shared_transformer."
    mlp_adapters: bool = True

    @property
    def renames(self) -> tuple[tuple[str, str], ...]:
        """A hybrid layer's mixer and its norm (`mamba_decoder.`) read as a plain mamba
        layer's (checkpoint renames: stored prefix, read as)."""
        return tuple((f"model.layers.{i}.mamba_decoder.", f"model.layers.{i}.")
                     for i in self.layers)

    def stored(self, layer: int) -> str:
        """The prefix of the weights of the block hybrid layer `layer` runs."""
        if self.tied:
            layer = self.layers[self.layers.index(layer) % self.blocks]
        return f"model.layers.{layer}.{self.module}"


def read_shared_block(raw: dict[str, Any]) -> SharedBlockShape:
    """Zamba2Config's shared blocks (families/recurrent.py's _zamba2_config lists the
    hybrid layers under `zamba_hybrid_layers`; _zamba_config adds Zamba's names)."""
    blocks = int(raw["num_mem_blocks"])
    if blocks < 1:
        raise ExportError(f"num_mem_blocks must be at least 1, got {blocks}")
    return SharedBlockShape(layers=tuple(raw["zamba_hybrid_layers"]), blocks=blocks,
                            attention_adapters=bool(raw["use_shared_attention_adapter"]),
                            bias=bool(raw["add_bias_linear"]),
                            tied=bool(raw["tie_word_embeddings"]),
                            module=raw.get("zamba_shared_module", "shared_transformer."),
                            mlp_adapters=bool(raw.get("zamba_mlp_adapters", True)))


class SharedBlock:
    """Emits the shared block's applications of one graph (module docstring)."""

    def __init__(self, builder: DecoderBuilder, embeddings: str) -> None:
        assert builder.cfg.shared_block is not None
        self.b = builder
        self.s: SharedBlockShape = builder.cfg.shared_block
        self.embeddings = embeddings  # the tokens' embeddings, laid out as the stream

    def apply(self, layer: int, x: str, step: StepTensors) -> str:
        """linear(block(concat(x, embeddings))) of hybrid layer `layer`: what its mixer's
        input norm reads added to the residual stream x."""
        b, g = self.b, self.b.g
        pre, application = self.s.stored(layer), self.s.layers.index(layer)
        both = g.op("Concat", [x, self.embeddings], axis=-1)  # [.., 2H]
        h = b._norm(both, pre + "input_layernorm", 2 * b.cfg.hidden_size)
        attn = self._attention(pre, application, layer, h, step)
        t = self._mlp(pre, application, b._norm(attn, pre + "pre_ff_layernorm"))
        return b.w.linear(t, [f"model.layers.{layer}.linear.weight"], None)

    def _attention(self, pre: str, application: int, layer: int, h: str,
                   step: StepTensors) -> str:
        """[.., H]: attention of the application's q, k, v over its own KV cache."""
        b, g, cfg = self.b, self.b.g, self.b.cfg
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        names = [pre + f"self_attn.{part}_proj.weight" for part in ("q", "k", "v")]
        self._check(names, [q_size, kv_size, kv_size], 2 * cfg.hidden_size)
        q, k, v = g.op("Split", [b.w.linear(h, names, None),
                                 g.const([q_size, kv_size, kv_size])], 3, axis=-1)
        if self.s.attention_adapters:
            q, k, v = (g.op("Add", [t, self._adapter(
                pre + f"self_attn.linear_{part}_adapter_list.{application}.", h)])
                for t, part in zip((q, k, v), ("q", "k", "v"), strict=True))
        q, k, v = (b.tokens.spread(t) for t in (q, k, v))
        kv = kv_names(layer)
        attn = b.flavor.attention(g, q, k, v, (kv.past_key, kv.past_value),
                                  (kv.present_key, kv.present_value), step, cfg.layers[layer])
        attn = b.tokens.gather(attn, q_size)
        o = pre + "self_attn.o_proj.weight"
        b.w.check_output(o, cfg.num_heads, cfg.head_dim, cfg.hidden_size)
        return b.w.linear(attn, [o], None)

    def _mlp(self, pre: str, application: int, h: str) -> str:
        """The block's gated MLP, its gate|up plus the application's adapter."""
        b, g = self.b, self.b.g
        bias = self.s.bias
        if not self.s.mlp_adapters:  # Zamba: gate_proj and up_proj
            gate_up = b.w.linear(h, [pre + f"feed_forward.{part}_proj.weight"
                                     for part in ("gate", "up")], None)
        else:
            proj = pre + "feed_forward.gate_up_proj"
            gate_up = g.op("Add", [
                b.w.linear(h, [proj + ".weight"], proj + ".bias" if bias else None),
                self._adapter(pre + f"feed_forward.gate_up_proj_adapter_list.{application}.",
                              h)])
        gate, up = g.op("Split", [gate_up], 2, axis=-1, num_outputs=2)
        act = g.op("Mul", [b._activation(gate), up])
        down = pre + "feed_forward.down_proj"
        return b.w.linear(act, [down + ".weight"], down + ".bias" if bias else None)

    def _adapter(self, pre: str, h: str) -> str:
        """An application's LoRA adapter: `pre`1(`pre`0(h)), rank adapter_rank."""
        w = self.b.w
        return w.linear(w.linear(h, [pre + "0.weight"], None), [pre + "1.weight"], None)

    def _check(self, names: list[str], rows: list[int], width: int) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        cfg = self.b.cfg
        self.b.w.check_shapes(
            [(name, (out, width)) for name, out in zip(names, rows, strict=True)],
            f"{cfg.num_heads} heads of 2 x hidden_size / heads = {cfg.head_dim}, "
            f"{cfg.num_kv_heads} KV heads, input 2 x hidden_size")
