"""MiniMax-M3's lightning indexer (transformers' MiniMaxM3VLIndexer), which chooses each
query's *blocks* of keys, one choice per KV head, in front of the layer's grouped-query
attention.

Each token gets one index key k = norm(k_proj(x)) (index_head_dim wide) and
index_n_heads (= num_key_value_heads) index queries q = norm(q_proj(x)), the norms the
model's (1 + w) RMSNorm per head, both rotated as the attention's queries (its rotary
over the first rotary_dim dims, halves). Index head h of query s scores key t as
q[s,h] . k[t] in float32 over the keys the causal mask shows it; a block's score is the
best of its index_block_size keys' (blocks anchored at position 0); the
index_local_blocks blocks ending at the query's own are forced in; the query keeps its
index_topk_blocks best blocks (those with a visible key), and KV head h's queries attend
to the kept blocks' keys only (with the causal mask). A call of at most
index_topk_blocks blocks keeps every block: a bundle whose capacity is within
index_topk_blocks x index_block_size keys is the dense attention exactly and has no
indexer (ModelConfig.for_context), as DSA's (export/sparse_index.py).

The index key is cached in one more KV head of the layer's cache: its values hold the
rotated index key (zeros after index_head_dim), its keys zeros, and its
num_heads / num_key_value_heads query heads are zeros whose output is dropped, so the cache
contract (a layer's own KV heads: ModelInfo.layer_kv), its in-place update and the
attention op stay as they are (the same trick as DSA's extra latent columns).

Ties: as DSA's, a query keeps every block whose score is at least its
index_topk_blocks-th largest, so a tie at that boundary keeps all the tied blocks where
transformers keeps some of them in torch.topk's order; the forced blocks tie (+inf), so
index_local_blocks above index_topk_blocks is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeprefill.contract import kv_names
from edgeprefill.errors import ExportError
from edgeprefill.export.sparse_index import HIDDEN, rotate

if TYPE_CHECKING:
    from edgeprefill.export.decoder import DecoderBuilder
    from edgeprefill.export.flavors import StepTensors
    from edgeprefill.export.layer_attention import LayerAttention

# A forced block's score, above any real one (transformers' +inf)
FORCED = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class BlockIndex:
    """The indexer's config: index_n_heads, index_head_dim, index_block_size,
    index_topk_blocks, index_local_blocks, and the layers that have it."""

    heads: int
    head_dim: int
    block: int
    topk: int
    local: int
    layers: tuple[int, ...]

    @property
    def reach(self) -> int:
        """The most keys of a call that keeps every block."""
        return self.topk * self.block


def read_block_index(raw: dict[str, Any], kv_heads: int, head_dim: int,
                     rotary_dim: int) -> BlockIndex | None:
    """The indexer of config.json (MiniMaxM3VLTextConfig's keys; its layers the family's
    legacy hook listed as `block_index_layers`); None where no layer has one."""
    layers = tuple(int(i) for i in raw.get("block_index_layers") or ())
    if not layers:
        return None
    shape = BlockIndex(heads=int(raw["index_n_heads"]), head_dim=int(raw["index_head_dim"]),
                       block=int(raw["index_block_size"]), topk=int(raw["index_topk_blocks"]),
                       local=int(raw["index_local_blocks"]), layers=layers)
    if shape.heads != kv_heads:
        raise ExportError(f"config.json: index_n_heads ({shape.heads}) other than "
                          f"num_key_value_heads ({kv_heads}) is not supported (one block "
                          "choice per KV head)")
    if not rotary_dim <= shape.head_dim <= head_dim:
        raise ExportError(f"config.json: index_head_dim ({shape.head_dim}) must be at least "
                          f"the rotary dimension ({rotary_dim}) and at most head_dim "
                          f"({head_dim})")
    if min(shape.block, shape.topk) < 1 or not 0 <= shape.local <= shape.topk:
        raise ExportError(f"config.json: index_block_size and index_topk_blocks must be "
                          f"positive and index_local_blocks 0 to index_topk_blocks, got "
                          f"{shape.block}, {shape.topk} and {shape.local}")
    return shape


class BlockIndexer:
    """Emits the indexed layers' attention. `builder` is the DecoderBuilder. The indexer's
    weights stay float in a quantized bundle (they pick the blocks)."""

    def __init__(self, builder: DecoderBuilder) -> None:
        self.b = builder
        assert builder.cfg.block_index is not None
        self.shape: BlockIndex = builder.cfg.block_index

    def attention(self, p: str, h: str, i: int, step: StepTensors,
                  layer: LayerAttention) -> str:
        """Layer i's attention [.., H*D] (in the token layout, before o_proj) of its normed
        input h, each KV head's queries over the blocks that head's index query keeps."""
        b, g, cfg = self.b, self.b.g, self.b.cfg
        wide = cfg.for_layer(i)  # the index key's head, and its query heads, added
        flavor = b._flavor_for(wide)
        heads, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, k, v, _ = b._qkv(p, h, cfg, layer)
        assert q is not None and k is not None and v is not None  # normed: split
        q, k, v = (b.tokens.spread(t) for t in (q, k, v))
        assert layer.rope is not None
        index_q, index_k = self._index_qk(p + "self_attn.indexer.", h, step, layer.rope)
        names = kv_names(i)
        keys, visible = flavor.index_keys(g, index_k, names.past_value, step, 0,
                                          self.shape.head_dim, head=kv)
        kept = self._kept(index_q, keys, visible, step)  # [B,KV+1,C,K]
        extra = heads // kv * d
        q = g.op("Pad", [q, g.const([0, 0, 0, 0, 0, extra])])
        k = g.op("Pad", [k, g.const([0, 0, 0, 0, 0, d])])
        v = g.op("Concat", [v, g.op("Pad", [index_k, g.const(
            [0, 0, 0, 0, 0, d - self.shape.head_dim])])], axis=-1)
        out = flavor.attention(g, q, k, v, (names.past_key, names.past_value),
                               (names.present_key, names.present_value), step, layer,
                               kept=kept)
        out = g.op("Slice", [out, g.const([0]), g.const([heads * d]), g.const([-1])])
        return b.tokens.gather(out, heads * d)

    def _index_qk(self, p: str, h: str, step: StepTensors, rope: str) -> tuple[str, str]:
        """The index queries [B,C,Hi,Di] (float32) and keys [B,C,Di] (the model's dtype),
        normed and rotated."""
        b, g, s = self.b, self.b.g, self.shape
        cos, sin = (g.op("Unsqueeze", [t, g.const([2])])
                    for t in b.flavor.rope_at_tokens(g, step, rope))  # [B,C,1,r/2]
        q = b._head_norm(self._linear(h, p + "q_proj.weight", s.heads * s.head_dim),
                         s.heads, p + "q_norm", s.head_dim)
        k = b._head_norm(self._linear(h, p + "k_proj.weight", s.head_dim), 1,
                         p + "k_norm", s.head_dim)
        q = g.op("Reshape", [b.tokens.spread(q), g.const([0, 0, s.heads, s.head_dim])])
        k = g.op("Unsqueeze", [b.tokens.spread(k), g.const([2])])
        q, k = (rotate(g, t, cos, sin, b.cfg.rotary_dim, s.head_dim, False) for t in (q, k))
        q32 = q if b.dtype == np.float32 else g.op("Cast", [q], to=1)
        return q32, g.op("Squeeze", [k, g.const([2])])

    def _kept(self, q: str, keys: str, visible: str, step: StepTensors) -> str:
        """Which keys each KV head's queries keep, [B,KV+1,C,K] bool (the index key's own
        head: every visible key): q [B,C,Hi,Di] float32, keys [B,K,Di], visible [B,C,K]."""
        g, s = self.b.g, self.shape
        keys32 = g.op("Cast", [keys], to=1)
        keys_t = g.op("Unsqueeze", [g.op("Transpose", [keys32], perm=[0, 2, 1]), g.const([1])])
        scores = g.op("MatMul", [q, keys_t])  # [B,C,Hi,K]
        seen = g.op("Unsqueeze", [visible, g.const([2])])  # [B,C,1,K]
        scores = g.op("Where", [seen, scores, g.const(HIDDEN, np.float32)])
        # blocks of block_size keys from position 0, the last one padded with hidden keys
        width = g.op("Shape", [scores], start=-1)  # [1]: K
        short = g.op("Mod", [g.op("Sub", [g.const([s.block]), g.op("Mod", [
            width, g.const([s.block])])]), g.const([s.block])])
        pads = g.op("Concat", [g.const([0, 0, 0, 0, 0, 0, 0]), short], axis=0)
        padded = g.op("Pad", [scores, pads, g.const(HIDDEN, np.float32)])
        blocks = g.op("ReduceMax", [g.op("Reshape", [padded, g.const([0, 0, 0, -1, s.block])]),
                                    g.const([-1])], keepdims=0)  # [B,C,Hi,nb]
        count = g.op("Shape", [blocks], start=-1)  # [1]: nb
        if s.local:
            ids = g.op("Range", [g.const(0), g.op("Squeeze", [count, g.const([0])]),
                                 g.const(1)])  # [nb]
            steps = g.op("Range", [g.const(0), g.op("Squeeze", [step.chunk, g.const([0])]),
                                   g.const(1)])
            at = g.op("Add", [g.op("Unsqueeze", [g.op("Cast", [step.past_lens], to=7),
                                                 g.const([1])]), steps])  # [B,C] positions
            own = g.op("Unsqueeze", [g.op("Div", [at, g.const(s.block)]), g.const([2])])
            forced = g.op("And", [g.op("LessOrEqual", [ids, own]), g.op("Greater", [
                ids, g.op("Sub", [own, g.const(s.local)])])])  # [B,C,nb]
            blocks = g.op("Where", [g.op("Unsqueeze", [forced, g.const([2])]),
                                    g.const(FORCED, np.float32), blocks])
        best, _ = g.op("TopK", [blocks, g.op("Min", [count, g.const([s.topk])])], 2,
                       axis=-1, largest=1, sorted=0)
        threshold = g.op("ReduceMin", [best, g.const([-1])], keepdims=1)
        chosen = g.op("GreaterOrEqual", [blocks, threshold])  # [B,C,Hi,nb]
        every = g.op("Concat", [g.op("Shape", [chosen]), g.const([s.block])], axis=0)
        per_key = g.op("Expand", [g.op("Unsqueeze", [chosen, g.const([-1])]), every])
        per_key = g.op("Slice", [g.op("Reshape", [per_key, g.const([0, 0, 0, -1])]),
                                 g.const([0]), width, g.const([-1])])  # [B,C,Hi,K]
        kept = g.op("Transpose", [g.op("And", [per_key, seen])], perm=[0, 2, 1, 3])
        return g.op("Concat", [kept, g.op("Unsqueeze", [visible, g.const([1])])], axis=1)

    def _linear(self, x: str, name: str, out: int) -> str:
        """x [.., hidden] times the checkpoint's [out, hidden] weight, kept float."""
        b = self.b
        b.w.check_shapes([(name, (out, b.cfg.hidden_size))],
                         f"index_n_heads {self.shape.heads}, index_head_dim "
                         f"{self.shape.head_dim}")
        weight = b.g.weight(name + ".t", (b.cfg.hidden_size, out), b.dtype,
                            lambda: np.ascontiguousarray(b.ckpt.get(name, np.float32).T)
                            .astype(b.dtype))
        return b.g.op("MatMul", [x, weight])
