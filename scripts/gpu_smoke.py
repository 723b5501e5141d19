#!/usr/bin/env python3
"""Smoke test of edgeprefill's GPU paths on the first GPU it meets.

    python scripts/gpu_smoke.py [--keep DIR] [--max-batch 2]

It exports the shipped tiny model (models/tiny-recall) as `standard` bundles and proves,
part by part, one line each (`ok`, `SKIP` with the reason, or `FAIL` with the reason):

  versions      Python, ONNX Runtime and its providers, TensorRT (>= 10.15), cuda-python
                (its major against the driver's CUDA and TensorRT's), the GPU
  parse         TensorRT's ONNX parser makes exactly 2 x layers KV-cache update layers
  build         the fp32 engine: one profile per bucket plus decode, every present KV
                output aliasing its past input
  in-place      one prefill changes only its slot's positions, through the bound addresses
  logits        TensorRT against the CPU backend: a padded multi-piece prefill, a nearly
                full slot, decode with more rows than the max batch, prefix copy and slot
                swap, alternating profiles
  fp16          an fp16 bundle's fp16 engine against the CPU; a float32 bundle at fp16 refused
  odd-capacity  an odd --capacity is rounded so every KV slot is 256-byte aligned, and runs
  ort-cuda      ONNX Runtime's CUDA provider with the device KV arena: the standard flavour
                at fp32 and fp16, the ort flavour at fp16 (fp32 is refused), an int4
                bundle at fp16 (against its float32 twin) and an int8 one (against itself
                on the CPU), where nodes ran

Without a GPU (or TensorRT, or onnxruntime-gpu) the parts that need it print `SKIP` and the
script exits 0; it exits 1 when a part fails. docs/jetson.md says what each failure means.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgeprefill.engines.base import Backend, BackendOptions, StepBatch  # noqa: E402
from edgeprefill.errors import EdgeprefillError  # noqa: E402

if TYPE_CHECKING:
    from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
    from edgeprefill.engines.trt.backend import TensorRTBackend

TINY_MODEL = ROOT / "models" / "tiny-recall"
CHUNKS = (16, 64)  # buckets of the smoke bundles
MAX_CONTEXT = 256
ODD_CAPACITY = 201
PARTS = ("versions", "parse", "build", "in-place", "logits", "fp16", "odd-capacity", "ort-cuda")
TRT_PARTS = PARTS[1:7]
# Largest |logit difference| against the CPU backend, relative to the logits' magnitude.
TOLERANCE = {"fp32": 2e-3, "fp16": 3e-2}


# ---- what this machine has


class Env(NamedTuple):
    versions: str  # one line
    trt: Any  # the tensorrt module when the TensorRT path can run here
    trt_missing: str  # why it cannot, else ""
    ort_cuda_missing: str  # why ONNX Runtime's CUDA provider cannot run here, else ""


def probe() -> Env:
    import onnxruntime as ort

    providers = [p.removesuffix("ExecutionProvider") for p in ort.get_available_providers()]
    parts = [f"Python {platform.python_version()}",
             f"onnxruntime {ort.__version__} ({', '.join(providers)})"]
    gpu, gpu_missing = gpu_name()
    parts.append(f"GPU {gpu}" if gpu else "no GPU")
    trt, trt_missing = None, ""
    try:
        from edgeprefill.engines.gpu_libs import require_tensorrt
        from edgeprefill.engines.trt.cuda import CudaDevice

        trt = require_tensorrt()
        parts.append(f"TensorRT {trt.__version__}")
        device = CudaDevice()  # checks cuda-python's major against the driver and TensorRT
        device.close()
        parts.append(f"cuda-python {cuda_python_version()}")
    except EdgeprefillError as err:
        trt, trt_missing = None, str(err)
    if gpu_missing:
        trt_missing = trt_missing or gpu_missing
        trt = None
    ort_missing = gpu_missing
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        ort_missing = "this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return Env("; ".join(parts), trt, trt_missing, ort_missing)


def gpu_name() -> tuple[str, str]:
    """(the GPU's name, "") or ("", why there is none)."""
    try:
        from edgeprefill.engines.gpu_libs import require_cudart

        rt = require_cudart()
        err, count = rt.cudaGetDeviceCount()
        if err == rt.cudaError_t.cudaSuccess and count > 0:
            err, props = rt.cudaGetDeviceProperties(0)
            name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
            return f"{name.rstrip(chr(0)).strip()} (sm {props.major}.{props.minor})", ""
        return "", "no CUDA device is visible (cudaGetDeviceCount)"
    except EdgeprefillError:
        pass
    if any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/nvhost-ctrl-gpu")):
        return "present (name unknown without cuda-python)", ""
    return "", "no NVIDIA GPU on this machine"


def cuda_python_version() -> str:
    from importlib import metadata

    for name in ("cuda-bindings", "cuda-python"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


# ---- reporting


class Report:
    def __init__(self) -> None:
        self.failed = 0

    def line(self, status: str, part: str, text: str) -> None:
        print(f"{status:<5} {part}: {' '.join(text.split())}", flush=True)
        self.failed += status == "FAIL"

    def run(self, part: str, body: Callable[[], str]) -> None:
        try:
            self.line("ok", part, body())
        except (EdgeprefillError, AssertionError) as err:
            self.line("FAIL", part, str(err) or type(err).__name__)
        except Exception as err:  # noqa: BLE001 - report every part, then the traceback
            self.line("FAIL", part, f"{type(err).__name__}: {err}")
            traceback.print_exc(file=sys.stderr)


# ---- the scenarios: one backend against another, step by step


class Scenario(NamedTuple):
    name: str
    run: Callable[[Backend], list[np.ndarray]]  # the logits of each step


def prefill(backend: Backend, tokens: np.ndarray, past: int, slot: int) -> np.ndarray:
    step = StepBatch(tokens[None].astype(np.int64), np.array([past], np.int32),
                     np.array([len(tokens)], np.int32), slot)
    return backend.run(step).copy()


def decode(backend: Backend, tokens: list[int], pasts: list[int], first_slot: int) -> np.ndarray:
    step = StepBatch(np.array(tokens, np.int64)[:, None], np.array(pasts, np.int32),
                     np.ones(len(tokens), np.int32), first_slot)
    return backend.run(step).copy()


def scenarios(capacity: int, max_batch: int, vocab: int, buckets: tuple[int, ...]
              ) -> list[Scenario]:
    """The step sequences the TensorRT backend plans differently from the CPU: each must
    give the same logits. `buckets` are the bundle's prefill chunk sizes."""
    rng = np.random.default_rng(0)

    def ids(n: int) -> np.ndarray:
        return rng.integers(3, vocab, size=n)

    big = max(b for b in buckets if b < capacity)
    multi, near, rows = ids(big + 6), ids(capacity - 5), max_batch + 1
    firsts = [ids(5) for _ in range(rows)]
    tail, copy_a, copy_b = ids(4), ids(30), ids(12)
    alt = [ids(10), ids(40), ids(1)]

    def padded_multi_piece(b: Backend) -> list[np.ndarray]:
        return [prefill(b, multi, 0, 0), decode(b, [7], [len(multi)], 0)]

    def nearly_full(b: Backend) -> list[np.ndarray]:
        return [prefill(b, near, 0, 1), prefill(b, tail, capacity - 5, 1),
                decode(b, [9], [capacity - 1], 1)]

    def wide_decode(b: Backend) -> list[np.ndarray]:
        out = [prefill(b, firsts[slot], 0, slot) for slot in range(rows)]
        return out + [decode(b, list(range(5, 5 + rows)), [5] * rows, 0)]

    def copy_and_swap(b: Backend) -> list[np.ndarray]:
        out = [prefill(b, copy_a, 0, 0), prefill(b, copy_b, 0, 1)]
        b.copy_kv(0, 2, 16)
        b.swap_kv(0, 1, 30)
        return out + [decode(b, [5, 6, 7], [12, 30, 16], 0)]

    def alternating(b: Backend) -> list[np.ndarray]:
        out, past = [], 0
        for piece in alt:
            out.append(prefill(b, piece, past, 0))
            past += len(piece)
            out.append(decode(b, [11], [past], 0))
            past += 1
        return out

    return [
        Scenario(f"padded {len(multi)}-token prefill", padded_multi_piece),
        Scenario(f"nearly full slot ({capacity - 5}+4 of {capacity})", nearly_full),
        Scenario(f"decode of {rows} rows (max batch {max_batch})", wide_decode),
        Scenario("prefix copy and slot swap", copy_and_swap),
        Scenario("alternating profiles", alternating),
    ]


def compare(
    backend: Backend, reference: Backend, capacity: int, max_batch: int, tolerance: float,
) -> str:
    """Every scenario on both backends (fresh KV each); AssertionError naming the first that
    differs by more than `tolerance`; else a summary line."""
    vocab = backend.manifest.model.vocab_size
    buckets = tuple(backend.manifest.chunks)
    worst = 0.0
    plans = scenarios(capacity, max_batch, vocab, buckets)
    for scenario in plans:
        results = []
        for b in (backend, reference):
            b.allocate_kv(slots=max(3, max_batch + 1), capacity=capacity)
            results.append(scenario.run(b))
        for index, (got, want) in enumerate(zip(*results, strict=True)):
            diff = float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want))))
            worst = max(worst, diff)
            if not diff <= tolerance:  # also catches NaN
                raise AssertionError(f"{scenario.name}: step {index} logits differ by "
                                     f"{diff:.3g} of their scale (tolerance {tolerance:g})")
    return f"{len(plans)} scenarios match (max relative diff {worst:.2g}): " + "; ".join(
        s.name for s in plans)


