"""Runs one attention layer's decode step through ONNX Runtime twice, its own
GroupQueryAttention and the library's DecodeAttention, and prints the largest differences;
exit status 1 past 1e-5. Needs only numpy and onnxruntime, so that an aarch64 Python (under
qemu-user) runs it: tests/test_kernels_native.py writes the models and inputs it reads.

    python one_layer.py FOLDER LIBRARY
"""

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort


def run(model: Path, library: str | None, feeds: dict, threads: int):
    """One decode step with the cache bound in place: (out, keys, values)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if library is not None:
        options.register_custom_ops_library(library)
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    keys, values = feeds["keys"].copy(), feeds["values"].copy()
    binding = session.io_binding()
    binding.bind_cpu_input("qkv", feeds["qkv"])
    binding.bind_cpu_input("seqlens_k", feeds["positions"])
    binding.bind_cpu_input("total", np.array(feeds["positions"].max() + 1, np.int32))
    binding.bind_output("out")
    for name, array in (("k", keys), ("v", values)):
        for kind, bind in (("past_", binding.bind_input), ("present_", binding.bind_output)):
            bind(kind + name, "cpu", 0, np.float32, array.shape, array.ctypes.data)
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0], keys, values


def main(folder: Path, library: str) -> int:
    feeds = dict(np.load(folder / "feeds.npz"))
    worst = 0.0
    for threads in (1, 2):
        want = run(folder / "stock.onnx", None, feeds, threads)
        got = run(folder / "native.onnx", library, feeds, threads)
        for name, a, b in zip(("out", "keys", "values"), want, got, strict=True):
            error = float(np.abs(a - b).max())
            worst = max(worst, error)
            print(f"threads={threads} {name} max_error={error:.3g}")
    print("ok" if worst <= 1e-5 else "FAIL")
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
