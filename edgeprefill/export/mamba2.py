"""Mamba-2 mixers (Granite 4.0-H's) as stock ONNX ops, with their two states.

transformers' GraniteMoeHybridMambaLayer (Mamba2Mixer's torch path):

  z, xBC, dt   = split(in_proj(h))                       [inner, conv_dim, heads]
  xBC          = silu(causal depthwise conv of L tokens over xBC)   state 1: its last L-1
  x, B, C      = split(xBC)          x per head [heads, head_dim]; B, C per group [groups,
                                     state_size], group g serving heads / groups heads
  dt           = clamp(softplus(dt + dt_bias), time_step_limit)      float32
  per token t:   h = exp(dt_t A) h + dt_t x_t (x) B_t      state 2: h, float32
                                                            [heads, head_dim, state_size]
                 y_t = h C_t + D x_t                        A = -exp(A_log)
  out          = out_proj(norm.weight * rmsnorm_per_group(y * silu(z)))

The recurrence runs token by token in a `Scan` over the chunk, as transformers' decode
step (mamba2_selective_state_update) does; for a prompt transformers runs the chunked
(SSD) form, which equals it up to float rounding (tests/test_mamba2.py measures both).
A row's padding (t >= valid_len) gets dt = 0, which leaves h as it is, so the state the
Scan ends with is the one at the row's last valid token. Both states read as zeros where
past_lens is 0 and go to their `present_*` outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeprefill.contract import BATCH, CONV, RECURRENT, state_names
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.mixer_shapes import MambaShape
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.recurrent_mixer import RecurrentMixer
from edgeprefill.export.short_conv import StateSpec
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

F32 = np.dtype(np.float32)


class Mamba2(RecurrentMixer):
    """Emits Mamba-2 layers; the values they all share are computed once."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv, past_lens: str,
                 valid_lens: str, chunk: str) -> None:
        super().__init__(g, w, cfg, tokens, conv, past_lens, valid_lens, chunk)
        assert cfg.mamba is not None
        self.m: MambaShape = cfg.mamba

    def states(self, layer: int) -> list[StateSpec]:
        """The layer's conv state (model dtype) and recurrent state (float32)."""
        m = self.m
        return [(state_names(layer, CONV), self.w.dtype, [BATCH, m.conv_dim, m.conv_kernel - 1]),
                (state_names(layer, RECURRENT), F32,
                 [BATCH, m.heads, m.head_dim, m.state_size])]

    def layer(self, p: str, h: str, layer: int, rows) -> str:
        """The Mamba-2 sublayer of layer prefix `p` on its normed input `h`. `rows` keeps
        the tokens that go on."""
        g, m, pre = self.g, self.m, p + self.cfg.spec.names.mamba
        self._check_shapes(pre)
        bias = pre + "in_proj.bias" if m.proj_bias else None
        projected = self.tokens.spread(self._scaled(
            self.w.linear(self._input(h), [pre + "in_proj.weight"], bias)))
        z, xbc, dt = g.op("Split", [projected, g.const([m.inner, m.conv_dim, m.heads])], 3,
                          axis=-1)
        conv_state = state_names(layer, CONV)
        full = self.conv.full(conv_state.past, xbc)
        self.conv.store(full, conv_state.present, m.conv_kernel - 1, m.conv_dim)
        taps = self.conv.taps(pre + "conv1d.weight", m.conv_kernel, m.conv_dim,
                              lambda n: self.w.ckpt.get(n, np.float32))
        conv_bias = self.w.tensor(pre + "conv1d.bias") if m.conv_bias else None
        xbc = self._silu(self.conv.convolve(full, taps, m.conv_kernel, conv_bias))
        y = self._recurrence(pre, layer, self._float(xbc), self._float(dt))
        y = self._gated_norm(pre, y, z)  # [B, C, inner]
        y = rows(self.tokens.gather(y, m.inner))
        bias = pre + "out_proj.bias" if m.out_bias else None
        return self.w.linear(y, [pre + "out_proj.weight"], bias)

    def _input(self, h: str) -> str:
        """The mixer's input times Falcon-H1's ssm_in_multiplier."""
        scales = self.cfg.scales
        if scales is None or scales.ssm_in == 1.0:
            return h
        return self.g.op("Mul", [h, self.g.const(scales.ssm_in, self.w.dtype)])

    def _scaled(self, projected: str) -> str:
        """in_proj's output times Falcon-H1's muP vector: one multiplier each for z, x, B,
        C and dt (transformers' compute_mup_vector)."""
        scales, m = self.cfg.scales, self.m
        if scales is None or scales.ssm == (1.0,) * 5:
            return projected
        group = m.groups * m.state_size
        sizes = (m.inner, m.inner, group, group, m.heads)
        vector = np.concatenate([np.full(n, f, np.float32) for n, f in zip(sizes, scales.ssm,
                                                                            strict=True)])
        return self.g.op("Mul", [projected, self.g.const(vector, self.w.dtype)])

    def _recurrence(self, pre: str, layer: int, xbc: str, dt: str) -> str:
        """[B, C, inner] float32: the SSM over the chunk's tokens from the layer's
        recurrent state (zeros at position 0), its last value written to the state's
        present output; D x added."""
        g, m = self.g, self.m
        group = m.groups * m.state_size
        x, b, c = g.op("Split", [xbc, g.const([m.inner, group, group])], 3, axis=-1)
        x = g.op("Reshape", [x, g.const([0, 0, m.heads, m.head_dim])])
        dt = self._dt(pre, dt)  # [B, C, heads]
        a = g.op("Neg", [g.op("Exp", [self._f32(pre + "A_log", (m.heads,))])])
        decay = g.op("Exp", [g.op("Mul", [dt, a])])
        dtx = g.op("Mul", [x, g.op("Unsqueeze", [dt, g.const([3])])])
        state = state_names(layer, RECURRENT)
        kept = g.op("Where", [self.continues, state.past, g.const(0.0, np.float32)])
        final, out = g.op("Scan", [kept, dtx, self._per_head(b), self._per_head(c), decay], 2,
                          num_scan_inputs=4, scan_input_axes=[1] * 4, scan_output_axes=[1],
                          body=self._step_body(f"mamba{layer}_"))
        g.op("Identity", [final], [state.present])
        d = g.op("Unsqueeze", [self._f32(pre + "D", (m.heads,)), g.const([1])])  # [heads, 1]
        y = g.op("Add", [out, g.op("Mul", [x, d])])
        return g.op("Reshape", [y, g.const([0, 0, m.inner])])

    def _dt(self, pre: str, dt: str) -> str:
        """[B, C, heads] float32: softplus(dt + dt_bias) within time_step_limit; 0 on
        padding (a decay of 1 and no input: the state stays as it is)."""
        g, m = self.g, self.m
        dt = g.op("Softplus", [g.op("Add", [dt, self._f32(pre + "dt_bias", (m.heads,))])])
        if m.dt_min > 0.0 or m.dt_max != float("inf"):
            dt = g.op("Clip", [dt, g.const(m.dt_min, np.float32), g.const(m.dt_max, np.float32)])
        return g.op("Where", [self.valid, dt, g.const(0.0, np.float32)])

    def _per_head(self, x: str) -> str:
        """[B, C, groups * state_size] -> [B, C, heads, state_size]: head j reads group
        j // (heads / groups), as repeat_interleave does."""
        g, m = self.g, self.m
        x = g.op("Reshape", [x, g.const([0, 0, m.groups, 1, m.state_size])])
        x = g.op("Expand", [x, g.const([1, 1, 1, m.heads // m.groups, 1])])
        return g.op("Reshape", [x, g.const([0, 0, m.heads, m.state_size])])

    def _step_body(self, prefix: str) -> Any:
        """The Scan's body: one token's update of h and its output (module docstring)."""
        m = self.m
        return ssm_step_body(prefix, [m.heads, m.head_dim, m.state_size],
                             [m.heads, m.state_size], [m.heads], [2, 3])

    def _gated_norm(self, pre: str, y: str, z: str) -> str:
        """The gated RMSNorm (MambaShape.norm) in float32: the gate y * silu(z) before or
        after an RMS norm per group of inner / groups channels times the weight, or the gate
        alone; [B, C, inner] in the model's dtype."""
        g, m = self.g, self.m
        gate = self._silu(self._float(z))
        if m.norm is None:
            return self._cast(g.op("Mul", [y, gate]), self.w.dtype)
        if m.norm == "gate_first":
            y = g.op("Mul", [y, gate])
        grouped = g.op("Reshape", [y, g.const([0, 0, m.groups, m.inner // m.groups])])
        mean = g.op("ReduceMean", [g.op("Mul", [grouped, grouped]), g.const([-1])], keepdims=1)
        inverse = g.op("Reciprocal", [g.op("Sqrt", [
            g.op("Add", [mean, g.const(self._norm_eps, np.float32)])])])
        normed = g.op("Reshape", [g.op("Mul", [grouped, inverse]), g.const([0, 0, m.inner])])
        y = g.op("Mul", [normed, self._f32(pre + "norm.weight", (m.inner,))])
        if m.norm == "norm_first":
            y = g.op("Mul", [y, gate])
        return self._cast(y, self.w.dtype)

    @property
    def _norm_eps(self) -> float:
        """The gated RMSNorm's epsilon: the mixer's own (Zamba2's 1e-5) or the model's."""
        return self.m.norm_eps if self.m.norm_eps is not None else self.cfg.norm_eps

    def _f32(self, name: str, shape: tuple[int, ...]) -> str:
        """A checkpoint tensor kept in float32 (the SSM's parameters are used so)."""
        return self.g.weight(name + ".f32", shape, np.float32,
                             lambda: self.w.ckpt.get(name, np.float32))

    def _check_shapes(self, pre: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        m, hidden = self.m, self.cfg.hidden_size
        self.w.check_shapes(((pre + "in_proj.weight", (m.inner + m.conv_dim + m.heads, hidden)),
                            (pre + "conv1d.weight", (m.conv_dim, 1, m.conv_kernel)),
                            (pre + "A_log", (m.heads,)), (pre + "D", (m.heads,)),
                            (pre + "dt_bias", (m.heads,)),
                            *(((pre + "norm.weight", (m.inner,)),) if m.norm else ()),
                            (pre + "out_proj.weight", (hidden, m.inner))),
            f"mamba_n_heads {m.heads} of {m.head_dim}, mamba_n_groups {m.groups}, "
            f"mamba_d_state {m.state_size}, mamba_d_conv {m.conv_kernel}")


def ssm_step_body(prefix: str, state: list[int], group: list[int], decay: list[int],
                  decay_axes: list[int]) -> Any:
    """A selective SSM's Scan body, one token: h = decay h + dtx (x) B, y = h C, float32.
    `state` is h's shape past the batch axis, [channels, width, state_size]; B and C are
    `group` ([channels or 1, state_size], broadcast over the channels), dtx is [channels,
    width], and decay `decay`, unsqueezed at `decay_axes` to h's rank: Mamba-2's is one per
    head ([heads], axes 2 and 3), Mamba-1's one per channel and state ([channels,
    state_size] of a width of 1, axis 2)."""
    body = GraphBuilder(prefix)
    shape = [BATCH, *state]
    h = body.input(prefix + "h", F32, shape)
    dtx = body.input(prefix + "dtx", F32, [BATCH, *state[:2]])
    b = body.input(prefix + "B", F32, [BATCH, *group])
    c = body.input(prefix + "C", F32, [BATCH, *group])
    factor = body.input(prefix + "decay", F32, [BATCH, *decay])
    h = body.op("Mul", [h, body.op("Unsqueeze", [factor, body.const(decay_axes)])])
    update = body.op("Mul", [body.op("Unsqueeze", [dtx, body.const([3])]),
                             body.op("Unsqueeze", [b, body.const([2])])])
    # The sum is the output itself: an Identity to it copied h once per token (1.5 MB
    # at Granite-4.0-H-1B's widths; the Scan ran 0.82x as long without, same bits).
    h = body.op("Add", [h, update], [prefix + "h_out"])
    out = body.op("MatMul", [h, body.op("Unsqueeze", [c, body.const([3])])])
    body.op("Squeeze", [out, body.const([3])], [prefix + "y"])
    body.output(prefix + "h_out", F32, shape)
    body.output(prefix + "y", F32, [BATCH, *state[:2]])
    return body.to_graph(prefix + "step")
