"""The `ort` flavour's mixture-of-experts block: one com.microsoft `MoE` (float32) or
`QMoE` (int4, int8) node per layer over the experts' stacked weights.

The unrolled dispatch of export/moe.py costs a dozen nodes per expert whether a token chose
it or not: 8 layers of 128 experts decoded 4.2 tokens/s in int4 that way on the 2-core VM,
861 through the op (docs/benchmarks.md, *Mixture of experts*). The op takes the router
logits and does softmax, top-k and (normalize_routing_weights) the renormalization itself,
then runs each chosen expert's SwiGLU on its tokens: the routing of Qwen2/3-MoE, OLMoE,
Qwen3.5-MoE, Qwen3-Next, Qwen3-VL-MoE and Mixtral, and DeepSeek-V2's greedy (one group;
its routed_scaling_factor, which the op lacks, multiplies the op's output). Granite MoE's
softmax over the top k logits is the same renormalized top k of the softmax over all
(exp(l_i) / sum_topk exp(l_j)). LFM2-MoE's routing (the top k of sigmoid + bias, weighed
by the sigmoid alone, renormalized with an epsilon, scaled; DeepSeek-V3's within its best
groups, Kolibri-1's biased on the logits), ERNIE-4.5-MoE's (the top k of softmax + bias,
weighed by the softmax, renormalized with a floor), PhiMoE's sparsemixer and DeepSeek-V2's
group-limited one are computed in the graph as the unrolled form computes them, and handed
to the op as logits it cannot read otherwise: log(weight) at the k chosen experts and -inf
elsewhere, so the op's softmax and top k find exactly those k and renormalize their weights
to sum 1; the output times each token's sum of weights undoes that. So does a quantized
block whose family leaves its top k weights as the softmax gave them (Qwen2-MoE, OLMoE,
Jamba): QMoE's CPU kernel (onnxruntime 1.32) renormalizes them whatever
normalize_routing_weights says, at 4 bits and at 8, 0.05-0.6 of the logits' scale off on
the fixtures; the float MoE op honours it. Llama 4's experts
take the token times its weight, unweighed after: with its one expert per token, x times
that weight goes in and the chosen expert's logit is 0 (weight 1); with more, each expert
would need its own input, and the block stays unrolled. LongCat-Flash's identity
experts and ZAYA's skip expert go in as chosen too (_chosen_logits): the identity picks
leave the op's columns and are added after it, a skip pick weighs 0; ZAYA's and Inkling's
routers hand the block their choice (routed). gpt-oss's router logits carry its bias; its
experts' biases are the op's fc1/fc2 bias inputs and its clamped SwiGLU the op's
activation attributes (_swiglu), as is Hy4's (a clamp before the activation, beta 0).
Step 3.7's layers that clamp after the activation keep the unrolled form, each alone
(clamped_after).
The `standard` flavour and fp16 bundles keep the unrolled graph (export/moe.py).

Weights: fc1 [E, 2I, H] with each expert's gate and up rows interleaved (g0, u0, g1, ...,
the CPU kernel's only layout, swiglu_fusion=1), fc2 [E, H, I]. int4: each expert's rows
quantized as MatMulNBits' are (export/quantize.py: blocks along the input, zero point 8),
stored [E, out, in / 2] with float32 scales [E, out, blocks]: the op's layout, which needs
H and I to be multiples of the block size. int8: each expert's rows with one scale per
output row (export/quantize.py int8_rows: the other projections' per-channel int8, stored
plus 128, the op's implicit zero point), [E, out, in] with float32 scales [E, out], and no
block_size: that kernel dequantizes and multiplies in float, so the experts compute what
their dequantized weights do; with a block_size the 8-bit kernel quantizes the activations
too (docs/design.md, *Mixture of experts*).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from edgeprefill.export.experts import MoeConfig
from edgeprefill.export.moe import MixtureOfExperts, tensor_attribute
from edgeprefill.export.quantize import QuantConfig, int4_blockwise, int8_rows

# the op's own; the others ("sigmoid", "softmax_bias", "sparsemixer", ...) go in as chosen
OP_ROUTINGS = ("softmax", "topk_softmax")


def why_unrolled(experts: MixtureOfExperts, activation: str,
                 quant: QuantConfig | None) -> str | None:
    """Why the block cannot be the op, in words (None: it can)."""
    moe = experts.moe
    if experts.names.expert_norm is not None:
        return "each expert's output is normed before its weight, which the op lacks"
    if moe.inner_width:
        return "the experts run between projections of their own, which the op lacks"
    if moe.logit_scale != 1.0:
        return "the router's logits are scaled first, which the op does not"
    if moe.input_scaled and moe.top_k > 1:
        return (f"each of a token's {moe.top_k} experts takes the token times its own "
                "weight; the op runs them on one input")
    if activation != "silu":
        return f"the experts' activation is {activation}, the op's CPU kernel takes SiLU"
    if experts.dtype != np.float32:
        return "the op's CPU kernel runs float32 only (this bundle is fp16)"
    if quant is None or quant.kind == "int8":  # int8: one scale per row, any width
        return None
    if experts.hidden % quant.block_size or moe.width % quant.block_size:
        return (f"hidden {experts.hidden} and expert width {moe.width} are not multiples of "
                f"the int4 block size {quant.block_size}")
    return None


# Step 3.7's layers whose experts clamp their SwiGLU after the activation (swiglu_limits):
# the op's swiglu_limit (gpt-oss's clamp, Hy4's before the activation) does not compute it
CLAMPED_AFTER = ("their SwiGLU is clamped after the activation (swiglu_limits), which the "
                 "op's swiglu_limit does not compute")


def clamped_after(experts: MixtureOfExperts, p: str) -> bool:
    """Whether layer p's routed experts clamp after the activation (CLAMPED_AFTER): that
    layer alone keeps the unrolled experts, the others take the op."""
    routed = experts.clamps.get(p, (None, None))[0]
    return routed is not None and not routed.gate_first


class MoeOp(MixtureOfExperts):
    """MixtureOfExperts (its router and checkpoint readers) as one contrib op."""

    def __init__(self, experts: MixtureOfExperts, quant: QuantConfig | None) -> None:
        super().__init__(experts.g, experts.w, experts.ckpt, experts.moe, experts.names,
                         experts.hidden, experts.dtype, experts.act, experts.clamps,
                         experts.norm)
        self.quant = quant

    def block(self, p: str, h: str) -> str:
        if clamped_after(self, p):  # Step 3.7's clamped layers: the unrolled experts
            return super().block(p, h)
        g, moe = self.g, self.moe
        x = g.op("Reshape", [h, g.const([-1, self.hidden])])  # [N, H]
        total, routed, identity = None, x, None  # routed: the op's input
        if moe.input_scaled:  # Llama 4, one expert per token (why_unrolled)
            logits, routed = self._input_scaled(p, x)
            normalize = 1
        elif (not moe.zero_experts and _op_routes(moe)
              and (self.quant is None or _normalized(moe))):
            logits = self._router_logits(p, x)  # [N, E]
            normalize = int(_normalized(moe))
        else:  # QMoE's CPU kernel renormalizes even at normalize_routing_weights 0
            chosen, weights = self._route(p, x)
            logits, total = self._chosen_logits(chosen, weights)
            normalize = 1
            if moe.zero_experts:  # LongCat-Flash's identity experts: beside the op
                identity = self._identity(x, chosen, weights)
        out = self._op(p, routed, logits, normalize)
        if total is not None:
            out = g.op("Mul", [out, total])  # the chosen routings' weights, scaling included
        elif moe.scaling != 1.0:  # the op's own routing knows no routed_scaling_factor
            out = g.op("Mul", [out, g.const(moe.scaling, self.dtype)])
        if identity is not None:
            out = g.op("Add", [out, identity])
        out = self._with_shared(p, x, out)
        return g.op("Reshape", [out, g.op("Shape", [h])])

    def routed(self, p: str, h: str, chosen: str, weights: str) -> str:
        """The block's output for tokens a router outside it routed (ZAYA's: one expert
        each, or its skip expert as expert 0 at weight 0, which the op weighs 0)."""
        g = self.g
        x = g.op("Reshape", [h, g.const([-1, self.hidden])])  # [N, H]
        logits, total = self._chosen_logits(chosen, weights)
        out = g.op("Mul", [self._op(p, x, logits, 1), total])
        out = self._with_shared(p, x, out)
        return g.op("Reshape", [out, g.op("Shape", [h])])

    def _op(self, p: str, x: str, logits: str, normalize: int) -> str:
        """The MoE (float32) or QMoE (int4, int8) node's output [N, H] for x [N, H] routed by
        `logits` [N, E] (the op's softmax, top k and, at `normalize`, renormalizing)."""
        g, moe = self.g, self.moe
        attrs = {"k": moe.top_k, "normalize_routing_weights": normalize,
                 "activation_type": "swiglu", "swiglu_fusion": 1, **self._swiglu(p)}
        bias1, bias2 = self._biases(p)
        if self.quant is None:
            fc1 = self.g.weight(p + "experts.fc1", (moe.experts, 2 * moe.width, self.hidden),
                                self.dtype, lambda: self._stacked(p, self._fc1))
            fc2 = self.g.weight(p + "experts.fc2", (moe.experts, self.hidden, moe.width),
                                self.dtype, lambda: self._stacked(p, self._fc2))
            return g.op("MoE", [x, logits, fc1, bias1, fc2, bias2], domain="com.microsoft",
                        **attrs)
        q = self.quant
        fc1, scale1 = self._quantized(p + "experts.fc1", 2 * moe.width, self.hidden, p,
                                      self._fc1)
        fc2, scale2 = self._quantized(p + "experts.fc2", self.hidden, moe.width, p, self._fc2)
        # int8: no block_size, the per-row kernel (float activations)
        bits = {"expert_weight_bits": 8} if q.kind == "int8" else {
            "expert_weight_bits": 4, "block_size": q.block_size,
            "accuracy_level": q.accuracy_level}
        return g.op("QMoE", [x, logits, fc1, scale1, bias1, fc2, scale2, bias2],
                    domain="com.microsoft", **bits, **attrs)

    def _swiglu(self, p: str) -> dict[str, float]:
        """Layer p's activation attributes: silu(gate) * up is alpha 1, beta 0, no limit;
        gpt-oss's clamped SwiGLU (clamp(up) + 1) * g * sigmoid(alpha g), g = min(gate,
        limit), is its alpha, beta 1 and swiglu_limit (the CPU kernel clamps the gate
        above and up on both sides, as GptOssExperts does); Hy4's silu(min(gate, L)) *
        clamp(up, -L, L) (a clamp before the activation) is alpha 1, beta 0 and L."""
        clamped = self.moe.clamped
        routed = self.clamps.get(p, (None, None))[0]
        if routed is not None:  # a clamp before the activation (clamped_after)
            return {"activation_alpha": 1.0, "activation_beta": 0.0,
                    "swiglu_limit": routed.limit}
        if clamped is None:
            return {"activation_alpha": 1.0, "activation_beta": 0.0}
        return {"activation_alpha": clamped.alpha, "activation_beta": 1.0,
                "swiglu_limit": clamped.limit}

    def _biases(self, p: str) -> tuple[str, str]:
        """The stacked expert biases fc1 [E, 2I] (interleaved as fc1's rows) and fc2
        [E, H]; "" where the family has none."""
        moe, n = self.moe, self.names
        fc1 = fc2 = ""
        if n.gate_up_bias is not None:
            gate_up = [self._gate_up_bias(p, e) for e in range(moe.experts)]
            fc1 = self.g.weight(p + "experts.fc1.bias", (moe.experts, 2 * moe.width),
                                self.dtype, lambda: np.stack([
                                    _interleaved(read()) for read in gate_up]).astype(self.dtype))
        if n.down_bias is not None:
            down = [self._down_bias(p, e) for e in range(moe.experts)]
            fc2 = self.g.weight(p + "experts.fc2.bias", (moe.experts, self.hidden), self.dtype,
                                lambda: np.stack([read() for read in down]).astype(self.dtype))
        return fc1, fc2

    def _chosen_logits(self, chosen: str, weights: str) -> tuple[str, str]:
        """([N, E] log(weight) at each token's chosen experts, -inf elsewhere; [N, 1] the
        sum of their weights) from `chosen` [N, k] and `weights` [N, k] (float32), as
        MixtureOfExperts._route or ZAYA's router gives them. A choice past the real experts
        (an identity expert) leaves the op's columns, and a choice at weight 0 (ZAYA's skip
        expert) is -inf too: the op runs k experts of a row that has fewer, weighing the
        others 0, and gives 0 for a row of none (onnxruntime 1.32's MoE and QMoE)."""
        g, moe = self.g, self.moe
        shape = g.op("Concat", [g.op("Shape", [chosen], end=1), g.const([moe.choices])],
                     axis=0)
        empty = g.op("ConstantOfShape", [shape],
                     value=tensor_attribute(np.array([-np.inf], np.float32)))
        logits = g.op("ScatterElements", [empty, chosen, g.op("Log", [weights])], axis=1)
        if moe.zero_experts:
            logits = g.op("Slice", [logits, g.const([0]), g.const([moe.experts]),
                                    g.const([1])])
            real = g.op("Less", [chosen, g.const(moe.experts, np.int64)])
            weights = g.op("Where", [real, weights, g.const(0.0, self.dtype)])
        return logits, g.op("ReduceSum", [weights, g.const([-1])], keepdims=1)

    def _input_scaled(self, p: str, x: str) -> tuple[str, str]:
        """([N, E] 0 at each token's one chosen expert, -inf elsewhere; x [N, H] times that
        expert's weight): the op's expert then runs on the scaled token, weighed by 1."""
        g = self.g
        chosen, weights = self._route(p, x)  # [N, 1], [N, 1]
        shape = g.op("Concat", [g.op("Shape", [chosen], end=1),
                                g.const([self.moe.experts])], axis=0)
        empty = g.op("ConstantOfShape", [shape],
                     value=tensor_attribute(np.array([-np.inf], np.float32)))
        zero = g.op("ConstantOfShape", [g.op("Shape", [chosen])],
                    value=tensor_attribute(np.zeros(1, np.float32)))
        logits = g.op("ScatterElements", [empty, chosen, zero], axis=1)
        return logits, g.op("Mul", [x, weights])

    def _fc1(self, p: str, e: int) -> np.ndarray:
        """Expert e's [2I, H] gate and up rows, interleaved (g0, u0, g1, u1, ...)."""
        return _interleaved(self._gate_up_reader(p, e)())

    def _fc2(self, p: str, e: int) -> np.ndarray:
        return self._down_reader(p, e)()

    def _stacked(self, p: str, read) -> np.ndarray:
        return np.stack([read(p, e).astype(self.dtype) for e in range(self.moe.experts)])

    def _quantized(self, name: str, rows: int, cols: int, p: str, read) -> tuple[str, str]:
        """The experts' [rows, cols] weights stacked, quantized as the op reads them: int4,
        packed uint8 [E, rows, cols / 2] and float32 scales [E, rows, blocks]; int8, each
        expert's rows as int8_rows quantizes them (one symmetric scale per output row, the
        other projections' per-channel int8, DynamicQuantizeMatMul's, stored plus 128):
        uint8 [E, rows, cols] and float32 scales [E, rows]."""
        q, experts = self.quant, self.moe.experts
        assert q is not None
        quantize: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
        if q.kind == "int8":
            quantize, data_shape, scale_shape = int8_rows, (rows, cols), (rows,)
        else:
            quantize = partial(int4_blockwise, block=q.block_size)
            data_shape, scale_shape = (rows, cols // 2), (rows, cols // q.block_size)

        def compute() -> tuple[np.ndarray, np.ndarray]:
            parts = [quantize(read(p, e)) for e in range(experts)]
            return (np.stack([data.reshape(data_shape) for data, _ in parts]),
                    np.stack([scale.reshape(scale_shape) for _, scale in parts]))

        parts = self.w.memoized(name, compute)
        weight = self.g.weight(f"{name}.{q.kind}", (experts, *data_shape), np.dtype(np.uint8),
                               lambda: parts()[0])
        scale = self.g.weight(name + ".scale", (experts, *scale_shape), np.dtype(np.float32),
                              lambda: parts()[1])
        return weight, scale


def _normalized(moe: MoeConfig) -> bool:
    """Whether the family renormalizes its top k weights to sum 1 (the op's
    normalize_routing_weights)."""
    return moe.norm_topk or moe.routing == "topk_softmax"


def _op_routes(moe: MoeConfig) -> bool:
    """Whether the op's own softmax and top k route as the family does: DeepSeek-V2's
    group-limited routing over one group is the plain softmax top k (its greedy); soft-capped
    logits (Laguna's) go in as chosen."""
    if moe.logit_softcap:
        return False
    return moe.routing in OP_ROUTINGS or (moe.routing == "softmax_group_limited"
                                          and moe.groups == 1)


def _interleaved(gate_up: np.ndarray) -> np.ndarray:
    """Gate-first rows [2I, ...] (gate, then up) as the op's g0, u0, g1, u1, ..."""
    width = gate_up.shape[0] // 2
    out = np.empty_like(gate_up)
    out[0::2], out[1::2] = gate_up[:width], gate_up[width:]
    return out
