"""FP8 checkpoints, read back to float as transformers dequantizes them.

transformers' "fp8" quantization (FineGrainedFP8: Ministral 3's Instruct releases, Qwen3's
and DeepSeek's -FP8 checkpoints) stores each quantized projection's weight as float8 e4m3
beside its `weight_scale_inv`: one scale per block of `weight_block_size` = [rows, columns]
of the weight, or one for the whole weight where the block size is null. Where it has no
FP8 kernels (on a CPU) transformers loads such a checkpoint dequantized,
`weight * scale_inv` block by block (`_dequantize_fp8_weight`), and a static scheme's
`activation_scale` goes unused; export reads the same float weights, then writes the bundle
in its own precision (fp32, fp16, or `--quantize`).

numpy has no float8 type of its own and safetensors' numpy reader has none either, so the
float8 tensors are read from the file's bytes (safetensors: an 8-byte header length, a JSON
header of dtype, shape and byte offsets, then the data) as ml_dtypes' float8 types.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from edgeprefill.errors import ExportError

FLOAT8 = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
          "F8_E8M0": ml_dtypes.float8_e8m0fnu}  # safetensors' names; E8M0: UE8M0 scales
SCALE_SUFFIX = "_scale_inv"  # beside `weight`: `weight_scale_inv`
UNUSED = ("activation_scale", "input_scale")  # a static scheme's, unused when dequantized


@dataclass(frozen=True)
class Fp8Scheme:
    block: tuple[int, int] | None  # [rows, columns] per scale; None: one scale per weight

    def check(self, name: str, weight: tuple[int, ...], scale: tuple[int, ...]) -> None:
        """One line where a weight's scales do not fit the scheme."""
        if math.prod(scale) == 1:
            return
        if self.block is None:
            raise ExportError(f"the fp8 weight {name!r} has scales of shape {list(scale)}, "
                              "but weight_block_size null means one scale per weight")
        (rows, cols), (block_rows, block_cols) = weight[-2:], self.block
        expected = [*weight[:-2], math.ceil(rows / block_rows), math.ceil(cols / block_cols)]
        if list(scale) != expected:
            raise ExportError(f"the fp8 weight {name!r} of shape {list(weight)} has scales of "
                              f"shape {list(scale)}; weight_block_size {list(self.block)} "
                              f"implies {expected}")

    def describe(self) -> str:
        """In words, for the manifest's quirks and `inspect`."""
        scales = "one scale per weight" if self.block is None else \
            f"a scale per {self.block[0]}x{self.block[1]} block"
        return f"FP8 weights ({scales}), dequantized to float"

    def dequantize(self, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """float32 weight [..., rows, cols] times its scales (checked by `check`): block
        (i, j) scales rows i*block_rows.. and columns j*block_cols.., the last blocks
        cut at the weight's edge (transformers' _dequantize_fp8_weight)."""
        scale = scale.astype(np.float32)
        if self.block is None or scale.size == 1:
            return weight * scale.reshape(())
        rows, cols = weight.shape[-2:]
        block_rows, block_cols = self.block
        full = np.repeat(np.repeat(scale, block_rows, axis=-2), block_cols, axis=-1)
        return weight * full[..., :rows, :cols]


def read_fp8_scheme(family: str, raw: dict[str, Any], mxfp4_experts: bool = False,
                    bitnet: bool = False) -> Fp8Scheme | None:
    """The checkpoint's FP8 scheme from config.json's `quantization_config` (None without
    one, or for the MXFP4 experts of a family that reads them: `mxfp4_experts`, gpt-oss,
    export/mxfp4.py; or for BitNet's layers where the family has them: `bitnet`,
    export/bitlinear.py; or for bitsandbytes' layers, export/bnb.py); any other
    quantization is refused in one line."""
    quant = raw.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else "unknown"
    if (method == "mxfp4" and mxfp4_experts) or (method == "bitnet" and bitnet) or \
            method == "bitsandbytes":
        return None
    if method != "fp8":
        raise ExportError(f"{family}: the checkpoint is quantized (quantization_config, "
                          f"{method}); export reads float, fp8, bitsandbytes or int4 gptq, "
                          "awq and compressed-tensors weights: take its bf16 release")
    block = quant.get("weight_block_size")
    if block is None:
        return Fp8Scheme(None)
    if not (isinstance(block, list) and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)):
        raise ExportError(f"{family}: quantization_config's weight_block_size must be two "
                          f"positive integers or null, got {block!r}")
    return Fp8Scheme((block[0], block[1]))


def read_float8(path: Path, name: str, header: dict[str, Any]) -> np.ndarray:
    """A float8 tensor of a safetensors file as float32 (exact: float32 holds every
    float8 value)."""
    entry = header[name]
    start, end = entry["data_offsets"]
    offset = 8 + _header_length(path) + start
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(end - start,))
    return data.view(FLOAT8[entry["dtype"]]).reshape(entry["shape"]).astype(np.float32)


def safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header: tensor name -> dtype, shape, data_offsets."""
    length = _header_length(path)
    with open(path, "rb") as handle:
        handle.seek(8)
        return json.loads(handle.read(length))


def _header_length(path: Path) -> int:
    with open(path, "rb") as handle:
        return struct.unpack("<Q", handle.read(8))[0]
