"""What config.json asks of a family that export refuses, each in one line: switches its
spec marks unsupported, keys its model cannot run without, the family's own refusals, a
rope type only another family's model computes."""

from __future__ import annotations

from typing import Any

from edgeprefill.errors import ExportError
from edgeprefill.export.families import FamilySpec
from edgeprefill.export.rope import SHARED_ROPE_TYPES, RopeConfig

# A FamilySpec.unsupported switch -> what a true value asks for.
UNSUPPORTED = {
    "mlp_bias": "mlp_bias=true is not supported",
    "qk_layernorm": "per-head LayerNorm on q/k (qk_layernorm) is not supported",
    "use_qk_norm": "per-head LayerNorm on q/k (use_qk_norm) is not supported",
    "use_bias": "use_bias=true (biases on every projection) is not supported",
    "clip_qkv": "clip_qkv (q/k/v clamped) is not supported",
}


def refuse_unsupported(family: str, spec: FamilySpec, raw: dict[str, Any]) -> None:
    for key in spec.unsupported:
        if raw.get(key):
            raise ExportError(f"{family}: {UNSUPPORTED[key]}")
    for key in spec.required:
        if raw.get(key) is None:
            raise ExportError(f"{family}: config.json needs {key}; the family's model cannot "
                              "run without it")
    reason = spec.refuse(raw) if spec.refuse is not None else None
    if reason is not None:
        raise ExportError(f"{family}: {reason}")
    # Refused in every family: a checkpoint trained without the causal mask is no causal
    # LM, even where the family's transformers model ignores the key.
    if raw.get("use_bidirectional_attention"):
        raise ExportError(f"{family}: use_bidirectional_attention=true is not a causal LM")


def refuse_other_familys_rope(family: str, spec: FamilySpec,
                               ropes: dict[str, RopeConfig]) -> None:
    for rope in ropes.values():
        if rope.kind not in SHARED_ROPE_TYPES and rope.kind not in spec.rope_types:
            supported = ", ".join((*SHARED_ROPE_TYPES, *spec.rope_types))
            raise ExportError(f"{family}: rope type {rope.kind!r} is not supported by this "
                              f"family's model; supported: {supported}")
