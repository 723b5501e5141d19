"""Attention of Gemma 4's KV-shared layers: the last `num_kv_shared_layers` layers compute
only their queries and attend over the KV an earlier layer of their kind (its producer)
wrote in the same step.

Such a layer has no cache of its own (no past_key/past_value in the graph): it reads its
producer's present tensors, the cache after this step's keys and values went in, with
the mask of its kind (causal, within its window if it slides) as plain ONNX ops over the
positions some row's last token can see (not the whole capacity), in either flavour.
transformers' layer reads its producer's keys and values of this forward, the cache
included, under the same mask: the same numbers.

Since no later layer reads what a shared layer computes for a token but that token's own
stream, and only each row's last valid token reaches the LM head, the shared layers run
on that token alone (`DecoderBuilder` cuts the stream before the first of them, as
transformers' `_maybe_slice_kv_shared_inputs` does): queries [B, 1, H*D] at each row's
last position.
"""

from __future__ import annotations

import numpy as np

from edgeprefill.contract import KVNames
from edgeprefill.export.flavors import Flavor, StandardFlavor, mask_key
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.layer_attention import LayerAttention
from edgeprefill.export.model_config import ModelConfig


class SharedKV:
    """Emits the shared layers' attention. The per-step values they read (rotary tables
    gathered at each row's last position, masks) are made once, before the layers: a value
    made inside a layer and read by a later one would cross the region the int4 load
    rewrite puts in an If (engines/ort/switches.py), which hands on float values only."""

    def __init__(self, g: GraphBuilder, flavor: Flavor, past_lens: str,
                 valid_lens: str) -> None:
        self.g, self.flavor = g, flavor
        cfg = flavor.cfg
        last = g.op("Sub", [g.op("Add", [past_lens, valid_lens]), g.const([1], np.int32)])
        at = g.op("Unsqueeze", [g.op("Cast", [last], to=7), g.const([1])])  # [B,1] int64
        tables = flavor.rope_table_names()
        layers = [cfg.layers[i] for i in cfg.shared_kv]
        self._values: dict[str, str] = {}
        for rope in sorted({layer.rope for layer in layers if layer.rope is not None}):
            for part in (".cos", ".sin"):  # the table [max + 1, r/2] -> [B,1,1,r/2]
                gathered = g.op("Gather", [tables[rope] + part, at])
                self._values[rope + part] = g.op("Unsqueeze", [gathered, g.const([1])])
        std = StandardFlavor(cfg, np.dtype(flavor.dtype), flavor.max_context)
        # The keys any row's last token may see: up to the longest row's last position,
        # from the shortest row's oldest in its window. Not the whole capacity: a decode
        # step would read every slot position (0.69x the decode rate at 8192 against 512,
        # benchmarks/shared_kv_decode.py).
        end = g.op("Add", [g.op("ReduceMax", [at], keepdims=0), g.const(1)])
        self._spans: dict[int | None, tuple[str, str]] = {}
        for window in {layer.window for layer in layers}:
            start = g.const(0) if window is None else g.op("Max", [
                g.op("Sub", [g.op("ReduceMin", [at], keepdims=0), g.const(window - 1)]),
                g.const(0)])
            key_pos = g.op("Range", [start, end, g.const(1)])
            self._values[mask_key(window)] = std.mask_over(g, key_pos, at, window)
            self._spans[window] = (g.op("Unsqueeze", [start, g.const([0])]),
                                   g.op("Unsqueeze", [end, g.const([0])]))

    def attention(self, q: str, cfg: ModelConfig, layer: LayerAttention,
                  producer: KVNames) -> str:
        """q [B,1,H*D] of each row's last token, of a layer seen as `cfg`
        (ModelConfig.for_layer), over its producer's present cache; [B,H*D]."""
        g = self.g
        std = StandardFlavor(cfg, self.flavor.dtype, self.flavor.max_context)
        q4 = std.heads_first(g, q, cfg.num_heads)
        if layer.rope is not None:
            q4 = std.rotate(g, q4, self._values[layer.rope + ".cos"],
                            self._values[layer.rope + ".sin"])
        mask = self._values[mask_key(layer.window)]
        keys, values = (self._span(cache, layer.window)
                        for cache in (producer.present_key, producer.present_value))
        out = std.attend(g, q4, keys, values, mask, layer)
        return g.op("Squeeze", [out, g.const([1])])

    def _span(self, cache: str, window: int | None) -> str:
        """`cache` [B,KV,cap,D] cut to the positions the mask of `window` covers. Cut
        again by each shared layer: a cut made in one layer and read by a later one would
        cross the int4 load rewrite's If (see the class docstring)."""
        start, end = self._spans[window]
        return self.g.op("Slice", [cache, start, end, self.g.const([2])])
