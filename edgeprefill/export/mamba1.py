"""Mamba-1 mixers (mamba, falcon_mamba) as stock ONNX ops, with their two states.

transformers' MambaMixer (its torch path; FalconMambaMixer adds the norms marked *):

  x, z         = split(in_proj(h))                              [inner, inner]
  x            = silu(causal depthwise conv of L tokens over x)  state 1: its last L-1
  dt, B, C     = split(x_proj(x))                               [dt_rank, N, N]
  *dt, B, C    = each x / rms(x), no weight (mixer_rms_eps); Jamba's times its own
                 weight (dt_layernorm, b_layernorm, c_layernorm; rms_norm_eps)
  dt           = softplus(dt_proj(dt))                          [inner], float32
  per token t:   h = exp(dt_t A) h + dt_t x_t (x) B_t            state 2: h, float32
                                                                 [inner, N]; A [inner, N]
                 y_t = h C_t + D x_t                             A = -exp(A_log)
  out          = out_proj(y * silu(z))

Unlike Mamba-2, dt is one per channel and A one per channel and state element, so the
decay is [inner, N] per token, not a scalar per head. The recurrence is Mamba-2's `Scan`
body (mamba2.ssm_step_body) with h shaped [inner, 1, N]: each channel a head of width
1, B and C one group broadcast over them. The native Mamba2Scan does not take it (its
body's name differs: kernels/mamba2_scan.py), so it runs as the stock Scan. Padding and
a row's first chunk are handled as in Mamba-2 (dt = 0 leaves h as it is; states read as
zeros where past_lens is 0).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeprefill.contract import BATCH, CONV, RECURRENT, state_names
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.mamba2 import F32, ssm_step_body
from edgeprefill.export.mixer_shapes import SelectiveShape
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.recurrent_mixer import RecurrentMixer
from edgeprefill.export.short_conv import StateSpec
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

# Jamba's norms of dt, B and C (the mixer's modules, in x_proj's order)
NORMS = ("dt_layernorm", "b_layernorm", "c_layernorm")


class Mamba1(RecurrentMixer):
    """Emits Mamba-1 layers; the values they all share are computed once."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv, past_lens: str,
                 valid_lens: str, chunk: str) -> None:
        super().__init__(g, w, cfg, tokens, conv, past_lens, valid_lens, chunk)
        assert cfg.selective is not None
        self.s: SelectiveShape = cfg.selective

    def states(self, layer: int) -> list[StateSpec]:
        """The layer's conv state (model dtype) and recurrent state (float32)."""
        s = self.s
        return [(state_names(layer, CONV), self.w.dtype, [BATCH, s.inner, s.conv_kernel - 1]),
                (state_names(layer, RECURRENT), F32, [BATCH, s.inner, 1, s.state_size])]

    def layer(self, p: str, h: str, layer: int, rows) -> str:
        """The Mamba-1 sublayer of layer prefix `p` on its normed input `h`. `rows` keeps
        the tokens that go on."""
        g, s, pre = self.g, self.s, p + self.cfg.spec.names.mamba
        self._check_shapes(pre)
        bias = pre + "in_proj.bias" if s.proj_bias else None
        projected = self.tokens.spread(self.w.linear(h, [pre + "in_proj.weight"], bias,
                                                     reorder=self._in_proj_order))
        x, z = g.op("Split", [projected, g.const([s.inner, s.inner])], 2, axis=-1)
        conv_state = state_names(layer, CONV)
        full = self.conv.full(conv_state.past, x)
        self.conv.store(full, conv_state.present, s.conv_kernel - 1, s.inner)
        taps = self.conv.taps(pre + "conv1d.weight", s.conv_kernel, s.inner,
                              lambda n: self.w.ckpt.get(n, np.float32))
        conv_bias = self.w.tensor(pre + "conv1d.bias") if s.conv_bias else None
        x = self._silu(self.conv.convolve(full, taps, s.conv_kernel, conv_bias))
        y = self._recurrence(pre, layer, x)  # [B, C, inner] float32
        y = self._cast(g.op("Mul", [y, self._silu(self._float(z))]), self.w.dtype)
        y = rows(self.tokens.gather(y, s.inner))
        bias = pre + "out_proj.bias" if s.proj_bias else None
        return self.w.linear(y, [pre + "out_proj.weight"], bias)

    def _recurrence(self, pre: str, layer: int, x: str) -> str:
        """[B, C, inner] float32: the selective scan over the chunk's tokens from the
        layer's recurrent state (zeros at position 0), its last value written to the
        state's present output; D x added. `x` is the convolution's output."""
        g, s = self.g, self.s
        dt, b, c = self._selection(pre, x)
        x = self._float(x)
        a = g.op("Neg", [g.op("Exp", [self._f32(pre + "A_log", (s.inner, s.state_size))])])
        decay = g.op("Exp", [g.op("Mul", [g.op("Unsqueeze", [dt, g.const([3])]), a])])
        dtx = g.op("Unsqueeze", [g.op("Mul", [dt, x]), g.const([3])])  # [B, C, inner, 1]
        state = state_names(layer, RECURRENT)
        kept = g.op("Where", [self.continues, state.past, g.const(0.0, np.float32)])
        body = ssm_step_body(f"selective{layer}_", [s.inner, 1, s.state_size],
                             [self._groups, s.state_size], [s.inner, s.state_size], [2])
        final, out = g.op("Scan", [kept, dtx, b, c, decay], 2, num_scan_inputs=4,
                          scan_input_axes=[1] * 4, scan_output_axes=[1], body=body)
        g.op("Identity", [final], [state.present])
        y = g.op("Reshape", [out, g.const([0, 0, s.inner])])
        return g.op("Add", [y, g.op("Mul", [x, self._f32(pre + "D", (s.inner,))])])

    # B and C per token: one group broadcast over the channels (multi-head mixers: one per
    # channel, each its head's)
    _groups = 1
    # in_proj's rows as stored -> [x | z] (None: stored so)
    _in_proj_order: Callable[[np.ndarray], np.ndarray] | None = None

    def _selection(self, pre: str, x: str) -> tuple[str, str, str]:
        """dt [B, C, inner] (_dt's) and B, C [B, C, 1, N], float32, from the convolution's
        output `x` through x_proj (and Falcon-Mamba's or Jamba's norms)."""
        g, s = self.g, self.s
        params = self.w.linear(x, [pre + "x_proj.weight"], None)
        parts = g.op("Split", [params, g.const([s.dt_rank, s.state_size, s.state_size])], 3,
                     axis=-1)
        dt, b, c = (self._norm(self._float(t), pre + norm) for t, norm in zip(
            parts, NORMS, strict=True))
        b, c = (g.op("Unsqueeze", [t, g.const([2])]) for t in (b, c))
        return self._dt(pre, dt), b, c

    def _dt(self, pre: str, dt: str) -> str:
        """[B, C, inner] float32: softplus(dt_proj(dt)); 0 on padding (a decay of 1 and no
        input: the state stays as it is)."""
        g, s = self.g, self.s
        weight = g.weight(pre + "dt_proj.weight.f32t", (s.dt_rank, s.inner), np.float32,
                          lambda: self.w.ckpt.get(pre + "dt_proj.weight", np.float32).T.copy())
        dt = g.op("Add", [g.op("MatMul", [dt, weight]), self._f32(pre + "dt_proj.bias",
                                                                    (s.inner,))])
        return g.op("Where", [self.valid, g.op("Softplus", [dt]), g.const(0.0, np.float32)])

    def _norm(self, x: str, name: str) -> str:
        """Falcon-Mamba's RMS norm without weight over the last axis (float32), Jamba's
        times the weight of module `name`; else x."""
        eps = self.s.bc_dt_eps
        if eps is None:
            return x
        g = self.g
        mean = g.op("ReduceMean", [g.op("Mul", [x, x]), g.const([-1])], keepdims=1)
        normed = g.op("Mul", [x, g.op("Reciprocal", [g.op("Sqrt", [
            g.op("Add", [mean, g.const(eps, np.float32)])])])])
        if not self.s.bc_dt_weighted:
            return normed
        weight = name + ".weight"
        return g.op("Mul", [normed, self._f32(weight, self.w.shape(weight))])

    def _f32(self, name: str, shape: tuple[int, ...]) -> str:
        """A checkpoint tensor kept in float32 (the SSM's parameters are used so), read as
        `shape` (a multi-head mixer stores A and D per head)."""
        return self.g.weight(name + ".f32", shape, np.float32,
                             lambda: self.w.ckpt.get(name, np.float32).reshape(shape))

    def _norm_shapes(self, pre: str) -> list[tuple[str, tuple[int, ...]]]:
        """Jamba's dt, B and C norm weights and their shapes; none elsewhere."""
        s = self.s
        if not s.bc_dt_weighted:
            return []
        return [(pre + norm + ".weight", (width,))
                for norm, width in zip(NORMS, (s.dt_rank, s.state_size, s.state_size),
                                       strict=True)]

    def _check_shapes(self, pre: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        s, hidden = self.s, self.cfg.hidden_size
        self.w.check_shapes(((pre + "in_proj.weight", (2 * s.inner, hidden)),
                            (pre + "conv1d.weight", (s.inner, 1, s.conv_kernel)),
                            (pre + "x_proj.weight", (s.dt_rank + 2 * s.state_size, s.inner)),
                            (pre + "dt_proj.weight", (s.inner, s.dt_rank)),
                            (pre + "A_log", (s.inner, s.state_size)), (pre + "D", (s.inner,)),
                            (pre + "out_proj.weight", (hidden, s.inner)),
                            *self._norm_shapes(pre)),
            f"expand x hidden_size {s.inner} channels, state_size {s.state_size}, "
            f"time_step_rank {s.dt_rank}, conv_kernel {s.conv_kernel}")
