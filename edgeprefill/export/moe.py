"""The graph of a mixture-of-experts block: routing, then sparse dispatch per expert.

Built from stock ONNX ops, the same in both flavours. For a layer's N tokens x [N, H]:

  route       router logits [N, E] (float32) -> the top k experts of each token and their
              weights (experts.py: each family's routing)
  dispatch    for each expert e, unrolled: the tokens that chose it (NonZero of its column
              of the [E, N] choice mask), gathered [n_e, H]; its gated MLP as ordinary
              MatMuls (so the int8/int4 quantizer and the native kernels take them as any
              projection); times each token's weight (Llama 4: the tokens times their
              weights go in, the output is not weighed)
  combine     every expert's rows scattered to their token's slot [N k, H] (ScatterND;
              each slot is one expert's), the k slots of a token summed

A decode step therefore reads only the chosen experts' weights (an expert no token chose
runs its MatMuls on zero rows), and a prefill chunk computes each token's k experts only.
Padding tokens of a chunk (the `standard` flavour's) are routed like any token; their rows
are dropped later as before.

TopK keeps the lower index first among equal scores (ONNX's rule); torch.topk on the CPU
follows no fixed order among ties (all-zero scores of 128 experts, top 8: experts 81-88),
so exactly tied router scores are the one place the bundle and transformers may choose
different experts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export import mxfp4
from edgeprefill.export.checkpoint import Checkpoint, stored_apart
from edgeprefill.export.experts import MoeConfig, MoeNames
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.swiglu_clamps import Clamp, clamped_glu
from edgeprefill.export.weights import GraphWeights

FLOAT = 1  # onnx TensorProto.FLOAT
Activation = Callable[[str], str]
# The decoder's norm: (x, module name, width, epsilon or None: the model's, kind of NORMS or
# None: the model's) -> x normed over its last axis
Norm = Callable[[str, str, int, float | None, str | None], str]


class MixtureOfExperts:
    def __init__(self, g: GraphBuilder, w: GraphWeights, ckpt: Checkpoint, moe: MoeConfig,
                 names: MoeNames, hidden: int, dtype: np.dtype, act: Activation,
                 clamps: Mapping[str, tuple[Clamp | None, Clamp | None]] | None = None,
                 norm: Norm | None = None) -> None:
        self.g, self.w, self.ckpt = g, w, ckpt
        self.moe, self.names, self.hidden = moe, names, hidden
        # the width the experts run at: Muse Spark's between its two projections
        self.expert_hidden = moe.inner_width or hidden
        self.norm = norm  # Muse Spark's norms inside the block
        self.dtype = np.dtype(dtype)
        self.act = act
        # layer prefix -> its routed and shared experts' SwiGLU clamps (Step 3.7, Hy4)
        self.clamps = clamps or {}

    def block(self, p: str, h: str) -> str:
        """The block's output for h [..., H] (any leading shape), shaped as h."""
        g = self.g
        x = g.op("Reshape", [h, g.const([-1, self.hidden])])  # [N, H]
        chosen, weights = self._route(p, x)  # [N, k] int64, [N, k] model dtype
        routed = self._dispatch(p, self._projected_in(p, x), chosen, weights)
        routed = self._projected_out(p, routed)
        if self.moe.zero_experts:
            routed = g.op("Add", [routed, self._identity(x, chosen, weights)])
        out = self._with_shared(p, x, routed)
        return g.op("Reshape", [out, g.op("Shape", [h])])

    def _projected_in(self, p: str, x: str) -> str:
        """The experts' input [N, M] of x [N, H]: x, or Muse Spark's pre_norm(pre_proj(x))
        (the family's norm at its epsilon)."""
        n = self.names
        if n.pre_proj is None:
            return x
        name = p + n.pre_proj + ".weight"
        self._check(name, (self.expert_hidden, self.hidden))
        projected = self.w.linear(x, [name], None)
        if n.pre_norm is None:
            return projected
        assert self.norm is not None
        return self.norm(projected, p + n.pre_norm, self.expert_hidden, None, None)

    def _projected_out(self, p: str, routed: str) -> str:
        """The experts' summed output [N, H] of theirs [N, M]: Muse Spark's post_proj."""
        if self.names.post_proj is None:
            return routed
        name = p + self.names.post_proj + ".weight"
        self._check(name, (self.hidden, self.expert_hidden))
        return self.w.linear(routed, [name], None)

    def _identity(self, x: str, chosen: str, weights: str) -> str:
        """The zero-computation experts' output [N, H] (LongCat-Flash's): each returns the
        token, so together x times the weights of a token's choices past the real experts
        (which _dispatch's slots leave at zero)."""
        g = self.g
        zero = g.op("GreaterOrEqual", [chosen, g.const(self.moe.experts, np.int64)])
        weight = g.op("Where", [zero, weights, g.const(0.0, self.dtype)])  # [N, k]
        return g.op("Mul", [x, g.op("ReduceSum", [weight, g.const([-1])], keepdims=1)])

    def routed(self, p: str, h: str, chosen: str, weights: str) -> str:
        """The block's output for h [..., H], shaped as h, whose N tokens chose `chosen`
        [N, k] (int64) with `weights` [N, k] (model dtype) by a router the block does not
        compute (ZAYA's, export/zaya_router.py)."""
        g = self.g
        x = g.op("Reshape", [h, g.const([-1, self.hidden])])  # [N, H]
        out = self._with_shared(p, x, self._dispatch(p, x, chosen, weights))
        return g.op("Reshape", [out, g.op("Shape", [h])])

    def route(self, p: str, x: str) -> tuple[str, str]:
        """Each of the N tokens' k experts [N, k] (int64) and their weights [N, k] (model
        dtype) for x [N, H], by the family's router (JetMoE's attention experts' too)."""
        return self._route(p, x)

    def _with_shared(self, p: str, x: str, routed: str) -> str:
        """The routed experts' output [N, H] with the shared expert's of x added, where the
        family has one; halved where it averages the two (Cohere 2 MoE); plus the block's
        output bias where it has one (JetMoE's)."""
        out = routed
        if self.moe.shared_width:
            out = self.g.op("Add", [out, self._shared(p, x)])
            if self.moe.averaged:
                out = self.g.op("Mul", [out, self.g.const(0.5, self.dtype)])
        if self.names.output_bias is not None:
            name = p + self.names.output_bias
            self._check(name, (self.hidden,))
            out = self.g.op("Add", [out, self.w.tensor(name)])
        return out

    def _route(self, p: str, x: str) -> tuple[str, str]:
        """Each token's k experts and their weights, as the family's router computes them
        (in float32, as transformers' routers do)."""
        g, moe, k = self.g, self.moe, self.g.const([self.moe.top_k])
        logits = self._router_logits(p, x)
        if self.dtype != np.float32:
            logits = g.op("Cast", [logits], to=FLOAT)
        if moe.logit_scale != 1.0:  # Muse Spark: times the model's output_multiplier
            logits = g.op("Mul", [logits, g.const(moe.logit_scale, np.float32)])
        if moe.logit_softcap:  # Laguna: c * tanh(logits / c), in float32
            cap = g.const(moe.logit_softcap, np.float32)
            logits = g.op("Mul", [g.op("Tanh", [g.op("Div", [logits, cap])]), cap])
        if moe.routing == "topk_softmax":  # Granite MoE
            top, chosen = g.op("TopK", [logits, k], 2, axis=-1)
            weights = g.op("Softmax", [top], axis=-1)
        elif moe.routing == "sparsemixer":  # PhiMoE
            chosen, weights = self._sparsemixer(logits)
        elif moe.routing == "topk_sigmoid":  # Llama 4
            top, chosen = g.op("TopK", [logits, k], 2, axis=-1)
            weights = g.op("Sigmoid", [top])
        elif moe.routing in ("sigmoid", "softmax_bias"):  # the bias chooses, never weighs
            scores = g.op("Sigmoid", [logits]) if moe.routing == "sigmoid" else \
                g.op("Softmax", [logits], axis=-1)
            ranked = logits if moe.bias_on_logits else scores
            if moe.expert_bias and self._has_expert_bias(p):
                ranked = g.op("Add", [ranked, self._expert_bias(p)])
            if moe.grouped:  # DeepSeek-V3: a group scored by its two best
                ranked = self._in_best_groups(ranked, 2)
            _, chosen = g.op("TopK", [ranked, k], 2, axis=-1)
            weights = g.op("GatherElements", [scores, chosen], axis=-1)
        elif moe.routing == "softmax_group_limited":  # DeepSeek-V2: a group by its best
            scores = g.op("Softmax", [logits], axis=-1)
            ranked = self._in_best_groups(scores, 1) if moe.grouped else scores
            _, chosen = g.op("TopK", [ranked, k], 2, axis=-1)
            weights = g.op("GatherElements", [scores, chosen], axis=-1)
        else:
            top, chosen = g.op("TopK", [g.op("Softmax", [logits], axis=-1), k], 2, axis=-1)
            weights = top
        if moe.norm_topk:
            total = g.op("ReduceSum", [weights, g.const([-1])], keepdims=1)
            if moe.norm_eps:
                total = g.op("Add", [total, g.const(moe.norm_eps, np.float32)])
            if moe.norm_min:
                total = g.op("Max", [total, g.const(moe.norm_min, np.float32)])
            weights = g.op("Div", [weights, total])
        if moe.scaling != 1.0:
            weights = g.op("Mul", [weights, g.const(moe.scaling, np.float32)])
        if self.dtype != np.float32:
            weights = g.op("Cast", [weights], to=10)
        return chosen, weights

    def _sparsemixer(self, logits: str) -> tuple[str, str]:
        """PhiMoE's two choices ([N, 2] experts, weights): the best logit's expert, then the
        best of the others, each weighed by its softmax over the logits near it."""
        g = self.g
        first, first_weight = self._mixed(logits, logits)
        without = g.op("ScatterElements", [logits, first, g.op(
            "Expand", [g.const(-np.inf, np.float32), g.op("Shape", [first])])], axis=1)
        second, second_weight = self._mixed(logits, without)
        return (g.op("Concat", [first, second], axis=1),
                g.op("Concat", [first_weight, second_weight], axis=1))

    def _mixed(self, logits: str, candidates: str) -> tuple[str, str]:
        """sparsemixer's step: the best of `candidates` [N, E] (logits, or logits with -inf
        at earlier choices) and its softmax over the candidates whose logit l is within
        (best - l) / max(|l|, best) <= 2 jitter of it."""
        g = self.g
        best, chosen = g.op("TopK", [candidates, g.const([1])], 2, axis=-1)  # [N, 1]
        factor = g.op("Max", [g.op("Abs", [logits]), best])
        gap = g.op("Div", [g.op("Sub", [best, logits]), factor])
        far = g.op("Greater", [gap, g.const(2 * self.moe.jitter, np.float32)])
        near = g.op("Where", [far, g.const(-np.inf, np.float32), candidates])
        weight = g.op("GatherElements", [g.op("Softmax", [near], axis=-1), chosen], axis=-1)
        return chosen, weight

    def _in_best_groups(self, ranked: str, best_of: int) -> str:
        """ranked [N, E] float32 with -inf outside each token's best `top_groups` groups
        (n_group groups of consecutive experts, each scored by the sum of its `best_of`
        highest ranked values: DeepSeek-V3's 2, V2's 1), so that the top k are chosen
        within those groups (V2 masks with 0 instead: the same choice, its scores > 0)."""
        g, moe = self.g, self.moe
        grouped = g.op("Reshape", [ranked, g.const([-1, moe.groups,
                                                    moe.experts // moe.groups])])  # [N, G, S]
        tops, _ = g.op("TopK", [grouped, g.const([best_of])], 2, axis=-1)
        score = g.op("ReduceSum", [tops, g.const([-1])], keepdims=0)  # [N, G]
        _, best = g.op("TopK", [score, g.const([moe.top_groups])], 2, axis=-1)  # [N, tg]
        zeros = g.op("ConstantOfShape", [g.op("Shape", [score])],
                     value=tensor_attribute(np.zeros(1, np.float32)))
        ones = g.op("ConstantOfShape", [g.op("Shape", [best])],
                    value=tensor_attribute(np.ones(1, np.float32)))
        kept = g.op("Cast", [g.op("ScatterElements", [zeros, best, ones], axis=1)], to=9)
        masked = g.op("Where", [g.op("Unsqueeze", [kept, g.const([-1])]), grouped,
                                g.const(-np.inf, np.float32)])  # [N, G, S]
        return g.op("Reshape", [masked, g.const([-1, moe.experts])])

    def _dispatch(self, p: str, x: str, chosen: str, weights: str) -> str:
        """Each expert on the tokens that chose it; their rows summed per token. Rows are
        indexed by slot (token * k + the token's i-th choice): every slot is one expert's,
        so the rows scatter to distinct places (no reduction: TensorRT's parser takes
        ScatterND without one only) and the k slots of a token are summed after."""
        g, k = self.g, self.moe.top_k
        flat_weights = g.op("Reshape", [weights, g.const([-1])])  # [N k]
        slots = self.expert_slots(chosen)
        outputs = []
        for e, slot in enumerate(slots):
            tokens = g.op("Div", [slot, g.const(k)])
            rows = g.op("Gather", [x, tokens], axis=0)  # [n_e, H]
            if self.names.expert_norm is not None:  # weighed after the norm, below
                outputs.append(self._expert(p, e, rows))
                continue
            weight = g.op("Unsqueeze", [g.op("Gather", [flat_weights, slot]), g.const([1])])
            if self.moe.input_scaled:  # Llama 4: expert(weight * x)
                outputs.append(self._expert(p, e, g.op("Mul", [rows, weight])))
            else:
                outputs.append(g.op("Mul", [self._expert(p, e, rows), weight]))
        width = self.expert_hidden
        combined = self.at_slots(slots, outputs, flat_weights, width)
        if self.names.expert_norm is not None:
            combined = g.op("Mul", [self._expert_normed(p, combined),
                                    g.op("Unsqueeze", [flat_weights, g.const([1])])])
        return g.op("ReduceSum", [g.op("Reshape", [combined, g.const([-1, k, width])]),
                                  g.const([1])], keepdims=0)

    def _expert_normed(self, p: str, rows: str) -> str:
        """Muse Spark's norm of each expert's output (MuseSparkExperts.post_expert_norm,
        input-scaled, one for every expert) on the slots' rows [N k, M]: each row is one
        expert's output, so one norm of them all is each expert's own."""
        assert self.norm is not None and self.names.expert_norm is not None
        name = p + self.names.expert_norm
        self._check(name + ".weight", (self.expert_hidden,))
        return self.norm(rows, name, self.expert_hidden, self.moe.expert_norm_eps,
                         "rms_input_scaled")

    def at_slots(self, slots: list[str], outputs: list[str], flat: str, width: int) -> str:
        """[N k, width]: each expert's rows `outputs` [n_e, width] at its `slots`
        (expert_slots' order); `flat` any [N k] tensor, for the count. Every slot is one
        expert's, so the rows scatter to distinct places."""
        g = self.g
        index = g.op("Unsqueeze", [g.op("Concat", slots, axis=0), g.const([1])])  # [N k, 1]
        shape = g.op("Concat", [g.op("Shape", [flat]), g.const([width])], axis=0)
        start = g.op("ConstantOfShape", [shape], value=tensor_attribute(np.zeros(1, self.dtype)))
        return g.op("ScatterND", [start, index, g.op("Concat", outputs, axis=0)])

    def expert_slots(self, chosen: str) -> list[str]:
        """For each expert, the slots [n_e] (int64: token * k + the token's i-th choice)
        of `chosen` [N, k] that chose it."""
        g, experts = self.g, self.moe.experts
        hit = g.op("Equal", [g.op("Unsqueeze", [chosen, g.const([-1])]),
                             g.const(np.arange(experts).reshape(1, 1, -1))])  # [N, k, E]
        per_expert = g.op("Reshape", [g.op("Transpose", [hit], perm=[2, 0, 1]),
                                      g.const([experts, -1])])  # [E, N k]
        expert_rows = g.op("Split", [per_expert], experts, axis=0, num_outputs=experts)
        if experts == 1:
            expert_rows = [expert_rows]
        # NonZero of a [1, N k] row: its row 1
        return [g.op("Gather", [g.op("NonZero", [row]), g.const(1)], axis=0)
                for row in expert_rows]

    def _expert(self, p: str, e: int, x: str) -> str:
        """Expert e's gated MLP on its tokens x [n_e, H] (Muse Spark's [n_e, M])."""
        g, width, hidden = self.g, self.moe.width, self.expert_hidden
        stem = p + self.names.expert.format(j=e)
        gate_up = self.w.project(x, stem + "gate_up.weight", hidden, 2 * width,
                                 self._gate_up_reader(p, e))
        if self.names.gate_up_bias is not None:
            gate_up = g.op("Add", [gate_up, self._bias(stem + "gate_up.bias", 2 * width,
                                                       self._gate_up_bias(p, e))])
        gate, up = g.op("Split", [gate_up], 2, axis=-1, num_outputs=2)
        out = self.w.project(self._gated(p, gate, up), stem + "down.weight", width, hidden,
                             self._down_reader(p, e))
        if self.names.down_bias is not None:
            out = g.op("Add", [out, self._bias(stem + "down.bias", hidden,
                                               self._down_bias(p, e))])
        return out

    def _gated(self, p: str, gate: str, up: str) -> str:
        """act(gate) * up (Step 3.7's and Hy4's clamped as layer p's clamp says), or gpt-oss's
        clamped SwiGLU: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g = min(gate,
        limit)."""
        g, clamped = self.g, self.moe.clamped
        if clamped is None:
            return clamped_glu(g, gate, self.act, up, self.clamps.get(p, (None, None))[0],
                               self.dtype)
        limit = g.const(clamped.limit, self.dtype)
        gate = g.op("Min", [gate, limit])
        up = g.op("Clip", [up, g.const(-clamped.limit, self.dtype), limit])
        glu = g.op("Mul", [gate, g.op("Sigmoid", [g.op("Mul", [
            gate, g.const(clamped.alpha, self.dtype)])])])
        return g.op("Mul", [g.op("Add", [up, g.const(1.0, self.dtype)]), glu])

    def _bias(self, name: str, size: int, read: Callable[[], np.ndarray]) -> str:
        return self.g.weight(name, (size,), self.dtype, lambda: read().astype(self.dtype))

    def _gate_up_bias(self, p: str, e: int) -> Callable[[], np.ndarray]:
        """Expert e's [2I] gate and up biases, gate first (as _gate_up_reader's rows)."""
        assert self.names.gate_up_bias is not None
        name = p + self.names.gate_up_bias
        self._check(name, (self.moe.experts, 2 * self.moe.width))
        return lambda: self._gate_first(self.ckpt.get_index(name, e))

    def _down_bias(self, p: str, e: int) -> Callable[[], np.ndarray]:
        assert self.names.down_bias is not None
        name = p + self.names.down_bias
        self._check(name, (self.moe.experts, self.expert_hidden))
        return lambda: self.ckpt.get_index(name, e)

    def _gate_first(self, rows: np.ndarray) -> np.ndarray:
        """Fused gate/up rows as gate then up (gpt-oss interleaves them: g0, u0, g1, ...)."""
        if not self.names.interleaved:
            return rows
        return np.concatenate([rows[0::2], rows[1::2]])

    def _shared(self, p: str, x: str) -> str:
        """The shared expert: its MLP, times sigmoid(shared_expert_gate(x)) where gated
        (Qwen2-MoE)."""
        g, n = self.g, self.names
        assert n.shared is not None
        stem = p + n.shared
        parts = [n.shared_gate_up] if n.shared_gate_up else [n.gate, n.up]
        if n.shared_gate_up and stored_apart(self.ckpt, stem + n.shared_gate_up,
                                             stem + n.gate):
            parts = [n.gate, n.up]
        gate_up = self.w.linear(x, [stem + part + ".weight" for part in parts], None)
        gate, up = g.op("Split", [gate_up], 2, axis=-1, num_outputs=2)
        down = stem + (n.shared_down or n.down) + ".weight"
        glu = clamped_glu(g, gate, self.act, up, self.clamps.get(p, (None, None))[1],
                          self.dtype)
        mlp = self.w.linear(glu, [down], None)
        if n.shared_gate is None:
            return mlp
        return g.op("Mul", [mlp, g.op("Sigmoid", [g.op("MatMul", [x, self._transposed(
            p + n.shared_gate, (1, self.hidden))])])])

    def _router_logits(self, p: str, x: str) -> str:
        """[N, E] router logits of x [N, H], in the model dtype (with gpt-oss's bias); E
        counts any zero-computation experts."""
        logits = self.g.op("MatMul", [x, self._router(p)])
        if self.names.router_bias is None:
            return logits
        name = p + self.names.router_bias
        self._check(name, (self.moe.experts,))
        return self.g.op("Add", [logits, self.w.tensor(name)])

    def _router(self, p: str) -> str:
        """The router's [H, E] weight, kept in float (never quantized: a quantized router
        would choose other experts)."""
        name = self.w.resolve(tuple(p + name for name in self.names.router))
        if self.names.router_hidden_first:  # stored [H, E] already (ERNIE 4.5 VL)
            self._check(name, (self.hidden, self.moe.choices))
            return self.g.weight(name, (self.hidden, self.moe.choices), self.dtype,
                                 lambda: self.ckpt.get(name, np.float32).astype(self.dtype))
        return self._transposed(name, (self.moe.choices, self.hidden))

    def _transposed(self, name: str, shape: tuple[int, int]) -> str:
        if self.ckpt.shape(name) != shape:
            raise ExportError(f"{name} has shape {self.ckpt.shape(name)}, but config.json "
                              f"implies {shape}")
        return self.g.weight(name, shape[::-1], self.dtype, lambda: np.ascontiguousarray(
            self.ckpt.get(name, np.float32).T.astype(self.dtype)))

    def _has_expert_bias(self, p: str) -> bool:
        """Whether the layer has its selection bias (always, unless the family's may be
        left out: A.X K1's, zero where absent)."""
        return not self.names.expert_bias_optional or any(
            self.ckpt.has(p + name) for name in self.names.expert_bias)

    def _expert_bias(self, p: str) -> str:
        """The selection bias [E], stored [E] or [rows, E] (its first row: the text's)."""
        name = self.w.resolve(tuple(p + name for name in self.names.expert_bias))
        experts, rows = self.moe.choices, self.names.modalities
        if self.ckpt.shape(name) not in ((experts,), (rows, experts)):
            raise ExportError(f"{name} has shape {self.ckpt.shape(name)}, but config.json "
                              f"implies {experts} experts")
        return self.g.weight(name, (experts,), np.dtype(np.float32),
                             lambda: self.ckpt.get(name, np.float32).reshape(-1, experts)[0])

    def _gate_up_reader(self, p: str, e: int) -> Callable[[], np.ndarray]:
        """Expert e's [2I, H] gate and up rows (gate first), from any layout."""
        n, stem = self.names, p + self.names.expert.format(j=e)
        if n.stacked is not None:  # DBRX
            gate, up = (self._stacked_rows(p + name, e) for name in n.stacked[:2])
            return lambda: np.concatenate([gate(), up()])
        if n.split_gate_up is not None and self.ckpt.has(p + n.split_gate_up[0]):  # Step 3.7
            halves = [p + name for name in n.split_gate_up]
            for name in halves:
                self._check(name, (self.moe.experts, self.moe.width, self.expert_hidden))
            return lambda: np.concatenate([self.ckpt.get_index(name, e) for name in halves])
        separate = [stem + n.gate + ".weight", stem + n.up + ".weight"]
        if all(self.ckpt.has(name) for name in separate):
            self._check(separate[0], (self.moe.width, self.expert_hidden))
            return lambda: np.concatenate([self.ckpt.get(name) for name in separate])
        read = self._fused_reader(p, e, n.fused_gate_up, separate[0], 2 * self.moe.width,
                                  self.expert_hidden)
        return lambda: self._gate_first(read())

    def _down_reader(self, p: str, e: int) -> Callable[[], np.ndarray]:
        n, stem = self.names, p + self.names.expert.format(j=e)
        if n.stacked is not None:  # DBRX: stored [I, H], in by out
            rows = self._stacked_rows(p + n.stacked[2], e)
            return lambda: np.ascontiguousarray(rows().T)
        separate = stem + n.down + ".weight"
        if self.ckpt.has(separate):
            self._check(separate, (self.expert_hidden, self.moe.width))
            return lambda: self.ckpt.get(separate)
        return self._fused_reader(p, e, n.fused_down, separate, self.expert_hidden,
                                  self.moe.width)

    def _stacked_rows(self, name: str, e: int) -> Callable[[], np.ndarray]:
        """Expert e's [I, H] rows of a DBRX tensor stacked [E * I, H]."""
        width = self.moe.width
        self._check(name, (self.moe.experts * width, self.expert_hidden))
        return lambda: self.ckpt.get_index(name, slice(e * width, (e + 1) * width))

    def _fused_reader(self, p: str, e: int, candidates: tuple[str, ...], separate: str,
                      rows: int, cols: int) -> Callable[[], np.ndarray]:
        """Expert e's [rows, cols] ([out, in]) weight of a fused tensor: stored [E, out,
        in]; or [E, in, out] (gpt-oss always; Qwen3-VL-MoE where the stored shape is not
        [E, out, in], as transformers' Transpose(check_dims=True) reads it); or gpt-oss's
        MXFP4 blocks and scales of [E, out, in]."""
        experts = self.moe.experts
        if self.names.mxfp4:
            stored = next((p + c for c in candidates if self.ckpt.has(p + c + mxfp4.BLOCKS)),
                          None)
            if stored is not None:
                blocks, scales = stored + mxfp4.BLOCKS, stored + mxfp4.SCALES
                blocks_shape, scales_shape = mxfp4.stored_shapes(experts, rows, cols)
                self._check(blocks, blocks_shape)
                self._check(scales, scales_shape)
                return lambda: mxfp4.dequantize(self.ckpt.get_index(blocks, e, np.uint8),
                                                self.ckpt.get_index(scales, e, np.uint8))
        fused = self._fused(p, candidates, separate)
        shape = (experts, rows, cols)
        if self.names.transposed or (self.names.fused_transposable
                                     and self.ckpt.shape(fused) != shape):
            self._check(fused, (experts, cols, rows))
            return lambda: np.ascontiguousarray(self.ckpt.get_index(fused, e).T)
        self._check(fused, shape)
        return lambda: self.ckpt.get_index(fused, e)

    def _fused(self, p: str, candidates: tuple[str, ...], separate: str) -> str:
        found = next((p + c for c in candidates if self.ckpt.has(p + c)), None)
        if found is None:
            fused = " or ".join(repr(p + c) for c in candidates)
            raise ExportError(f"the checkpoint lacks the expert tensor {separate!r} (or the "
                              f"fused {fused})")
        return found

    def _check(self, name: str, shape: tuple[int, ...]) -> None:
        if self.ckpt.shape(name) != shape:
            raise ExportError(f"{name} has shape {self.ckpt.shape(name)}, but config.json "
                              f"implies {shape} ({self.moe.experts} experts of width "
                              f"{self.moe.width}, hidden {self.expert_hidden})")


def tensor_attribute(array: np.ndarray):
    from onnx import numpy_helper

    return numpy_helper.from_array(array)
