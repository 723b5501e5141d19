"""Qwen3.5's Gated DeltaNet (linear attention) as stock ONNX ops, with its two states.

transformers' Qwen3_5GatedDeltaNet (Qwen3NextGatedDeltaNet's recurrence):

  qkv, z, b, a = in_proj_qkv(h), in_proj_z(h), in_proj_b(h), in_proj_a(h)
                 (Qwen3-Next: in_proj_qkvz(h), in_proj_ba(h), their rows grouped per key
                 head, which export reorders into these four: grouped_rows; Lara Mini's
                 and OLMo Hybrid's stored otherwise: FamilySpec.delta_names)
  qkv          = silu(causal depthwise conv of L tokens over qkv)   state 1: its last L-1
  q, k, v      = split(qkv); q, k l2-normalized per head, q / sqrt(key_dim)
                 (each key head serves value_heads / key_heads consecutive value heads)
  beta, g      = sigmoid(b), -exp(A_log) * softplus(a + dt_bias)    float32
                 (OLMo Hybrid: beta doubled, DeltaNetShape.beta_scale)
  per token t:   S = S * exp(g_t)                                   state 2: S, float32
                 delta = (v_t - k_t S) * beta_t                     [v_heads, k_dim, v_dim]
                 S = S + k_t (x) delta
                 o_t = q_t S
  out          = out_proj(rmsnorm(o) * norm.weight * silu(z))      per value head
                 (OLMo Hybrid: at its own epsilon, DeltaNetShape.norm_eps)

The recurrence runs token by token in a `Scan` over the chunk, exactly as
torch_recurrent_gated_delta_rule does (the chunked form transformers uses for a prompt
equals it up to float rounding); a chunked formulation would be faster on long chunks.
Where the native kernels run, the Scan is swapped at load time for one
`edgeprefill.GatedDeltaRule` node on the same inputs (kernels/gated_delta.py): the bundle
keeps the Scan, so it still loads on a stock ONNX Runtime.
A row's padding (t >= valid_len) gets a decay of 1 and a beta of 0, which leave S as it
is, so the state the Scan ends with is the one at the row's last valid token. Both
states read as zeros where past_lens is 0 and go to their `present_*` outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeprefill.contract import BATCH, CONV, RECURRENT, state_names
from edgeprefill.errors import ExportError
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.mixer_shapes import DeltaNetShape
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.recurrent_mixer import RecurrentMixer
from edgeprefill.export.short_conv import StateSpec
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

GROUPED = ("in_proj_qkvz", "in_proj_ba")  # Qwen3-Next's
L2_EPS = 1e-6  # transformers' l2norm in the recurrence


class GatedDeltaNet(RecurrentMixer):
    """Emits Gated DeltaNet layers; the values they all share are computed once."""

    # The Scan body's name is this + the layer + "_step": kernels/gated_delta.py switches
    # "delta{layer}_step" bodies for its op, whose decay is one per head.
    step_prefix = "delta"
    # Whether the decay is one per key channel ([B, C, value_heads, key_dim]: Kimi's KDA,
    # export/kimi_delta.py) rather than one per head ([B, C, value_heads]).
    per_channel_decay = False

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv, past_lens: str,
                 valid_lens: str, chunk: str) -> None:
        super().__init__(g, w, cfg, tokens, conv, past_lens, valid_lens, chunk)
        assert cfg.delta is not None
        self.d: DeltaNetShape = cfg.delta
        self._norm_eps = cfg.norm_eps if cfg.delta.norm_eps is None else cfg.delta.norm_eps

    def states(self, layer: int) -> list[StateSpec]:
        """The layer's conv state (model dtype) and recurrent state (float32)."""
        d = self.d
        return [(state_names(layer, CONV), self.w.dtype,
                 [BATCH, d.conv_dim, d.conv_kernel - 1]),
                (state_names(layer, RECURRENT), np.dtype(np.float32),
                 [BATCH, d.value_heads, d.key_dim, d.value_dim])]

    def layer(self, p: str, h: str, layer: int, rows) -> str:
        """The linear-attention sublayer of layer prefix `p` on its normed input `h`.
        `rows` keeps the tokens that go on."""
        g, d, names = self.g, self.d, self.cfg.spec.delta_names
        pre = p + names.mixer
        self._check_shapes(pre)
        value_size = d.value_heads * d.value_dim
        projected = self.tokens.spread(self._projected(pre, h))
        mixed, z, b, a = g.op("Split", [projected, g.const(
            [d.conv_dim, value_size, d.value_heads, d.value_heads])], 4, axis=-1)
        mixed = self._convolved(pre, layer, mixed)
        out = self._recurrence(pre, layer, self._float(mixed), self._float(b), self._float(a))
        y = self._gated_norm(pre, out, z)  # [B, C, value_size]
        y = rows(self.tokens.gather(y, value_size))
        return self.w.linear(y, [pre + names.out + ".weight"], None)

    def _convolved(self, pre: str, layer: int, mixed: str) -> str:
        """silu of the causal depthwise convolution of q | k | v over the layer's conv
        state and the chunk (the state's next value written to its present output)."""
        d, names = self.d, self.cfg.spec.delta_names
        conv_state = state_names(layer, CONV)
        full = self.conv.full(conv_state.past, mixed)
        self.conv.store(full, conv_state.present, d.conv_kernel - 1, d.conv_dim)
        convs = [pre + n + ".weight" for n in names.conv]
        taps = self.conv.taps(convs[0], d.conv_kernel, d.conv_dim, lambda _: np.concatenate(
            [self.w.ckpt.get(n, np.float32) for n in convs]))
        return self._silu(self.conv.convolve(full, taps, d.conv_kernel))

    def _projected(self, pre: str, h: str) -> str:
        """[..., conv_dim + value_size + 2 value_heads]: qkv, z, b and a of h, side by side."""
        if not self.cfg.spec.delta_grouped:
            names = self.cfg.spec.delta_names.projections
            return self.w.linear(h, [pre + n + ".weight" for n in names], None)
        order = grouped_rows(self.d)
        return self.w.linear(h, [pre + n + ".weight" for n in GROUPED], None,
                             reorder=lambda rows: rows[order])

    def _recurrence(self, pre: str, layer: int, mixed: str, b: str, a: str) -> str:
        """[B, C, value_heads, value_dim] float32: the delta rule over the chunk's tokens
        from the layer's recurrent state (zeros at position 0), its last value written
        to the state's present output."""
        g = self.g
        state = state_names(layer, RECURRENT)
        q, k, v = self._qkv(mixed)
        decay, beta = self._gates(pre, b, a)
        kept = g.op("Where", [self.continues, state.past, g.const(0.0, np.float32)])
        final, out = g.op("Scan", [kept, q, k, v, decay, beta], 2, num_scan_inputs=5,
                          scan_input_axes=[1] * 5, scan_output_axes=[1],
                          body=self._step_body(f"{self.step_prefix}{layer}_"))
        g.op("Identity", [final], [state.present])
        return out

    def _qkv(self, mixed: str) -> tuple[str, str, str]:
        """q, k [B, C, value_heads, key_dim] (normalized, q scaled, key heads repeated) and
        v [B, C, value_heads, value_dim], float32."""
        g, d = self.g, self.d
        key_size = d.key_heads * d.key_dim
        q, k, v = g.op("Split", [mixed, g.const([key_size, key_size,
                                                 d.value_heads * d.value_dim])], 3, axis=-1)
        q = g.op("Div", [self._l2norm(q), g.const(d.key_dim**0.5, np.float32)])
        k = self._l2norm(k)
        v = g.op("Reshape", [v, g.const([0, 0, d.value_heads, d.value_dim])])
        return self._repeat_heads(q), self._repeat_heads(k), v

    def _l2norm(self, x: str) -> str:
        """[B, C, key_heads * key_dim] -> [B, C, key_heads, key_dim], each head x times
        rsqrt(sum(x^2) + eps)."""
        g, d = self.g, self.d
        x = g.op("Reshape", [x, g.const([0, 0, d.key_heads, d.key_dim])])
        total = g.op("ReduceSum", [g.op("Mul", [x, x]), g.const([-1])], keepdims=1)
        inverse = g.op("Reciprocal", [g.op("Sqrt", [
            g.op("Add", [total, g.const(L2_EPS, np.float32)])])])
        return g.op("Mul", [x, inverse])

    def _repeat_heads(self, x: str) -> str:
        """[B, C, key_heads, D] -> [B, C, value_heads, D]: value head j reads key head
        j // (value_heads / key_heads), as repeat_interleave does."""
        g, d = self.g, self.d
        if d.value_heads == d.key_heads:
            return x
        group = d.value_heads // d.key_heads
        x = g.op("Unsqueeze", [x, g.const([3])])
        x = g.op("Expand", [x, g.const([1, 1, 1, group, 1])])
        return g.op("Reshape", [x, g.const([0, 0, d.value_heads, d.key_dim])])

    def _gates(self, pre: str, b: str, a: str) -> tuple[str, str]:
        """decay = exp(g) and beta [B, C, value_heads], float32; 1 and 0 on padding."""
        g = self.g
        a_log = self.g.weight(pre + "A_log.f32", (self.d.value_heads,), np.float32,
                                lambda: self.w.ckpt.get(pre + "A_log", np.float32))
        dt_bias = self.g.weight(pre + "dt_bias.f32", (self.d.value_heads,), np.float32,
                                  lambda: self.w.ckpt.get(pre + "dt_bias", np.float32))
        rate = g.op("Neg", [g.op("Exp", [a_log])])
        gate = g.op("Mul", [rate, g.op("Softplus", [g.op("Add", [a, dt_bias])])])
        decay = g.op("Where", [self.valid, g.op("Exp", [gate]), g.const(1.0, np.float32)])
        beta = g.op("Sigmoid", [b])
        if self.d.beta_scale != 1.0:  # OLMo Hybrid: negative eigenvalues allowed
            beta = g.op("Mul", [beta, g.const(self.d.beta_scale, np.float32)])
        beta = g.op("Where", [self.valid, beta, g.const(0.0, np.float32)])
        return decay, beta

    def _step_body(self, prefix: str) -> Any:
        """The Scan's body: one token's update of S and its output (module docstring)."""
        d = self.d
        body = GraphBuilder(prefix)
        f32 = np.float32
        state = body.input(prefix + "S", f32, [BATCH, d.value_heads, d.key_dim, d.value_dim])
        q = body.input(prefix + "q", f32, [BATCH, d.value_heads, d.key_dim])
        k = body.input(prefix + "k", f32, [BATCH, d.value_heads, d.key_dim])
        v = body.input(prefix + "v", f32, [BATCH, d.value_heads, d.value_dim])
        decay_shape = [BATCH, d.value_heads, d.key_dim] if self.per_channel_decay else \
            [BATCH, d.value_heads]
        decay = body.input(prefix + "decay", f32, decay_shape)
        beta = body.input(prefix + "beta", f32, [BATCH, d.value_heads])
        last = body.const([2, 3])
        # S [B, H, key_dim, value_dim] times each head's decay, or each key row's (KDA)
        decay_axes = body.const([3]) if self.per_channel_decay else last
        state = body.op("Mul", [state, body.op("Unsqueeze", [decay, decay_axes])])
        row_k = body.op("Unsqueeze", [k, body.const([2])])  # [B, H, 1, key_dim]
        remembered = body.op("MatMul", [row_k, state])  # [B, H, 1, value_dim]
        delta = body.op("Mul", [
            body.op("Sub", [body.op("Unsqueeze", [v, body.const([2])]), remembered]),
            body.op("Unsqueeze", [beta, last])])
        column_k = body.op("Unsqueeze", [k, body.const([3])])  # [B, H, key_dim, 1]
        # The sum is the output itself: an Identity to it copied S once per token (as
        # export/mamba2.py's body, whose Scan ran 0.82x as long without it, same bits).
        state = body.op("Add", [state, body.op("Mul", [column_k, delta])], [prefix + "S_out"])
        out = body.op("MatMul", [body.op("Unsqueeze", [q, body.const([2])]), state])
        body.op("Squeeze", [out, body.const([2])], [prefix + "o"])
        body.output(prefix + "S_out", f32, [BATCH, d.value_heads, d.key_dim, d.value_dim])
        body.output(prefix + "o", f32, [BATCH, d.value_heads, d.value_dim])
        return body.to_graph(prefix + "step")

    def _gated_norm(self, pre: str, out: str, z: str) -> str:
        """Qwen3NextRMSNormGated per value head: norm(o) in float32, back to the model's
        dtype, times the weight, times silu(z) in float32; [B, C, value_heads*value_dim]."""
        g, d, dtype = self.g, self.d, self.w.dtype
        out = self._cast(out, dtype)  # the recurrence's output in the model's dtype
        x = self._float(out)
        mean = g.op("ReduceMean", [g.op("Mul", [x, x]), g.const([-1])], keepdims=1)
        inverse = g.op("Reciprocal", [g.op("Sqrt", [
            g.op("Add", [mean, g.const(self._norm_eps, np.float32)])])])
        normed = g.op("Mul", [self._cast(g.op("Mul", [x, inverse]), dtype),
                              self.w.tensor(pre + self.cfg.spec.delta_names.norm + ".weight")])
        gate = self._silu(self._float(g.op("Reshape", [
            z, g.const([0, 0, d.value_heads, d.value_dim])])))
        y = self._cast(g.op("Mul", [self._float(normed), gate]), dtype)
        return g.op("Reshape", [y, g.const([0, 0, d.value_heads * d.value_dim])])

    def _check_shapes(self, pre: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line. The input
        projections are checked together: families split their rows differently."""
        d, hidden, names = self.d, self.cfg.hidden_size, self.cfg.spec.delta_names
        value_size = d.value_heads * d.value_dim
        sources = GROUPED if self.cfg.spec.delta_grouped else names.projections
        projections = [pre + n + ".weight" for n in sources]
        rows = sum(self.w.shape(n)[0] for n in projections)
        expected = d.conv_dim + value_size + 2 * d.value_heads  # q|k|v, z, b, a
        if rows != expected or any(self.w.shape(n)[1:] != (hidden,) for n in projections):
            self._refuse(" + ".join(projections), (rows, *self.w.shape(projections[0])[1:]),
                         (expected, hidden))
        convs = [pre + n + ".weight" for n in names.conv]
        channels = sum(self.w.shape(n)[0] for n in convs)
        if channels != d.conv_dim or any(self.w.shape(n)[1:] != (1, d.conv_kernel)
                                         for n in convs):
            self._refuse(" + ".join(convs), (channels, *self.w.shape(convs[0])[1:]),
                         (d.conv_dim, 1, d.conv_kernel))
        for name, shape in ((pre + names.norm + ".weight", (d.value_dim,)),
                            (pre + names.out + ".weight", (hidden, value_size))):
            if self.w.shape(name) != shape:
                self._refuse(name, self.w.shape(name), shape)

    def _refuse(self, name: str, got: tuple[int, ...], shape: tuple[int, ...]) -> None:
        d = self.d
        raise ExportError(
            f"{name} has shape {got}, but config.json implies {shape} "
            f"(linear_num_key_heads {d.key_heads} of {d.key_dim}, "
            f"linear_num_value_heads {d.value_heads} of {d.value_dim}, "
            f"linear_conv_kernel_dim {d.conv_kernel})")


def grouped_rows(d: DeltaNetShape) -> np.ndarray:
    """The row order that takes Qwen3-Next's stacked in_proj_qkvz and in_proj_ba rows
    ([key head, q | k | v | z], then [key head, b | a]; each key head's v, z, b and a are
    its value_heads / key_heads value heads') to Qwen3.5's q, k, v, z, b, a (each all heads
    in order), as transformers' fix_query_key_value_ordering splits them."""
    per = d.value_heads // d.key_heads
    width = per * d.value_dim  # a key head's v (and z) rows
    block = 2 * d.key_dim + 2 * width  # a key head's qkvz rows
    heads = np.arange(d.key_heads)[:, None]

    def part(base: int, stride: int, start: int, size: int) -> np.ndarray:
        return (base + heads * stride + start + np.arange(size)).reshape(-1)

    qkvz = d.key_heads * block
    return np.concatenate([
        part(0, block, 0, d.key_dim), part(0, block, d.key_dim, d.key_dim),
        part(0, block, 2 * d.key_dim, width), part(0, block, 2 * d.key_dim + width, width),
        part(qkvz, 2 * per, 0, per), part(qkvz, 2 * per, per, per)])
