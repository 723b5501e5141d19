"""One normalizing place for Hugging Face config.json files, and the family registry.

Published checkpoints were written by many transformers versions: `rope_theta` at the top
level or inside `rope_parameters`, `rope_scaling` with `type` or `rope_type`, `head_dim`
absent or null, `num_key_value_heads` absent. Everything downstream reads the fields of
`ModelConfig` and never looks at the raw dict.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeprefill.errors import ExportError
from edgeprefill.export.config_checks import check_model_config


@dataclass(frozen=True)
class FamilySpec:
    """What distinguishes one decoder family from plain Llama."""

    qkv_bias: bool | None  # None: read `attention_bias` from the config (also biases o_proj)
    qk_norm: bool  # per-head RMSNorm on q and k before rotary (Qwen3)
    tie_default: bool  # `tie_word_embeddings` when the config does not say


FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(qkv_bias=None, qk_norm=False, tie_default=False),
    "mistral": FamilySpec(qkv_bias=False, qk_norm=False, tie_default=False),
    "qwen2": FamilySpec(qkv_bias=True, qk_norm=False, tie_default=False),
    "qwen3": FamilySpec(qkv_bias=None, qk_norm=True, tie_default=False),
}

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    kind: str = "default"  # one of ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ROPE_TYPES:
            raise ExportError(
                f"rope type {self.kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
            )


@dataclass(frozen=True)
class ModelConfig:
    family: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_positions: int
    tie_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    rope: RopeConfig
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_model_config(self)

    @property
    def spec(self) -> FamilySpec:
        return FAMILIES[self.family]

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ModelConfig:
        family = raw.get("model_type")
        if family not in FAMILIES:
            raise ExportError(
                f"model_type {family!r} is not supported; supported: {', '.join(sorted(FAMILIES))}"
            )
        spec = FAMILIES[family]
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ExportError(f"hidden_act {act!r} is not supported (only silu)")
        if raw.get("mlp_bias"):
            raise ExportError("mlp_bias=true is not supported")
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            attention_bias = bool(raw.get("attention_bias", False))
            return cls(
                family=family,
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(_given(raw.get("num_key_value_heads"), heads)),
                head_dim=int(raw.get("head_dim") or hidden // max(heads, 1)),  # 0: refused
                vocab_size=int(raw["vocab_size"]),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_positions=int(raw.get("max_position_embeddings", 2048)),
                tie_embeddings=bool(raw.get("tie_word_embeddings", spec.tie_default)),
                qkv_bias=attention_bias if spec.qkv_bias is None else spec.qkv_bias,
                o_bias=attention_bias if spec.qkv_bias is None else False,
                qk_norm=spec.qk_norm,
                rope=_rope_from_hf(raw),
                sliding_window=_sliding_window(raw),
                bos_token_id=_first_id(raw.get("bos_token_id")),
                eos_token_ids=_ids(raw.get("eos_token_id")),
            )
        except KeyError as missing:
            raise ExportError(f"config.json lacks the required key {missing}") from None
        except (TypeError, ValueError) as bad:
            raise ExportError(f"config.json has a malformed value: {bad}") from None

    @classmethod
    def from_dir(cls, hf_dir: Path) -> ModelConfig:
        path = hf_dir / "config.json"
        if not path.is_file():
            raise ExportError(f"{path} not found: is {hf_dir} a Hugging Face model folder?")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ExportError(f"{path} is not valid JSON: {err}") from None
        if not isinstance(raw, dict):
            raise ExportError(f"{path} does not hold a JSON object")
        return cls.from_hf(raw)


def _rope_from_hf(raw: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters` (theta inside); older versions write
    # `rope_theta` plus an optional `rope_scaling` whose kind is `type` or `rope_type`.
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    return RopeConfig(
        theta=float(theta),
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_positions=int(params.get("original_max_position_embeddings", 8192)),
    )


def _given(value: Any, default: Any) -> Any:
    """`value` unless absent or null; 0 stays 0 (and is refused), unlike `value or default`."""
    return default if value is None else value


def _sliding_window(raw: dict[str, Any]) -> int | None:
    # Qwen2/3 carry `sliding_window` but only use it with `use_sliding_window`.
    if raw.get("use_sliding_window") is False:
        return None
    window = raw.get("sliding_window")
    return int(window) if window else None


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)


def _first_id(value: Any) -> int | None:
    ids = _ids(value)
    return ids[0] if ids else None


def rope_inv_freq(rope: RopeConfig, head_dim: int):
    """Inverse frequencies [head_dim/2] as float32, computed as transformers does."""
    import numpy as np

    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    inv_freq = (1.0 / (rope.theta**exponents)).astype(np.float32)
    if rope.kind == "linear":
        return (inv_freq / rope.factor).astype(np.float32)
    if rope.kind == "llama3":
        return _llama3_scaled(inv_freq, rope)
    return inv_freq


def _llama3_scaled(inv_freq, rope: RopeConfig):
    import numpy as np

    low_wavelen = rope.original_max_positions / rope.low_freq_factor
    high_wavelen = rope.original_max_positions / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)
