"""Stand-ins for the GPU under the TensorRT backend, so its logic runs on the CPU.

- `HostDevice`: DeviceMemory over host memory. Addresses are real host pointers, every copy
  is bounds-checked against the buffer it lands in (device memory would not complain).
- `OrtEngineRuntime`: stands in for a loaded TensorRT engine. Each call is checked against
  its optimization profile as TensorRT would, recorded, and run with ONNX Runtime on the
  CPU over the parser-ready graph, reading and writing the bound addresses, so the
  backend's results can be compared with the ONNX Runtime backend's.
- `FakeTensorRT`: the `tensorrt` module's surface that edgeprefill calls (runtime, engine,
  contexts, builder, parser, logger), recording each call in order with its arguments.
"""

from __future__ import annotations

import ctypes
import enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import onnx
import onnxruntime as ort

from edgeprefill.bundle import GraphInfo, Manifest, ModelInfo, TokenizerInfo
from edgeprefill.contract import FileRecord
from edgeprefill.engines.trt.graph import parser_ready_graph
from edgeprefill.engines.trt.plan import ProfilePlan, profile_plan
from edgeprefill.engines.trt.steps import TensorBinding

KV, D, VOCAB = 2, 8, 50  # dims of fake_manifest's model
ALIGNMENT = 256  # what TensorRT demands of every tensor address


def fake_manifest(
    chunks=(16, 64), max_context=256, layers=1, kv_heads=KV, head_dim=D, dtype="float32",
    attention_free=(),
) -> Manifest:
    """A standard-flavour manifest of a model that was never exported (plain-function tests);
    the layers in `attention_free` without KV (Llama-Nemotron's)."""
    kv = [dtype, ["batch", kv_heads, "capacity", head_dim]]
    kv_layers = [i for i in range(layers) if i not in attention_free]
    inputs = {"input_ids": ["int64", ["batch", "chunk"]], "past_lens": ["int32", ["batch"]],
              "valid_lens": ["int32", ["batch"]]}
    outputs = {"logits": ["float32", ["batch", VOCAB]]}
    for i in kv_layers:
        inputs |= {f"past_key.{i}": kv, f"past_value.{i}": kv}
        outputs |= {f"present_key.{i}": kv, f"present_value.{i}": kv}
    graph = GraphInfo(
        file="model.onnx", data_file="model.onnx.data", flavor="standard", dtype=dtype,
        opsets={"": 24}, inputs=inputs, outputs=outputs,
        kv_inputs=[[f"past_key.{i}", f"past_value.{i}"] for i in kv_layers],
        kv_outputs=[[f"present_key.{i}", f"present_value.{i}"] for i in kv_layers],
    )
    return Manifest(
        model=ModelInfo("llama", layers, 4, kv_heads, head_dim, 32, VOCAB,
                        attention_free_layers=list(attention_free)), graph=graph,
        tokenizer=TokenizerInfo(None, None, None, None), chunks=list(chunks),
        max_context=max_context, eos_token_ids=[2], bos_token_id=1,
        files={"model.onnx": FileRecord("g" * 64, 1),
               "model.onnx.data": FileRecord("w" * 64, 1)},
    )


