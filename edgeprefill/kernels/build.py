"""Builds the native kernel library with g++ against ONNX Runtime's C API headers.

    python -m edgeprefill.kernels.build            # build, or say in one line why not
    python -m edgeprefill.kernels.build --if-possible   # the same, exit status 0 either way
    python -m edgeprefill.kernels.build --target jetson-orin  # cross-compile ($CXX or
                                                  # aarch64-linux-gnu-g++), for a check here

Nothing from ONNX Runtime is linked: the library takes the API table ONNX Runtime hands
to `RegisterCustomOps`. The headers come from `EDGEPREFILL_ORT_HEADERS` (a folder holding
`onnxruntime_c_api.h`), else from the npm registry package below, fetched once with
`npm pack` into the cache folder. No header is ever kept in the repository.

The library lands in `EDGEPREFILL_KERNELS_DIR` (default `~/.cache/edgeprefill/kernels`),
named by a digest of its sources and flags, so a changed source never loads a stale build.
It is compiled for this machine's CPU (x86: `-march=native`; 64-bit Arm: the -march its
/proc/cpuinfo Features allow, targets.py): build it where it runs. A cross build (--target)
lands beside it under the target's name and is never loaded here (docs/jetson.md).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from edgeprefill.cache_dir import user_cache_dir
from edgeprefill.errors import EdgeprefillError
from edgeprefill.kernels.targets import TARGETS, Target, native_march_flag

SOURCES = ("library.cc", "decode_attention.cc", "prefill_attention.cc", "swiglu.cc",
           "rms_norm.cc", "matmul_bf16.cc", "matmul_f32.cc", "matmul_int4.cc", "matmul_int8.cc",
           "gated_delta.cc", "mamba2_scan.cc")
# Hashed with the sources, not compiled on their own.
HEADERS = ("kernel_common.h", "decode_rows.h", "soft_cap.h", "swiglu.h", "rms_norm.h",
           "float_vec.h")
# GCC's default -ffp-contract=fast stays: the hot products are explicit FMA intrinsics
# either way, =off would undo ~400 multiply-adds gcc fuses in single-site code, and the
# scalar code that several ops share writes its multiply-adds as std::fma (docs/design.md).
# The -march goes second (flags()): x86's -march=native, Arm's from its Features, a target's.
FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden")
HEADERS_PACKAGE = "com.github.asus4.onnxruntime@0.4.9"  # MIT; ONNX Runtime 1.2x C API headers
HEADERS_IN_PACKAGE = "package/Plugins/Android/onnxruntime.aar"  # a zip with headers/ inside
HEADERS_ENV = "EDGEPREFILL_ORT_HEADERS"
DIR_ENV = "EDGEPREFILL_KERNELS_DIR"
COMPILER = "g++"


class KernelBuildError(EdgeprefillError):
    """The native library cannot be built here (no compiler, no headers, a compile error)."""


def library_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    return user_cache_dir("kernels")


def source_dir() -> Path:
    return Path(__file__).resolve().parent


# The first CPU's lines of /proc/cpuinfo that cpu_identity keeps: x86's model name and flags,
# Arm's Features and part (Arm lists no model name).
IDENTITY_KEYS = ("model name", "flags", "Features", "CPU implementer", "CPU part")


def cpu_identity() -> str:
    """The CPU's model and feature flags: `-march=native` code built on one CPU may stop on
    an illegal instruction on another (a cache folder can outlive a change of machine)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    return identity_lines(text)


def identity_lines(cpuinfo: str) -> str:
    """The first of each IDENTITY_KEYS line of /proc/cpuinfo text, in its order."""
    keep: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key = line.split(":")[0].strip()
        if key in IDENTITY_KEYS:
            keep.setdefault(key, line)
    return "\n".join(keep.values())


def cpu_has_bf16() -> bool:
    """AVX512-BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids and later, which add AMX): in the
    flags the kernel build keys its library on."""
    return "avx512_bf16" in cpu_identity().split()


