"""Nemotron-H's one-sublayer blocks read as export's pre-norm layers.

A Nemotron-H block is a norm and one sublayer added to the residual: a Mamba-2 mixer
(`linear_attention`), attention (`full_attention`), an MLP (`mlp`) or experts (`moe`). A
mixer block followed by an MLP block is exactly a pre-norm layer (input norm, mixer,
post-attention norm, MLP), so each mixer block starts a layer, the MLP block after it (if
any) completes it, and a mixer followed by another mixer makes a layer without an MLP.
The checkpoint's tensors are read under the layer's names (`renames`, as the checkpoint
reader applies them), so the decoder and the contract see ordinary layers: the KV and
state names count these layers, not the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeprefill.errors import ExportError

# Nemotron-H's block kinds -> the kind of the layer a mixer block starts
MIXERS = {"linear_attention": "mamba", "full_attention": "full_attention"}
# Where a checkpoint keeps its blocks: the Hub's (`backbone.`) and transformers 5's saves,
# and both under Nemotron 3 Nano Omni's `language_model.` (its whole causal LM).
STORED = ("backbone.layers.", "model.layers.", "language_model.backbone.layers.",
          "language_model.model.layers.")


@dataclass(frozen=True)
class LayerGroups:
    layer_types: list[str]  # per layer: "mamba" or "full_attention"
    mlp_less: tuple[int, ...]  # layers whose mixer block no MLP block follows
    renames: tuple[tuple[str, str], ...]  # (stored prefix, read as) of every block


def group_blocks(kinds: list[str]) -> LayerGroups:
    """The layers of Nemotron-H blocks of `kinds` (transformers' names, dense: no `moe`);
    an MLP block no mixer block precedes is refused in one line."""
    types: list[str] = []
    with_mlp: set[int] = set()
    renames: list[tuple[str, str]] = []
    for block, kind in enumerate(kinds):
        if kind in MIXERS:
            layer = len(types)
            types.append(MIXERS[kind])
            mixer = "mamba." if kind == "linear_attention" else "self_attn."
            renames += _block(block, layer, "input_layernorm.", mixer)
        elif kind == "mlp" and types and len(types) - 1 not in with_mlp:
            layer = len(types) - 1
            with_mlp.add(layer)
            renames += _block(block, layer, "post_attention_layernorm.", "mlp.")
        else:
            raise ExportError(f"nemotron_h: block {block} ({kind}) is not supported there; "
                              "a block is mamba or attention, or an MLP right after one")
    mlp_less = tuple(i for i in range(len(types)) if i not in with_mlp)
    return LayerGroups(types, mlp_less, tuple(renames))


def _block(block: int, layer: int, norm: str, sublayer: str) -> list[tuple[str, str]]:
    """The renames of block `block`'s norm and sublayer to layer `layer`'s `norm` and
    `sublayer`."""
    read_as = f"model.layers.{layer}."
    return [(f"{stored}{block}.{part}", read_as + to) for stored in STORED
            for part, to in (("norm.", norm), ("mixer.", sublayer))]
