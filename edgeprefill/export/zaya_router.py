"""ZAYA's router: each token's one expert, or none (its skip expert), as transformers'
ZayaRouter chooses it.

  r        down_proj(x) [R] (router_hidden_size), plus the previous layer's r times
           `router_states_scale` on every layer but the first (EDA: a state carried
           across depth within a token, never across tokens, so it crosses no call)
  logits   out_proj(gelu(fc2(gelu(fc1(rmsnorm(r)))))) [E + 1]: the last is the skip expert
  choice   the top 1 of softmax(logits) + `balancing_biases` (float32; the bias chooses,
           never weighs; the skip expert's is -1 as transformers loads it, whatever the
           checkpoint stores); its weight the softmax's; the skip expert weighs 0 (expert
           0 then runs on the token times 0, as ZayaExperts' mask leaves it out)

The router's weights stay float in a quantized bundle (a quantized router would choose
other experts).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.checkpoint import Checkpoint
from edgeprefill.export.graph import GraphBuilder

PREFIX = "mlp.gate."  # the router's modules under a layer's prefix
FLOAT = 1  # onnx TensorProto.FLOAT
Norm = Callable[[str, str, int], str]  # x, the norm's module, its width -> normed x
Rows = Callable[[str], str]


class ZayaRouter:
    """Emits each layer's routing; holds the EDA state between layers of one graph."""

    def __init__(self, g: GraphBuilder, ckpt: Checkpoint, experts: int, hidden: int,
                 width: int, dtype: np.dtype, norm: Norm) -> None:
        self.g, self.ckpt, self.experts, self.hidden = g, ckpt, experts, hidden
        self.width, self.dtype, self.norm = width, np.dtype(dtype), norm
        self.previous: str | None = None  # the last layer's r, laid out as its input

    def keep_rows(self, rows: Rows) -> None:
        """The carried state cut to the tokens that go on (the last layer's last tokens)."""
        if self.previous is not None:
            self.previous = rows(self.previous)

    def route(self, p: str, h: str) -> tuple[str, str]:
        """([N, 1] int64 expert, [N, 1] its weight in the model dtype) of h [..., hidden]."""
        g, m = self.g, p + PREFIX
        self._check(m)
        r = g.op("Add", [g.op("MatMul", [h, self._transposed(m + "down_proj.weight")]),
                         self._float(m + "down_proj.bias")])
        if self.previous is not None:
            carried = g.op("Mul", [self.previous, self._float(m + "router_states_scale")])
            r = g.op("Add", [r, carried])
        self.previous = r
        x = self.norm(r, m + "router_mlp.norm", self.width)
        for fc in ("fc1", "fc2"):
            x = g.op("Gelu", [self._linear(x, m + "router_mlp." + fc, True)],
                     approximate="none")
        logits = self._linear(x, m + "router_mlp.out_proj", False)
        logits = g.op("Reshape", [logits, g.const([-1, self.experts + 1])])
        if self.dtype != np.float32:
            logits = g.op("Cast", [logits], to=FLOAT)
        probs = g.op("Softmax", [logits], axis=-1)
        ranked = g.op("Add", [probs, self._biases(m + "balancing_biases")])
        _, chosen = g.op("TopK", [ranked, g.const([1])], 2, axis=-1)  # [N, 1]
        weight = g.op("GatherElements", [probs, chosen], axis=-1)
        skip = g.op("Equal", [chosen, g.const(self.experts, np.int64)])
        weight = g.op("Where", [skip, g.const(0.0, np.float32), weight])
        chosen = g.op("Where", [skip, g.const(0, np.int64), chosen])
        if self.dtype != np.float32:
            weight = g.op("Cast", [weight], to=10)
        return chosen, weight

    def _linear(self, x: str, name: str, bias: bool) -> str:
        y = self.g.op("MatMul", [x, self._transposed(name + ".weight")])
        return self.g.op("Add", [y, self._float(name + ".bias")]) if bias else y

    def _transposed(self, name: str) -> str:
        """A router weight [out, in] as MatMul's [in, out], float."""
        out, inp = self.ckpt.shape(name)
        return self.g.weight(name, (inp, out), self.dtype, lambda: np.ascontiguousarray(
            self.ckpt.get(name, np.float32).T).astype(self.dtype))

    def _float(self, name: str) -> str:
        """A router tensor as stored, in the graph's dtype (never quantized)."""
        return self.g.weight(name, self.ckpt.shape(name), self.dtype,
                             lambda: self.ckpt.get(name, self.dtype))

    def _biases(self, name: str) -> str:
        """balancing_biases [E + 1], float32, the skip expert's -1 whatever is stored:
        transformers' ZayaPreTrainedModel._init_weights sets it so as it loads a
        checkpoint (and the others zero where the checkpoint lacks them)."""
        def read() -> np.ndarray:
            stored = self.ckpt.get(name, np.float32) if self.ckpt.has(name) else \
                np.zeros(self.experts + 1, np.float32)
            return np.concatenate([stored[:-1], np.float32([-1.0])])

        return self.g.weight(name, (self.experts + 1,), np.dtype(np.float32), read)

    def _check(self, m: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        r, e = self.width, self.experts + 1
        expected = [("down_proj.weight", (r, self.hidden)), ("down_proj.bias", (r,)),
                    ("router_mlp.norm.weight", (r,)),
                    ("router_mlp.fc1.weight", (r, r)), ("router_mlp.fc1.bias", (r,)),
                    ("router_mlp.fc2.weight", (r, r)), ("router_mlp.fc2.bias", (r,)),
                    ("router_mlp.out_proj.weight", (e, r))]
        if self.previous is not None:
            expected.append(("router_states_scale", (r,)))
        if self.ckpt.has(m + "balancing_biases"):
            expected.append(("balancing_biases", (e,)))
        for name, shape in expected:
            if self.ckpt.shape(m + name) != shape:
                raise ExportError(f"{m + name} has shape {self.ckpt.shape(m + name)}, but "
                                  f"config.json implies {shape} (router_hidden_size {r}, "
                                  f"{self.experts} experts and the skip expert, hidden "
                                  f"{self.hidden})")
