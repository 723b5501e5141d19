"""One virtualenv per comparator under benchmarks/work/venvs, made on first use."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from comparison.procs import run_logged, subprocess_env
from comparison.settings import Settings, StepError, say

# A bare `torch` requirement pulls GBs of CUDA wheels; torch==2.13.0 resolves to a local CPU
# wheel. It is installed first, then repeated in every later install so nothing replaces it.
TORCH_PIN = "torch==2.13.0"
VENV_PACKAGES: dict[str, list[str]] = {
    # Builds the checkpoint and runs the transformers baseline.
    "torch": [TORCH_PIN, "transformers>=5,<6", "tokenizers", "safetensors", "numpy"],
    # The GenAI model builder imports torch, transformers 5.x, onnx and onnx_ir.
    "ortgenai": [TORCH_PIN, "onnxruntime-genai", "onnx", "onnx-ir", "transformers>=5,<6", "numpy"],
    # optimum-onnx pins transformers < 4.58, hence its own venv. accelerate lets its exporter
    # deduplicate the tied embedding / LM head, as a user following its docs would get.
    "optimum": [TORCH_PIN, "optimum-onnx[onnxruntime]", "accelerate"],
    "ceilings": ["numpy", "onnx", "onnxruntime"],
    # OpenVINO GenAI and the optimum-intel exporter; pip pins matching openvino releases.
    "openvino": [TORCH_PIN, "openvino-genai", "optimum-intel[openvino]", "numpy"],
    # llama.cpp through its Python binding, compiled from PyPI's sdist (VENV_ENV). The GGUF
    # converter (from the same sdist, runners/export_gguf.py) needs torch, transformers and
    # gguf-py's dependencies.
    "llamacpp": [TORCH_PIN, "transformers>=5,<6", "llama-cpp-python", "numpy", "safetensors",
                 "pyyaml", "tqdm", "requests"],
}
# Environment for pip, per venv. llama-cpp-python has no Linux wheel on PyPI: pip compiles the
# vendored llama.cpp, here for this CPU only (GGML_NATIVE: AVX-512/VNNI where present), with no
# BLAS or GPU backend, on two jobs (the machine is shared).
LLAMACPP_CMAKE_ARGS = "-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF " \
    "-DGGML_METAL=OFF -DLLAMA_CURL=OFF"
VENV_ENV: dict[str, dict[str, str]] = {
    "llamacpp": {"CMAKE_ARGS": LLAMACPP_CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": "2",
                 "FORCE_CMAKE": "1", "PIP_NO_BINARY": "llama-cpp-python"},
}
# Pulled in but broken next to the pinned CPU torch (torchvision's PyPI wheel registers no
# ops against torch 2.13.0+cpu, and transformers then fails to import): removed after install.
VENV_REMOVE: dict[str, list[str]] = {"openvino": ["torchvision"]}
INSTALL_TIMEOUT_S = 1800  # a venv's pip install; --timeout raises it
PROJECT_VENV = "project"  # edgeprefill runs from the project's own venv, never a copy


def venv_python(venv: str, settings: Settings) -> Path:
    if venv == PROJECT_VENV:
        return settings.project_python
    return settings.work_dir / "venvs" / venv / "bin" / "python"


def ensure_venv(venv: str, settings: Settings) -> Path:
    """Create benchmarks/work/venvs/<venv> on first use; a marker records what was installed."""
    python = venv_python(venv, settings)
    if venv == PROJECT_VENV:
        if not python.exists():
            raise StepError(f"project venv python not found: {python}")
        return python
    venv_dir = python.parent.parent
    packages = VENV_PACKAGES[venv]
    marker = venv_dir / "benchmark-installed.json"
    if marker.exists() and json.loads(marker.read_text()) == packages:
        return python
    say(f"  setting up venv {venv_dir} (first use; this takes a few minutes)")
    log_path = settings.work_dir / "venvs" / f"{venv}.install.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = subprocess_env(settings.threads, python)
    env.pop("HF_HUB_OFFLINE")
    env.update(VENV_ENV.get(venv, {}))
    if not python.exists():
        run_logged([sys.executable, "-m", "venv", str(venv_dir)], log_path, env, 600, False)
    pip = [str(python), "-m", "pip", "install", "--progress-bar", "off"]
    if TORCH_PIN in packages:
        run_logged(pip + [TORCH_PIN], log_path, env, INSTALL_TIMEOUT_S, settings.verbose)
    # llama.cpp's compile took 20 minutes on a quiet 2-core machine and over 30 on a busy one.
    run_logged(pip + packages, log_path, env, max(INSTALL_TIMEOUT_S, settings.timeout_s),
               settings.verbose)
    if VENV_REMOVE.get(venv):
        remove = [str(python), "-m", "pip", "uninstall", "-y", *VENV_REMOVE[venv]]
        run_logged(remove, log_path, env, 600, settings.verbose)
    marker.write_text(json.dumps(packages))
    return python



