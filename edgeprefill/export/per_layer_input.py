"""Gemma 4's (and Gemma 3n's) per-layer inputs (PLE): a second embedding feeds every decoder layer.

`embed_tokens_per_layer` holds, per token, one `P`-wide vector per layer ([vocab, L*P],
times sqrt(P)); a projection of the (scaled) main embedding gives another
(per_layer_model_projection times hidden**-0.5, RMS-normed per layer); their sum times
2**-0.5 is the per-layer input. After its MLP, layer i adds
norm(per_layer_projection(act(per_layer_input_gate(x)) * input_i)) to its stream.
Tensors keep the token layout of the stream ([B,C,...] or packed [1,T,...]).
"""

from __future__ import annotations

from collections.abc import Callable

from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

TABLE = "model.embed_tokens_per_layer.weight"
PROJECTION = "model.per_layer_model_projection.weight"
PROJECTION_NORM = "model.per_layer_projection_norm"

Norm = Callable[[str, str], str]  # (x, module name) -> the family's norm of x
Activation = Callable[[str], str]


class PerLayerInputs:
    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PackedTokens | PaddedTokens, norm: Norm, act: Activation) -> None:
        self.g, self.w, self.cfg, self.tokens = g, w, cfg, tokens
        self.norm, self.act = norm, act
        self.inputs: str | None = None  # [.., L, P] once `build` ran

    def build(self, ids: str, embedded: str) -> None:
        """The per-layer inputs of every token, from the ids [B,C] and the main embedding
        as the first layer reads it (scaled)."""
        g, cfg, dtype = self.g, self.cfg, self.w.dtype
        width = cfg.num_layers * cfg.per_layer_input
        self._check(TABLE, (cfg.per_layer_vocab, width))
        if cfg.per_layer_vocab < cfg.vocab_size:  # Gemma 3n: its table ends before the
            # vocabulary (the image and audio tokens); the ids past it read row 0
            inside = g.op("Less", [ids, g.const(cfg.per_layer_vocab)])
            ids = g.op("Where", [inside, ids, g.const(0)])
        table = self.w.rows(TABLE, self.tokens.indices(ids))  # quantized where weights are
        table = g.op("Mul", [table, g.const(cfg.per_layer_input ** 0.5, dtype)])
        projected = self.w.linear(embedded, [PROJECTION], None)
        projected = g.op("Mul", [projected, g.const(cfg.hidden_size ** -0.5, dtype)])
        per_layer = [0, 0, cfg.num_layers, cfg.per_layer_input]
        projected = self.norm(g.op("Reshape", [projected, g.const(per_layer)]), PROJECTION_NORM)
        mixed = g.op("Add", [projected, g.op("Reshape", [table, g.const(per_layer)])])
        self.inputs = g.op("Mul", [mixed, g.const(2.0 ** -0.5, dtype)])

    def keep_last(self) -> None:
        """From here on, each row's last valid token only ([B, L, P]), as the stream."""
        assert self.inputs is not None, "build() first"
        self.inputs = self.tokens.last(self.inputs)

    def layer(self, prefix: str, x: str, i: int, rows: Callable[[str], str]) -> str:
        """What layer i adds to its stream x (already cut to `rows`)."""
        g = self.g
        assert self.inputs is not None, "build() first"
        mine = g.op("Gather", [self.inputs, g.const(i)], axis=-2)  # [.., P]
        gate = self.act(self.w.linear(x, [prefix + "per_layer_input_gate.weight"], None))
        mixed = g.op("Mul", [gate, rows(mine)])
        out = self.w.linear(mixed, [prefix + "per_layer_projection.weight"], None)
        return self.norm(out, prefix + "post_per_layer_input_norm")

    def _check(self, name: str, shape: tuple[int, int]) -> None:
        self.w.check_shapes([(name, shape)], "vocab_size_per_layer_input, num_hidden_layers x "
                            "hidden_size_per_layer_input")
