"""The export command of each exporter family: checkpoint folder in, the runtime's model out.

An exporter is `(runtime, settings, hf_dir, out) -> argv`, run in the runtime's venv.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from comparison.models import max_context
from comparison.settings import RUNNERS_DIR, Settings
from comparison.venvs import venv_python

if TYPE_CHECKING:
    from comparison.registry import Runtime


def genai_block_option(runtime: Runtime) -> list[str]:
    if runtime.block_size is None:
        return []
    return ["--extra_options", f"block_size={runtime.block_size}"]


def ortgenai(runtime: Runtime, settings: Settings, hf_dir: Path, out: Path) -> list[str]:
    python = str(venv_python(runtime.venv, settings))
    cache = out.parent / "genai-cache"
    return [
        python, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out),
        "-p", runtime.quant, "-e", "cpu", "-c", str(cache), *genai_block_option(runtime),
    ]


def optimum(runtime: Runtime, settings: Settings, hf_dir: Path, out: Path) -> list[str]:
    cli = str(venv_python(runtime.venv, settings).parent / "optimum-cli")
    return [cli, "export", "onnx", "--model", str(hf_dir), "--task",
            "text-generation-with-past", str(out)]


def edgeprefill(runtime: Runtime, settings: Settings, hf_dir: Path, out: Path) -> list[str]:
    cli = str(venv_python(runtime.venv, settings).parent / "edgeprefill")
    quantize = [] if runtime.quant == "fp32" else ["--quantize", runtime.quant]
    if runtime.block_size:
        quantize += ["--block-size", str(runtime.block_size)]
    return [
        cli, "export", str(hf_dir), "-o", str(out), "--chunks", settings.chunks,
        "--max-context", str(max_context(settings)), *quantize, "--overwrite",
    ]


def openvino(runtime: Runtime, settings: Settings, hf_dir: Path, out: Path) -> list[str]:
    """optimum-intel's OpenVINO export; int4 at group size 32 (a 576-wide layer has no
    128-wide groups) over every layer (ratio 1)."""
    cli = str(venv_python(runtime.venv, settings).parent / "optimum-cli")
    weights = {"fp32": ["--weight-format", "fp32"], "int8": ["--weight-format", "int8"],
               "int4": ["--weight-format", "int4", "--group-size", "32", "--ratio", "1.0"]}
    return [cli, "export", "openvino", "--model", str(hf_dir), "--task",
            "text-generation-with-past", *weights[runtime.quant], str(out)]


def llamacpp(runtime: Runtime, settings: Settings, hf_dir: Path, out: Path) -> list[str]:
    """llama.cpp's convert_hf_to_gguf.py to F32, then its quantizer to Q8_0 or Q4_0
    (runners/export_gguf.py; the converter comes from the llama-cpp-python sdist)."""
    python = str(venv_python(runtime.venv, settings))
    gguf_type = {"fp32": "f32", "int8": "q8_0", "int4": "q4_0"}[runtime.quant]
    source_cache = settings.work_dir / "venvs" / "llamacpp-src"
    return [python, str(RUNNERS_DIR / "export_gguf.py"), str(hf_dir), str(out), gguf_type,
            str(settings.threads), str(source_cache)]