class HostDevice:
    stream = 0
    closed = False

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}

    def alloc(self, nbytes: int) -> int:
        # 256-byte aligned like cudaMalloc, so alignment is checked on the CPU too.
        raw = np.zeros(max(nbytes, 1) + ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % ALIGNMENT
        buffer = raw[start : start + max(nbytes, 1)]
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
            assert address % ALIGNMENT == 0, f"{name} at {address:#x} is not 256-byte aligned"
            dtype = self.dtypes[name]
            self.device.check(address, int(np.prod(shape)) * dtype.itemsize)
            bind = io.bind_output if name in outputs else io.bind_input
            bind(name, "cpu", 0, dtype, shape, address)
        self.session.run_with_iobinding(io)

    def close(self) -> None:
        self.closed = True


# ---- A stand-in for the `tensorrt` module: records every call the backend makes into it.

class Severity(enum.Enum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


class LayerType(enum.Enum):
    MATRIX_MULTIPLY = 0
    SCATTER = 1
    KV_CACHE_UPDATE = 2


class FakeILogger:
    Severity = Severity

    def __init__(self) -> None:
        pass


class FakeTensorRT(SimpleNamespace):
    """`tensorrt` as far as edgeprefill uses it. `calls` lists (object, method, args) in
    call order. Knobs: `aliases` (present -> past the engine reports), `profiles` (the
    engine's count), `rejected` (addresses set_tensor_address refuses), `build_error` (the
    builder logs it and returns None), `load_error` (the runtime logs it and returns None),
    `kv_layers` (KV-cache update layers the parser creates: one per KV tensor)."""

    def __init__(self, manifest: Manifest, **knobs: Any) -> None:
        graph = manifest.graph
        pairs = zip(_flat(graph.kv_outputs), _flat(graph.kv_inputs), strict=True)
        super().__init__(
            __version__="10.15.1.29", calls=[], loaded=[], aliases=dict(pairs),
            profiles=None, rejected=set(), build_error=None, load_error=None,
            kv_layers=2 * manifest.model.kv_layers, ILogger=FakeILogger, LayerType=LayerType,
            ExecutionContextAllocationStrategy=SimpleNamespace(USER_MANAGED="user"),
            NetworkDefinitionCreationFlag=SimpleNamespace(STRONGLY_TYPED=0),
            MemoryPoolType=SimpleNamespace(WORKSPACE="workspace"),
            BuilderFlag=SimpleNamespace(FP16="fp16"), IProgressMonitor=FakeProgressMonitor,
        )
        for name, value in knobs.items():
            setattr(self, name, value)

    def record(self, who: str, method: str, *args: Any) -> None:
        self.calls.append((who, method, args))

    def Runtime(self, logger: Any) -> FakeRuntime:  # noqa: N802 - TensorRT's spelling
        return FakeRuntime(self, logger)

    def Builder(self, logger: Any) -> FakeBuilder:  # noqa: N802
        return FakeBuilder(self, logger)

    def OnnxParser(self, network: Any, logger: Any) -> FakeParser:  # noqa: N802
        return FakeParser(self, network)


class FakeProgressMonitor:
    def __init__(self) -> None:
        pass


class FakeRuntime:
    def __init__(self, trt: FakeTensorRT, logger: Any) -> None:
        self.trt, self.logger = trt, logger

    def deserialize_cuda_engine(self, data: Any) -> FakeEngine | None:
        self.trt.record("runtime", "deserialize_cuda_engine", type(data).__name__)
        self.trt.loaded.append(bytes(data))
        if self.trt.load_error:
            self.logger.log(Severity.ERROR, self.trt.load_error)
            return None
        return FakeEngine(self.trt)


class FakeEngine:
    device_memory_size_v2 = 4096

    def __init__(self, trt: FakeTensorRT) -> None:
        self.trt = trt
        self.num_optimization_profiles = trt.profiles

    def get_aliased_input_tensor(self, name: str) -> str | None:
        return self.trt.aliases.get(name)

    def create_execution_context(self, strategy: Any) -> FakeContext:
        self.trt.record("engine", "create_execution_context", strategy)
        return FakeContext(self.trt, len([c for c in self.trt.calls if c[1] ==
                                          "create_execution_context"]) - 1)


class FakeContext:
    def __init__(self, trt: FakeTensorRT, index: int) -> None:
        self.trt, self.who = trt, f"context{index}"

    def set_device_memory(self, address: int, size: int) -> None:
        self.trt.record(self.who, "set_device_memory", address, size)

    def set_optimization_profile_async(self, profile: int, stream: int) -> bool:
        self.trt.record(self.who, "set_optimization_profile_async", profile, stream)
        return True

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.trt.record(self.who, "set_input_shape", name, tuple(shape))
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.trt.record(self.who, "set_tensor_address", name, address)
        return address not in self.trt.rejected

    def execute_async_v3(self, stream: int) -> bool:
        self.trt.record(self.who, "execute_async_v3", stream)
        return True


class FakeLayer(NamedTuple):
    type: LayerType


class FakeNetwork:
    def __init__(self, trt: FakeTensorRT) -> None:
        self.layers = [FakeLayer(LayerType.MATRIX_MULTIPLY)]
        self.layers += [FakeLayer(LayerType.KV_CACHE_UPDATE)] * trt.kv_layers

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def get_layer(self, index: int) -> FakeLayer:
        return self.layers[index]


class FakeParser:
    def __init__(self, trt: FakeTensorRT, network: FakeNetwork) -> None:
        self.trt, self.num_errors = trt, 0

    def parse(self, graph: bytes, path: str) -> bool:
        self.trt.record("parser", "parse", path)
        return True


class FakeProfile:
    def __init__(self, trt: FakeTensorRT) -> None:
        self.trt = trt

    def set_shape(self, name: str, *shapes: Any) -> None:
        self.trt.record("profile", "set_shape", name, *shapes)


class FakeConfig:
    def __init__(self, trt: FakeTensorRT) -> None:
        self.trt, self.count = trt, 0
        self.progress_monitor = None

    def set_memory_pool_limit(self, pool: str, size: int) -> None:
        self.trt.record("config", "set_memory_pool_limit", pool, size)

    def set_flag(self, flag: str) -> None:
        self.trt.record("config", "set_flag", flag)

    def add_optimization_profile(self, profile: FakeProfile) -> int:
        self.count += 1
        return self.count - 1


class FakeBuilder:
    def __init__(self, trt: FakeTensorRT, logger: Any) -> None:
        self.trt, self.logger = trt, logger

    def create_network(self, flags: int) -> FakeNetwork:
        self.trt.record("builder", "create_network", flags)
        return FakeNetwork(self.trt)

    def create_builder_config(self) -> FakeConfig:
        return FakeConfig(self.trt)

    def create_optimization_profile(self) -> FakeProfile:
        return FakeProfile(self.trt)

    def build_serialized_network(self, network: FakeNetwork, config: FakeConfig) -> bytes | None:
        self.trt.record("builder", "build_serialized_network", config.count)
        if self.trt.build_error:
            self.logger.log(Severity.WARNING, "a warning that is not the reason")
            self.logger.log(Severity.ERROR, self.trt.build_error)
            return None
        if self.trt.profiles is None:
            self.trt.profiles = config.count
        return b"serialized engine"


def _flat(pairs: list[list[str]]) -> list[str]:
    return [name for pair in pairs for name in pair]
