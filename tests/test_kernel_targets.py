"""Which -march the native kernels are built with: x86's -march=native, 64-bit Arm's from
/proc/cpuinfo's Features (Jetson Orin: armv8.2-a+dotprod+fp16), and --target cross builds."""

from __future__ import annotations

import pytest

from edgeprefill.kernels import build, targets

# /proc/cpuinfo's first CPU on a Jetson AGX Orin (Cortex-A78AE) and on a Raspberry Pi 3
# (Cortex-A53, Armv8.0: no dot products, no half precision arithmetic).
ORIN_FEATURES = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
                 "asimdrdm lrcpc dcpop asimddp uscat ilrcpc flagm paca pacg")
ORIN = f"""processor\t: 0
BogoMIPS\t: 62.50
Features\t: {ORIN_FEATURES}
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd42
CPU revision\t: 1

processor\t: 1
Features\t: fp asimd
"""
PI3_FEATURES = {"fp", "asimd", "evtstrm", "crc32", "cpuid"}


def test_orin_features_choose_armv82_with_dot_products_and_half_precision():
    assert targets.arm_march(targets.arm_features(ORIN)) == "armv8.2-a+dotprod+fp16"
    assert targets.arm_march(PI3_FEATURES) == "armv8-a"
    # dot products without every v8.2 marker: the extension on the v8.0 base, never v8.2's
    assert targets.arm_march(PI3_FEATURES | {"asimddp"}) == "armv8-a+dotprod"


def test_arm_build_flags_and_identity_come_from_the_features(monkeypatch):
    monkeypatch.setattr(targets, "is_arm64", lambda: True)
    monkeypatch.setattr(build, "cpu_identity", lambda: build.identity_lines(ORIN))
    assert build.flags()[1] == "-march=armv8.2-a+dotprod+fp16"
    # the library's digest keys on the first CPU's Features and part (Arm has no model name)
    assert build.identity_lines(ORIN).splitlines() == [
        f"Features\t: {ORIN_FEATURES}", "CPU implementer\t: 0x41", "CPU part\t: 0xd42"]


def test_x86_identity_and_flags_are_unchanged():
    text = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\nmodel name\t: B\n"
    assert build.identity_lines(text) == "model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma"
    if not targets.is_arm64():
        assert build.flags()[:2] == ("-O3", "-march=native")


def test_a_cross_build_names_its_target_and_says_when_its_compiler_is_missing(
        monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-g++")
    orin = targets.TARGETS["jetson-orin"]
    assert build.flags(orin)[:2] == ("-O3", "-march=armv8.2-a+dotprod+fp16")
    assert build.library_path(orin).name.startswith("libedgeprefill_kernels-jetson-orin-")
    assert build.library_path(orin) != build.library_path()  # never loaded here
    assert build.main(["--target", "jetson-orin"]) == 1
    assert capsys.readouterr().err.strip() == (
        "native kernels not built: no no-such-g++ on PATH to compile the native kernels")


@pytest.mark.slow
def test_the_whole_library_cross_builds_for_jetson_orin(monkeypatch, tmp_path):
    orin = targets.TARGETS["jetson-orin"]
    if build.shutil.which(orin.chosen_compiler()) is None:
        pytest.skip(f"no {orin.chosen_compiler()} (Debian: apt install g++-aarch64-linux-gnu)")
    try:
        headers = build.headers_dir()
    except build.KernelBuildError as err:
        pytest.skip(f"no ONNX Runtime headers: {err}")
    monkeypatch.setenv(build.HEADERS_ENV, str(headers))
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path))
    path = build.build(cross=orin)
    assert path.read_bytes()[:4] == b"\x7fELF" and path.read_bytes()[18] == 183  # EM_AARCH64
