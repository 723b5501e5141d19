"""Kimi Linear's KDA (Kimi delta attention): the gated delta rule of gated_delta.py with a
decay per key channel instead of one per head, as stock ONNX ops.

transformers' KimiLinearDeltaAttention (heads = linear_num_heads, each of head_dim K for
keys and values alike; no head repeat):

  q, k, v      = silu(causal depthwise conv of q_proj(h) | k_proj(h) | v_proj(h))
                 (its own short convolution each: q_conv1d, k_conv1d, v_conv1d)
                 q, k l2-normalized per head (x / sqrt(sum(x^2) + 1e-6)), q / sqrt(K)
  f            = f_b_proj(f_a_proj(h)) + dt_bias                    [heads * K], float32
  g            = -exp(A_log[head]) * softplus(f)                    one per key channel
  beta         = sigmoid(b_proj(h))                                 one per head
  per token t:   S = S * exp(g_t)[:, :, None]                       the only change: each
                 delta = (v_t - k_t S) * beta_t                     key row of S decays
                 S = S + k_t (x) delta                              at its own rate
                 o_t = q_t S
  out          = o_proj(rmsnorm(o) * o_norm.weight * sigmoid(g_b_proj(g_a_proj(h))))
                 per head, all in float32 (Qwen3.5's gate is silu, its weight applied in
                 the model's dtype)

Bailing hybrid (Ling 3) runs the same layer with full-rank f_proj and g_proj in place of
the low-rank pairs (FamilySpec.kda_full_rank), A_log stored [heads], and, where
kda_safe_gate, a bounded decay g = kda_lower_bound * sigmoid(exp(A_log) * f) in place of
the softplus (DeltaNetShape.gate_lower_bound), cast through the model's dtype.

The state and the Scan are gated_delta.py's, shaped alike ([B, heads, K, K], float32), and
so are the masks: padding gets a decay of 1 and a beta of 0. The native GatedDeltaRule
takes one decay per head, so this Scan's body is named kda{layer}_step, which the load-time
switch (kernels/gated_delta.py) leaves alone: it runs on stock operators everywhere.
"""

from __future__ import annotations

import numpy as np

from edgeprefill.export.gated_delta import GatedDeltaNet

# Names beside FamilySpec.delta_names (q/k/v_proj, their convolutions, o_proj and o_norm),
# relative to the mixer's prefix
BETA = "b_proj"
GATE = ("g_a_proj", "g_b_proj")  # the output gate, low rank (K)
FORGET = ("f_a_proj", "f_b_proj")  # the decay's projection, low rank (K)
FULL_GATE, FULL_FORGET = "g_proj", "f_proj"  # Bailing's, full rank (FamilySpec.kda_full_rank)