# ---- bundles


class Bundles:
    """The smoke bundles, exported on first use into `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[tuple[str, str, str | None], Path] = {}

    def get(self, flavor: str = "standard", dtype: str = "fp32",
            quant: str | None = None) -> Path:
        """`quant`: `--quantize int4` or `int8` at accuracy level 0 (float activations). An
        int4 bundle's float32 and float16 forms compute with the very same weights
        (export/quantize.py); an int8 one's do not (float32: DynamicQuantizeMatMul)."""
        key = (flavor, dtype, quant)
        if key not in self.made:
            from edgeprefill.export.exporter import ExportOptions, export
            from edgeprefill.export.quantize import QuantConfig

            out = self.root / f"tiny-{flavor}-{dtype}{'-' + quant if quant else ''}"
            export(TINY_MODEL, out, ExportOptions(
                flavor=flavor, dtype=dtype, chunks=CHUNKS, max_context=MAX_CONTEXT,
                overwrite=True, show_progress=False,
                quant=QuantConfig(quant, accuracy_level=0) if quant else None))
            self.made[key] = out
        return self.made[key]


def cpu_backend(bundle: Path) -> OnnxRuntimeBackend:
    from edgeprefill.bundle import load_manifest
    from edgeprefill.engines.ort.backend import OnnxRuntimeBackend

    return OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(threads=2))


