"""Consistency checks of a normalized model config, run once when `ModelConfig` is built.

A config that no graph can honour (no heads, heads that do not split into KV groups, ids
outside the vocabulary) is refused here in one line, instead of exporting a bundle that
fails at load time with a traceback.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from edgeprefill.errors import ExportError

if TYPE_CHECKING:
    from edgeprefill.export.model_config import ModelConfig

# config field -> the name config.json gives it, for messages the user can act on.
POSITIVE_FIELDS = {
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
    "max_positions": "max_position_embeddings",
}


def check_model_config(cfg: ModelConfig) -> None:
    for name, hf_name in POSITIVE_FIELDS.items():
        if getattr(cfg, name) < 1:
            raise ExportError(f"config.json: {hf_name} must be positive, got {getattr(cfg, name)}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ExportError(
            f"config.json: num_attention_heads ({cfg.num_heads}) is not a multiple of "
            f"num_key_value_heads ({cfg.num_kv_heads})"
        )
    if not (math.isfinite(cfg.norm_eps) and cfg.norm_eps > 0):
        key = cfg.spec.eps_key or (
            "layer_norm_eps" if cfg.spec.norm.startswith("layer") else "rms_norm_eps")
        raise ExportError(f"config.json: {key} must be positive, got {cfg.norm_eps}")
    for rope in cfg.ropes.values():
        if not (math.isfinite(rope.theta) and rope.theta > 0):
            raise ExportError(f"config.json: rope_theta must be positive, got {rope.theta}")
    if cfg.sliding_window is not None and cfg.sliding_window < 1:
        raise ExportError(f"config.json: sliding_window must be positive, got {cfg.sliding_window}")
    ids = [*cfg.eos_token_ids, *([] if cfg.bos_token_id is None else [cfg.bos_token_id])]
    outside = [i for i in ids if not 0 <= i < cfg.vocab_size]
    if outside:
        raise ExportError(
            f"config.json: bos/eos token ids {outside} are outside the vocabulary "
            f"(vocab_size {cfg.vocab_size})"
        )


def check_tokenizer_fits(tokenizer_json, vocab_size: int) -> None:
    """Every id the tokenizer can produce must have a row in the embedding."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_json))
    except Exception as err:  # tokenizers raises plain Exception for bad files
        raise ExportError(f"cannot read {tokenizer_json}: {err}") from None
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    top = max(ids, default=-1)
    if top >= vocab_size:
        raise ExportError(
            f"the tokenizer produces ids up to {top} but the model's vocab_size is "
            f"{vocab_size}: config.json and tokenizer.json do not belong together"
        )
