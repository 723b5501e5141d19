"""The comparators, by name: one `Runtime` entry each.

A runtime is measured by running `benchmarks/runners/<runner>` in its venv (venvs.py) on
the artifact its exporter made (exporters.py; none: the checkpoint itself). Adding one is
an entry here and a runner file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from comparison import exporters
from comparison.settings import Settings
from comparison.venvs import PROJECT_VENV

Exporter = Callable[["Runtime", Settings, Path, Path], list[str]]


@dataclass(frozen=True)
class Runtime:
    name: str
    venv: str
    runner: str
    quant: str  # fp32, int8 or int4: what the exporter is asked for
    description: str
    export: Exporter | None  # None: the runner loads the checkpoint itself
    block_size: int | None = None  # int4 block; None = the exporter's default (32 for both)
    options: tuple[tuple[str, str], ...] = ()  # runner options (the spec's "options")
    default: bool = True  # in the default --runtimes list

    @property
    def precision(self) -> str:
        """What the row is compared under: the weights' precision and, where it is not the
        default, their int4 block (block 128 is compared with block 128 only)."""
        return self.quant if self.block_size is None else f"{self.quant}-b{self.block_size}"


def is_ours(name: str) -> bool:
    return name.startswith("edgeprefill")


def _edgeprefill(name: str, quant: str, description: str, block: int | None = None,
                 spin: bool = True, compute: str = "fp32") -> Runtime:
    if compute != "fp32":  # same bundle, another arithmetic (engines/ort/bf16_compute.py)
        return Runtime(name, PROJECT_VENV, "run_edgeprefill.py", quant, description,
                       exporters.edgeprefill, options=(("compute", compute),), default=False)
    if not spin:  # the --no-spin rows: threads sleep between ops
        return Runtime(f"{name}-no-spin", PROJECT_VENV, "run_edgeprefill.py", quant,
                       f"{description}, sleeping threads (--no-spin)", exporters.edgeprefill,
                       block, options=(("spin", "off"),), default=False)
    return Runtime(name, PROJECT_VENV, "run_edgeprefill.py", quant, description,
                   exporters.edgeprefill, block, default=block is None)


def _ortgenai(name: str, quant: str, description: str, block: int | None = None) -> Runtime:
    return Runtime(name, "ortgenai", "run_ortgenai.py", quant, description, exporters.ortgenai,
                   block, default=block is None)


def _openvino(name: str, quant: str, description: str, hint: str | None = None) -> Runtime:
    options = (("precision_hint", hint),) if hint else ()
    return Runtime(name, "openvino", "run_openvino.py", quant, description, exporters.openvino,
                   options=options, default=False)


def _llamacpp(name: str, quant: str, description: str, f32_attention: bool = False) -> Runtime:
    """Not in the default list: its venv compiles llama.cpp (about 20 minutes on 2 cores).
    f32_attention: flash attention off and an f32 KV cache (llama.cpp's defaults, flash on and
    an f16 cache, compute attention in f16)."""
    options = (("flash_attn", "off"), ("kv_type", "f32")) if f32_attention else ()
    return Runtime(name, "llamacpp", "run_llamacpp.py", quant, description, exporters.llamacpp,
                   options=options, default=False)


RUNTIMES: dict[str, Runtime] = {
    runtime.name: runtime
    for runtime in [
        _edgeprefill("edgeprefill", "fp32", "edgeprefill bundle"),
        _edgeprefill("edgeprefill-int8", "int8",
                     "edgeprefill bundle, --quantize int8 (int8 weights and activations)"),
        _edgeprefill("edgeprefill-int4", "int4",
                     "edgeprefill bundle, --quantize int4 (MatMulNBits, block 32)"),
        *(_edgeprefill(name, quant, "edgeprefill bundle", spin=False)
          for name, quant in (("edgeprefill", "fp32"), ("edgeprefill-int8", "int8"),
                              ("edgeprefill-int4", "int4"))),
        _edgeprefill("edgeprefill-bf16", "fp32",
                     "edgeprefill bundle (fp32), --compute bf16: projections and prefill "
                     "attention in bf16 (native kernels; fast with AVX512-BF16)", compute="bf16"),
        _edgeprefill("edgeprefill-int8-bf16", "int8",
                     "edgeprefill bundle, --quantize int8, --compute bf16 (prefill attention "
                     "in bf16)", compute="bf16"),
        _edgeprefill("edgeprefill-int4-bf16", "int4",
                     "edgeprefill bundle, --quantize int4, --compute bf16 (prefill attention "
                     "in bf16)", compute="bf16"),
        _edgeprefill("edgeprefill-int4-b128", "int4",
                     "edgeprefill bundle, --quantize int4 --block-size 128", 128),
        _ortgenai("ortgenai", "fp32", "ONNX Runtime GenAI fp32"),
        _ortgenai("ortgenai-int4", "int4", "ONNX Runtime GenAI int4"),
        _ortgenai("ortgenai-int4-b128", "int4", "ONNX Runtime GenAI int4, block_size=128", 128),
        _openvino("openvino", "fp32", "OpenVINO GenAI LLMPipeline, fp32 weights, the CPU "
                  "plugin's default precision (bf16 where the CPU has it)"),
        _openvino("openvino-f32", "fp32", "OpenVINO GenAI, fp32 weights, f32 inference", "f32"),
        _openvino("openvino-int8", "int8", "OpenVINO GenAI, int8 weight compression"),
        _openvino("openvino-int4", "int4", "OpenVINO GenAI, int4 weights, group size 32"),
        _llamacpp("llamacpp", "fp32", "llama.cpp (llama-cpp-python), F32 GGUF, llama.cpp's "
                  "defaults (flash attention on, f16 KV cache)"),
        _llamacpp("llamacpp-f32", "fp32", "llama.cpp, F32 GGUF, flash attention off, f32 KV "
                  "cache", f32_attention=True),
        _llamacpp("llamacpp-q8_0", "int8", "llama.cpp (llama-cpp-python), Q8_0 GGUF"),
        _llamacpp("llamacpp-q4_0", "int4", "llama.cpp (llama-cpp-python), Q4_0 GGUF (block 32)"),
        Runtime("optimum", "optimum", "run_optimum.py", "fp32", "optimum ORTModelForCausalLM",
                exporters.optimum),
        Runtime("torch", "torch", "run_torch.py", "fp32", "transformers + PyTorch eager", None),
    ]
}
