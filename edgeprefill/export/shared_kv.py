"""Attention of Gemma 4's KV-shared layers: the last `num_kv_shared_layers` layers compute
only their queries and attend over the KV an earlier layer of their kind (its producer)
wrote in the same step.

Such a layer has no cache of its own (no past_key/past_value in the graph): it reads its
producer's present tensors, the cache after this step's keys and values went in, with
the mask of its kind (causal, within its window if it slides) as plain ONNX ops over the
whole capacity, in either flavour. transformers' layer reads its producer's keys and
values of this forward, the cache included, under the same mask: the same numbers.
"""

from __future__ import annotations

import numpy as np

from edgeprefill.contract import KVNames
from edgeprefill.export.flavors import Flavor, StandardFlavor, StepTensors, mask_key, positions
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.model_config import LayerAttention, ModelConfig


class SharedKV:
    """Emits the shared layers' attention. The per-step values they read (rotary tables
    gathered at the positions, masks) are made once, before the layers: a value made
    inside a layer and read by a later one would cross the region the int4 load rewrite
    puts in an If (engines/ort/switches.py), which hands on float values only."""

    def __init__(self, g: GraphBuilder, flavor: Flavor, step: StepTensors,
                 producer_key: str) -> None:
        self.g, self.flavor, self.step = g, flavor, step
        self.producer_key = producer_key  # any present key: the capacity for the masks
        self._values: dict[str, str] = {}
        cfg = flavor.cfg
        layers = [cfg.layers[i] for i in cfg.shared_kv]
        self._at = positions(g, g.op("Cast", [step.past_lens], to=7), step.chunk)
        for rope in sorted({layer.rope for layer in layers if layer.rope is not None}):
            for part in (".cos", ".sin"):
                self._values[rope + part] = self._value(rope + part)
        for window in {layer.window for layer in layers}:
            self._values[mask_key(window)] = self._value(mask_key(window), window)

    def attention(self, q: str, cfg: ModelConfig, layer: LayerAttention,
                  producer: KVNames) -> str:
        """q [B,C,H*D] of a layer seen as `cfg` (ModelConfig.for_layer) over its producer's
        present cache; [B,C,H*D] like Flavor.attention."""
        g = self.g
        std = StandardFlavor(cfg, self.flavor.dtype, self.flavor.max_context)
        q4 = std.heads_first(g, q, cfg.num_heads)
        if layer.rope is not None:
            q4 = std.rotate(g, q4, self._values[layer.rope + ".cos"],
                            self._values[layer.rope + ".sin"])
        mask = self._values[mask_key(layer.window)]
        return std.attend(g, q4, producer.present_key, producer.present_value, mask, layer)

    def _value(self, key: str, window: int | None = None) -> str:
        """The standard flavour's step value `key` (a rotary table gathered at the
        positions, [B,1,C,r/2], or a mask): its own where the flavour made it, else made
        here from the flavour's tables."""
        if isinstance(self.flavor, StandardFlavor) and key in self.step.extra:
            return self.step.extra[key]
        g = self.g
        if key.endswith((".cos", ".sin")):  # the ort flavour's full table [max + 1, r/2]
            gathered = g.op("Gather", [self.step.extra[key], self._at])  # [B,C,r/2]
            return g.op("Unsqueeze", [gathered, g.const([1])])
        std = StandardFlavor(self.flavor.cfg, np.dtype(self.flavor.dtype),
                             self.flavor.max_context)
        return std.causal_mask(g, self.producer_key, self._at, window)
