"""Stand-ins for the GPU under the TensorRT backend, so its logic runs on the CPU.

- `HostDevice`: DeviceMemory over host memory. Addresses are real host pointers, every copy
  is bounds-checked against the buffer it lands in (device memory would not complain).
- `OrtEngineRuntime`: stands in for a loaded TensorRT engine. Each call is checked against
  its optimization profile as TensorRT would, recorded, and run with ONNX Runtime on the
  CPU over the parser-ready graph, reading and writing the bound addresses, so the
  backend's results can be compared with the ONNX Runtime backend's.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnxruntime as ort

from edgeprefill.bundle import GraphInfo, Manifest, ModelInfo, TokenizerInfo
from edgeprefill.engines.trt.graph import parser_ready_graph
from edgeprefill.engines.trt.plan import ProfilePlan, profile_plan
from edgeprefill.engines.trt.steps import TensorBinding

KV, D, VOCAB = 2, 8, 50  # dims of fake_manifest's model


def fake_manifest(chunks=(16, 64), max_context=256, layers=1) -> Manifest:
    """A standard-flavour manifest of a model that was never exported (plain-function tests)."""
    kv = ["float32", ["batch", KV, "capacity", D]]
    inputs = {"input_ids": ["int64", ["batch", "chunk"]], "past_lens": ["int32", ["batch"]],
              "valid_lens": ["int32", ["batch"]]}
    outputs = {"logits": ["float32", ["batch", VOCAB]]}
    for i in range(layers):
        inputs |= {f"past_key.{i}": kv, f"past_value.{i}": kv}
        outputs |= {f"present_key.{i}": kv, f"present_value.{i}": kv}
    graph = GraphInfo(
        file="model.onnx", data_file="model.onnx.data", flavor="standard", dtype="float32",
        opsets={"": 24}, inputs=inputs, outputs=outputs,
        kv_inputs=[[f"past_key.{i}", f"past_value.{i}"] for i in range(layers)],
        kv_outputs=[[f"present_key.{i}", f"present_value.{i}"] for i in range(layers)],
    )
    return Manifest(
        model=ModelInfo("llama", layers, 4, KV, D, 32, VOCAB), graph=graph,
        tokenizer=TokenizerInfo(None, None, None, None), chunks=list(chunks),
        max_context=max_context, eos_token_ids=[2], bos_token_id=1,
        files={"model.onnx": {"sha256": "g" * 64, "bytes": 1},
               "model.onnx.data": {"sha256": "w" * 64, "bytes": 1}},
    )


class HostDevice:
    stream = 0
    closed = False

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}

    def alloc(self, nbytes: int) -> int:
        buffer = np.zeros(max(nbytes, 1), np.uint8)
        self.buffers[buffer.ctypes.data] = buffer
        return buffer.ctypes.data

    def free(self, address: int) -> None:
        del self.buffers[address]  # KeyError on a double free or a foreign address

    def upload(self, address: int, array: np.ndarray) -> None:
        assert array.flags.c_contiguous
        self.check(address, array.nbytes)
        ctypes.memmove(address, array.ctypes.data, array.nbytes)

    def download(self, array: np.ndarray, address: int) -> None:
        assert array.flags.c_contiguous
        self.check(address, array.nbytes)
        ctypes.memmove(array.ctypes.data, address, array.nbytes)

    def copy_rows(self, dst, dst_pitch, src, src_pitch, width, height) -> None:
        for row in range(height):
            self.check(dst + row * dst_pitch, width)
            self.check(src + row * src_pitch, width)
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def check(self, address: int, nbytes: int) -> None:
        """[address, address + nbytes) lies inside one allocated buffer."""
        for base, buffer in self.buffers.items():
            if base <= address and address + nbytes <= base + buffer.nbytes:
                return
        raise AssertionError(f"{nbytes} bytes at {address:#x} are outside every buffer")


class Executed(NamedTuple):
    profile: int
    bindings: dict[str, TensorBinding]


class OrtEngineRuntime:
    def __init__(
        self, bundle_dir: Path, manifest: Manifest, capacity: int, max_batch: int,
        device: HostDevice | None = None,
    ) -> None:
        self.device = device or HostDevice()
        self.plan: ProfilePlan = profile_plan(manifest, capacity, max_batch)
        model = parser_ready_graph(bundle_dir, manifest, capacity)
        onnx.load_external_data_for_model(model, str(bundle_dir))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        types = {**manifest.graph.inputs, **manifest.graph.outputs}
        self.dtypes = {name: np.dtype(dtype) for name, (dtype, _) in types.items()}
        self.calls: list[Executed] = []
        self.closed = False

    def execute(self, profile: int, bindings: dict[str, TensorBinding]) -> None:
        shapes = self.plan.profiles[profile].shapes
        for name, shape_range in shapes.items():  # TensorRT rejects shapes off the profile
            assert shape_range.contains(bindings[name].shape), (name, bindings[name].shape)
        assert set(bindings) == set(self.dtypes), "every graph input and output is bound"
        self.calls.append(Executed(profile, dict(bindings)))
        io = self.session.io_binding()
        outputs = {o.name for o in self.session.get_outputs()}
        for name, (address, shape) in bindings.items():
            dtype = self.dtypes[name]
            self.device.check(address, int(np.prod(shape)) * dtype.itemsize)
            bind = io.bind_output if name in outputs else io.bind_input
            bind(name, "cpu", 0, dtype, shape, address)
        self.session.run_with_iobinding(io)

    def close(self) -> None:
        self.closed = True
