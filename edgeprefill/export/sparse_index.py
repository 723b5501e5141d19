"""DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-5), as transformers'
DeepseekV32Indexer computes it, in front of the layer's latent attention
(export/latent_attention.py).

Each token gets an index key k = LayerNorm(wk(x)) (one head, index_head_dim wide) and
index_n_heads index queries q = wq_b(q_resid), both rotated on their first
qk_rope_head_dim dims (halves for DeepSeek-V3.2, interleaved pairs for GLM-5). Query s
scores key t as sum_h w[s,h] * relu(q[s,h] . k[t]) * index_head_dim^-0.5, with
w = weights_proj(x) * index_n_heads^-0.5 (weights_proj and the scores in float32, as
transformers keeps them), over the keys the causal mask shows it; it keeps its
`index_topk` best keys and the attention masks the rest.

The index key is cached as extra columns of the layer's one latent KV head,
[k_pe | c | index_k]: the attention's queries are zero there (the scores do not move) and
the output's extra columns are dropped, so the cache contract, its in-place update and
value = key stay as they are. Where a call's keys are no more than index_topk, transformers'
topk(min(index_topk, T)) keeps every key: DSA is then exactly the dense MLA, so a bundle
whose capacity is within index_topk has no indexer at all (ModelConfig.for_context).

Hy4's indexer (HYV4Indexer) rotates the *last* qk_rope_head_dim dims of each index query
and key (halves; Hy4-VL's, HYV4VLIndexer, interleaved pairs), and its k_norm is a LayerNorm
at rms_norm_eps (computed in float32, as transformers keeps it); its "shared" layers are
GLM-5's.

Ties: a query keeps every key whose score is at least its index_topk-th largest (TopK's
smallest), so a tie exactly at that boundary keeps all the tied keys, where transformers
keeps one of them in torch.topk's order (as Doge's dynamic mask, export/dynamic_mask.py).
GLM-5's "shared" layers (indexer_types) reuse the previous "full" layer's selection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.moe import tensor_attribute

if TYPE_CHECKING:
    from edgeprefill.export.decoder import DecoderBuilder
    from edgeprefill.export.flavors import StepTensors

# DeepseekV32Indexer's k_norm: nn.LayerNorm(index_head_dim, eps=1e-6)
INDEX_NORM_EPS = 1e-6
# The score of a key a query cannot see (the scores are float32)
HIDDEN = float(np.finfo(np.float32).min)


# FamilySpec.sparse_index: where each indexer rotates (its first qk_rope_head_dim dims, or
# its last: Hy4's and Hy4-VL's) and how (halves or interleaved pairs)
ROTARIES = ("halves", "interleaved", "last_halves", "last_interleaved")


@dataclass(frozen=True)
class IndexShape:
    """The indexer's config: index_n_heads, index_head_dim, index_topk, whether its rotary
    is on interleaved pairs (GLM-5, Hy4-VL) or halves (DeepSeek-V3.2, Hy4), and on the last
    dims (Hy4, Hy4-VL) rather than the first, its key norm's epsilon, the layers that reuse
    the previous full layer's selection (GLM-5's and Hy4's "shared" indexer_types), and the
    layers without an indexer, which attend to every key their mask shows (dots.3's sliding
    layers)."""

    heads: int
    head_dim: int
    topk: int
    interleaved: bool = False
    shared: tuple[int, ...] = ()
    rope_last: bool = False
    norm_eps: float = INDEX_NORM_EPS
    plain: tuple[int, ...] = ()


def read_index(raw: dict[str, Any], rotary: str, rope_dim: int,
               plain: tuple[int, ...] = ()) -> IndexShape:
    """The indexer of config.json (DeepseekV32Config's, GlmMoeDsaConfig's and HYV4Config's
    keys) whose rotary is `rotary` (one of ROTARIES): Hy4's and Hy4-VL's (on the last dims)
    normed at rms_norm_eps; `plain` the layers without one."""
    assert rotary in ROTARIES
    last = rotary.startswith("last_")
    layers = int(raw["num_hidden_layers"])
    types = raw.get("indexer_types") or ["full"] * layers
    if len(types) != layers or any(t not in ("full", "shared") for t in types) \
            or types[0] != "full":
        raise ExportError(f"indexer_types must be {layers} of \"full\" and \"shared\", the "
                          f"first \"full\", got {types!r}")
    shape = IndexShape(heads=int(raw["index_n_heads"]), head_dim=int(raw["index_head_dim"]),
                       topk=int(raw["index_topk"]),
                       interleaved=rotary.endswith("interleaved"),
                       shared=tuple(i for i, t in enumerate(types) if t == "shared"),
                       rope_last=last,
                       norm_eps=float(raw["rms_norm_eps"]) if last else INDEX_NORM_EPS,
                       plain=plain)
    if min(shape.heads, shape.topk) < 1 or shape.head_dim < rope_dim:
        raise ExportError(f"config.json: index_n_heads and index_topk must be positive and "
                          f"index_head_dim at least qk_rope_head_dim, got {shape}")
    return shape


def glm_indexer_types(raw: dict[str, Any]) -> dict[str, Any]:
    """GlmMoeDsaConfig's indexer_types where absent: index_topk_pattern ("F"/"S" or a list),
    else full where max(i - index_skip_topk_offset + 1, 0) % index_topk_freq is 0."""
    if raw.get("indexer_types") is not None:
        return raw
    pattern = raw.get("index_topk_pattern")
    if pattern is not None:
        types = [{"F": "full", "S": "shared"}[c] for c in pattern] \
            if isinstance(pattern, str) else list(pattern)
    else:
        freq = max(int(raw.get("index_topk_freq", 1)), 1)
        offset = int(raw.get("index_skip_topk_offset", 2))
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared"
                 for i in range(int(raw["num_hidden_layers"]))]
    return {**raw, "indexer_types": types}


def rotate(g: GraphBuilder, x: str, cos: str, sin: str, rope_dim: int, width: int,
           interleaved: bool, last: bool = False) -> str:
    """x [..., width] rotated on its first rope_dim dims (its last where `last`) by cos,
    sin [..., rope_dim/2] that broadcast against it (halves, as apply_rotary_pos_emb, or
    interleaved pairs)."""
    if last:
        rest, part = g.op("Split", [x, g.const([width - rope_dim, rope_dim])], 2, axis=-1)
    else:
        part, rest = g.op("Split", [x, g.const([rope_dim, width - rope_dim])], 2, axis=-1)
    if interleaved:  # DeepSeek's interleave: evens then odds, rotated as halves
        pairs = g.op("Reshape", [part, g.const([0, 0, 0, rope_dim // 2, 2])])
        x1, x2 = (g.op("Squeeze", [t, g.const([-1])])
                  for t in g.op("Split", [pairs], 2, axis=-1, num_outputs=2))
    else:
        x1, x2 = g.op("Split", [part], 2, axis=-1, num_outputs=2)
    first = g.op("Sub", [g.op("Mul", [x1, cos]), g.op("Mul", [x2, sin])])
    second = g.op("Add", [g.op("Mul", [x2, cos]), g.op("Mul", [x1, sin])])
    return g.op("Concat", [rest, first, second] if last else [first, second, rest], axis=-1)


def kept_keys(g: GraphBuilder, q: str, w: str, keys: str, visible: str, topk: int,
              scale: float) -> str:
    """Which keys each query keeps, [B,C,K] bool: q [B,C,Hi,Di] and w [B,C,Hi] float32
    (w already times index_n_heads^-0.5), keys [B,K,Di] (any float dtype), visible
    [B,C,K] bool (the causal mask). A query with at most `topk` visible keys keeps them
    all."""
    keys32 = g.op("Cast", [keys], to=1)
    keys_t = g.op("Unsqueeze", [g.op("Transpose", [keys32], perm=[0, 2, 1]), g.const([1])])
    scores = g.op("Relu", [g.op("Mul", [g.op("MatMul", [q, keys_t]),
                                        g.const(scale, np.float32)])])  # [B,C,Hi,K]
    summed = g.op("MatMul", [g.op("Unsqueeze", [w, g.const([2])]), scores])  # [B,C,1,K]
    summed = g.op("Squeeze", [summed, g.const([2])])
    hidden = g.op("Where", [visible, summed, g.const(HIDDEN, np.float32)])
    count = g.op("Min", [g.op("Shape", [hidden], start=-1), g.const([topk])])
    largest, _ = g.op("TopK", [hidden, count], 2, axis=-1, largest=1, sorted=0)
    threshold = g.op("ReduceMin", [largest, g.const([-1])], keepdims=1)
    return g.op("And", [visible, g.op("GreaterOrEqual", [hidden, threshold])])


class Indexer:
    """Emits each DSA layer's index key and selection. `builder` is the DecoderBuilder.
    Its weights stay float in a
    quantized bundle (they pick the keys), weights_proj in float32 as transformers keeps
    it (_keep_in_fp32_modules)."""

    def __init__(self, builder: DecoderBuilder) -> None:
        self.b = builder
        assert builder.cfg.sparse_index is not None and builder.cfg.latent is not None
        self.shape: IndexShape = builder.cfg.sparse_index
        self.rope_dim = builder.cfg.latent.rope_dim
        self.kept: str | None = None  # the last full layer's, which shared layers reuse

    def indexes(self, i: int) -> bool:
        """Whether layer i has the indexer (dots.3's sliding layers do not)."""
        return i not in self.shape.plain

    def layer(self, p: str, h: str, q_resid: str, i: int, step: StepTensors, rope: str,
              past_key: str, start: int) -> tuple[str, str]:
        """(the chunk's index keys [B,C,Di], rotated, to cache from column `start` on; the
        keys each query keeps [B,C,K] bool). h [.., hidden] and q_resid [.., q_lora_rank]
        in the token layout; a shared layer caches zeros and reuses the last selection."""
        b, g, s = self.b, self.b.g, self.shape
        if i in s.shared:
            assert self.kept is not None  # read_index: the first layer is full
            width = g.op("Concat", [g.op("Shape", [b.tokens.spread(h)], end=2),
                                    g.const([s.head_dim])], axis=0)
            zeros = g.op("ConstantOfShape", [width],
                         value=tensor_attribute(np.zeros(1, b.dtype)))
            return zeros, self.kept
        cos, sin = (g.op("Unsqueeze", [t, g.const([2])])
                    for t in b.flavor.rope_at_tokens(g, step, rope))  # [B,C,1,r/2]
        q = b.tokens.spread(self._linear(q_resid, p + "wq_b.weight", b.dtype))
        q = g.op("Reshape", [q, g.const([0, 0, s.heads, s.head_dim])])
        q = self._rotate(q, cos, sin)
        k = self._linear(h, p + "wk.weight", b.dtype)
        k = b.flavor.layer_norm(g, k, b.w.tensor(p + "k_norm.weight"),
                                b.w.tensor(p + "k_norm.bias"), s.norm_eps)
        k = g.op("Unsqueeze", [b.tokens.spread(k), g.const([2])])
        k = g.op("Squeeze", [self._rotate(k, cos, sin), g.const([2])])  # [B,C,Di]
        h32 = h if b.dtype == np.float32 else g.op("Cast", [h], to=1)
        w = self._linear(h32, p + "weights_proj.weight", np.dtype(np.float32))
        w = b.tokens.spread(g.op("Mul", [w, g.const(s.heads**-0.5, np.float32)]))
        keys, visible = b.flavor.index_keys(g, k, past_key, step, start)
        q32 = q if b.dtype == np.float32 else g.op("Cast", [q], to=1)
        self.kept = kept_keys(g, q32, w, keys, visible, s.topk, s.head_dim**-0.5)
        return k, self.kept

    def _rotate(self, x: str, cos: str, sin: str) -> str:
        return rotate(self.b.g, x, cos, sin, self.rope_dim, self.shape.head_dim,
                      self.shape.interleaved, self.shape.rope_last)

    def _linear(self, x: str, name: str, dtype: np.dtype) -> str:
        """x [.., in] times the checkpoint's [out, in] weight, stored [in, out] in `dtype`."""
        b = self.b
        out, width = b.w.shape(name)
        expected = {"wq_b": (self.shape.heads * self.shape.head_dim, b.cfg.latent.q_lora_rank
                             if b.cfg.latent else 0),
                    "wk": (self.shape.head_dim, b.cfg.hidden_size),
                    "weights_proj": (self.shape.heads, b.cfg.hidden_size)}
        b.w.check_shapes([(name, expected[name.split(".")[-2]])],
                         f"index_n_heads {self.shape.heads}, index_head_dim "
                         f"{self.shape.head_dim}")
        weight = b.g.weight(name + ".t", (width, out), dtype,
                            lambda: np.ascontiguousarray(b.ckpt.get(name, np.float32).T)
                            .astype(dtype))
        return b.g.op("MatMul", [x, weight])
