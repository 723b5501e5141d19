"""Value heads narrower than the query/key heads (MiMo-V2-Flash: v_head_dim 128 beside
q/k heads of 192). The chunk-graph contract gives a layer's key and value buffers one head
size, so each value head is padded with zeros to head_dim before attention (a softmax-
weighted sum of zeros stays zero) and the attention's output is cut back to v_head_dim per
head before o_proj. Exact; the value cache holds head_dim - v_head_dim zeros per head."""

from __future__ import annotations

from edgeprefill.export.graph import GraphBuilder


def pad_values(g: GraphBuilder, v: str, kv_heads: int, v_dim: int, head_dim: int) -> str:
    """v [B, C, kv_heads * v_dim] -> [B, C, kv_heads * head_dim], each head's tail zeros."""
    heads = g.op("Reshape", [v, g.const([0, 0, kv_heads, v_dim])])
    padded = g.op("Pad", [heads, g.const([0, 0, 0, 0, 0, 0, 0, head_dim - v_dim])])
    return g.op("Reshape", [padded, g.const([0, 0, kv_heads * head_dim])])


def cut_values(g: GraphBuilder, attn: str, heads: int, v_dim: int, head_dim: int) -> str:
    """attn [B, C, heads * head_dim] -> [B, C, heads * v_dim]: each head's first v_dim."""
    per_head = g.op("Reshape", [attn, g.const([0, 0, heads, head_dim])])
    cut = g.op("Slice", [per_head, g.const([0]), g.const([v_dim]), g.const([3])])
    return g.op("Reshape", [cut, g.const([0, 0, heads * v_dim])])
