"""A context cap: the longest context a bundle of the model computes as its transformers
model does, where that is shorter than its max_position_embeddings, and why
(`ModelConfig.context_cap`, from `FamilySpec.context_cap`). The exporter defaults to it
and refuses a longer `--max-context` in one line that names the reason, not the
positions config.json states."""

from __future__ import annotations

from typing import Any, NamedTuple

from edgeprefill.errors import ExportError


class ContextCap(NamedTuple):
    tokens: int
    # What the context would exceed, and why that is the limit: the refusal's line after
    # "--max-context N exceeds "
    reason: str


def attention_chunk_cap(raw: dict[str, Any]) -> ContextCap | None:
    """Llama 4's rope layers attend within chunks of attention_chunk_size; within the
    first chunk that is causal attention, past it neither the KV cache nor the masks of a
    bundle express the chunk boundary. None where no layer is chunked."""
    if "chunked_attention" not in (raw.get("layer_types") or ()):
        return None
    chunk = int(raw["attention_chunk_size"])
    if chunk < 1:
        raise ExportError(f"attention_chunk_size must be at least 1, got {chunk}")
    return ContextCap(chunk, f"attention_chunk_size ({chunk}): chunked attention past one "
                             "chunk is not supported")


def longrope_window_cap(raw: dict[str, Any]) -> ContextCap | None:
    """PhiMoE's longrope turns by its short factors while a forward call's positions stay
    within original_max_position_embeddings and by its long ones past it, the keys cached
    by earlier calls keeping theirs: a bundle follows it exactly within the original
    window only. None without longrope, or where the positions end within the window."""
    params = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if params.get("rope_type", params.get("type")) != "longrope":
        return None
    window = longrope_window(raw, params)
    if int(raw["max_position_embeddings"]) <= window:
        return None
    return ContextCap(window, f"original_max_position_embeddings ({window}): longrope's "
                              "short factors are exact only within the original window "
                              "(transformers switches to the long factors past it, per call)")


def longrope_window(raw: dict[str, Any], params: dict[str, Any]) -> int:
    """original_max_position_embeddings, top-level (PhimoeConfig's) or the rope's."""
    return int(raw.get("original_max_position_embeddings")
               or params["original_max_position_embeddings"])
