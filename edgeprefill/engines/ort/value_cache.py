"""One buffer as both KV caches of a layer whose value is its key (the manifest's
graph.value_is_key: multi-head latent attention, absorbed, export/latent_attention.py).

Such a layer's GroupQueryAttention takes its key as its value (`v = k`), so it writes the
same vectors to present_key.{i} and present_value.{i}. Bound to one buffer, the cache
takes half the memory: GroupQueryAttention writes each new key, then the same bytes again
as its value, and reads both from that buffer; the native attention kernels
(PrefillAttention, DecodeAttention) do likewise (their packed q/k/v holds the key twice).
The logits are the same bits as with two buffers (tests/test_mla.py).

The manifest is trusted only as far as the graph agrees: a layer whose attention could
write anything else into its value cache (another value input, a rotary inside the op,
which rotates the key alone) is refused at load. Besides the attention, only Slices may
read the cache (DeepSeek Sparse Attention's index keys, export/sparse_index.py: a read
whose result feeds the op's attention_bias, so it runs before the op writes).

Only on the CPU provider: on CUDA, ONNX Runtime's GroupQueryAttention kernels have not
been run against one shared buffer, so a GPU load keeps two.
"""

from __future__ import annotations

from typing import Any

from onnx import helper

from edgeprefill.bundle import Manifest
from edgeprefill.contract import kv_names
from edgeprefill.errors import BackendError


def shared_layers(graph: Any, manifest: Manifest, device: str) -> list[int]:
    """The layers whose key and value caches this load binds to one buffer: the
    manifest's graph.value_is_key on the CPU, none elsewhere. Raises BackendError where
    the graph does not write such a layer's key as its value."""
    for layer in manifest.graph.value_is_key:
        _check_layer(graph, layer)
    return list(manifest.graph.value_is_key) if device == "cpu" else []


def _check_layer(graph: Any, layer: int) -> None:
    names = kv_names(layer)
    readers = [node for node in graph.graph.node
               if {names.past_key, names.past_value} & set(node.input)
               and node.op_type != "Slice"]
    if not (len(readers) == 1 and _writes_key_as_value(readers[0], layer)):
        raise BackendError(f"the manifest's graph.value_is_key lists layer {layer}, but its "
                           "attention does not write its key as its value; re-export the "
                           "bundle")


def _writes_key_as_value(node: Any, layer: int) -> bool:
    """A GroupQueryAttention whose value input is its key input, rotating nothing inside
    (its rotary would turn the key alone), writing this layer's caches."""
    names = kv_names(layer)
    inputs, outputs = list(node.input), list(node.output)
    rotary = next((helper.get_attribute_value(a) for a in node.attribute
                   if a.name == "do_rotary"), 0)
    return (node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft"
            and len(inputs) > 4 and len(outputs) == 3 and inputs[1] != ""
            and inputs[1] == inputs[2] and inputs[3:5] == [names.past_key, names.past_value]
            and outputs[1:] == [names.present_key, names.present_value] and rotary == 0)
