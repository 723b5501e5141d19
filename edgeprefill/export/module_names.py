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
nn.Linear module: PEFT targets them as parameters (target_parameters), whose deltas are
mapped back to the stored tensors by transformers' reverse conversion (`LoadedModel`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeprefill.errors import ExportError


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
    mapping: list = []
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


@dataclass(frozen=True)
class Parameter:
    """A parameter of the model transformers builds, as peft's ParamWrapper sees it."""

    name: str  # its full name: `model.layers.0.mlp.experts.gate_up_proj`
    shape: tuple[int, ...]  # as loaded: an MoE's fused experts (experts, out, in)
    transposed: bool  # its module's `is_transposed`: experts stored (experts, in, out)


class LoadedModel:
    """The model transformers builds from a checkpoint's config.json, on the meta device
    (no weights, no memory): the parameters a LoRA on parameters (peft's target_parameters)
    wraps, and transformers' own reverse conversion (`revert_weight_conversion`, what its
    save_pretrained applies) from a loaded parameter to the tensors the checkpoint stores.
    Its ops (split, concatenate, stack, transpose) are linear: applied to a parameter's
    delta they give the stored tensors' deltas."""

    def __init__(self, model) -> None:
        self._model = model

    @classmethod
    def build(cls, hf_dir: Path) -> LoadedModel:
        """Refused in one line where transformers is missing or cannot build the model."""
        try:
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM
        except ImportError:
            raise ExportError("merging a LoRA on parameters (target_parameters) needs "
                              "transformers and torch: pip install 'edgeprefill[export]'") from None
        try:
            config = AutoConfig.from_pretrained(hf_dir)
            with torch.device("meta"):
                return cls(AutoModelForCausalLM.from_config(config))
        except Exception as err:  # noqa: BLE001 - transformers raises many kinds
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ExportError(f"merging a LoRA on parameters (target_parameters) maps them "
                              f"by the model transformers builds of {hf_dir}, which it cannot "
                              f"build: {first}") from None

    def parameters(self) -> dict[str, list[Parameter]]:
        """Each module's own parameters, in the order the module registers them (the order
        peft nests its ParamWrappers: the first one innermost)."""
        found: dict[str, list[Parameter]] = {}
        for module_name, module in self._model.named_modules():
            transposed = bool(getattr(module, "is_transposed", False))
            for name, param in module.named_parameters(recurse=False):
                full = f"{module_name}.{name}" if module_name else name
                found.setdefault(module_name, []).append(
                    Parameter(full, tuple(param.shape), transposed))
        return found

    def stored_shapes(self, name: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """The stored tensors the parameter `name` is saved as, and their shapes."""
        import torch

        parts = self._reverted(name, torch.empty(shape, device="meta"))
        return {stored: tuple(part.shape) for stored, part in parts.items()}

    def stored(self, name: str, delta: np.ndarray) -> dict[str, np.ndarray]:
        """The parameter `name`'s `delta` as the deltas of the stored tensors it is saved
        as, each in its stored layout."""
        import torch

        parts = self._reverted(name, torch.from_numpy(np.ascontiguousarray(delta)))
        return {stored: part.contiguous().numpy() for stored, part in parts.items()}

    def _reverted(self, name: str, tensor) -> dict:
        from transformers.core_model_loading import revert_weight_conversion

        return revert_weight_conversion(self._model, {name: tensor})
