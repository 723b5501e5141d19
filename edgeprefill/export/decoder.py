"""Build the chunk graph of a decoder-only model straight from its config and weights.

One graph runs one step: B rows of C tokens each (a prefill chunk is B=1, a decode step is
B=active sessions with C=1). The contract (names and axes from edgeprefill/contract.py),
shared with the runtime through the manifest:

  inputs   input_ids        [B, C]            int64
           past_lens        [B]               int32  tokens already in each row's cache
           valid_lens       [B]               int32  valid tokens of the chunk (rest: padding)
           past_key.{i}     [B, KV, cap, D]   model dtype (and past_value.{i})
  outputs  logits           [B, vocab]        float32, only each row's last valid token
           present_key.{i}  [B, KV, cap, D]   the same buffer as past_key.{i}, updated in place
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeprefill.contract import (
    BATCH,
    CAPACITY,
    CHUNK,
    INPUT_IDS,
    LOGITS,
    PAST_LENS,
    VALID_LENS,
    kv_names,
)
from edgeprefill.export.checkpoint import Checkpoint
from edgeprefill.export.flavors import Flavor, StepTensors
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig, int4_blockwise, int8_per_channel


class DecoderBuilder:
    """Emits the graph layer by layer; weights stay lazy (read when the writer asks)."""

    def __init__(
        self, cfg: ModelConfig, ckpt: Checkpoint, flavor: Flavor,
        quant: QuantConfig | None = None,
    ) -> None:
        self.cfg = cfg
        self.ckpt = ckpt
        self.flavor = flavor
        self.quant = quant
        self._memo: tuple[str, tuple] | None = None  # last quantized weight's parts
        self.dtype = flavor.dtype
        self.g = GraphBuilder()

    def build(self) -> GraphBuilder:
        g, cfg = self.g, self.cfg
        ids = g.input(INPUT_IDS, np.int64, [BATCH, CHUNK])
        past_lens = g.input(PAST_LENS, np.int32, [BATCH])
        valid_lens = g.input(VALID_LENS, np.int32, [BATCH])
        g.output(LOGITS, np.float32, [BATCH, cfg.vocab_size])
        self._declare_kv_io()
        chunk = g.op("Slice", [g.op("Shape", [ids]), g.const([1]), g.const([2])])  # [1]
        step = self.flavor.step_tensors(g, past_lens, chunk, kv_names(0).past_key)
        embed = self._embedding()
        x = g.op("Gather", [embed, ids])  # [B,C,hidden]
        delta = None  # each sublayer's output, added to the residual by the next norm
        for layer in range(cfg.num_layers):
            x, delta = self._layer(layer, x, delta, step)
        x = g.op("Add", [x, delta])
        # Only each row's last valid token reaches the LM head: full [C, vocab] logits of
        # a 256-token chunk would cost more than a layer.
        last = g.op("Sub", [valid_lens, g.const([1], np.int32)])
        index = g.op("Unsqueeze", [g.op("Cast", [last], to=7), g.const([1])])  # [B,1]
        hidden = g.op("GatherND", [x, index], batch_dims=1)  # [B,hidden]
        hidden = self.flavor.rms_norm(g, hidden, self._tensor("model.norm.weight"))
        logits = self._lm_head(hidden)
        if self.dtype != np.float32:
            logits = g.op("Cast", [logits], to=1)
        g.rename(logits, LOGITS)
        return g

    def _declare_kv_io(self) -> None:
        shape = [BATCH, self.cfg.num_kv_heads, CAPACITY, self.cfg.head_dim]
        for layer in range(self.cfg.num_layers):
            names = kv_names(layer)
            self.g.input(names.past_key, self.dtype, shape)
            self.g.input(names.past_value, self.dtype, shape)
        for layer in range(self.cfg.num_layers):
            names = kv_names(layer)
            self.g.output(names.present_key, self.dtype, shape)
            self.g.output(names.present_value, self.dtype, shape)

    def _layer(self, layer: int, x: str, delta: str | None, step: StepTensors) -> tuple[str, str]:
        """One decoder layer; returns the residual stream and the MLP's output, which the
        next layer's input norm adds (one fused residual-add + norm per sublayer)."""
        g, cfg, flavor = self.g, self.cfg, self.flavor
        p = f"model.layers.{layer}."
        x, h = flavor.add_rms_norm(g, x, delta, self._tensor(p + "input_layernorm.weight"))
        q, k, v = self._qkv(p, h)
        names = kv_names(layer)
        past = (names.past_key, names.past_value)
        present = (names.present_key, names.present_value)
        attn = flavor.attention(g, q, k, v, past, present, step)
        o_bias = p + "self_attn.o_proj.bias" if cfg.o_bias else None
        attn = self._linear(attn, [p + "self_attn.o_proj.weight"], o_bias)
        x, h = flavor.add_rms_norm(g, x, attn, self._tensor(p + "post_attention_layernorm.weight"))
        return x, self._mlp(p, h)

    def _qkv(self, p: str, h: str) -> list[str | None]:
        """One packed projection for q, k and v. Flavours whose attention takes the packed
        tensor get it whole ([qkv, None, None]: no split copies); otherwise it is split,
        with per-head norms for Qwen3."""
        g, cfg = self.g, self.cfg
        attn = p + "self_attn."
        weights = [attn + f"{n}_proj.weight" for n in "qkv"]
        bias = attn + "qkv_proj.bias" if cfg.qkv_bias else None
        qkv = self._linear(h, weights, bias)
        if self.flavor.packed_qkv and not cfg.qk_norm:
            return [qkv, None, None]
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k, v = g.op("Split", [qkv, g.const([q_size, kv_size, kv_size])], 3, axis=-1)
        if cfg.qk_norm:
            q = self._head_norm(q, cfg.num_heads, self._tensor(attn + "q_norm.weight"))
            k = self._head_norm(k, cfg.num_kv_heads, self._tensor(attn + "k_norm.weight"))
        return [q, k, v]

    def _head_norm(self, x: str, heads: int, weight: str) -> str:
        g, d = self.g, self.cfg.head_dim
        per_head = g.op("Reshape", [x, g.const([0, 0, heads, d])])
        normed = self.flavor.rms_norm(g, per_head, weight)
        return g.op("Reshape", [normed, g.const([0, 0, heads * d])])

    def _mlp(self, p: str, h: str) -> str:
        g = self.g
        mlp = p + "mlp."
        # One packed projection: a decode step is dominated by per-kernel overhead, so one
        # MatMul and a split beat two MatMuls (int4 decode ~10% faster, measured); in a
        # prefill chunk the split's copy costs ~1%.
        gate_up = self._linear(h, [mlp + "gate_proj.weight", mlp + "up_proj.weight"], None)
        gate, up = g.op("Split", [gate_up], 2, axis=-1, num_outputs=2)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])  # SiLU(gate)*up
        return self._linear(act, [mlp + "down_proj.weight"], None)

    def _linear(self, x: str, weight_names: list[str], bias_name: str | None) -> str:
        """x @ concat(W_i^T) (+ bias): HF stores [out, in]; MatMul wants [in, out]."""
        g = self.g
        in_dim = self._shape(weight_names[0])[1]
        out_dim = sum(self._shape(n)[0] for n in weight_names)
        name = weight_names[0] if len(weight_names) == 1 else _packed_name(weight_names)

        def out_in() -> np.ndarray:  # [out, in], the checkpoint's layout, packed
            return np.concatenate([self.ckpt.get(n, np.float32) for n in weight_names])

        if self.quant is None:
            produce = lambda: np.ascontiguousarray(out_in().T.astype(self.dtype))  # noqa: E731
            y = g.op("MatMul", [x, g.weight(name, (in_dim, out_dim), self.dtype, produce)])
        else:
            y = self._quantized_matmul(x, name, in_dim, out_dim, out_in)
        if bias_name is None:
            return y
        return g.op("Add", [y, self._bias(bias_name, weight_names, out_dim)])

    def _quantized_matmul(self, x: str, name: str, k: int, n: int, out_in) -> str:
        g, q = self.g, self.quant
        if q.kind == "int8":
            parts = self._quantized(name, lambda: int8_per_channel(out_in().T))
            weight = g.weight(name + ".int8", (k, n), np.int8, lambda: parts()[0])
            scale = g.weight(name + ".scale", (n,), np.float32, lambda: parts()[1])
            return g.op("DynamicQuantizeMatMul", [x, weight, scale], domain="com.microsoft")
        blocks = -(-k // q.block_size)
        parts = self._quantized(name, lambda: int4_blockwise(out_in(), q.block_size))
        weight = g.weight(name + ".int4", (n, blocks, q.block_size // 2), np.uint8,
                          lambda: parts()[0])
        scale = g.weight(name + ".scale", (n * blocks,), np.float32, lambda: parts()[1])
        return g.op(
            "MatMulNBits", [x, weight, scale], domain="com.microsoft", K=k, N=n, bits=4,
            block_size=q.block_size, accuracy_level=q.accuracy_level,
        )

    def _quantized(self, name: str, compute):
        """Quantize a weight once for its several initializers (the writer asks for them
        one after another)."""

        def parts() -> tuple:
            if self._memo is None or self._memo[0] != name:
                self._memo = (name, compute())
            return self._memo[1]

        return parts

    def _bias(self, name: str, weight_names: list[str], size: int) -> str:
        # A packed projection's bias is the concatenation of its parts' biases.
        parts = [w.removesuffix(".weight") + ".bias" for w in weight_names]
        return self.g.weight(name, (size,), self.dtype, self._concat(parts))

    def _concat(self, names: list[str]) -> Callable[[], np.ndarray]:
        return lambda: np.concatenate([self.ckpt.get(n, self.dtype) for n in names])

    def _embedding(self) -> str:
        return self._tensor("model.embed_tokens.weight")

    def _lm_head(self, hidden: str) -> str:
        """[B, hidden] -> [B, vocab]. Stored [vocab, hidden] as in the checkpoint, read by
        Gemm(transB=1) without a transposed copy.

        Tied embeddings are written twice, as the Gather table and as the LM head: ONNX
        Runtime repacks the Gemm's weight into its own buffer at load, and a table shared
        with the Gather would then be held twice in memory (the packed copy and the
        original, all of it read by the packing). Kept apart, the Gather's table stays
        memory-mapped and only the rows of tokens seen are resident: 108 MiB less RSS
        after load on the SmolLM2-135M shape, for 113 MB more on disk (docs/benchmarks.md)."""
        name = "model.embed_tokens.weight" if self.cfg.tie_embeddings else "lm_head.weight"
        if self.quant is not None:
            vocab, hidden_size = self._shape(name)
            def out_in():
                return self.ckpt.get(name, np.float32)
            return self._quantized_matmul(hidden, "lm_head", hidden_size, vocab, out_in)
        head = self.g.weight(
            "lm_head.weight", self._shape(name), self.dtype, lambda: self.ckpt.get(name, self.dtype)
        )
        return self.g.op("Gemm", [hidden, head], transB=1)

    def _tensor(self, name: str) -> str:
        """A checkpoint tensor stored unchanged (only converted to the graph dtype)."""
        return self.g.weight(
            name, self._shape(name), self.dtype, lambda: self.ckpt.get(name, self.dtype)
        )

    def _shape(self, name: str) -> tuple[int, ...]:
        return self.ckpt.shape(name)


def _packed_name(names: list[str]) -> str:
    stem = names[0].rsplit(".", 2)[0]
    parts = "_".join(n.rsplit(".", 2)[1].removesuffix("_proj") for n in names)
    return f"{stem}.{parts}_proj.weight"
