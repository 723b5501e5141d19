"""Checkpoint tensors as graph initializers, and the projections over them.

Weights stay lazy: each is registered with its shape and a function that reads (and
converts, packs or quantizes) it when the writer streams it to the external data file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.checkpoint import Checkpoint
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.prequantized import matmul_nbits, same_order, stacked
from edgeprefill.export.quantize import (
    BLOCKWISE,
    QuantConfig,
    block_rows,
    in_row_chunks,
    int8_per_channel,
    int8_rows,
)


class GraphWeights:
    def __init__(
        self, g: GraphBuilder, ckpt: Checkpoint, dtype: np.dtype, quant: QuantConfig | None
    ) -> None:
        self.g = g
        self.ckpt = ckpt
        self.dtype = dtype
        self.quant = quant
        self._memo: tuple[str, tuple] | None = None  # last quantized weight's parts
        self._in_order: dict[tuple[str, bytes], str] = {}  # (x, order) -> x gathered so

    def linear(
        self, x: str, weight_names: list[str], bias_name: str | None,
        reorder: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> str:
        """x @ concat(W_i^T) (+ bias): HF stores [out, in]; MatMul wants [in, out].
        `reorder` permutes the output rows of weight and bias (GPT-NeoX's fused qkv)."""
        in_dim = self.shape(weight_names[0])[1]
        out_dim = sum(self.shape(n)[0] for n in weight_names)
        name = _packed_name(weight_names)

        def out_in() -> np.ndarray:  # [out, in], the checkpoint's layout, packed
            rows = np.concatenate([self.ckpt.get(n, np.float32) for n in weight_names])
            return rows if reorder is None else reorder(rows)

        if self.quant is not None and all(self.ckpt.is_int4(n) for n in weight_names):
            y = self.stored_int4(x, in_dim, out_dim, weight_names, reorder)
        else:
            y = self.project(x, name, in_dim, out_dim, out_in)
        if bias_name is None:
            return y
        return self.g.op("Add", [y, self._bias(bias_name, weight_names, out_dim, reorder)])

    def project(self, x: str, name: str, in_dim: int, out_dim: int,
                out_in: Callable[[], np.ndarray]) -> str:
        """x @ W^T for the [out, in] weight `out_in` reads when the writer asks, written as
        `name`: a float MatMul, or the bundle's quantized one."""
        g = self.g
        if self.quant is None or not self.quant.float_layers:
            produce = lambda: np.ascontiguousarray(out_in().T.astype(self.dtype))  # noqa: E731
            return g.op("MatMul", [x, g.weight(name, (in_dim, out_dim), self.dtype, produce)])
        return self.quantized_matmul(x, name, in_dim, out_dim, out_in)

    def quantized_matmul(self, x: str, name: str, k: int, n: int, out_in,
                         kind: str | None = None) -> str:
        """x @ W^T with W quantized as `kind` (default: the bundle's; the LM head's may
        differ, QuantConfig.head): int8 in a float32 bundle per output channel
        (DynamicQuantizeMatMul, the CPU's int8 GEMMs), else blockwise (MatMulNBits)."""
        g, q = self.g, self.quant
        bits = _bits(kind or q.kind)
        if self._per_channel(bits):
            parts = self.memoized(name, lambda: int8_per_channel(out_in().T))
            weight = g.weight(name + ".int8", (k, n), np.int8, lambda: parts()[0])
            scale = g.weight(name + ".scale", (n,), np.float32, lambda: parts()[1])
            return g.op("DynamicQuantizeMatMul", [x, weight, scale], domain="com.microsoft")
        blocks = -(-k // q.block_size)
        parts = self.memoized(name, lambda: BLOCKWISE[bits](out_in(), q.block_size))
        weight = g.weight(name + f".int{bits}", (n, blocks, q.block_size * bits // 8),
                          np.uint8, lambda: parts()[0])
        scale = g.weight(name + ".scale", (n * blocks,), self.dtype,
                         lambda: parts()[1].astype(self.dtype))
        return g.op(
            "MatMulNBits", [x, weight, scale], domain="com.microsoft", K=k, N=n, bits=bits,
            block_size=q.block_size, accuracy_level=q.accuracy_level,
        )

    def check_shapes(self, expected: Iterable[tuple[str, tuple[int, ...]]],
                     implied_by: str) -> None:
        """Each (name, shape) stored with the shape config.json implies; else one line naming
        the weight, both shapes and `implied_by` (the config's numbers behind the shape), so a
        checkpoint that disagrees with its config fails before the graph uses it."""
        for name, shape in expected:
            if self.shape(name) != shape:
                raise ExportError(f"{name} has shape {self.shape(name)}, but config.json "
                                  f"implies {shape} ({implied_by})")

    def check_output(self, name: str, heads: int, values: int, hidden: int) -> None:
        """The attention's output projection `name` ([out, in]) maps what the graph hands it,
        each of `heads` heads' `values` values side by side, to the residual's `hidden`. A
        checkpoint whose projection disagrees (a transposed or another model's tensor) fails
        here in one line, not as a MatMul dimension error at the bundle's first call."""
        self.check_shapes([(name, (hidden, heads * values))],
                          f"{heads} heads of {values} values, hidden {hidden}")

    def check_mlp(self, inputs: list[str], down: str, gated: bool) -> None:
        """An MLP maps its input's width back to that width: its input projections ([out,
        in]: up, or gate and up, or one packed gate_up) share one input width, and `down`
        takes their output (half of it where `gated`) back to it. A checkpoint whose MLP
        weights disagree (a transposed or another model's tensor) fails here in one line,
        not as a MatMul dimension error at the bundle's first call."""
        shapes = [self.shape(name) for name in inputs]
        if len(shapes) == 2 and shapes[0] != shapes[1]:
            raise ExportError(f"{inputs[0]} has shape {shapes[0]} but {inputs[1]} has "
                              f"{shapes[1]}: the two must be the same")
        width = shapes[0][1]
        expected = (width, sum(shape[0] for shape in shapes) // (2 if gated else 1))
        if self.shape(down) != expected:
            raise ExportError(f"{down} has shape {self.shape(down)}, but the MLP's "
                              f"{', '.join(inputs)} imply {expected} ([hidden, intermediate])")

    def stored_int4(self, x: str, k: int, n: int, weight_names: list[str],
                    reorder: Callable[[np.ndarray], np.ndarray] | None) -> str:
        """x @ concat(W_i^T) for layers a pre-quantized checkpoint stores in 4 bits. An
        act-order layer's MatMulNBits takes x's last axis gathered into its input order
        (export/act_order.py). Fused parts of one order share one MatMulNBits (GPTQ orders
        q, k and v by the Hessian of their one input, so alike); parts of different orders
        cannot: each run of one order gets its own, their outputs concatenated (and their
        rows reordered after, where `reorder` asks)."""
        runs = _runs_of_one_order(weight_names, self.ckpt.int4_order)
        if len(runs) == 1:
            return self.stored_int4_matmul(self.in_order(x, runs[0][1]),
                                           _packed_name(weight_names), k, n, weight_names,
                                           reorder)
        ys = [self.stored_int4_matmul(self.in_order(x, order), _packed_name(names), k,
                                      sum(self.shape(w)[0] for w in names), names, None)
              for names, order in runs]
        y = self.g.op("Concat", ys, axis=-1)
        return y if reorder is None else self._reordered(y, n, reorder, weight_names[0])

    def in_order(self, x: str, order: np.ndarray | None) -> str:
        """x [..., in] with its last axis gathered into `order` (None: x itself), once per
        x and order."""
        if order is None:
            return x
        key = (x, order.tobytes())
        if key not in self._in_order:
            self._in_order[key] = self._gathered_last_axis(x, order)
        return self._in_order[key]

    def _gathered_last_axis(self, x: str, order: np.ndarray) -> str:
        """x[..., order] as whole rows: ONNX Runtime's Gather along the last axis copies one
        element at a time (4 ms for 64 tokens of 2048 inputs, measured, against 0.3 ms
        here), its Gather along the first copies rows. So x, flattened to [tokens, in]
        (any rank: a chunk's [B, C, in], a last row's [B, in]), is transposed, its rows
        gathered, and transposed back."""
        g = self.g
        rows = g.op("Transpose", [g.op("Flatten", [x], axis=-1)], perm=[1, 0])  # [in, tokens]
        picked = g.op("Transpose", [g.op("Gather", [rows, g.const(order)], axis=0)],
                      perm=[1, 0])
        return g.op("Reshape", [picked, g.op("Shape", [x])])

    def _reordered(self, y: str, n: int, reorder: Callable[[np.ndarray], np.ndarray],
                   first: str) -> str:
        """y [..., n] with its last axis as `reorder` puts rows: gathered, and negated where
        it negates rows (nanochat's reflected rotary)."""
        index, signs = _signed_order(reorder, n, first)
        y = self.g.op("Gather", [y, self.g.const(index)], axis=-1)
        return y if (signs > 0).all() else self.g.op("Mul", [y, self.g.const(signs, self.dtype)])

    def stored_int4_matmul(self, x: str, name: str, k: int, n: int, weight_names: list[str],
                           reorder: Callable[[np.ndarray], np.ndarray] | None) -> str:
        """x @ W^T for layers a pre-quantized checkpoint stores in 4 bits: MatMulNBits on
        its own codes, scales and zero points (export/prequantized.py), its group size as
        the block size."""
        g, q = self.g, self.quant
        assert q is not None

        def compute() -> tuple:
            weight = stacked([self.ckpt.int4_weight(w) for w in weight_names])
            if reorder is not None:  # rows of codes, scales and zero points alike; a
                # negated row's scale negated (its codes and zero point are 0..15)
                index, signs = _signed_order(reorder, n, weight_names[0])
                weight = replace(weight, codes=weight.codes[index], zeros=weight.zeros[index],
                                 scales=weight.scales[index] * signs[:, None])
            return matmul_nbits(weight)

        assert self.ckpt.int4 is not None  # is_int4
        block = self.ckpt.int4.group_size
        blocks = -(-k // block)
        parts = self.memoized(name, compute)
        inputs = [x, g.weight(name + ".int4", (n, blocks, block // 2), np.uint8,
                              lambda: parts()[0]),
                  g.weight(name + ".scale", (n * blocks,), self.dtype,
                           lambda: parts()[1].astype(self.dtype))]
        if not self.ckpt.int4.symmetric:
            inputs.append(g.weight(name + ".zero_point", (n, -(-blocks // 2)), np.uint8,
                                   lambda: parts()[2]))
        return g.op("MatMulNBits", inputs, domain="com.microsoft", K=k, N=n, bits=4,
                    block_size=block, accuracy_level=q.accuracy_level)

    def rows(self, name: str, indices: str, quantize: bool = True) -> str:
        """Rows `indices` of the embedding table `name` [vocab, width]: a Gather of the
        float table, or, in a quantized bundle (unless `quantize` is False or
        QuantConfig.embeddings is), GatherBlockQuantized, which dequantizes the rows it
        gathers only: the table stays int4/int8 in the file and in memory."""
        g, q = self.g, self.quant
        if q is None or not q.embeddings or not quantize:
            return g.op("Gather", [self.tensor(name), indices])
        vocab, width = self.shape(name)
        table = lambda: self.ckpt.get(name, np.float32)  # noqa: E731
        bits = _bits(q.kind)
        if self._per_channel(bits):  # one scale per row, as the projections'
            parts = self.memoized(name, lambda: in_row_chunks(int8_rows, table()))
            block, data_shape, blocks = 16, (vocab, width), 1
            while block < width:  # one block spans the row: one scale per row
                block *= 2
        else:  # whole blocks, the padding sliced off below (quantize.block_rows says why)
            parts = self.memoized(name, lambda: in_row_chunks(
                lambda t: block_rows(t, q.block_size, bits), table()))
            block, blocks = q.block_size, -(-width // q.block_size)
            data_shape = (vocab, blocks * block * bits // 8)
        data = g.weight(name + f".{q.kind}", data_shape, np.uint8, lambda: parts()[0])
        scale = g.weight(name + ".scale", (vocab, blocks), self.dtype,
                         lambda: parts()[1].astype(self.dtype))
        rows = g.op("GatherBlockQuantized", [data, indices, scale], domain="com.microsoft",
                    gather_axis=0, quantize_axis=1, block_size=block, bits=bits)
        if data_shape[1] * 8 // bits > width:
            rows = g.op("Slice", [rows, g.const([0]), g.const([width]), g.const([-1])])
        return rows

    def _per_channel(self, bits: int) -> bool:
        """int8 in a float32 bundle: per output channel (row), DynamicQuantizeMatMul's
        float32-only scheme; any other kind is MatMulNBits' blocks."""
        return bits == 8 and self.dtype == np.float32

    def memoized(self, name: str, compute):
        """Quantize a weight once for its several initializers (the writer asks for them
        one after another)."""

        def parts() -> tuple:
            if self._memo is None or self._memo[0] != name:
                self._memo = (name, compute())
            return self._memo[1]

        return parts

    def check_bias(self, bias: str, width: int, implied_by: str) -> None:
        """The bias `bias` stored as [width], the outputs it is added to; else one line
        naming it, both shapes and `implied_by` (what has those outputs), before the graph
        is written. A bias of another length had failed only when the writer read it,
        naming a packed tensor the checkpoint has not, or not at all where a packed
        projection's biases summed to its width (k short by one, v long by one)."""
        if self.shape(bias) != (width,):
            raise ExportError(f"{bias} has shape {self.shape(bias)}, but {implied_by} "
                              f"implies {(width,)}")

    def _bias(self, name: str, weight_names: list[str], size: int, reorder) -> str:
        # A packed projection's bias is the concatenation of its parts' biases.
        parts = [w.removesuffix(".weight") + ".bias" for w in weight_names]
        for part, weight in zip(parts, weight_names, strict=True):
            self.check_bias(part, self.shape(weight)[0], f"{weight} of shape {self.shape(weight)}")

        def produce() -> np.ndarray:
            bias = np.concatenate([self.ckpt.get(n, np.float32) for n in parts])
            return (bias if reorder is None else reorder(bias)).astype(self.dtype)

        return self.g.weight(name, (size,), self.dtype, produce)

    def resolve(self, candidates: tuple[str, ...]) -> str:
        """The first of a tensor's historical names that the checkpoint holds."""
        found = next((name for name in candidates if self.ckpt.has(name)), None)
        if found is None:
            raise ExportError(
                f"the checkpoint lacks the tensor {' or '.join(map(repr, candidates))}"
            )
        return found

    def tensor(self, name: str) -> str:
        """A checkpoint tensor stored unchanged (only converted to the graph dtype)."""
        return self.g.weight(
            name, self.shape(name), self.dtype, lambda: self.ckpt.get(name, self.dtype)
        )

    def shape(self, name: str) -> tuple[int, ...]:
        return self.ckpt.shape(name)



def _runs_of_one_order(names: list[str], order_of: Callable[[str], np.ndarray | None]
                       ) -> list[tuple[list[str], np.ndarray | None]]:
    """`names` cut into runs of consecutive weights of one input order, with that order."""
    runs: list[tuple[list[str], np.ndarray | None]] = []
    for name in names:
        order = order_of(name)
        if runs and same_order(runs[-1][1], order):
            runs[-1][0].append(name)
        else:
            runs.append(([name], order))
    return runs


def _signed_order(reorder: Callable[[np.ndarray], np.ndarray], n: int,
                  first: str) -> tuple[np.ndarray, np.ndarray]:
    """What `reorder` does to n rows, as (row index, sign +-1 per row): the families'
    reorders permute rows and negate some (nanochat); one that scales rows otherwise
    cannot apply to 4-bit codes: refused."""
    moved = np.asarray(reorder(np.arange(1, n + 1, dtype=np.float64)[:, None]))[:, 0]
    index = np.abs(moved).astype(np.int64) - 1
    if not (np.array_equal(np.sort(index), np.arange(n))
            and np.array_equal(np.abs(moved), index + 1)):
        raise ExportError(f"the fused projection of {first} rescales its rows, which export "
                          "cannot apply to 4-bit codes")
    return index, np.sign(moved).astype(np.float32)


def _packed_name(names: list[str]) -> str:
    """A fused projection's name (`{stem}.q_k_v_proj.weight`); one weight's, its own."""
    if len(names) == 1:
        return names[0]
    stem = names[0].rsplit(".", 2)[0]
    parts = "_".join(n.rsplit(".", 2)[1].removesuffix("_proj") for n in names)
    return f"{stem}.{parts}_proj.weight"


def _bits(kind: str) -> int:
    """"int8" -> 8, "int4" -> 4."""
    return int(kind.removeprefix("int"))