def builds_avx2(flags: list[str]) -> bool:
    """Whether a CPU with these flags builds the kernels' AVX2 path: kernel_common.h's
    EP_AVX2, AVX2 and FMA without AVX-512 (which takes the AVX-512 code instead)."""
    return "avx2" in flags and "fma" in flags and "avx512f" not in flags


def cpu_has_vector_kernels() -> bool:
    """Whether the fp32 kernels build vector code here: AVX-512, or AVX2 with FMA (Zen 1-3,
    Intel client CPUs since Haswell, Alder Lake and later among them). Elsewhere (Arm, older
    x86) the library builds its portable loops, which run slower than ONNX Runtime's own
    attention (a 2,048-token prefill 1.6x as long on a Zen 3, docs/benchmarks.md); 64-bit
    Arm's NEON decode attention is unmeasured, its prefill portable (docs/jetson.md)."""
    flags = cpu_identity().split()
    return "avx512f" in flags or builds_avx2(flags)


def l1_data_bytes(cpu_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The first CPU's level-1 data cache in bytes, from sysfs (None where it says nothing)."""
    for index in sorted(cpu_dir.glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip()
                                 for name in ("level", "type", "size"))
        except OSError:
            continue
        if level == "1" and kind in ("Data", "Unified") and size[:-1].isdigit():
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1])
            return int(size[:-1]) * scale if scale else None
    return None


def tiling_flags(l1_bytes: int | None) -> tuple[str, ...]:
    """PrefillAttention's blocking for this CPU (prefill_attention.cc says why): its default,
    96 columns x 64 keys, needs ~44 KB of L1 data cache (Intel since Ice Lake: 48 KB); with
    less (AMD Zen 4: 32 KB) 48 columns x 128 keys in 8-row tiles measured 1.3x faster in
    fp32 and 1.1x in bf16 (docs/benchmarks.md). Unknown: the default."""
    if l1_bytes is not None and l1_bytes < 48 << 10:
        return ("-DEP_COLUMNS=48", "-DEP_KEY_BLOCK=128", "-DEP_TILE_ROWS=8")
    return ()


def flags(target: Target | None = None) -> tuple[str, ...]:
    """The compile flags for this machine, or for `target` (its -march; the default tiling,
    as its cache is unknown here)."""
    if target is not None:
        return (FLAGS[0], f"-march={target.march}", *FLAGS[1:])
    march = native_march_flag(cpu_identity())
    return (FLAGS[0], march, *FLAGS[1:]) + tiling_flags(l1_data_bytes())


def digest(target: Target | None = None) -> str:
    h = hashlib.sha256(" ".join(flags(target)).encode())
    h.update(cpu_identity().encode() if target is None else target.name.encode())
    for name in SOURCES + HEADERS:
        h.update((source_dir() / name).read_bytes())
    return h.hexdigest()[:16]


def library_path(target: Target | None = None) -> Path:
    """This machine's library, or a cross build's (named by its target: never loaded here)."""
    if target is None:
        return library_dir() / f"libedgeprefill_kernels-{digest()}.so"
    return library_dir() / f"libedgeprefill_kernels-{target.name}-{digest(target)}.so"