# ---- the TensorRT parts


class TrtSmoke:
    def __init__(self, trt: Any, bundles: Bundles, max_batch: int) -> None:
        self.trt, self.bundles, self.max_batch = trt, bundles, max_batch

    def parse(self) -> str:
        from edgeprefill.engines.trt.build import (
            BuildOptions,
            count_kv_layers,
            parse_network,
            prepare_build,
        )
        from edgeprefill.engines.trt.logger import capturing_logger

        inputs = prepare_build(self.bundles.get(), BuildOptions(max_batch=self.max_batch))
        parsed = parse_network(self.trt, capturing_logger(self.trt), inputs)
        found = count_kv_layers(self.trt, parsed.network)
        expected = 2 * inputs.manifest.model.num_layers
        assert found == expected, f"{found} KV-cache update layers, expected {expected}"
        return f"{found} KV-cache update layers (2 x {expected // 2} layers)"

    def engine(self, bundle: Path, capacity: int | None = None, precision: str | None = None
               ) -> tuple[TensorRTBackend, str]:
        """Build (forced) and load an engine; the backend on it and a line about it."""
        from edgeprefill.bundle import load_manifest
        from edgeprefill.engines.trt.backend import TensorRTBackend
        from edgeprefill.engines.trt.build import BuildOptions, build_engine
        from edgeprefill.engines.trt.runtime import open_runtime

        notes: list[str] = []
        options = BuildOptions(precision=precision, max_batch=self.max_batch, capacity=capacity,
                               force=True)
        result = build_engine(bundle, options, lambda text: notes.append(text))
        manifest = load_manifest(bundle)
        runtime = open_runtime(bundle, manifest, BackendOptions())  # checks aliasing, profiles
        profiles = runtime.engine.num_optimization_profiles
        assert profiles == len(runtime.plan.profiles), f"{profiles} profiles"
        pairs = sum(len(p) for p in manifest.graph.kv_outputs)
        names = ", ".join(p.name for p in runtime.plan.profiles)
        line = (f"{result.engine.name}: {profiles} profiles ({names}), {pairs}/{pairs} KV "
                f"outputs alias their past inputs, built in {result.seconds:.1f} s")
        return TensorRTBackend(bundle, manifest, BackendOptions(), runtime=runtime), line

    def build(self) -> str:
        backend, line = self.engine(self.bundles.get())
        backend.close()
        return line

    def in_place(self) -> str:
        bundle = self.bundles.get()
        backend, _ = self.engine(bundle)
        reference = cpu_backend(bundle)
        try:
            capacity = backend.plan.capacity
            for b in (backend, reference):
                b.allocate_kv(slots=3, capacity=capacity)
            before = [a.copy() for a in backend.kv_arrays()]
            tokens = np.random.default_rng(1).integers(3, backend.manifest.model.vocab_size, 20)
            for b in (backend, reference):
                prefill(b, tokens, 0, 1)
            bucket = min(c for c in backend.plan.buckets if c >= len(tokens))
            for old, new, want in zip(before, backend.kv_arrays(), reference.kv_arrays(),
                                      strict=True):
                assert np.array_equal(old[[0, 2]], new[[0, 2]]), "another slot changed"
                assert np.array_equal(old[1, :, bucket:], new[1, :, bucket:]), (
                    "positions past the padded chunk changed")
                assert np.any(new[1, :, :20] != old[1, :, :20]), "the slot was not written"
                np.testing.assert_allclose(new[1, :, :20], want[1, :, :20], atol=2e-3)
            return (f"a 20-token prefill wrote slot 1 positions 0..19 (as the CPU did) and "
                    f"nothing past its {bucket}-token bucket nor in slots 0 and 2; every "
                    "address was accepted")
        finally:
            backend.close()

    def logits(self) -> str:
        bundle = self.bundles.get()
        backend, _ = self.engine(bundle)
        try:
            return compare(backend, cpu_backend(bundle), backend.plan.capacity, self.max_batch,
                           TOLERANCE["fp32"])
        finally:
            backend.close()

    def fp16(self) -> str:
        from edgeprefill.engines.trt.build import BuildOptions, build_engine

        try:
            build_engine(self.bundles.get(), BuildOptions(precision="fp16", force=True),
                         lambda text: None)
            raise AssertionError("a float32 bundle was built at fp16")
        except EdgeprefillError as err:
            refusal = str(err)
        assert "fp32 only" in refusal, refusal
        backend, line = self.engine(self.bundles.get(dtype="fp16"))
        try:  # the reference: the same weights in float32 on the CPU
            summary = compare(backend, cpu_backend(self.bundles.get()), backend.plan.capacity,
                              self.max_batch, TOLERANCE["fp16"])
        finally:
            backend.close()
        return f"{line}; {summary}; a float32 bundle at fp16 is refused"

    def odd_capacity(self) -> str:
        backend, _ = self.engine(self.bundles.get(), capacity=ODD_CAPACITY)
        try:
            capacity = backend.plan.capacity
            assert capacity != ODD_CAPACITY and backend.slot_bytes % 256 == 0, (
                f"capacity {capacity}, slot bytes {backend.slot_bytes}")
            summary = compare(backend, cpu_backend(self.bundles.get()), capacity,
                              self.max_batch, TOLERANCE["fp32"])
        finally:
            backend.close()
        return (f"--capacity {ODD_CAPACITY} built as {capacity} ({backend.slot_bytes} B "
                f"slots); {summary}")


