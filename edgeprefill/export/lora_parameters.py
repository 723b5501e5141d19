"""A LoRA on parameters (peft's `target_parameters`), merged as dense deltas.

peft 0.21's "all-linear" on a transformers 5 MoE model targets the experts' fused
parameters (`mlp.experts.gate_up_proj` [experts, 2 * inter, hidden], `down_proj`) and a
router's `gate.weight` as parameters, each wrapped by a `ParamWrapper`. Several on one
module are nested, the parameter the module registers first innermost, and saved as

  <module>.lora_A.weight, <module>.lora_B.weight                 the outermost wrapper's
  <module>.base_layer.lora_A.weight, ... .base_layer.lora_B...   the next one in, and so on

A wrapper's delta is peft's `ParamWrapper.get_delta_weight`, in the loaded parameter's
layout: lora_A [r * experts, in], lora_B [out, r * experts]; for experts (a 3-D
parameter) A is read as (experts, r, in) and B as (out, r, experts), and the delta of
expert e is scale * B[:, :, e] @ A[e]: [out, in] per expert for the usual (experts, out,
in) layout (peft swaps in and out), its transpose for a module whose `is_transposed` stores
(experts, in, out); a 2-D parameter's is scale * B @ A, a Linear's. r and alpha follow
rank_pattern / alpha_pattern keyed by the parameter's full name.

transformers 5 loads the experts fused from the per-expert tensors most checkpoints store,
so the delta is mapped back to the stored tensors by transformers' own reverse conversion
(module_names.LoadedModel) as the tensors are read: a parameter's dense delta is computed
when the first of its stored tensors is read, and kept until they all are (a few at a
time: a layer's experts' delta is the size of their float32 weights).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.module_names import Parameter

BASE_LAYER = ".base_layer"
CACHED = 4  # parameters whose stored deltas are kept computed at once


@dataclass(frozen=True)
class ParameterDelta:
    """One wrapped parameter's low-rank update, as peft's ParamWrapper holds it."""

    a: np.ndarray  # [r * experts, in]
    b: np.ndarray  # [out, r * experts]
    scale: float
    parameter: Parameter

    def dense(self) -> np.ndarray:
        """peft's get_delta_weight, float32, of the loaded parameter's shape."""
        a, b = self.a.astype(np.float32), self.b.astype(np.float32)
        shape = self.parameter.shape
        if len(shape) == 2 or shape[0] == 1:  # peft's Linear.get_delta_weight, then added
            return np.broadcast_to(b @ a * self.scale, shape).copy()  # as `param += delta`
        experts = shape[0]
        per_expert = np.matmul(b.reshape(b.shape[0], -1, experts).transpose(2, 0, 1),
                               a.reshape(experts, -1, a.shape[-1]))  # (experts, out, in)
        return (per_expert.transpose(0, 2, 1) if self.parameter.transposed
                else per_expert) * self.scale


def in_out(parameter: Parameter) -> tuple[int, int, int]:
    """(experts, in, out) of a parameter as peft's ParamWrapper reads its shape."""
    shape = parameter.shape
    if len(shape) == 2:
        return 1, shape[1], shape[0]
    if len(shape) != 3:
        raise ExportError(f"the adapter's LoRA on the parameter {parameter.name} of shape "
                          f"{shape}: peft wraps 2-D and 3-D parameters only")
    experts, first, second = shape
    return (experts, first, second) if parameter.transposed else (experts, second, first)


def wrapped_parameter(module: str, targets: list[str],
                      loaded: dict[str, list[Parameter]]) -> Parameter | None:
    """The parameter a LoRA saved under `module` (`X`, `X.base_layer`, ...) wraps: of X's
    parameters that `targets` name (the full name, or its end at a dot, as peft matches),
    in X's order, the one as many wrappers in as the name has `.base_layer`s, counted from
    the outermost (the last). None where X has no targeted parameter: a module's LoRA."""
    depth = 0
    while module.endswith(BASE_LAYER):
        module, depth = module.removesuffix(BASE_LAYER), depth + 1
    wrapped = [p for p in loaded.get(module, ())
               if any(p.name == t or p.name.endswith("." + t) for t in targets)]
    if not wrapped:
        return None
    if depth >= len(wrapped):
        raise ExportError(f"the adapter's LoRA under {module}{BASE_LAYER * depth} wraps a "
                          f"parameter of {module}, which has {len(wrapped)} targeted: is it "
                          "the adapter of another model?")
    return wrapped[len(wrapped) - 1 - depth]


