"""Where `EDGEPREFILL_KERNELS=auto` (the default) runs the native kernels: only on a CPU with
AVX-512 or AVX2 + FMA, their vector code. Built for another CPU (Arm, older x86) the library
runs its portable loops, which took 1.6x as long as ONNX Runtime's GroupQueryAttention for a
2,048-token prefill on a Zen 3 before its AVX2 path (docs/benchmarks.md); `require` still
runs them there."""

from __future__ import annotations

import pytest

from edgeprefill.kernels import build, select
from edgeprefill.sdk import Engine


@pytest.fixture
def cpu(monkeypatch, tmp_path):
    """Sets the CPU's identity (/proc/cpuinfo's model name and flags lines, or what a
    machine without them gives) and a built library for it."""
    built = tmp_path / "libedgeprefill_kernels.so"
    built.write_bytes(b"")
    monkeypatch.setattr(select, "library_path", lambda: built)

    def set_cpu(identity: str) -> None:
        monkeypatch.setattr(build, "cpu_identity", lambda: identity)
    return set_cpu


AVX = "model name\t: Intel(R) Core(TM) i7-2600\nflags\t\t: fpu sse4_2 avx"  # Sandy Bridge
AVX2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx fma avx2 bmi2"  # Zen 3
AVX512 = AVX2 + " avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16"  # Zen 4


@pytest.mark.parametrize("identity", [AVX, "aarch64"])
def test_auto_keeps_the_stock_graph_without_vector_code(cpu, monkeypatch, identity):
    cpu(identity)
    monkeypatch.setenv(select.MODE_ENV, "auto")
    reason = select.why_not("ort", "float32", "cpu")
    assert reason == ("this CPU has neither AVX-512 nor AVX2 with FMA: the kernels' portable "
                      "loops are slower here than ONNX Runtime's; EDGEPREFILL_KERNELS=require "
                      "runs them")
    assert select.describe("ort", "float32") == f"{select.STOCK} ({reason})"
    monkeypatch.setenv(select.MODE_ENV, "require")
    assert select.why_not("ort", "float32", "cpu") is None


@pytest.mark.parametrize("identity", [AVX512, AVX2])
def test_auto_runs_them_with_avx512_or_avx2(cpu, monkeypatch, identity):
    cpu(identity)
    monkeypatch.setenv(select.MODE_ENV, "auto")
    assert select.why_not("ort", "float32", "cpu") is None
    assert select.describe("ort", "float32") == select.NATIVE


def test_a_load_on_a_cpu_without_vector_code_runs_the_stock_graph(tiny_bundle, monkeypatch):
    """The whole load: no kernel op in the session, its stats say why."""
    monkeypatch.setattr(select, "cpu_has_vector_kernels", lambda: False)
    monkeypatch.delenv(select.MODE_ENV, raising=False)
    engine = Engine.load(tiny_bundle, threads=1, background=False, warm_up=False)
    assert engine.backend.kernels.library is None
    assert "this CPU has neither AVX-512 nor AVX2" in engine.backend.kernels.described
    engine.close()


def test_inspect_says_what_runs_without_the_kernels(tiny_bundle, monkeypatch):
    """Its kernels, compute and steps lines on a CPU without vector code under `auto`."""
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    monkeypatch.setattr(select, "cpu_has_vector_kernels", lambda: False)
    monkeypatch.delenv(select.MODE_ENV, raising=False)
    lines = CliRunner().invoke(cli, ["inspect", str(tiny_bundle)]).output.splitlines()
    shown = {line[:12].strip(): line[12:] for line in lines if line[:12].strip()}
    assert shown["kernels"].startswith(f"{select.STOCK} (this CPU has neither AVX-512 nor AVX2")
    assert shown["compute"] == ("fp32 (exact, the default: the projections on ONNX Runtime's "
                                "MatMul (no native kernels)); --compute bf16 needs the native "
                                "kernels, which do not run here")
    assert shown["steps"] == ("a prefill chunk and the decode rows in two calls (the stock "
                              "GroupQueryAttention takes one row per call with a past; one "
                              "call with the native kernels)")
