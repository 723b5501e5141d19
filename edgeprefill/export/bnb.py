"""bitsandbytes checkpoints (unsloth's `-bnb-4bit` releases, QLoRA merges saved in 4 bits,
`load_in_8bit` saves), read back to float as bitsandbytes dequantizes them.

transformers' "bitsandbytes" quantization replaces each nn.Linear (and GPT-2's Conv1D,
quantized as [out, in]) but the ones it skips (`llm_int8_skip_modules`, the LM head) with
bitsandbytes' Linear4bit or Linear8bitLt; biases, norms and embeddings stay float. Their
state dicts:

  4 bits (`load_in_4bit`): `X.weight` holds the codes of the flattened [out, in] weight, two
      per byte, the first in the high nibble (any storage dtype: `bnb_4bit_quant_storage`,
      its bytes are what count). Beside it `X.weight.quant_map` (the 16 values of the nf4 or
      fp4 codebook), `X.weight.absmax` (one scale per block of `blocksize` values of the
      flat weight, the last block cut short) and `X.weight.quant_state.bitsandbytes__nf4`
      (or `__fp4`): uint8 bytes of JSON, the quant_type, blocksize, dtype and shape. Double
      quantization (`bnb_4bit_use_double_quant`) stores the absmax itself as uint8 codes of
      `X.weight.nested_quant_map` (256 values) with one `X.weight.nested_absmax` per
      `nested_blocksize` of them, plus the `nested_offset` of the JSON.
      w = quant_map[code] * absmax[block], absmax = nested_quant_map[c] * nested_absmax
      + nested_offset where double-quantized, all in float32: what bitsandbytes' forward
      multiplies by at a float32 compute dtype (its gemm_4bit dequantizes to the
      activations' dtype). The JSON's dtype (bfloat16 in most releases) is the dtype its
      `dequantize_4bit` returns, rounded from these; export keeps them unrounded.
  8 bits (`load_in_8bit`, LLM.int8): `X.weight` int8 [out, in], `X.SCB` float32 [out] (each
      row's absmax) and `X.weight_format` (0: row-major, the only layout saved since
      bitsandbytes 0.45). w = (int8 * SCB) * (1 / 127 in float32), as
      `int8_vectorwise_dequant` computes it. (Its eval forward also quantizes activations
      to int8; the weights it multiplies are these.)

Which layers are quantized is read off the tensors (a quant_state, or an SCB), never the
config's module lists. export reads those layers' float weights and writes the bundle in
its own precision: the float bundle computes with bitsandbytes' exact weights; `--quantize`
requantizes them as any float checkpoint's (int4 on nf4 weights adds its error to theirs).
Nothing here imports bitsandbytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeprefill.errors import ExportError

METHOD = "bitsandbytes"
QUANT_STATE = ".quant_state.bitsandbytes__"  # `X.weight` + this + the quant type
FOUR_BIT = "4bit"
INT8 = "int8"
QUANT_TYPES = ("nf4", "fp4")
# the side tensors of a layer, by kind: suffixes of `X.weight` (4 bits) or of `X.` (8 bits)
FOUR_BIT_PARTS = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map")
INT8_PARTS = ("SCB", "weight_format")
DTYPES = ("float32", "float16", "bfloat16")  # a quant state's dtype: the float weight's
INT8_STEP = np.float32(7.874015718698502e-3)  # bitsandbytes' 1/127, a float32 factor
ROW_FORMAT = 0  # weight_format: "row" (col32 and the Turing/Ampere tiles are older)

Reader = Callable[[str], np.ndarray]  # a stored tensor by name, as it is stored


@dataclass(frozen=True)
class BnbScheme:
    """A bitsandbytes checkpoint's quantization, from config.json's quantization_config."""

    bits: int  # 4 or 8
    quant_type: str | None = None  # nf4 or fp4 (4 bits)
    double_quant: bool = False  # 4 bits: the absmax double-quantized

    def describe(self) -> str:
        """In words, for the manifest's quirks and `inspect`."""
        kind = "int8 (LLM.int8)" if self.bits == 8 else \
            f"{self.quant_type}{' (double-quantized scales)' * self.double_quant}"
        return f"bitsandbytes {kind} weights, dequantized to float"


def read_bnb_scheme(family: str, raw: dict[str, Any]) -> BnbScheme | None:
    """The checkpoint's bitsandbytes scheme, or None where its quantization_config is no
    bitsandbytes one (an old one without quant_method counts where it loads in 4 or 8 bits,
    as transformers reads it); a config export cannot read is refused in one line."""
    quant = raw.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    four = bool(quant.get("load_in_4bit") or quant.get("_load_in_4bit"))
    eight = bool(quant.get("load_in_8bit") or quant.get("_load_in_8bit"))
    method = quant.get("quant_method", METHOD if four or eight else None)
    if method != METHOD:
        return None
    if four == eight:
        raise ExportError(f"{family}: the bitsandbytes quantization_config must load in 4 or "
                          f"in 8 bits, it says load_in_4bit {four}, load_in_8bit {eight}")
    if eight:
        return BnbScheme(8)
    kind = quant.get("bnb_4bit_quant_type", "fp4")  # BitsAndBytesConfig's default
    if kind not in QUANT_TYPES:
        raise ExportError(f"{family}: bnb_4bit_quant_type {kind!r} is not nf4 or fp4")
    return BnbScheme(4, kind, bool(quant.get("bnb_4bit_use_double_quant")))


