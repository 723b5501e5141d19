"""The native kernels' row functions (tests/kernels_native: decode attention, MatMulInt8,
MatMulBf16, MatMulF32, the RMS norm and SwiGLU rows) against scalar references, with no
ONNX Runtime: built for this CPU, and cross-built for 64-bit Arm (Jetson: NEON, sdot) and
run under qemu-aarch64. The Arm checks skip, with the reason, without the cross compiler or
qemu (Debian: apt install g++-aarch64-linux-gnu qemu-user)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgeprefill.kernels import build
from edgeprefill.kernels.targets import TARGETS, Target, is_arm64
from tests.test_native_kernels import CAPACITY, HEAD_DIM, KV_HEADS, WIDTH, one_layer_model

HARNESS = Path(__file__).parent / "kernels_native"
# The kernel sources the checks link besides their own files (check_int8.cc includes
# matmul_int8.cc for the functions in its unnamed namespace).
KERNEL_SOURCES = ("decode_attention.cc",)
# One line per check: 5 decode attention cases x (cache, output), 2 MatMulInt8, 2 MatMulBf16
# (error, a row alone), 2 x 2 MatMulF32, 2 rows.
CHECKS = 20
ARM_SYSROOT = "/usr/aarch64-linux-gnu"  # the cross toolchain's libraries, for qemu's -L
ARM_PYTHON_ENV = "EDGEPREFILL_ARM_PYTHON"  # an aarch64 Python with numpy and onnxruntime


def headers() -> Path:
    try:
        return build.headers_dir()
    except build.KernelBuildError as err:
        pytest.skip(f"no ONNX Runtime headers: {err}")


def compile_harness(compiler: str, target: Target | None, out: Path) -> Path:
    """The harness built with build.py's flags for `target` (None: this CPU), as an
    executable; --gc-sections drops the ops' ONNX Runtime glue, which nothing here calls."""
    if shutil.which(compiler) is None:
        pytest.skip(f"no {compiler} on PATH")
    flags = [f for f in build.flags(target) if f != "-shared"]
    sources = [*sorted(HARNESS.glob("*.cc")), *(build.source_dir() / n for n in KERNEL_SOURCES)]
    command = [compiler, *flags, f"-I{headers()}", f"-I{build.source_dir()}", *map(str, sources),
               "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections", "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def checked(command: list[str]) -> str:
    """The harness's output, after asserting that each of its checks ran and passed."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "all ok" in done.stdout, done.stdout + done.stderr
    assert sum(line.startswith("ok ") for line in done.stdout.splitlines()) == CHECKS, done.stdout
    return done.stdout


@pytest.mark.slow  # x86's paths have ONNX Runtime's own checks (test_native_kernels.py)
def test_kernel_rows_match_scalar_references_on_this_cpu(tmp_path):
    output = checked([str(compile_harness(build.COMPILER, None, tmp_path / "harness"))])
    assert "neon=0" in output or is_arm64()


@pytest.mark.parametrize("name", ["jetson-orin", pytest.param("aarch64", marks=pytest.mark.slow)])
def test_kernel_rows_match_scalar_references_on_arm_under_qemu(name, tmp_path):
    if shutil.which("qemu-aarch64") is None:
        pytest.skip("no qemu-aarch64 on PATH (Debian: apt install qemu-user)")
    target = TARGETS[name]
    binary = compile_harness(target.chosen_compiler(), target, tmp_path / "harness")
    output = checked(["qemu-aarch64", "-L", ARM_SYSROOT, str(binary)])
    dotprod = int("+dotprod" in target.march)  # MatMulInt8's sdot path, else its portable one
    assert f"neon=1 dotprod={dotprod}" in output


@pytest.mark.slow
def test_the_cross_built_library_runs_in_aarch64_onnx_runtime(tmp_path, monkeypatch):
    """The whole library for Jetson Orin, registered in an aarch64 ONNX Runtime (PyPI's
    wheel under qemu-user, docs/jetson.md), against that runtime's GroupQueryAttention."""
    arm_python = os.environ.get(ARM_PYTHON_ENV)
    if not arm_python:
        pytest.skip(f"{ARM_PYTHON_ENV} names no aarch64 Python with onnxruntime (docs/jetson.md)")
    monkeypatch.setenv(build.HEADERS_ENV, str(headers()))
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path))
    orin = TARGETS["jetson-orin"]
    if shutil.which(orin.chosen_compiler()) is None:
        pytest.skip(f"no {orin.chosen_compiler()} on PATH")
    library = build.build(cross=orin)
    positions = np.array([0, 127, 128, 300, 511, CAPACITY - 1], np.int32)
    rng = np.random.default_rng(1)
    shape = (len(positions), KV_HEADS, CAPACITY, HEAD_DIM)
    np.savez(tmp_path / "feeds.npz", positions=positions,
             qkv=rng.standard_normal((len(positions), 1, WIDTH)).astype(np.float32),
             keys=rng.standard_normal(shape).astype(np.float32) * 2,
             values=rng.standard_normal(shape).astype(np.float32) * 2)
    (tmp_path / "stock.onnx").write_bytes(one_layer_model(False))
    (tmp_path / "native.onnx").write_bytes(one_layer_model(True))
    done = subprocess.run([arm_python, str(HARNESS / "one_layer.py"), str(tmp_path), str(library)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("ok"), done.stdout + done.stderr