def ort_cuda(bundles: Bundles, max_batch: int) -> str:
    """Both graph flavours at fp32 and fp16 on ONNX Runtime's CUDA provider against the CPU
    (fp16 against the same weights in float32); every combination runs, then the first
    that failed is raised with the others' lines."""
    lines, failed = [], []
    for flavor, dtype, quant in (("standard", "fp32", None), ("standard", "fp16", None),
                                 ("ort", "fp32", None), ("ort", "fp16", None),
                                 ("ort", "fp16", "int4"), ("ort", "fp16", "int8")):
        name = f"{flavor} {dtype}{' ' + quant if quant else ''}"
        if (flavor, dtype) == ("ort", "fp32"):
            lines.append(f"ort fp32: {ort_fp32_refused(bundles)}")
            continue
        try:
            lines.append(f"{name}: {ort_cuda_one(bundles, flavor, dtype, max_batch, quant)}")
        except Exception as err:  # noqa: BLE001 - each combination reports on its own
            failed.append(f"{name} FAILED: {type(err).__name__}: {err}")
            traceback.print_exc(file=sys.stderr)
    if failed:
        raise AssertionError("; ".join(failed + lines))
    return "; ".join(lines)


def ort_fp32_refused(bundles: Bundles) -> str:
    """ONNX Runtime's CUDA GroupQueryAttention is float16/bfloat16 only: a float32 ort bundle
    is refused in one line rather than run with its attention on the CPU."""
    from edgeprefill.bundle import load_manifest
    from edgeprefill.engines.ort.backend import OnnxRuntimeBackend

    bundle = bundles.get("ort", "fp32")
    try:
        OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(device="cuda")).close()
    except EdgeprefillError as err:
        assert "GroupQueryAttention" in str(err), str(err)
        return "refused in one line (CUDA GroupQueryAttention is fp16/bf16 only)"
    raise AssertionError("a float32 ort bundle loaded on the CUDA provider")


