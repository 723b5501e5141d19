"""Rotary position embeddings: the scaling types, computed as transformers computes them.

`transformers.modeling_rope_utils` computes inverse frequencies (and a factor that scales
cos and sin) per rope type; a bundle bakes the resulting cos/sin tables into its graph.
The types whose frequencies depend on the sequence length are pinned to one choice per
bundle (see `RopeConfig.for_context` and docs/design.md, "Rotary scaling"):

- `dynamic`: transformers recomputes the base only past `max_position_embeddings`, which
  a bundle never reaches (export refuses a larger context): it is `default` in a bundle.
- `ntk_alpha`: HunYuan's "dynamic" rope with a fixed `alpha`, which only stretches the base
  (theta * alpha ** (dim / (dim - 2))): static, whatever the sequence length.
- `longrope`: transformers takes `short_factor` while the sequence is at most
  `original_max_position_embeddings` long and `long_factor` beyond; a bundle whose context
  fits the original window uses the short factors, a larger one the long factors.
- `proportional`: the default rope on the first `partial_rotary_factor` of each head's
  frequencies and zero frequencies (no rotation) on the rest, over the whole head (the
  global layers of LFM3 and Gemma 4): unlike a partial rotary, the rotated pairs are
  (i, i + head_dim / 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.config_checks import config_value

# RopeConfig fields the rope computations divide by or take the log of -> their config key.
POSITIVE_PARAMS = {"factor": "factor",
                   "original_max_positions": "original_max_position_embeddings",
                   "beta_fast": "beta_fast", "beta_slow": "beta_slow", "alpha": "alpha",
                   "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor"}


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    kind: str = "default"  # a key of ROPE_TYPES
    rotary_dim: int = 0  # dims rotated per head (partial rotary: fewer than head_dim)
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_positions: int = 8192  # llama3, yarn, longrope
    max_positions: int = 2048  # the config's max_position_embeddings (longrope, yarn)
    attention_factor: float | None = None  # yarn, longrope: None derives it from factor
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn
    short_factor: tuple[float, ...] = ()  # longrope
    long_factor: tuple[float, ...] = ()  # longrope
    use_long_factor: bool = False  # longrope: which set this bundle uses (for_context)
    alpha: float = 1.0  # ntk_alpha
    proportion: float = 1.0  # proportional: the share of frequencies that rotate

    def __post_init__(self) -> None:
        if self.kind not in ROPE_TYPES:
            raise ExportError(
                f"rope type {self.kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
            )
        if self.rotary_dim % 2:
            raise ExportError(f"the rotary dimension must be even, got {self.rotary_dim}")
        for name, key in POSITIVE_PARAMS.items():
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):  # a log or a division by it
                raise ExportError(f"config.json: the rope's {key} must be positive, got {value}")
        if not 0 <= self.proportion <= 1:  # the share of a head's frequencies that rotate
            raise ExportError(f"config.json: the rope's partial_rotary_factor must be 0 to 1, "
                              f"got {self.proportion}")
        if self.kind == "longrope":
            half = self.rotary_dim // 2
            for name in ("short_factor", "long_factor"):
                if len(getattr(self, name)) != half:
                    raise ExportError(
                        f"longrope {name} has {len(getattr(self, name))} entries; the rotary "
                        f"dimension {self.rotary_dim} needs {half}"
                    )

    def for_context(self, max_context: int) -> RopeConfig:
        """The variant a bundle of `max_context` positions uses (longrope: short or long)."""
        if self.kind != "longrope":
            return self
        return replace(self, use_long_factor=max_context > self.original_max_positions)

    def inv_freq(self) -> np.ndarray:
        """[rotary_dim / 2] float32 inverse frequencies."""
        return ROPE_TYPES[self.kind](self).astype(np.float32)

    def cos_sin_scale(self) -> float:
        """The factor transformers multiplies cos and sin by (`attention_scaling`)."""
        if self.kind == "yarn":
            return _yarn_attention_factor(self)
        if self.kind == "longrope":
            return _longrope_attention_factor(self)
        return 1.0

    def describe(self) -> str:
        if self.kind == "longrope":
            return f"longrope ({'long' if self.use_long_factor else 'short'} factors)"
        if self.kind == "ntk_alpha":
            return f"NTK alpha {self.alpha:g}"
        if self.kind == "proportional":
            scaled = "" if self.factor == 1.0 else f" x{self.factor:g}"
            return f"proportional ({self.proportion:g} of each head's frequencies){scaled}"
        return self.kind if self.factor == 1.0 else f"{self.kind} x{self.factor:g}"


def _exponents(rope: RopeConfig) -> np.ndarray:
    dim = rope.rotary_dim
    return np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)


def _default(rope: RopeConfig) -> np.ndarray:
    return (1.0 / (np.float32(rope.theta) ** _exponents(rope))).astype(np.float32)


def _ntk_alpha(rope: RopeConfig) -> np.ndarray:
    # HunYuanDenseV1RotaryEmbedding: the base in double precision, then the default rope.
    dim = rope.rotary_dim
    return _default(replace(rope, theta=rope.theta * rope.alpha ** (dim / (dim - 2))))


def _proportional(rope: RopeConfig) -> np.ndarray:
    # transformers' _compute_proportional_rope_parameters: the exponents' denominator is
    # the whole head (rotary_dim, which is head_dim), the frequencies past the rotated
    # share are zero (cos 1, sin 0), and all are divided by the factor.
    half = rope.rotary_dim // 2
    rotated = int(rope.proportion * rope.rotary_dim // 2)
    exponents = np.arange(0, 2 * rotated, 2, dtype=np.int64).astype(np.float32) \
        / np.float32(rope.rotary_dim)
    inv_freq = np.zeros(half, np.float32)
    inv_freq[:rotated] = 1.0 / (np.float32(rope.theta) ** exponents)
    return (inv_freq / np.float32(rope.factor)).astype(np.float32)


def _linear(rope: RopeConfig) -> np.ndarray:
    return (_default(rope) / np.float32(rope.factor)).astype(np.float32)


def _llama3(rope: RopeConfig) -> np.ndarray:
    inv_freq = _default(rope)
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


def _yarn(rope: RopeConfig) -> np.ndarray:
    dim, base = rope.rotary_dim, rope.theta
    pos_freqs = np.float32(base) ** _exponents(rope)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (np.float32(rope.factor) * pos_freqs)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_positions / (rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)  # share of the extrapolated frequency
    return (interpolation * (1 - keep) + extrapolation * keep).astype(np.float32)


def _yarn_attention_factor(rope: RopeConfig) -> float:
    if rope.attention_factor is not None:
        return rope.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    return mscale(rope.factor)


def _longrope(rope: RopeConfig) -> np.ndarray:
    factors = rope.long_factor if rope.use_long_factor else rope.short_factor
    ext = np.asarray(factors, dtype=np.float32)
    return (1.0 / (ext * (np.float32(rope.theta) ** _exponents(rope)))).astype(np.float32)


def _longrope_attention_factor(rope: RopeConfig) -> float:
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(rope.factor) / math.log(rope.original_max_positions))


# transformers' shared rope types (ROPE_INIT_FUNCTIONS, and default), which every family's
# model computes; the others in ROPE_TYPES are one family's own (FamilySpec.rope_types),
# which the other families' models fail on.
SHARED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
ROPE_TYPES: dict[str, Callable[[RopeConfig], np.ndarray]] = {
    "default": _default,
    "linear": _linear,
    "dynamic": _default,  # = default within max_position_embeddings (see the module doc)
    "llama3": _llama3,
    "yarn": _yarn,
    "longrope": _longrope,
    "ntk_alpha": _ntk_alpha,
    "proportional": _proportional,
}


def rope_params(raw: dict[str, Any]) -> dict[str, Any]:
    """The rope dict transformers 5 reads from a config with one rope (or one per layer
    type, unmerged): `rope_scaling or rope_parameters`, as PreTrainedConfig's
    convert_rope_params_to_dict. A legacy `rope_scaling` replaces `rope_parameters` whole,
    theta included (its own, else the top-level `rope_theta`, else the default)."""
    return config_value(raw, "rope_scaling", dict) or config_value(raw, "rope_parameters", dict) \
        or {}


def rope_from_params(
    params: dict[str, Any], raw: dict[str, Any], rotary_dim: int, theta_default: float = 10000.0
) -> RopeConfig:
    """One RopeConfig from a rope parameter dict (`rope_parameters` of transformers >= 5,
    or the older `rope_scaling` with `rope_theta` at the top level of `raw`)."""
    kind = params.get("rope_type", params.get("type", "default"))
    max_positions = int(raw.get("max_position_embeddings", 2048))
    # As transformers' standardize_rope_params: a top-level value wins over the rope
    # dict's (Phi-3 saves both), and without either the window is max_position_embeddings.
    original = _first(raw.get("original_max_position_embeddings"),
                      params.get("original_max_position_embeddings"), max_positions)
    factor = params.get("factor")
    if factor is None:
        # longrope/yarn without a factor: the ratio of the extended to the original window.
        factor = max_positions / original if (original and kind in ("longrope", "yarn")) else 1.0
    return RopeConfig(
        theta=float(params.get("rope_theta", raw.get("rope_theta", theta_default))),
        kind=kind,
        rotary_dim=rotary_dim,
        factor=float(factor),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_positions=int(original),
        max_positions=max_positions,
        attention_factor=_optional_float(params.get("attention_factor")),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=_optional_float(params.get("mscale")),
        mscale_all_dim=_optional_float(params.get("mscale_all_dim")),
        truncate=bool(params.get("truncate", True)),
        short_factor=tuple(float(f) for f in params.get("short_factor") or ()),
        long_factor=tuple(float(f) for f in params.get("long_factor") or ()),
        alpha=float(params.get("alpha") or 1.0),
        proportion=float(params.get("partial_rotary_factor", 1.0))
        if kind == "proportional" else 1.0,
    )


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
