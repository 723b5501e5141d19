"""Baichuan 1 and 2 (`model_type: baichuan`, Baichuan's remote code: transformers has no
class for it): Llama with q, k and v in one projection, `self_attn.W_pack`, whose rows are
all the queries, then all the keys, then all the values (its attention unflattens them as
(3, hidden)), one KV head per query head and no biases.

Two choices tell the four models apart, and no key of config.json names either. Each is
read from the keys of the model's own config class, which config.json keeps (transformers
writes every attribute of the class):

- Positions. The 7B models (Baichuan-7B, Baichuan2-7B) rotate q and k (base 10000); their
  config classes define `max_position_embeddings`, which their rotary reads. The 13B models
  (Baichuan-13B, Baichuan2-13B) add ALiBi instead (`_get_interleave`'s slopes, BLOOM's:
  export/alibi.py) and their config classes have no such key, only `model_max_length`,
  the length their ALiBi mask is first built to. A config with neither is refused, and so
  is a released shape (7B: hidden 4096, 32 heads; 13B: 5120, 40) whose keys say the other
  model's positions.
- LM head. Baichuan 2's is a NormHead: logits = hidden @ normalize(W).T, each row of the
  stored weight L2-normalized at the first forward. Baichuan 1's is a plain Linear. The
  vocabularies differ (Baichuan 2's 125,696 tokens, Baichuan 1's 64,000: how vLLM and
  TensorRT-LLM tell the versions apart), and Baichuan 2's config class has
  `z_loss_weight`, which Baichuan 1's lack. Another vocabulary without that key is refused:
  its head could be either. A row normalized twice is the same row, so a Baichuan 2
  checkpoint whose head was normalized already exports the same.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec

BAICHUAN2_VOCAB = 125696
BAICHUAN1_VOCAB = 64000
# The released models' (hidden_size, num_attention_heads) -> whether they use ALiBi.
RELEASED_ALIBI = {(4096, 32): False, (5120, 40): True}
# Keys other families' models read that Baichuan's ignores (a fixed rotary base, no grouped
# KV heads, no biases), and `alibi`, which _baichuan_config writes: dropped before reading.
IGNORED = ("num_key_value_heads", "head_dim", "rope_theta", "rope_scaling", "rope_parameters",
           "partial_rotary_factor", "sliding_window", "use_sliding_window", "layer_types",
           "no_rope_layers", "attention_bias", "mlp_bias", "alibi")


def uses_alibi(raw: dict[str, Any]) -> bool | None:
    """ALiBi (a 13B config class: model_max_length alone), rotary (a 7B one:
    max_position_embeddings), or None where config.json has neither key."""
    if raw.get("max_position_embeddings") is not None:
        return False
    if raw.get("model_max_length") is not None:
        return True
    return None


def norm_head(raw: dict[str, Any]) -> bool | None:
    """Baichuan 2's NormHead (its config class's z_loss_weight, or its vocabulary), Baichuan
    1's plain head (its vocabulary without that key), or None: neither."""
    if "z_loss_weight" in raw or raw.get("vocab_size") == BAICHUAN2_VOCAB:
        return True
    if raw.get("vocab_size") == BAICHUAN1_VOCAB:
        return False
    return None


def _baichuan_config(raw: dict[str, Any]) -> dict[str, Any]:
    """One KV head per query head; the positions as the stored keys say (uses_alibi),
    recorded as `alibi`; under ALiBi no layer rotates and model_max_length is the
    positions' length (ALiBi has no limit: the mask grows past it)."""
    alibi = uses_alibi(raw)
    if alibi is None:
        return raw  # refused: _baichuan_unsupported
    raw = {**raw, "alibi": alibi, "num_key_value_heads": raw["num_attention_heads"]}
    if alibi:
        raw["max_position_embeddings"] = raw["model_max_length"]
        raw["no_rope_layers"] = [0] * int(raw["num_hidden_layers"])
    return raw


def _baichuan_unsupported(raw: dict[str, Any]) -> str | None:
    if "alibi" not in raw:
        return ("config.json has neither max_position_embeddings (Baichuan 7B's rotary) nor "
                "model_max_length (Baichuan 13B's ALiBi): which positions the model uses is "
                "unknown")
    shape = (int(raw["hidden_size"]), int(raw["num_attention_heads"]))
    released = RELEASED_ALIBI.get(shape)
    if released is not None and released != raw["alibi"]:
        keys = "max_position_embeddings (rotary)" if not raw["alibi"] else \
            "model_max_length without max_position_embeddings (ALiBi)"
        model = "13B's, which uses ALiBi" if released else "7B's, which uses rotary"
        return (f"config.json has {keys}, but hidden_size {shape[0]} with {shape[1]} heads "
                f"is Baichuan {model}: which positions the model uses is unknown")
    if norm_head(raw) is None:
        return (f"vocab_size {raw.get('vocab_size')} is neither Baichuan 2's "
                f"({BAICHUAN2_VOCAB}: a normalized LM head) nor Baichuan 1's "
                f"({BAICHUAN1_VOCAB}: a plain one), and config.json has no z_loss_weight "
                "(Baichuan 2's): which LM head the model has is unknown")
    return None


FAMILIES: dict[str, FamilySpec] = {
    "baichuan": FamilySpec(
        names=replace(LLAMA_NAMES, qkv="self_attn.W_pack"),
        legacy=_baichuan_config, refuse=_baichuan_unsupported, ignores=IGNORED,
        alibi_from_config=lambda raw: bool(raw["alibi"]),
        head_normalized=lambda raw: bool(norm_head(raw)),
        defaults={"hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                  "bos_token_id": 1, "eos_token_id": 2},
        quirks=("q/k/v fused (W_pack)", "remote-code family: no transformers class"),
    ),
}
