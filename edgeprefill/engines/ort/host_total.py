"""On a GPU provider, GroupQueryAttention's `total_sequence_length` comes from the host.

The ort flavour computes it inside the graph, max(past_lens) + chunk (export/flavors.py).
On an H100 with onnxruntime-gpu 1.31.1 the whole graph's logits then came out wrong on the
CUDA provider (off by about their own scale at every step), while one GroupQueryAttention
node alone, called the way the graph calls it (packed q/k/v, rotary inside, the KV buffers
shared, first and later chunks and decode), matched the CPU, and so did the whole graph
with only this input fed from the host (docs/jetson.md). Which op of the in-graph
computation goes wrong there was not established: ONNX Runtime runs part of it on the CPU
and part on the GPU, and the kernel reads the value from host memory.

So on a GPU provider the backend feeds it: every GroupQueryAttention reads one extra graph
input, bound on the host each step. The bundle on disk is unchanged, and on the CPU the
graph runs as exported.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper

from edgeprefill.engines.base import StepBatch

HOST_TOTAL = "edgeprefill.total_sequence_length"  # the added input: int32, a scalar
TOTAL_INPUT = 6  # GroupQueryAttention's total_sequence_length


def feeds_total(device: str) -> bool:
    """Whether the backend feeds the total from the host on this device."""
    return device != "cpu"


def feed_total_from_host(model: ModelProto) -> bool:
    """Rewrites `model` in place so that every GroupQueryAttention reads HOST_TOTAL; False
    when it has none (the standard flavour). The nodes that computed it are left unused."""
    nodes = [n for n in model.graph.node
             if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
    if not nodes:
        return False
    for node in nodes:
        node.input[TOTAL_INPUT] = HOST_TOTAL
    model.graph.input.append(helper.make_tensor_value_info(HOST_TOTAL, TensorProto.INT32, []))
    return True


def host_total(step: StepBatch) -> np.ndarray:
    """What the graph computed: the longest row's past plus the chunk (padded) width."""
    return np.array(int(step.past_lens.max()) + step.input_ids.shape[1], np.int32)
