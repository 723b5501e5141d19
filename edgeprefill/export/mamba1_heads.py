"""Zamba's multi-head Mamba-1 mixers (transformers' ZambaMambaMixer): Mamba-1
(export/mamba1.py) with the mixer's `inner` channels in `n_mamba_heads` heads, each with
its own x_proj (to its dt, B and C) and dt_proj, as if each head were a Mamba-1 mixer of
its own (no dt/B/C norms):

  x, z       = in_proj(h), its rows interleaved per channel (x_0, z_0, x_1, ...)
  dt, B, C   = x_proj_weight[head] x_head                  [heads, dt_rank + 2N, head_dim]
  dt         = softplus(dt_proj_weight[head] dt + dt_proj_bias[head])
  A, D       = stored per head ([heads, head_dim, N], [heads, head_dim])

The recurrence is Mamba-1's Scan with B and C one per channel (its head's), [inner, N].
"""

from __future__ import annotations

import numpy as np

from edgeprefill.export.mamba1 import Mamba1


class MultiHeadMamba1(Mamba1):
    """Emits Zamba's multi-head Mamba-1 layers."""

    @property
    def _groups(self) -> int:  # type: ignore[override]
        return self.s.inner

    def _in_proj_order(self, rows: np.ndarray) -> np.ndarray:  # type: ignore[override]
        """in_proj's rows (x_0, z_0, x_1, z_1, ...) -> [x | z] (ZambaMambaMixer views its
        output [inner, 2] and splits the pairs)."""
        return np.concatenate([rows[0::2], rows[1::2]])

    def _selection(self, pre: str, x: str) -> tuple[str, str, str]:
        """dt [B, C, inner] and B, C [B, C, inner, N] (each channel its head's), float32."""
        g, s = self.g, self.s
        heads = s.heads
        width = s.inner // heads
        rank, n = s.dt_rank, s.state_size
        per_head = g.op("Unsqueeze", [g.op("Reshape", [self._float(x), g.const(
            [0, 0, heads, width])]), g.const([3])])  # [B, C, heads, 1, width]
        proj = self._transposed(pre + "x_proj_weight", (heads, rank + 2 * n, width))
        params = g.op("MatMul", [per_head, proj])  # [B, C, heads, 1, rank + 2N]
        dt, b, c = g.op("Split", [params, g.const([rank, n, n])], 3, axis=-1)
        dt_proj = self._transposed(pre + "dt_proj_weight", (heads, width, rank))
        dt = g.op("Reshape", [g.op("MatMul", [dt, dt_proj]), g.const([0, 0, s.inner])])
        dt = g.op("Add", [dt, self._f32(pre + "dt_proj_bias", (s.inner,))])
        dt = g.op("Where", [self.valid, g.op("Softplus", [dt]), g.const(0.0, np.float32)])
        shape = g.const([1, 1, 1, width, 1])
        b, c = (g.op("Reshape", [g.op("Expand", [t, shape]), g.const([0, 0, s.inner, n])])
                for t in (b, c))
        return dt, b, c

    def _transposed(self, name: str, stored: tuple[int, int, int]) -> str:
        """A per-head weight [heads, out, in] as [heads, in, out] float32, for MatMul."""
        shape = (stored[0], stored[2], stored[1])
        return self.g.weight(name + ".f32t", shape, np.float32, lambda: np.ascontiguousarray(
            self.w.ckpt.get(name, np.float32).transpose(0, 2, 1)))

    def _check_shapes(self, pre: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        s, hidden = self.s, self.cfg.hidden_size
        heads, width = s.heads, s.inner // s.heads
        self.w.check_shapes(((pre + "in_proj.weight", (2 * s.inner, hidden)),
                            (pre + "conv1d.weight", (s.inner, 1, s.conv_kernel)),
                            (pre + "x_proj_weight", (heads, s.dt_rank + 2 * s.state_size,
                                                     width)),
                            (pre + "dt_proj_weight", (heads, width, s.dt_rank)),
                            (pre + "dt_proj_bias", (heads, width)),
                            (pre + "A_log", (heads, width, s.state_size)),
                            (pre + "D", (heads, width)),
                            (pre + "out_proj.weight", (hidden, s.inner))),
            f"mamba_expand x hidden_size {s.inner} channels in n_mamba_heads {heads}, "
            f"mamba_d_state {s.state_size}, mamba_dt_rank {s.dt_rank}")