def ort_cuda_one(bundles: Bundles, flavor: str, dtype: str, max_batch: int,
                 quant: str | None = None) -> str:
    from edgeprefill.bundle import load_manifest
    from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
    from edgeprefill.engines.ort.providers import CUDA_EP, placement

    bundle = bundles.get(flavor, dtype, quant)
    gpu = OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(device="cuda"))
    # The CPU reference: the float32 twin, or for int8 the very bundle (no float32 twin)
    twin = bundle if quant == "int8" else bundles.get(flavor, "fp32", quant)
    try:
        summary = compare(gpu, cpu_backend(twin), MAX_CONTEXT,
                          max_batch, TOLERANCE[dtype])
        # The arena's class says the KV cache lived in device memory (ort/arena.py).
        arena = type(gpu.arena).__name__ if gpu.arena is not None else "no arena"
        off = placement(gpu.session, CUDA_EP).elsewhere
        where = (", ".join(f"{op} x{n}" for op, n in off.most_common()) + " on the CPU"
                 if off else "every node on CUDA")
    finally:
        gpu.close()
    return f"{arena}, {where}; {summary.split(':')[0]}"


# ---- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="export the bundles here and keep them")
    parser.add_argument("--max-batch", type=int, default=2,
                        help="decode profile batch of the engines (default 2: the scenarios "
                             "then decode wider than it)")
    args = parser.parse_args(argv)
    report = Report()
    env = probe()
    report.line("ok", "versions", env.versions)
    if env.trt_missing and env.ort_cuda_missing:
        for part in PARTS[1:]:
            reason = env.ort_cuda_missing if part == "ort-cuda" else env.trt_missing
            report.line("SKIP", part, reason)
        return 0
    with tempfile.TemporaryDirectory(prefix="edgeprefill-smoke-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        bundles = Bundles(root)
        smoke = TrtSmoke(env.trt, bundles, args.max_batch)
        bodies: dict[str, Callable[[], str]] = {
            "parse": smoke.parse, "build": smoke.build, "in-place": smoke.in_place,
            "logits": smoke.logits, "fp16": smoke.fp16, "odd-capacity": smoke.odd_capacity,
        }
        for part in TRT_PARTS:
            if env.trt_missing:
                report.line("SKIP", part, env.trt_missing)
            else:
                report.run(part, bodies[part])
        if env.ort_cuda_missing:
            report.line("SKIP", "ort-cuda", env.ort_cuda_missing)
        else:
            report.run("ort-cuda", lambda: ort_cuda(bundles, args.max_batch))
    return 1 if report.failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    start = time.perf_counter()
    code = main()
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    sys.exit(code)
