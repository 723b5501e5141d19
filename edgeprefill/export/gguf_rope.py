"""A GGUF file's Llama 3.1+ rope scaling (llama.cpp's `rope_freqs.weight`) -> the llama3
rope parameters transformers computes with, written into the staging config.json.

llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors) writes a
config's `rope_type: llama3` scaling as one factor per frequency, which llama.cpp divides
the frequency by. With x = L / wavelength (L: the converter's original context, 8192
unless config.json names one at its top level; lo, hi: low_freq_factor, high_freq_factor):
1 where x > hi, `factor` where x < lo, and 1 / ((1 - s) / factor + s) between, s = (x - lo)
/ (hi - lo). The file keeps no other trace of it (no rope.scaling metadata), and
transformers' GGUF reader skips the tensor, so its model of the file computes unscaled rope.

The factors pin `factor` (the largest) and, through the smoothed band, s as a line in x;
L, lo and hi enter only as lo / L and hi / L, so L is taken as the converter takes it (the
file's rope.scaling.original_context_length if it has one, else 8192) and lo, hi solved.
The parameters are kept only where transformers' llama3 rope of them reproduces the
tensor's frequencies (float32 tolerance); other factors are refused in one line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.rope import RopeConfig

TENSOR = "rope_freqs.weight"
CONVERTER_CONTEXT = 8192  # LlamaModel.generate_extra_tensors' original context default
RTOL = 1e-5  # float32 factors against frequencies recomputed in float32
NOT_LLAMA3 = "they are no llama3 rope scaling (Llama 3.1+'s), the one kind read from them"


@dataclass(frozen=True)
class Llama3Rope:
    """transformers' llama3 rope parameters (rope_parameters of a LlamaConfig)."""

    theta: float
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def as_params(self) -> dict[str, Any]:
        return {"rope_type": "llama3", "rope_theta": self.theta, "factor": self.factor,
                "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """[head_dim / 2] float32, as transformers' _compute_llama3_parameters."""
        return RopeConfig(theta=self.theta, kind="llama3", rotary_dim=head_dim,
                          factor=self.factor, low_freq_factor=self.low_freq_factor,
                          high_freq_factor=self.high_freq_factor,
                          original_max_positions=self.original_max_position_embeddings
                          ).inv_freq()


def write_rope_scaling(reader: Any, file: str, config_file: Path) -> None:
    """Write the rope_freqs of the file `reader` (a gguf.GGUFReader) opened, if it has
    them, as llama3 rope_parameters into `config_file` (transformers' config of the
    file, which lacks them); `file` names it in messages."""
    from gguf import dequantize

    tensor = next((t for t in reader.tensors if t.name == TENSOR), None)
    if tensor is None:
        return
    arch = field(reader, "general.architecture")
    scaling = field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):  # llama.cpp would apply both; transformers neither
        raise _refusal(file, f"{arch}.rope.scaling.type {scaling!r} scales "
                                       "the rope on top of them")
    original = field(reader, f"{arch}.rope.scaling.original_context_length")
    config = json.loads(config_file.read_text())
    params = config.get("rope_parameters") or {}
    if params.get("rope_type", "default") != "default":
        raise _refusal(file, f"transformers read a {params['rope_type']} rope "
                                       "from the file besides them")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope = llama3_rope(dequantize(tensor.data, tensor.tensor_type), theta, head_dim,
                       int(original or CONVERTER_CONTEXT), file)
    if rope is not None:
        config["rope_parameters"] = rope.as_params()
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def field(reader: Any, key: str) -> Any:
    """A scalar metadata value of the file (a string decoded); None where it has none."""
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    return bytes(value).decode() if field.types[0] == GGUFValueType.STRING else value[0].item()


def llama3_rope(factors: np.ndarray, theta: float, head_dim: int, original: int,
                file: str) -> Llama3Rope | None:
    """The llama3 rope whose frequencies are the default rope's divided by `factors`; None
    where every factor is 1 (no scaling). ExportError naming the tensor where no llama3
    rope reproduces them."""
    factors = np.asarray(factors, np.float64)
    if factors.shape != (head_dim // 2,):
        raise _refusal(file, f"{factors.size} factors for a head of {head_dim} (needs "
                             f"{head_dim // 2})")
    if np.all(factors == 1):
        return None
    default = RopeConfig(theta=theta, rotary_dim=head_dim).inv_freq()
    # x = L / wavelength, from float32 frequencies as the converter and transformers take it
    x = original * default.astype(np.float64) / (2 * math.pi)
    factor = float(factors.max())
    bands = _band_bounds(x, factors, factor) if 1 < factor < math.inf else None
    if bands is None:
        raise _refusal(file, NOT_LLAMA3)
    expected = (default / factors).astype(np.float32)
    for lo, hi, scale in (_tidy(*bands, factor), (*bands, factor)):
        rope = Llama3Rope(theta, scale, lo, hi, original)
        if np.allclose(rope.inv_freq(head_dim), expected, rtol=RTOL, atol=0):
            return rope
    raise _refusal(file, NOT_LLAMA3)


def _band_bounds(x: np.ndarray, factors: np.ndarray,
                  factor: float) -> tuple[float, float] | None:
    """(lo, hi) that put each frequency in the band its factor says: the smoothed ones
    fitted (s, from the factor, is a line in x), the bounds otherwise anywhere between
    the neighbouring bands. None where they do not fit 0 < lo < hi."""
    high, low = factors == 1, factors == factor
    medium = ~high & ~low
    above = float(x[high].min()) if high.any() else math.inf  # the least x left unscaled
    below = float(x[low].max()) if low.any() else 0.0  # the largest x fully scaled
    s = (1 / factors[medium] - 1 / factor) / (1 - 1 / factor)
    if medium.sum() >= 2:
        slope, offset = np.polyfit(x[medium], s, 1)  # s = slope * x + offset
        lo, hi = -offset / slope, (1 - offset) / slope
    elif medium.sum() == 1:  # one point of the line: any lo under it that keeps hi in range
        xm, sm = float(x[medium][0]), float(s[0])
        width = min(xm - below, (above - xm) * sm / (1 - sm) if sm < 1 else math.inf) / 2
        lo = xm - width
        hi = lo + width / sm
    elif math.isinf(above):  # all scaled by factor: bounds past every frequency
        lo, hi = 2 * below, 4 * below
    else:
        lo, hi = below + (above - below) / 3, below + 2 * (above - below) / 3
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < hi):
        return None
    return float(lo), float(hi)


def _tidy(lo: float, hi: float, factor: float) -> tuple[float, float, float]:
    """The values rounded to 6 significant digits, as a config.json writes them (1, 4, 32
    for Llama 3.2), kept where they reproduce the factors too."""
    return float(f"{lo:.6g}"), float(f"{hi:.6g}"), float(f"{factor:.6g}")


def _refusal(file: str, why: str) -> ExportError:
    return ExportError(f"{file}: its {TENSOR} (llama.cpp's per-frequency rope factors) "
                       f"cannot be exported: {why}")