class KimiDeltaAttention(GatedDeltaNet):
    """Emits KDA layers: GatedDeltaNet's with KDA's projections, gates and norm."""

    step_prefix = "kda"
    per_channel_decay = True

    def layer(self, p: str, h: str, layer: int, rows) -> str:
        """The KDA sublayer of layer prefix `p` on its normed input `h`; `rows` keeps the
        tokens that go on."""
        d, names = self.d, self.cfg.spec.delta_names
        pre = p + names.mixer
        self._check_kda_shapes(pre)
        size = d.value_heads * d.value_dim
        mixed, b, gate, forget = (self.tokens.spread(x) for x in self._kda_projections(pre, h))
        mixed = self._convolved(pre, layer, mixed)
        out = self._recurrence(pre, layer, self._float(mixed), self._float(b),
                               self._float(forget))
        y = self._gated_norm(pre, out, gate)  # [B, C, size]
        y = rows(self.tokens.gather(y, size))
        return self.w.linear(y, [pre + names.out + ".weight"], None)

    def _kda_projections(self, pre: str, h: str) -> tuple[str, str, str, str]:
        """q | k | v, beta's logits, the output gate and the decay's projection of h, in one
        MatMul for everything read from h (Kimi's low ranks then their own)."""
        g, d, names = self.g, self.d, self.cfg.spec.delta_names
        size = d.value_heads * d.value_dim
        first = (FULL_GATE, FULL_FORGET) if self.cfg.spec.kda_full_rank else \
            (GATE[0], FORGET[0])
        width = size if self.cfg.spec.kda_full_rank else d.key_dim
        projected = self.w.linear(
            h, [pre + n + ".weight" for n in (*names.projections, BETA, *first)], None)
        mixed, b, gate, forget = g.op("Split", [projected, g.const(
            [d.conv_dim, d.value_heads, width, width])], 4, axis=-1)
        if not self.cfg.spec.kda_full_rank:
            gate = self.w.linear(gate, [pre + GATE[1] + ".weight"], None)
            forget = self.w.linear(forget, [pre + FORGET[1] + ".weight"], None)
        return mixed, b, gate, forget

    def _gates(self, pre: str, b: str, a: str) -> tuple[str, str]:
        """decay [B, C, heads, K] (a: the forget projection, [B, C, heads * K]) and beta
        [B, C, heads], float32; 1 and 0 on padding."""
        g, d = self.g, self.d
        a_log = g.weight(pre + "A_log.f32", (d.value_heads, 1), np.float32,
                         lambda: self.w.ckpt.get(pre + "A_log", np.float32).reshape(-1, 1))
        dt_bias = g.weight(pre + "dt_bias.f32", (d.value_heads, d.key_dim), np.float32,
                           lambda: self.w.ckpt.get(pre + "dt_bias", np.float32).reshape(
                               d.value_heads, d.key_dim))
        x = g.op("Add", [g.op("Reshape", [a, g.const([0, 0, d.value_heads, d.key_dim])]),
                         dt_bias])
        rate = g.op("Exp", [a_log])  # [heads, 1]: each head's channels
        if d.gate_lower_bound is None:  # Kimi: -exp(A_log) * softplus(x)
            gate = g.op("Mul", [g.op("Neg", [rate]), g.op("Softplus", [x])])
        else:  # Bailing's bounded gate: lower * sigmoid(exp(A_log) * x)
            gate = g.op("Mul", [g.const(d.gate_lower_bound, np.float32),
                                g.op("Sigmoid", [g.op("Mul", [rate, x])])])
        if self.cfg.spec.kda_full_rank:  # Bailing's gate goes through the model's dtype
            gate = self._float(self._cast(gate, self.w.dtype))
        valid = g.op("Unsqueeze", [self.valid, g.const([3])])  # [B, C, 1, 1]
        decay = g.op("Where", [valid, g.op("Exp", [gate]), g.const(1.0, np.float32)])
        beta = g.op("Where", [self.valid, g.op("Sigmoid", [b]), g.const(0.0, np.float32)])
        return decay, beta

    def _l2norm(self, x: str) -> str:
        """[B, C, heads * K] -> [B, C, heads, K], each head x / sqrt(sum(x^2) + eps), as
        transformers' KDA divides (Qwen3.5's multiplies by the rsqrt)."""
        g, d = self.g, self.d
        x = g.op("Reshape", [x, g.const([0, 0, d.key_heads, d.key_dim])])
        total = g.op("ReduceSum", [g.op("Mul", [x, x]), g.const([-1])], keepdims=1)
        return g.op("Div", [x, g.op("Sqrt", [g.op("Add", [total, g.const(1e-6, np.float32)])])])

    def _gated_norm(self, pre: str, out: str, z: str) -> str:
        """KimiLinearRMSNormGated per head: the recurrence's output in the model's dtype,
        normed in float32, times the weight and sigmoid(z) in float32; [B, C, heads * K]
        in the model's dtype."""
        g, d, dtype = self.g, self.d, self.w.dtype
        x = self._float(self._cast(out, dtype))
        mean = g.op("ReduceMean", [g.op("Mul", [x, x]), g.const([-1])], keepdims=1)
        normed = g.op("Mul", [x, g.op("Reciprocal", [g.op("Sqrt", [
            g.op("Add", [mean, g.const(self._norm_eps, np.float32)])])])])  # x * rsqrt
        name = pre + self.cfg.spec.delta_names.norm + ".weight"
        weight = g.weight(name + ".f32", (d.value_dim,), np.float32,
                          lambda: self.w.ckpt.get(name, np.float32))
        gate = g.op("Sigmoid", [self._float(g.op("Reshape", [
            z, g.const([0, 0, d.value_heads, d.value_dim])]))])
        y = self._cast(g.op("Mul", [g.op("Mul", [normed, weight]), gate]), dtype)
        return g.op("Reshape", [y, g.const([0, 0, d.value_heads * d.value_dim])])

    def _check_kda_shapes(self, pre: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        d, hidden, names = self.d, self.cfg.hidden_size, self.cfg.spec.delta_names
        size, k = d.value_heads * d.value_dim, d.key_dim
        expected = [(pre + n + ".weight", (size, hidden)) for n in names.projections]
        expected += [(pre + n + ".weight", (size, 1, d.conv_kernel)) for n in names.conv]
        expected += [(pre + BETA + ".weight", (d.value_heads, hidden)),
                     (pre + "dt_bias", (size,)), (pre + names.norm + ".weight", (k,)),
                     (pre + names.out + ".weight", (hidden, size))]
        if self.cfg.spec.kda_full_rank:  # Bailing's
            expected += [(pre + n + ".weight", (size, hidden)) for n in (FULL_GATE, FULL_FORGET)]
            expected += [(pre + "A_log", (d.value_heads,))]
        else:
            expected += [(pre + GATE[0] + ".weight", (k, hidden)),
                         (pre + GATE[1] + ".weight", (size, k)),
                         (pre + FORGET[0] + ".weight", (k, hidden)),
                         (pre + FORGET[1] + ".weight", (size, k)),
                         (pre + "A_log", (1, 1, d.value_heads, 1))]
        self.w.check_shapes(expected, f"linear_num_heads {d.value_heads} of head_dim {k}, "
                                      f"short_conv_kernel_size {d.conv_kernel}")