@dataclass(frozen=True)
class Layer:
    """A layer stored by bitsandbytes: its kind and the side tensors read with its weight."""

    kind: str  # FOUR_BIT or INT8
    parts: tuple[str, ...]  # beside `X.weight`: its quant_state, absmax, ... or SCB


def quantized_layers(names: Iterable[str]) -> dict[str, Layer]:
    """`X.weight` -> its Layer, for each layer stored by bitsandbytes: 4 bits where any side
    tensor of a 4-bit layer is stored, 8 where an SCB or a weight_format is (a missing
    one is then said by the checks)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for name in names:
        owner = _owner(name)
        if owner is not None:
            found.setdefault(owner[0], (owner[1], []))[1].append(name)
    return {weight: Layer(kind, tuple(sorted(parts)))
            for weight, (kind, parts) in found.items()}


def _owner(name: str) -> tuple[str, str] | None:
    """The weight and kind of the layer whose side tensor `name` is, or None."""
    if QUANT_STATE in name:
        return name.split(QUANT_STATE)[0], FOUR_BIT
    if name.endswith(FOUR_BIT_PARTS) and ".weight." in name:
        return name.rsplit(".", 1)[0], FOUR_BIT
    for part in INT8_PARTS:
        if name.endswith("." + part):
            return name.removesuffix(part) + "weight", INT8
    return None


@dataclass(frozen=True)
class QuantState:
    """A 4-bit layer's quant_state JSON, checked against its stored tensors."""

    quant_type: str  # nf4 or fp4
    blocksize: int  # weights per absmax
    dtype: str  # the float weight's, one of DTYPES
    shape: tuple[int, int]  # [out, in]
    nested_blocksize: int | None = None  # absmax values per nested_absmax
    nested_offset: float = 0.0

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def blocks(self) -> int:
        return math.ceil(self.size / self.blocksize)


def quant_state(weight: str, names: Iterable[str], read: Reader,
                stored_shape: Callable[[str], tuple[int, ...]]) -> QuantState:
    """The 4-bit layer of `weight`'s quant_state, read from its JSON and checked: every
    field there, every side tensor stored, each of the size the state implies."""
    found = [n for n in names if n.startswith(weight + QUANT_STATE)]
    if len(found) != 1:
        raise ExportError(f"the bitsandbytes 4-bit weight {weight!r} has "
                          f"{'no' if not found else len(found)} "
                          f"{weight + QUANT_STATE + '<type>'!r} tensor{'s' * bool(found)} "
                          "beside it; it needs one")
    name = found[0]
    fields = _json(name, read(name))
    state = _state(name, fields)
    if name != weight + QUANT_STATE + state.quant_type:
        raise ExportError(f"{name} says quant_type {state.quant_type!r}")
    nested = weight + ".nested_absmax"
    if state.nested_blocksize is None and _count(stored_shape, nested) is not None:
        raise ExportError(f"{name} has no nested_blocksize and nested_offset, but "
                          f"{nested!r} is stored: they say how to read it")
    expected = {".absmax": state.blocks, ".quant_map": 16}
    if state.nested_blocksize is not None:
        expected |= {".nested_absmax": math.ceil(state.blocks / state.nested_blocksize),
                     ".nested_quant_map": 256}
    for part, count in expected.items():
        stored = _count(stored_shape, weight + part)
        if stored is None:
            raise ExportError(f"the bitsandbytes 4-bit weight {weight!r} has no "
                              f"{weight + part!r} beside it")
        if stored != count:
            raise ExportError(f"{weight + part} holds {stored} values; its quant_state "
                              f"(shape {list(state.shape)}, blocksize {state.blocksize}) "
                              f"implies {count}")
    return state


def check_packed(weight: str, state: QuantState, stored_bytes: int) -> None:
    """The packed codes fill ceil(size / 2) bytes."""
    if stored_bytes != math.ceil(state.size / 2):
        raise ExportError(f"the bitsandbytes 4-bit weight {weight!r} holds {stored_bytes} "
                          f"bytes; its shape {list(state.shape)} packs into "
                          f"{math.ceil(state.size / 2)}")


