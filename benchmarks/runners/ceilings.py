"""Machine ceilings: fp32 GEMM rate (ONNX Runtime MatMul and numpy) and memory read bandwidth.

Run by compare.py inside the ceilings venv:  python ceilings.py SPEC.json
SPEC.json: {"threads", "gemm_shapes": [[M, K, N], ...], "bandwidth_mib", "repeats"}.
compare.py sets OPENBLAS_NUM_THREADS/OMP_NUM_THREADS to the thread count before numpy loads.
Prints one JSON line.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from common import log, package_versions
from onnx import TensorProto, helper, numpy_helper


def time_runs(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up: thread pools, weight prepacking, page faults
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return runs


def matmul_session(weight: np.ndarray, threads: int) -> ort.InferenceSession:
    """One MatMul with B as an initializer, as in a model: ORT prepacks B like real weights."""
    k, n = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(weight, "b")],
    )
    # Pin the IR version: a newer onnx writes one that an older onnxruntime refuses.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def gemm_results(shape: list[int], threads: int, repeats: int) -> list[dict[str, Any]]:
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    flops = 2.0 * m * k * n
    session = matmul_session(b, threads)
    out = np.empty((m, n), dtype=np.float32)
    backends: dict[str, Callable[[], object]] = {
        "onnxruntime MatMul": lambda: session.run(None, {"a": a}),
        "numpy matmul": lambda: np.matmul(a, b, out=out),
    }
    results = []
    for backend, fn in backends.items():
        runs = time_runs(fn, repeats)
        best = flops / min(runs) / 1e9
        median = flops / statistics.median(runs) / 1e9
        log(f"GEMM {m}x{k}x{n} {backend}: {best:.1f} GFLOP/s best, {median:.1f} median")
        results.append(
            {
                "backend": backend,
                "shape_mkn": shape,
                "gflops_best": best,
                "gflops_median": median,
            }
        )
    return results


def max_in_threads(array: np.ndarray, pool: ThreadPoolExecutor, parts: int) -> float:
    """numpy reductions release the GIL, so slices reduced in threads read in parallel."""
    return max(pool.map(np.max, np.array_split(array, parts)))


def ort_gemv(weight: np.ndarray, threads: int) -> Callable[[], object]:
    """A [1 x K] . [K x N] MatMul over an initializer: a batch-1 decode step through the same
    MLAS kernels and thread pool the ONNX runtimes use."""
    session = matmul_session(weight, threads)
    row = np.ones((1, weight.shape[0]), dtype=np.float32)
    return lambda: session.run(None, {"a": row})


def bandwidth_row(
    method: str, fn: Callable[[], object], moved: float, read_only: bool, repeats: int
) -> dict[str, Any]:
    runs = time_runs(fn, repeats)
    best = moved / min(runs) / 1e9
    log(f"bandwidth {method}: {best:.1f} GB/s best")
    return {
        "method": method,
        "gbps_best": best,
        "gbps_median": moved / statistics.median(runs) / 1e9,
        "read_only": read_only,
    }


def copy_row(array: np.ndarray, repeats: int) -> dict[str, Any]:
    """Copy moves each byte twice, one read + one write; shown, not used for the floor."""
    target = np.empty_like(array)
    method = f"numpy copy, 1 thread, {array.nbytes >> 20} MiB (read+write)"
    return bandwidth_row(
        method, lambda: np.copyto(target, array), 2.0 * array.nbytes, False, repeats
    )


def bandwidth_results(mib: int, threads: int, repeats: int) -> list[dict[str, Any]]:
    """Several read kernels, because each can hit another limit first: np.sum is compute-bound
    (pairwise summation, ~7 GB/s here) so it is not used; np.max is a plain streaming read;
    a GEMV reads a matrix once per call like a decode step. The floor uses the best.

    The array must dwarf the last-level cache (260 MiB on the dev VM) or the figures are
    cache bandwidth."""
    array = np.ones(mib * 1024 * 1024 // 4, dtype=np.float32)  # ones: every page touched
    nbytes = float(array.nbytes)
    matrix = array.reshape(-1, 4096)
    vector = np.ones(4096, dtype=np.float32)
    rows = []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        rows.append(
            bandwidth_row(
                f"numpy max, 1 thread, {mib} MiB", lambda: np.max(array), nbytes, True, repeats
            )
        )
        rows.append(
            bandwidth_row(
                f"numpy max, {threads} threads, {mib} MiB",
                lambda: max_in_threads(array, pool, threads),
                nbytes,
                True,
                repeats,
            )
        )
    rows.append(
        bandwidth_row(
            f"BLAS sgemv, {threads} threads, {mib} MiB",
            lambda: matrix @ vector,
            nbytes,
            True,
            repeats,
        )
    )
    rows.append(copy_row(array, repeats))  # its second 1 GiB is freed before ORT copies
    rows.append(
        bandwidth_row(
            f"onnxruntime MatMul 1xK.KxN, {threads} threads, {mib} MiB",
            ort_gemv(array.reshape(4096, -1), threads),
            nbytes,
            True,
            repeats,
        )
    )
    return rows


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    threads, repeats = spec["threads"], spec["repeats"]
    gemm = []
    for shape in spec["gemm_shapes"]:
        gemm += gemm_results(shape, threads, repeats)
    bandwidth = bandwidth_results(spec["bandwidth_mib"], threads, repeats)
    print(
        json.dumps(
            {
                "threads": threads,
                "gemm": gemm,
                "bandwidth": bandwidth,
                "numpy_blas": np.show_config(mode="dicts")
                .get("Build Dependencies", {})
                .get("blas", {}),
                "versions": package_versions(["numpy", "onnxruntime", "onnx"]),
                "onnx_opset": onnx.defs.onnx_opset_version(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
