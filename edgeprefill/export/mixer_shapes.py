"""The shapes of the layers that carry a recurrent state instead of KV, as config.json
gives them: LFM2's short convolutions, Qwen3.5's Gated DeltaNet, the Mamba-2 and Mamba-1
mixers, RecurrentGemma's RG-LRU blocks, xLSTM's mLSTM cells, and Falcon-H1's multipliers
of the attention and Mamba-2 it runs side by side. Each `read_*` returns its fields of
ModelConfig (none where the family has no such layers); ModelConfig checks them once
built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeprefill.errors import ExportError
from edgeprefill.export.config_values import given, json_float, optional_float
from edgeprefill.export.families import FamilySpec


@dataclass(frozen=True)
class DeltaNetShape:
    """Qwen3.5's Gated DeltaNet layers (the config's linear_* keys): q and k of
    `key_heads` heads of `key_dim`, v of `value_heads` heads of `value_dim` (each key head
    serving value_heads / key_heads consecutive value heads), and a causal convolution of
    `conv_kernel` tokens over the q/k/v projection."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    norm_eps: float | None = None  # the gated norm's epsilon; None: the model's
    beta_scale: float = 1.0  # beta times this (OLMo Hybrid's linear_allow_neg_eigval: 2)
    # KDA's decay in log space (export/kimi_delta.py): Bailing's bounded gate,
    # lower * sigmoid(exp(A_log) x) (kda_safe_gate, kda_lower_bound); None: Kimi's
    # -exp(A_log) * softplus(x)
    gate_lower_bound: float | None = None

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v side by side."""
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim


@dataclass(frozen=True)
class MambaShape:
    """Mamba-2 layers (export/mamba2.py): `heads` heads of `head_dim` channels, B and C of
    `groups` groups (each serving heads / groups consecutive heads) of `state_size`, a
    causal convolution of `conv_kernel` tokens over x, B and C, and dt clamped to
    [dt_min, dt_max] (time_step_limit)."""

    heads: int
    head_dim: int
    groups: int
    state_size: int
    conv_kernel: int
    conv_bias: bool
    proj_bias: bool
    dt_min: float = 0.0
    dt_max: float = float("inf")
    out_bias: bool = False  # out_proj's bias (proj_bias is in_proj's)
    # The gated RMSNorm of y and z: "gate_first" rmsnorm(y * silu(z)) (Granite 4.0-H,
    # Nemotron-H), "norm_first" rmsnorm(y) * silu(z), or None: y * silu(z) alone (Falcon-H1
    # without mamba_rms_norm).
    norm: str | None = "gate_first"
    norm_eps: float | None = None  # the gated RMSNorm's epsilon; None: the model's

    @property
    def inner(self) -> int:
        """Channels of x, z and the output: heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: x, B and C side by side."""
        return self.inner + 2 * self.groups * self.state_size


@dataclass(frozen=True)
class SelectiveShape:
    """Mamba-1 mixers (export/mamba1.py): `inner` channels, each with its own dt (from
    x_proj's `dt_rank` columns through dt_proj) and its own decay per state element (A
    [inner, state_size]), a causal convolution of `conv_kernel` tokens over x; B, C and dt
    RMS-normed where `bc_dt_eps` is given: without weight (Falcon-Mamba's mixer_rms_eps), or
    by their own weights where `bc_dt_weighted` (Jamba's dt/b/c_layernorm, rms_norm_eps)."""

    inner: int
    state_size: int
    conv_kernel: int
    dt_rank: int
    conv_bias: bool
    proj_bias: bool
    bc_dt_eps: float | None = None
    bc_dt_weighted: bool = False
    # Zamba's multi-head mixers (export/mamba1_heads.py): `heads` heads, each with its own
    # x_proj and dt_proj, stored per head; 0: Mamba-1's single x_proj and dt_proj.
    heads: int = 0


@dataclass(frozen=True)
class LruShape:
    """RecurrentGemma's recurrent blocks (export/rg_lru.py): `width` channels (lru_width) in
    `heads` blocks of the gates' block-diagonal projections, a causal convolution of
    `conv_kernel` tokens (conv1d_width)."""

    width: int
    heads: int
    conv_kernel: int


@dataclass(frozen=True)
class ResidualFactors:
    """MiniMax's residual adds (block "normed"): after attention the normed stream times
    `alpha` plus the sublayer times `beta`, each pair its layer type's (softmax attention,
    lightning attention), then the MLP's."""

    full: tuple[float, float] = (1.0, 1.0)  # full_attn_alpha_factor, full_attn_beta_factor
    linear: tuple[float, float] = (1.0, 1.0)  # linear_attn_alpha_factor, _beta_factor
    mlp: tuple[float, float] = (1.0, 1.0)  # mlp_alpha_factor, mlp_beta_factor


@dataclass(frozen=True)
class MlstmShape:
    """xLSTM's mLSTM cells (export/mlstm.py): `heads` heads, q and k of `key_dim` per head,
    v of `value_dim`; input and forget gates soft-capped at `gate_cap` (None: not
    capped); `eps` the denominator's (the config's `eps`, not its `norm_eps`)."""

    heads: int
    key_dim: int
    value_dim: int
    gate_cap: float | None
    eps: float


@dataclass(frozen=True)
class HybridScales:
    """Falcon-H1's muP multipliers of its parallel attention and Mamba-2 and its MLP."""

    attention_in: float = 1.0  # the attention's input
    attention_out: float = 1.0  # its output
    key: float = 1.0  # k after its projection
    ssm_in: float = 1.0  # the mixer's input
    ssm_out: float = 1.0  # its output
    ssm: tuple[float, ...] = (1.0,) * 5  # its in_proj's z, x, B, C and dt sections
    mlp: tuple[float, float] = (1.0, 1.0)  # the MLP's gate and output


def read_conv(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """The conv layers' fields of ModelConfig (LFM2); none for other families."""
    if not spec.conv:
        return {}
    layers = tuple(i for i, kind in enumerate(raw["layer_types"]) if kind == "conv")
    return {"conv_layers": layers, "conv_kernel": int(raw["conv_L_cache"]),
            "conv_bias": bool(raw.get("conv_bias", False))}


def read_delta(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """The Gated DeltaNet layers' fields of ModelConfig (Qwen3.5); none for other families."""
    if not spec.delta_net:
        return {}
    layers = tuple(i for i, kind in enumerate(raw["layer_types"]) if kind == "linear_attention")
    shape = DeltaNetShape(
        key_heads=int(raw["linear_num_key_heads"]), value_heads=int(raw["linear_num_value_heads"]),
        key_dim=int(raw["linear_key_head_dim"]), value_dim=int(raw["linear_value_head_dim"]),
        conv_kernel=int(raw["linear_conv_kernel_dim"]),
        norm_eps=spec.delta_norm_eps, beta_scale=2.0 if spec.delta_beta_key
        and raw.get(spec.delta_beta_key) else 1.0,
        gate_lower_bound=float(raw["kda_lower_bound"]) if spec.kda and raw.get("kda_safe_gate")
        else None)
    return {"delta_layers": layers, "delta": shape}


def read_mamba(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """The Mamba-2 layers' fields of ModelConfig (the config's mamba_* keys, as
    GraniteMoeHybridConfig reads them); none for other families."""
    if not spec.mamba:
        return {}
    layers = tuple(i for i, kind in enumerate(raw["layer_types"]) if kind == "mamba")
    if spec.selective:
        return {"mamba_layers": layers, "selective": _selective(raw)}
    heads = int(raw["mamba_n_heads"])
    head_dim = raw.get("mamba_d_head", "auto")
    if head_dim == "auto":
        head_dim = int(raw["mamba_expand"]) * int(raw["hidden_size"]) // heads
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    proj_bias = bool(raw["mamba_proj_bias"])
    shape = MambaShape(
        heads=heads, head_dim=int(head_dim), groups=int(raw["mamba_n_groups"]),
        state_size=int(raw["mamba_d_state"]), conv_kernel=int(raw["mamba_d_conv"]),
        conv_bias=bool(raw["mamba_conv_bias"]), proj_bias=proj_bias,
        dt_min=json_float(limit[0]), dt_max=json_float(limit[1]),
        out_bias=bool(raw.get("mamba_out_bias", proj_bias)),
        norm=raw.get("mamba_norm", "gate_first"),
        norm_eps=optional_float(raw.get("mamba_norm_eps")))
    return {"mamba_layers": layers, "mamba": shape}


def read_lru(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """RecurrentGemma's recurrent blocks' fields of ModelConfig; none elsewhere."""
    if not spec.rg_lru:
        return {}
    shape = LruShape(width=int(raw["lru_width"]), heads=int(raw["num_attention_heads"]),
                     conv_kernel=int(raw["conv1d_width"]))
    if shape.conv_kernel < 2 or shape.width % shape.heads:
        raise ExportError(f"conv1d_width must be at least 2 (got {shape.conv_kernel}) and "
                          f"lru_width ({shape.width}) a multiple of num_attention_heads "
                          f"({shape.heads})")
    layers = tuple(i for i, kind in enumerate(raw["layer_types"]) if kind == "rg_lru")
    return {"lru_layers": layers, "lru": shape}


def read_rwkv(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """RWKV-4's blocks' fields of ModelConfig (every layer one; families/rwkv.py lists
    them in layer_types); none elsewhere."""
    if not spec.rwkv:
        return {}
    layers = tuple(i for i, kind in enumerate(raw["layer_types"]) if kind == "rwkv")
    return {"rwkv_layers": layers, "rescale_every": max(int(raw["rescale_every"]), 0)}


def read_lightning(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """MiniMax's lightning layers (`linear_attention` in layer_types) and its residual
    factors (1 where absent); none for other families."""
    if not spec.lightning:
        return {}

    def pair(kind: str) -> tuple[float, float]:
        return (float(raw.get(f"{kind}_alpha_factor", 1)),
                float(raw.get(f"{kind}_beta_factor", 1)))

    layers = tuple(i for i, kind in enumerate(raw["layer_types"]) if kind == "linear_attention")
    return {"lightning_layers": layers, "residual_factors": ResidualFactors(
        full=pair("full_attn"), linear=pair("linear_attn"), mlp=pair("mlp"))}


def read_mlstm(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """xLSTM's mLSTM cells' fields of ModelConfig (every layer one; families/xlstm.py
    lists them in layer_types and sets mlstm_*); none elsewhere."""
    if not spec.mlstm:
        return {}
    layers = tuple(i for i, kind in enumerate(raw["layer_types"]) if kind == "mlstm")
    heads = int(raw["num_heads"])
    shape = MlstmShape(heads=heads, key_dim=int(raw["mlstm_qk_dim"]) // heads,
                       value_dim=int(raw["mlstm_v_dim"]) // heads,
                       gate_cap=optional_float(raw["gate_soft_cap"]), eps=json_float(raw["eps"]))
    return {"mlstm_layers": layers, "mlstm": shape}


def read_hybrid_scales(raw: dict[str, Any]) -> HybridScales:
    """FalconH1Config's multipliers (1 where absent or null)."""
    def scale(key: str) -> float:
        return float(given(raw.get(key), 1.0))

    ssm = tuple(float(v) for v in raw.get("ssm_multipliers") or (1.0,) * 5)
    mlp = tuple(float(v) for v in raw.get("mlp_multipliers") or (1.0, 1.0))
    if len(ssm) != 5 or len(mlp) != 2:
        raise ExportError(f"ssm_multipliers must hold 5 values and mlp_multipliers 2, got "
                          f"{len(ssm)} and {len(mlp)}")
    return HybridScales(
        attention_in=scale("attention_in_multiplier"),
        attention_out=scale("attention_out_multiplier"), key=scale("key_multiplier"),
        ssm_in=scale("ssm_in_multiplier"), ssm_out=scale("ssm_out_multiplier"), ssm=ssm,
        mlp=(mlp[0], mlp[1]))


def _selective(raw: dict[str, Any]) -> SelectiveShape:
    """MambaConfig's (FalconMambaConfig's) mixer: `mamba_inner` channels
    (families/recurrent.py's _mamba1_config), a dt rank of hidden / 16 rounded up where "auto"."""
    hidden = int(raw["hidden_size"])
    rank = raw["time_step_rank"]
    return SelectiveShape(
        inner=int(raw["mamba_inner"]), state_size=int(raw["state_size"]),
        conv_kernel=int(raw["conv_kernel"]),
        dt_rank=-(-hidden // 16) if rank == "auto" else int(rank),
        conv_bias=bool(raw["use_conv_bias"]), proj_bias=bool(raw["use_bias"]),
        bc_dt_eps=optional_float(raw.get("mamba_bc_dt_eps")),
        bc_dt_weighted=bool(raw.get("mamba_bc_dt_weighted")),
        heads=int(raw.get("mamba_heads_per_layer") or 0))
