"""Llama-Nemotron's NAS blocks (`model_type: nemotron-nas`, `block_configs`): each layer's
two sublayers, attention and FFN, each chosen by neural architecture search to be whole
("full": Llama attention with num_attention_heads // n_heads_in_group KV heads, or a
SwiGLU MLP of its own width from ffn_mult), one linear layer hidden -> hidden without bias
("linear": `self_attn.linear_attn`, `mlp.linear_mlp`) or left out ("none").

A sublayer that is there reads its norm of the residual stream and adds its output to it,
as Llama's do; a sublayer left out has no norm either (its block builds neither), so the
stream passes on unchanged. Only full attention holds KV: the other layers are the
manifest's `attention_free_layers`, with neither KV nor state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeprefill.bundle import short_repr
from edgeprefill.errors import ExportError
from edgeprefill.values import is_integral

FULL, LINEAR, NONE = "full", "linear", "none"  # what a sublayer is
# the tensors of a sublayer replaced by one linear layer, relative to the layer prefix
LINEAR_ATTENTION, LINEAR_MLP = "self_attn.linear_attn.weight", "mlp.linear_mlp.weight"
# The keys of block_configs' entries the remote code's AttentionConfig and FFNConfig
# read for inference. `sparsify` only registers a backward hook (training), so any value
# computes the same forward.
ATTENTION_KEYS = ("no_op", "replace_with_linear", "n_heads_in_group", "sparsify")
FFN_KEYS = ("no_op", "replace_with_linear", "ffn_mult", "sparsify")
# Attention switches the remote code has that export does not compute (a sliding window,
# attention sinks): refused unless off (null or false).
WINDOW_KEYS = ("window_length", "num_sink_tokens", "unshifted_sink",
               "use_prefill_window_in_sink_attention")


@dataclass(frozen=True)
class NasBlocks:
    attention: tuple[str, ...]  # per layer: FULL, LINEAR or NONE
    ffn: tuple[str, ...]  # per layer: FULL, LINEAR or NONE
    kv_heads: tuple[int | None, ...]  # per layer: its KV heads where its attention is FULL
    widths: tuple[int | None, ...]  # per layer: its MLP's width where its FFN is FULL

    @property
    def attention_free(self) -> tuple[int, ...]:
        """The layers without attention of their own: no KV."""
        return tuple(i for i, kind in enumerate(self.attention) if kind != FULL)

    def describe(self) -> str:
        """The blocks in words, for the manifest's quirks (`inspect`)."""
        parts = [f"{name} {_counts(kinds)}" for name, kinds in
                 (("attention", self.attention), ("FFN", self.ffn)) if _counts(kinds)]
        widths = sorted({w for w in self.widths if w is not None})
        if widths:
            parts.append("MLP widths " + (str(widths[0]) if len(widths) == 1 else
                                          f"{widths[0]}-{widths[-1]}"))
        return f"NAS blocks of {len(self.attention)} layers (" + "; ".join(parts) + ")"


def _counts(kinds: tuple[str, ...]) -> str:
    """How many of `kinds` are left out and a linear layer, in words ("" for none)."""
    return ", ".join(f"{kinds.count(kind)} {what}" for kind, what in
                     ((NONE, "left out"), (LINEAR, "a linear layer")) if kind in kinds)


def read_blocks(raw: dict[str, Any]) -> NasBlocks:
    """`block_configs` as the remote code's BlockConfig reads it, one entry per layer;
    what it cannot be, or what export cannot compute, refused in one line."""
    layers, heads = int(raw["num_hidden_layers"]), int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    blocks = raw.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) != layers or not all(
            isinstance(block, dict) for block in blocks):
        raise ExportError(f"config.json: block_configs must list an object for each of the "
                          f"{layers} layers, got {short_repr(blocks)}")
    attention, ffn, kv, widths = [], [], [], []
    for i, block in enumerate(blocks):
        attn = _sublayer(block, i, "attention", ATTENTION_KEYS)
        attention.append(_kind(attn, i, "attention"))
        kv.append(_kv_heads(attn, i, heads) if attention[-1] == FULL else None)
        mlp = _sublayer(block, i, "ffn", FFN_KEYS)
        ffn.append(_kind(mlp, i, "ffn"))
        widths.append(ffn_width(_ffn_mult(mlp, i), hidden) if ffn[-1] == FULL else None)
    if FULL not in attention:
        raise ExportError("config.json: no block of block_configs has attention; export "
                          "needs at least one")
    return NasBlocks(tuple(attention), tuple(ffn), tuple(kv), tuple(widths))


def ffn_width(mult: float, hidden: int) -> int:
    """The remote code's _ffn_mult_to_intermediate_size: int(2 * ffn_mult * hidden / 3)
    rounded up to a multiple of 256."""
    width = int(2 * mult * hidden / 3)
    return -(-width // 256) * 256


def _sublayer(block: dict[str, Any], i: int, name: str, keys: tuple[str, ...]
              ) -> dict[str, Any]:
    """Block `i`'s `name` entry (absent: every field its default, as BlockConfig.from_dict
    reads it), refused where it sets a key export does not know or cannot compute."""
    entry = block.get(name, {})
    if not isinstance(entry, dict):
        raise ExportError(f"config.json: block_configs[{i}].{name} must be an object, got "
                          f"{short_repr(entry)}")
    full = not entry.get("no_op") and not entry.get("replace_with_linear")
    # a window or sinks count only where the attention is whole (AttentionConfig clears
    # them otherwise)
    known = keys + (WINDOW_KEYS if name == "attention" and not full else ())
    refused = sorted(key for key, value in entry.items()
                     if key not in known and value not in (None, False))
    if refused:
        what = ("a sliding window or attention sinks" if set(refused) <= set(WINDOW_KEYS)
                else "settings export does not know")
        raise ExportError(f"config.json: block_configs[{i}].{name} sets "
                          f"{', '.join(refused)}: {what}, not supported")
    return entry


def _kind(entry: dict[str, Any], i: int, name: str) -> str:
    if entry.get("no_op") and entry.get("replace_with_linear"):
        raise ExportError(f"config.json: block_configs[{i}].{name} is both no_op and "
                          "replace_with_linear; it can be one of them")
    return NONE if entry.get("no_op") else LINEAR if entry.get("replace_with_linear") else FULL


def _kv_heads(entry: dict[str, Any], i: int, heads: int) -> int:
    """num_attention_heads // n_heads_in_group, the group a divisor of the heads."""
    group = entry.get("n_heads_in_group")
    if not is_integral(group) or not 0 < group <= heads or heads % group:
        raise ExportError(f"config.json: block_configs[{i}].attention.n_heads_in_group must "
                          f"be a positive divisor of num_attention_heads ({heads}), got "
                          f"{short_repr(group)}")
    return heads // int(group)


def _ffn_mult(entry: dict[str, Any], i: int) -> float:
    # FFNConfig rounds it to 6 decimals before anything reads it
    mult = entry.get("ffn_mult")
    if isinstance(mult, bool) or not isinstance(mult, int | float) or not mult > 0:
        raise ExportError(f"config.json: block_configs[{i}].ffn.ffn_mult must be a positive "
                          f"number, got {short_repr(mult)}")
    return round(float(mult), 6)