def library_damage(path: Path) -> str | None:
    """Why the library file at `path` cannot be loaded whole, or None: not an ELF file, or
    one cut short (a full disk, a copy stopped half-way). A truncated library mapped by
    dlopen kills the process with SIGBUS on the first page past its end, and an empty one
    fails ONNX Runtime's registration with a traceback: both are found here first, from
    the ELF header's tables (GCC writes the section headers last), without reading more."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(64)
    except OSError as err:
        return f"unreadable: {err.strerror}"
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return "not a shared library (no ELF header)"
    if head[4] != 2 or head[5] != 1:  # not 64-bit little-endian: not ours to judge
        return None
    ph_off, sh_off = (int.from_bytes(head[at:at + 8], "little") for at in (0x20, 0x28))
    ph_size, ph_count, sh_size, sh_count = (
        int.from_bytes(head[at:at + 2], "little") for at in (0x36, 0x38, 0x3A, 0x3C))
    end = max(ph_off + ph_size * ph_count, sh_off + sh_size * sh_count)
    if end > size:
        return f"cut short ({size} of at least {end} bytes)"
    return None


def headers_dir(say: Callable[[str], None] = lambda line: None) -> Path:
    """A folder with onnxruntime_c_api.h: the env var's, else the cached npm package's."""
    given = os.environ.get(HEADERS_ENV)
    if given:
        if not (Path(given) / "onnxruntime_c_api.h").is_file():
            raise KernelBuildError(f"{HEADERS_ENV}={given} holds no onnxruntime_c_api.h")
        return Path(given)
    cached = library_dir() / ("headers-" + HEADERS_PACKAGE.rsplit("@", 1)[1])
    if not (cached / "onnxruntime_c_api.h").is_file():
        say(f"fetching ONNX Runtime's C API headers (npm pack {HEADERS_PACKAGE}) ...")
        fetch_headers(cached)
    return cached


def fetch_headers(target: Path) -> None:
    """`npm pack` the registry package and keep only the aar's headers/ folder."""
    if shutil.which("npm") is None:
        raise KernelBuildError(f"no npm to fetch ONNX Runtime's headers; set {HEADERS_ENV}")
    with tempfile.TemporaryDirectory() as tmp:
        run(["npm", "pack", HEADERS_PACKAGE, "--silent"], cwd=tmp, what="npm pack")
        tarball = next(Path(tmp).glob("*.tgz"))
        shutil.unpack_archive(tarball, tmp)
        staged = Path(tmp) / "headers"
        with zipfile.ZipFile(Path(tmp) / HEADERS_IN_PACKAGE) as aar:
            for member in aar.namelist():
                if member.startswith("headers/") and not member.endswith("/"):
                    aar.extract(member, tmp)
        target.parent.mkdir(parents=True, exist_ok=True)
        mine = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.move(str(staged), mine)
        try:
            os.rename(mine, target)  # atomic; fails if a concurrent build got there first
        except OSError:
            shutil.rmtree(mine, ignore_errors=True)


def run(command: list[str], cwd: str | None = None, what: str = "") -> None:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise KernelBuildError(f"{what or command[0]} failed: {err}") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise KernelBuildError(f"{what or command[0]} failed: {last[0]}")


def build(force: bool = False, say: Callable[[str], None] = lambda line: None,
          cross: Target | None = None) -> Path:
    """The library's path, compiled first if missing (atomically: a half-written file is
    never loaded), for this machine or, `cross`, for that target with its compiler. `say`
    hears what takes time (the command line's progress)."""
    path = library_path(cross)
    if path.is_file() and not force:
        damage = library_damage(path)
        if damage is None:
            return path
        say(f"the native kernels' library is damaged ({damage}): building it again")
    compiler = COMPILER if cross is None else cross.chosen_compiler()
    if shutil.which(compiler) is None:
        raise KernelBuildError(f"no {compiler} on PATH to compile the native kernels")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # before minutes of fetch and build
        headers = headers_dir(say)
        say(f"compiling the native kernels with {compiler} (a minute or so) ...")
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        sources = [str(source_dir() / name) for name in SOURCES]
        try:
            run([compiler, *flags(cross), f"-I{headers}", *sources, "-o", str(partial)],
                what=compiler)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    except OSError as err:  # a cache folder that is a file, read-only, a full disk
        where = err.filename or path.parent
        raise KernelBuildError(f"cannot write the library into {where}: "
                               f"{err.strerror or err}") from None
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgeprefill.kernels.build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--if-possible", action="store_true",
                        help="exit 0 when the library cannot be built (say why)")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    parser.add_argument("--target", choices=sorted(TARGETS),
                        help="cross-compile for this CPU ($CXX, else its cross compiler)")
    args = parser.parse_args(argv)
    cross = TARGETS[args.target] if args.target else None
    try:
        path = build(force=args.force, cross=cross,
                     say=lambda line: print(line, file=sys.stderr, flush=True))
    except KernelBuildError as err:
        print(f"native kernels not built: {err}", file=sys.stderr)
        return 0 if args.if_possible else 1
    print(f"native kernels: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
