"""Where `EDGEPREFILL_KERNELS=auto` (the default) runs the native kernels: only on a CPU with
AVX-512 or AVX2 + FMA, their vector code. Built for another CPU (Arm, older x86) the library
runs its portable loops, which took 1.6x as long as ONNX Runtime's GroupQueryAttention for a
2,048-token prefill on a Zen 3 before its AVX2 path (docs/benchmarks.md); `require` still
runs them there."""

from __future__ import annotations

import shutil

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
    monkeypatch.setattr(select, "library_damage", lambda path: None)  # taken as whole

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


def test_a_damaged_library_is_never_loaded_and_build_makes_it_again(tmp_path, monkeypatch,
                                                                     tiny_bundle):
    """A library cut short (a full disk, a copy stopped half-way) killed every load with
    SIGBUS, an empty or foreign file raised ONNX Runtime's registration traceback, and the
    build command took either as built: the load now runs the stock graph with one warning,
    and the build makes it again."""
    real = build.library_path()
    if build.library_damage(real) is not None:
        pytest.skip("the native library is not built here")
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path))
    monkeypatch.delenv(select.MODE_ENV, raising=False)
    copy = build.library_path()
    assert copy.parent == tmp_path and copy.name == real.name
    for damaged, said in ((real.read_bytes()[:1000], "cut short (1000 of at least "),
                          (b"", "not a shared library"), (b"garbage " * 20, "no ELF header")):
        copy.write_bytes(damaged)
        assert said in build.library_damage(copy)
        with Engine.load(tiny_bundle, threads=1, background=False, warm_up=False) as engine:
            assert engine.backend.kernels.library is None
            assert "library damaged" in engine.backend.kernels.described
            assert "python -m edgeprefill.kernels.build" in engine.backend.kernels.described
    headers = build.headers_dir()  # the cached headers: no fetch
    monkeypatch.setenv(build.HEADERS_ENV, str(headers))
    compiled = []  # the compiler's run, stood in for by a copy of the real library

    def compile_it(command, **kwargs):
        compiled.append(command[0])
        shutil.copy(real, command[command.index("-o") + 1])

    monkeypatch.setattr(build, "run", compile_it)
    monkeypatch.setattr(build.shutil, "which", lambda name: name)
    assert build.build() == copy and build.library_damage(copy) is None  # made again
    assert compiled == [build.COMPILER]
    assert build.build() == copy and compiled == [build.COMPILER]  # whole: not again
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path / "file" / "kernels"))
    with pytest.raises(build.KernelBuildError, match="cannot write the library into "):
        build.build()