def parameter_deltas(modules: dict[str, dict[str, np.ndarray]], config: dict,
                     loaded: dict[str, list[Parameter]],
                     ) -> tuple[dict[str, ParameterDelta], dict[str, dict[str, np.ndarray]]]:
    """The LoRAs saved per module (`modules`: the module -> its lora_A/lora_B/... tensors)
    sorted by `loaded`, each module's parameters as transformers builds the model: the
    parameters' deltas, keyed by the parameter's name, and the modules' LoRAs left."""
    targets = list(config.get("target_parameters") or [])
    deltas: dict[str, ParameterDelta] = {}
    left: dict[str, dict[str, np.ndarray]] = {}
    for module, parts in modules.items():
        parameter = wrapped_parameter(module, targets, loaded)
        if parameter is None:
            left[module] = parts
            continue
        if set(parts) != {"lora_A.weight", "lora_B.weight"}:
            raise ExportError(f"the adapter's LoRA on the parameter {parameter.name} has "
                              f"{' and '.join(sorted(parts))}, not lora_A.weight and "
                              "lora_B.weight")
        # peft keys the patterns by the parameter's full name (its `current_key`)
        r, scale = rank_and_scale(config, parameter.name)
        deltas[parameter.name] = parameter_delta(parameter, parts["lora_A.weight"],
                                                 parts["lora_B.weight"], r, scale)
    return deltas, left


def pattern_value(pattern: dict, module: str, default):
    """peft's get_pattern_key: the first key that matches the end of the module's name
    at a dot boundary."""
    for key in pattern:
        if re.match(rf"(.*\.)?({key})$", module):
            return pattern[key]
    return default


def rank_and_scale(config: dict, name: str) -> tuple[int, float]:
    """A LoRA's rank and the scale of its B @ A, for the module or parameter `name`: r and
    alpha by rank_pattern / alpha_pattern, alpha / r (alpha / sqrt(r) with rsLoRA)."""
    r = pattern_value(config.get("rank_pattern") or {}, name, config.get("r", 8))
    alpha = pattern_value(config.get("alpha_pattern") or {}, name, config.get("lora_alpha", 8))
    return r, alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def parameter_delta(parameter: Parameter, a: np.ndarray, b: np.ndarray, r: int,
                    scale: float) -> ParameterDelta:
    """The wrapper's delta, its A and B checked against the parameter's shape."""
    experts, fan_in, fan_out = in_out(parameter)
    if a.shape != (r * experts, fan_in) or b.shape != (fan_out, r * experts):
        raise ExportError(f"the adapter's LoRA on the parameter {parameter.name} "
                          f"{parameter.shape} has lora_A {tuple(a.shape)} and lora_B "
                          f"{tuple(b.shape)}, not ({r * experts}, {fan_in}) and ({fan_out}, "
                          f"{r * experts}) for its rank r={r}: is it the adapter of another "
                          "model?")
    return ParameterDelta(a, b, scale, parameter)


class StoredDeltas:
    """The stored tensors' dense deltas of the wrapped parameters, computed as read."""

    def __init__(self, deltas: dict[str, ParameterDelta], parts: dict[str, tuple[str, str]],
                 stored: Callable[[str, np.ndarray], dict[str, np.ndarray]],
                 as_loaded: frozenset[str] = frozenset()) -> None:
        self._deltas = deltas  # the loaded parameter's name -> its delta
        self.parts = parts  # the name read -> (the parameter, the stored tensor's name)
        self._stored = stored  # a parameter's delta -> its stored tensors' deltas
        # parameters the checkpoint stores as transformers loads them (fused, its names),
        # where transformers' conversion would save them otherwise: their own deltas
        self._as_loaded = as_loaded
        self._cache: dict[str, dict[str, np.ndarray]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.parts

    def delta(self, name: str) -> np.ndarray:
        """The delta of the tensor read as `name`, in its stored layout (float32)."""
        parameter, stored = self.parts[name]
        if parameter not in self._cache:
            if len(self._cache) >= CACHED:
                del self._cache[next(iter(self._cache))]
            dense = self._deltas[parameter].dense()
            self._cache[parameter] = ({parameter: dense} if parameter in self._as_loaded
                                      else self._stored(parameter, dense))
        return self._cache[parameter][stored]