def dequantize_4bit(packed: np.ndarray, state: QuantState, read: Reader,
                    weight: str) -> np.ndarray:
    """The float32 weight [out, in] of a 4-bit layer: its bytes `packed` (uint8, flat, as
    stored) unpacked high nibble first, each code's value times its block's absmax. Holds
    the codes (a byte a value) and one float32 copy."""
    size = state.size
    codes = np.empty(2 * packed.size, np.uint8)
    codes[0::2] = packed >> 4
    codes[1::2] = packed & 0x0F
    values = np.take(read(weight + ".quant_map").astype(np.float32), codes[:size])
    del codes
    absmax = _absmax(state, read, weight)
    full = size - size % state.blocksize
    blocks = values[:full].reshape(-1, state.blocksize)  # a view: scaled in place
    blocks *= absmax[:full // state.blocksize, None]
    if full < size:
        values[full:] *= absmax[-1]
    return values.reshape(state.shape)


def _absmax(state: QuantState, read: Reader, weight: str) -> np.ndarray:
    """A 4-bit layer's absmax per block, float32: stored, or decoded from its nested codes
    (each code's value times its nested block's absmax, plus the offset)."""
    stored = read(weight + ".absmax")
    if state.nested_blocksize is None:
        return stored.astype(np.float32).reshape(-1)
    values = np.take(read(weight + ".nested_quant_map").astype(np.float32),
                     stored.astype(np.uint8).reshape(-1))
    scales = np.repeat(read(weight + ".nested_absmax").astype(np.float32).reshape(-1),
                       state.nested_blocksize)[:values.size]
    values *= scales
    values += np.float32(state.nested_offset)
    return values


def dequantize_int8(weight: np.ndarray, scb: np.ndarray) -> np.ndarray:
    """The float32 weight [out, in] of an LLM.int8 layer: each int8 row times its SCB, then
    times 1/127 (in place: one float32 copy)."""
    values = weight.astype(np.float32)
    values *= scb.astype(np.float32).reshape(-1, 1)
    values *= INT8_STEP
    return values


def check_int8(weight: str, shape: tuple[int, ...], int8: bool, scb: int | None,
               weight_format: np.ndarray | None) -> None:
    """An LLM.int8 layer's weight is int8 [out, in], one SCB per row, stored row-major."""
    module = weight.removesuffix("weight")
    if scb is None:
        raise ExportError(f"the bitsandbytes 8-bit weight {weight!r} has no {module + 'SCB'!r} "
                          "beside it")
    if not int8 or len(shape) != 2:
        raise ExportError(f"{weight!r} has an SCB beside it (bitsandbytes 8-bit), but is not "
                          "stored as int8 [out, in]")
    if scb != shape[0]:
        raise ExportError(f"{module}SCB holds {scb} values; the int8 weight {weight!r} has "
                          f"{shape[0]} rows")
    layout = None if weight_format is None else int(weight_format.reshape(-1)[0])
    if layout not in (None, ROW_FORMAT):
        raise ExportError(f"{module}weight_format is {layout}: export reads the row-major "
                          "layout (0), which bitsandbytes saves since 0.45")


def _json(name: str, stored: np.ndarray) -> dict[str, Any]:
    try:
        text = np.asarray(stored, np.uint8).tobytes().decode("utf-8")
        fields = json.loads(text)
    except (UnicodeDecodeError, ValueError) as err:
        if isinstance(err, json.JSONDecodeError) and err.msg == "Extra data":
            # transformers 5 splits some fused layers on load (Sarvam-MoE's query_key_value,
            # Lara's in_proj), bitsandbytes quantizes the parts, and the save joins them
            # back, quant states included: no one layer's state, nor loadable by transformers
            raise ExportError(f"{name} holds several quant states one after another: a "
                              "fused layer saved from parts quantized apart, which neither "
                              "export nor transformers reads back; export the float "
                              "checkpoint (or quantize with --quantize)") from None
        raise ExportError(f"{name} is not bitsandbytes' JSON quant state: {err}") from None
    if not isinstance(fields, dict):
        raise ExportError(f"{name} is not bitsandbytes' JSON quant state (an object)")
    return fields


def _state(name: str, fields: dict[str, Any]) -> QuantState:
    def field(key: str) -> Any:
        if key not in fields:
            raise ExportError(f"{name} lacks {key!r}")
        return fields[key]

    quant_type = field("quant_type")
    if quant_type not in QUANT_TYPES:
        raise ExportError(f"{name} has quant_type {quant_type!r}; export reads nf4 and fp4")
    shape = field("shape")
    if not (isinstance(shape, list) and len(shape) == 2 and all(_positive(v) for v in shape)):
        raise ExportError(f"{name} has shape {shape!r}; a Linear weight's is [out, in]")
    nested = "nested_blocksize" in fields or "nested_offset" in fields
    return QuantState(
        quant_type, _block(name, "blocksize", field("blocksize")),
        _dtype(name, "dtype", field("dtype")), (shape[0], shape[1]),
        _block(name, "nested_blocksize", field("nested_blocksize")) if nested else None,
        float(_number(name, field("nested_offset"))) if nested else 0.0)


def _count(stored_shape: Callable[[str], tuple[int, ...]], name: str) -> int | None:
    try:
        return math.prod(stored_shape(name))
    except ExportError:  # not stored
        return None


def _block(name: str, key: str, value: Any) -> int:
    if not _positive(value):
        raise ExportError(f"{name} has {key} {value!r}; it must be a positive integer")
    return int(value)


def _dtype(name: str, key: str, value: Any) -> str:
    if value not in DTYPES:
        raise ExportError(f"{name} has {key} {value!r}; export reads "
                          f"{', '.join(DTYPES)}")
    return str(value)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ExportError(f"{name} has nested_offset {value!r}; it must be a number")
    return float(value)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
