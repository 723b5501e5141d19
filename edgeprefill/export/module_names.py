"""The names transformers 5 gives a checkpoint's tensors as it loads them, for an adapter.

transformers 5 renames some checkpoints' tensors as it loads them, by a conversion mapping
per model_type: EXAONE 3's `transformer.h.N.attn.attention.q_proj` is the module
`model.layers.N.self_attn.q_proj`, Phi-3.5-MoE's `block_sparse_moe.gate` is `mlp.router`,
LFM3's `self_attn.gate_proj` is `self_attn.g_proj`. A PEFT adapter trained on the loaded
model names its LoRA by the module. Export reads the names as stored (its families'
renames), so an adapter's module is mapped back to the stored tensor here, by
transformers' own renaming of each stored name (`core_model_loading.rename_source_key`):
the rules are transformers', applied as its loading applies them, not copied.

A stored tensor that transformers splits into several modules as it loads it (Sarvam-MoE's
`query_key_value` into q_proj, k_proj and v_proj) is recorded per part: a LoRA on one part
changes some rows of the stored tensor, which export does not merge (the caller refuses
it in one line). Several stored tensors fused into one parameter (the experts) are no
nn.Linear module, and PEFT targets them as parameters, which lora.py refuses already.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModuleNames:
    """transformers' name of a tensor -> the name the checkpoint stores it under."""

    renamed: dict[str, str] = field(default_factory=dict)  # one stored tensor, renamed
    split: dict[str, str] = field(default_factory=dict)  # a part of one stored tensor


def module_names(model_types: tuple[str, ...], stored: Iterable[str]) -> ModuleNames:
    """The stored names the conversion mappings of `model_types` (config.json's and its
    language model's) rename; empty where they have none, or where transformers is not
    installed (export reads checkpoints without it)."""
    if not model_types:
        return ModuleNames()
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            rename_source_key,
        )
    except ImportError:
        return ModuleNames()
    mapping = []
    for model_type in model_types:
        try:
            mapping += get_checkpoint_conversion_mapping(model_type) or []
        except Exception:  # noqa: BLE001, S112 - a type transformers cannot map: no renames
            continue
    # the transforms keep state as they match (a group's guard): fresh copies for this read
    mapping = copy.deepcopy(mapping)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    targets = {pattern: c.target_patterns for c in converters for pattern in c.source_patterns}
    names = ModuleNames()
    for name in stored:
        new, source = rename_source_key(name, renamings, converters)
        if source is None:
            if new != name:
                names.renamed[new] = name
            continue
        parts = targets.get(source, ())
        if len(parts) > 1:  # one stored tensor split into modules: each part named
            for part in parts:
                names.split[_replace_last(new, parts[0], part)] = name
    return names


def _replace_last(name: str, old: str, new: str) -> str:
    head, found, tail = name.rpartition(old)
    return head + new + tail if found else name
