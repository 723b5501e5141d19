"""Write a graph's weights once, to one external data file, with progress."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto
from tqdm import tqdm

from edgeprefill.errors import ExportError
from edgeprefill.export.graph import ONNX_DTYPE, Weight

# Large tensors start on a 64 KiB boundary so a runtime may map them straight from the file.
ALIGN_LARGE = 64 * 1024
ALIGN_SMALL = 64
LARGE = 1024 * 1024


def write_external_data(
    weights: list[Weight], path: Path, show_progress: bool = True
) -> list[TensorProto]:
    """Stream every weight to `path`; return initializers that point into it."""
    total = sum(w.nbytes for w in weights)
    protos: list[TensorProto] = []
    with open(path, "wb") as out, tqdm(
        total=total, unit="B", unit_scale=True, desc="writing weights",
        disable=not show_progress, leave=False,
    ) as bar:
        for weight in weights:
            array = _checked(weight)
            offset = _pad_to(out, ALIGN_LARGE if array.nbytes >= LARGE else ALIGN_SMALL)
            out.write(array.tobytes())
            protos.append(_external_proto(weight, path.name, offset, array.nbytes))
            bar.update(array.nbytes)
    return protos


def _checked(weight: Weight) -> np.ndarray:
    array = np.ascontiguousarray(weight.produce(), dtype=weight.dtype)
    if array.shape != weight.shape:
        raise ExportError(
            f"weight {weight.name} has shape {array.shape}, the config implies {weight.shape}"
        )
    # A damaged checkpoint's NaN or Inf would export fine and generate nonsense.
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ExportError(f"weight {weight.name} holds NaN or Inf values as {array.dtype}: "
                          "a damaged checkpoint, or values beyond that type's range")
    return array


def _pad_to(out, alignment: int) -> int:
    offset = out.tell()
    padding = (-offset) % alignment
    if padding:
        out.write(b"\0" * padding)
    return offset + padding


def _external_proto(weight: Weight, location: str, offset: int, length: int) -> TensorProto:
    proto = TensorProto()
    proto.name = weight.name
    proto.data_type = ONNX_DTYPE[weight.dtype]
    proto.dims.extend(weight.shape)
    proto.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = proto.external_data.add()
        entry.key, entry.value = key, str(value)
    return proto
