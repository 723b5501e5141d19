"""Consistency checks of a normalized model config, run once when `ModelConfig` is built.

A config that no graph can honour (no heads, heads that do not split into KV groups, ids
outside the vocabulary) is refused here in one line, instead of exporting a bundle that
fails at load time with a traceback.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from edgeprefill.errors import ExportError

if TYPE_CHECKING:
    from pathlib import Path

    from tokenizers import Tokenizer

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

# The sizes export builds tables and layer lists from before it reads a weight: the least
# and the largest each may be. The largest is far above any published model's (hidden
# 25600, 126 layers, 128 heads, head_dim 512, intermediate 53248, vocab 262144), far
# below what would exhaust the memory before a weight's shape could disagree (head_dim
# 2**40: a 4 TiB rope table).
SIZE_LIMITS = {
    "num_hidden_layers": (1, 2**16), "hidden_size": (1, 2**20), "head_dim": (1, 2**20),
    "num_attention_heads": (1, 2**16), "num_key_value_heads": (1, 2**16),
    "intermediate_size": (1, 2**24), "vocab_size": (1, 2**24),
    # no table is as long (a bundle's context is --max-context): a limit only for its type
    "max_position_embeddings": (1, 2**62),
    "num_nextn_predict_layers": (0, 2**16),  # DeepSeek-V3's MTP layers, left out
    "altup_num_inputs": (1, 2**16),  # Gemma 3n's streams
    # multi-head latent attention (export/latent_attention.py)
    "q_lora_rank": (1, 2**20), "kv_lora_rank": (1, 2**20), "qk_nope_head_dim": (0, 2**20),
    "qk_rope_head_dim": (1, 2**20), "v_head_dim": (1, 2**20),
}
JSON_TYPES = {dict: "an object", str: "a string", list: "a list"}
# The keys whose value the family hooks read as an object (null: none).
OBJECT_KEYS = ("text_config", "rope_parameters", "rope_scaling", "quantization_config",
               "attn_config", "ffn_config")  # DBRX's


def config_value(raw: dict[str, Any], key: str, kind: type) -> Any:
    """raw[key] where it is of `kind` (a key of JSON_TYPES), None where absent or null;
    anything else is refused in one line (a rope_parameters string had been an
    AttributeError deep in the rope code)."""
    value = raw.get(key)
    if value is not None and not isinstance(value, kind):
        raise ExportError(f"config.json: {key} must be {JSON_TYPES[kind]}, "
                          f"got {type(value).__name__}")
    return value


def check_objects(raw: dict[str, Any]) -> None:
    """Each OBJECT_KEYS key an object, null or absent (a text_config string had been an
    AttributeError in the family's unnest hook)."""
    for key in OBJECT_KEYS:
        config_value(raw, key, dict)


def positive_number(raw: dict[str, Any], key: str) -> float:
    """raw[key] as a positive finite float (a negative query_pre_attn_scalar had made the
    attention scale a complex number)."""
    value = float(raw[key])  # a string or list: from_hf's "malformed value" line
    if not (math.isfinite(value) and value > 0):
        raise ExportError(f"config.json: {key} must be positive, got {raw[key]!r}")
    return value


def check_sizes(raw: dict[str, Any]) -> None:
    """The SIZE_LIMITS keys config.json gives (null or absent: derived, checked later), each a
    positive integer within its limit (a list of them, one per layer: Gemma 3n's MLPs)."""
    for key in SIZE_LIMITS:
        value = raw.get(key)
        for size in value if isinstance(value, list) and key == "intermediate_size" else [value]:
            if size is None:
                continue
            if isinstance(size, bool) or not isinstance(size, int):
                raise ExportError(f"config.json: {key} must be an integer, got {size!r}")
            least, most = SIZE_LIMITS[key]
            if size < least:
                raise ExportError(f"config.json: {key} must be "
                                  f"{'positive' if least else 'at least 0'}, got {size}")
            if size > most:
                raise ExportError(f"config.json: {key} must be at most {most}, got {size}")


# The sizes every family reads as integers after its hooks have filled in what they derive:
# null there is no "derive it" (as check_sizes takes it) but a config.json missing its value.
GIVEN_SIZES = ("num_attention_heads", "hidden_size", "intermediate_size", "num_hidden_layers",
               "vocab_size")


def check_given(raw: dict[str, Any]) -> None:
    """Each GIVEN_SIZES key null in config.json named in one line (int(None) had been a
    "malformed value" line that named no key)."""
    for key in GIVEN_SIZES:
        if key in raw and raw[key] is None:
            raise ExportError(f"config.json: {key} is null; it must be a positive integer")


def check_model_config(cfg: ModelConfig) -> None:
    for name, hf_name in POSITIVE_FIELDS.items():
        if getattr(cfg, name) < 1:
            raise ExportError(f"config.json: {hf_name} must be positive, got {getattr(cfg, name)}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ExportError(
            f"config.json: num_attention_heads ({cfg.num_heads}) is not a multiple of "
            f"num_key_value_heads ({cfg.num_kv_heads})"
        )
    key = cfg.spec.eps_key or (
        "layer_norm_eps" if cfg.norm.startswith("layer") else "rms_norm_eps")
    for eps, name in ((cfg.norm_eps, key), (cfg.final_norm_eps, key),
                      (cfg.post_norm_eps, cfg.spec.post_norm_eps_key)):
        if eps is not None and not (math.isfinite(eps) and eps > 0):
            raise ExportError(f"config.json: {name} must be positive, got {eps}")
    temperature = cfg.residual_gate_temperature
    if temperature is not None and not (math.isfinite(temperature) and temperature != 0):
        raise ExportError(f"config.json: {cfg.spec.residual_gate_key} must be a nonzero "
                          f"number, got {temperature}")
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


def check_tokenizer_fits(tokenizer_json: Path | Tokenizer, vocab_size: int) -> None:
    """Every id the tokenizer can produce must have a row in the embedding. The tokenizer:
    a tokenizer.json file, or one converted from slow files (export/slow_tokenizer.py)."""
    from tokenizers import Tokenizer

    tokenizer = tokenizer_json
    if not isinstance(tokenizer, Tokenizer):
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
