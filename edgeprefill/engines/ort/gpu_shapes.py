"""On a GPU provider, few step shapes: each prefill chunk padded to a bucket, and every
shape the runtime sends run once at load.

ONNX Runtime's CUDA provider pays 33-45 ms the first time a session runs an input shape it
has not run before (each new chunk length, each new decode width), then ~0.6 ms for it;
seen on an H200 with onnxruntime-gpu 1.31.1 for the tiny model's int4 and float16 bundles
alike, where the CPU provider pays nothing measurable (docs/jetson.md). The scheduler cuts
prompts into pieces of any length (a prompt's last piece is its remainder), so a server
kept meeting new shapes: five requests sent at once to a fresh CUDA server waited
0.9-1.3 s for their first tokens. Padded to the smallest bucket it fits (the graph masks
padding through `valid_lens`, as TensorRT's steps pad theirs), a chunk has one of the
bundle's few bucket widths, and with the decode widths 1..slots they are few enough to run
each once at load (`warm_up_steps`).

A padded chunk writes K/V at its padded positions too, past the row's valid tokens, where
the row's next tokens overwrite them before anything attends to them: so a chunk is padded
only to a bucket that ends inside the capacity, else sent as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeprefill.engines.base import StepBatch, warm_up_decode, warm_up_prefill

PAD_ID = 0  # any id inside the vocabulary: padded positions are masked


def padded(step: StepBatch, buckets: Sequence[int], capacity: int) -> StepBatch:
    """`step` with its chunk padded to the smallest bucket that holds it and ends inside
    the capacity for every row; a decode step (chunk 1), a chunk of a bucket's width and a
    chunk no bucket fits as they are."""
    width = step.chunk
    if width == 1:  # every decode step: nothing to look at
        return step
    end = int(step.past_lens.max())
    fitting = [b for b in sorted(buckets) if width <= b and end + b <= capacity]
    if not fitting or fitting[0] == width:
        return step
    ids = np.full((step.rows, fitting[0]), PAD_ID, np.int64)
    ids[:, :width] = step.input_ids
    return step._replace(input_ids=ids)


def warm_up_steps(buckets: Sequence[int], capacity: int, slots: int) -> list[StepBatch]:
    """A prefill of each bucket that fits the capacity, into slot 0, and a decode step of
    each width 1..slots from slot 0: every shape `padded` steps and the decode rows take.
    The K/V they write is garbage no request reads (no slot records it)."""
    prefills = [warm_up_prefill(b) for b in sorted(buckets) if b <= capacity]
    return prefills + [warm_up_decode(rows) for rows in range(1, slots + 1)]
