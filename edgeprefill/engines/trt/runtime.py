"""A loaded TensorRT engine: one execution context per optimization profile.

`EngineRuntime` is what the TensorRT backend drives: bind every tensor of a call by address
and shape, run it on the device's stream. `TrtRuntime` implements it with TensorRT; the
backend's tests implement it with a fake that records the calls. Everything here beyond
`open_runtime`'s lookup is a direct call into TensorRT.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from edgeprefill.bundle import Manifest
from edgeprefill.engines.base import BackendOptions
from edgeprefill.engines.gpu_libs import require_tensorrt
from edgeprefill.engines.trt.cache import ENGINES_DIR, DeviceInfo, find_engine, usable_records
from edgeprefill.engines.trt.cuda import CudaDevice, DeviceMemory
from edgeprefill.engines.trt.logger import Captured, capturing_logger
from edgeprefill.engines.trt.plan import TENSOR_ALIGNMENT, ProfilePlan, profile_plan
from edgeprefill.engines.trt.steps import TensorBinding
from edgeprefill.errors import BackendError


class EngineRuntime(Protocol):
    device: DeviceMemory
    plan: ProfilePlan

    def execute(self, profile: int, bindings: dict[str, TensorBinding]) -> None:
        """Enqueue one call of `profile` with every graph input and output bound."""

    def close(self) -> None: ...


def open_runtime(bundle_dir: Path, manifest: Manifest, options: BackendOptions) -> TrtRuntime:
    """Load the newest engine built for this GPU, TensorRT version and graph."""
    trt = require_tensorrt()
    device = CudaDevice()
    try:
        info = DeviceInfo(*device.info(), trt.__version__)
        engines_dir = options.engine_dir or bundle_dir / ENGINES_DIR
        engine, plan = choose_engine(engines_dir, manifest, info, bundle_dir)
        return TrtRuntime(trt, engine, plan, device, manifest)
    except BaseException:
        device.close()  # the stream, and nothing else is held yet
        raise


def choose_engine(
    engines_dir: Path, manifest: Manifest, info: DeviceInfo, bundle_dir: Path
) -> tuple[Path, ProfilePlan]:
    """The engine file to load here and its profile plan; BackendError when none fits."""
    keys = usable_records(engines_dir, manifest, info)
    if not keys:
        raise BackendError(
            f"no TensorRT engine in {engines_dir} matches this GPU ({info.gpu_name}, sm "
            f"{info.compute_capability}), TensorRT {info.tensorrt_version} and this bundle's "
            f"graph; build one with `edgeprefill build {bundle_dir}`"
        )
    key = keys[0]
    engine = find_engine(engines_dir, key, verify=True)
    plan = profile_plan(manifest, key.capacity, key.max_batch)
    if engine is None or plan.buckets != key.buckets:
        raise BackendError(f"the engine {key.stem} is corrupt or was built for other "
                           f"buckets; rebuild with `edgeprefill build {bundle_dir} --force`")
    return engine, plan


class TrtRuntime:
    def __init__(
        self, trt: ModuleType, engine_path: Path, plan: ProfilePlan, device: DeviceMemory,
        manifest: Manifest,
    ) -> None:
        self.trt, self.plan, self.device = trt, plan, device
        self._logger = capturing_logger(trt)
        self._runtime = trt.Runtime(self._logger)
        self.engine = load_engine(self._runtime, engine_path, self._logger.captured)
        check_engine(self.engine, manifest, plan, engine_path.name)
        self._inputs = set(manifest.graph.inputs)
        # Steps run one at a time on one stream, so every context shares one scratch buffer
        # (the largest profile's) instead of each holding its own.
        self._scratch_bytes = int(self.engine.device_memory_size_v2)
        self._scratch = device.alloc(self._scratch_bytes)
        try:
            self.contexts = [self._context(i) for i in range(len(plan.profiles))]
        except BackendError:
            raise
        except Exception as err:  # noqa: BLE001 - TensorRT's bindings raise their own types
            raise BackendError(self._logger.captured.explain(
                f"TensorRT could not prepare {engine_path.name} to run ({err})")) from None
        device.synchronize()

    def _context(self, profile: int) -> Any:
        strategy = self.trt.ExecutionContextAllocationStrategy.USER_MANAGED
        context = self.engine.create_execution_context(strategy)
        if context is None:
            raise BackendError(self._logger.captured.explain(
                f"TensorRT could not create an execution context for profile {profile}"))
        setter = getattr(context, "set_device_memory", None)  # (memory, size) in newer 10.x
        if setter is not None:
            setter(self._scratch, self._scratch_bytes)
        else:
            context.device_memory = self._scratch
        if not context.set_optimization_profile_async(profile, self.device.stream):
            raise BackendError(self._logger.captured.explain(
                f"TensorRT refused optimization profile {profile}"))
        return context

    def execute(self, profile: int, bindings: dict[str, TensorBinding]) -> None:
        context = self.contexts[profile]
        name_of = self.plan.profiles[profile].name
        for name, binding in bindings.items():
            if name in self._inputs and not context.set_input_shape(name, binding.shape):
                raise BackendError(self._logger.captured.explain(
                    f"shape {binding.shape} of {name} is outside profile {name_of}"))
            check_address(name, binding.address)
            if not context.set_tensor_address(name, binding.address):
                raise BackendError(self._logger.captured.explain(
                    f"TensorRT rejected the address {binding.address:#x} of {name}"))
        if not context.execute_async_v3(self.device.stream):
            raise BackendError(self._logger.captured.explain(
                f"TensorRT failed to run profile {name_of}"))

    def close(self) -> None:
        """Contexts before the engine, the engine before its scratch memory; the stream
        last (the device is this runtime's)."""
        self.contexts = []
        self.engine = None
        if self._scratch:
            self.device.synchronize()
            self.device.free(self._scratch)
            self._scratch = 0
        self.device.close()


def load_engine(runtime: Any, path: Path, captured: Captured) -> Any:
    """Deserialize the engine file through a read-only memory map: its pages are the file's
    (the page cache can drop them), so the load never holds a second copy of the engine in
    process memory, which matters on an 8 GB Jetson."""
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            engine = runtime.deserialize_cuda_engine(view)
    except (OSError, ValueError) as err:
        raise BackendError(f"cannot read the engine {path}: {err}") from None
    except Exception as err:  # noqa: BLE001 - TensorRT's bindings raise their own types
        raise BackendError(captured.explain(f"TensorRT could not load {path.name} ({err})")
                           ) from None
    if engine is None:
        raise BackendError(captured.explain(
            f"TensorRT could not load {path.name}; rebuild it with `edgeprefill build --force`"))
    return engine


def check_engine(engine: Any, manifest: Manifest, plan: ProfilePlan, name: str) -> None:
    """The engine has the plan's profiles and updates every KV tensor in place."""
    if engine.num_optimization_profiles != len(plan.profiles):
        raise BackendError(f"{name} has {engine.num_optimization_profiles} optimization "
                           f"profiles, expected {len(plan.profiles)}; rebuild it with --force")
    aliased = getattr(engine, "get_aliased_input_tensor", None)
    if aliased is None:
        raise BackendError("this TensorRT cannot say whether the KV cache is updated in place "
                           "(no get_aliased_input_tensor); it needs TensorRT >= 10.15")
    graph = manifest.graph
    for past_pair, present_pair in zip(graph.kv_inputs, graph.kv_outputs, strict=True):
        for past, present in zip(past_pair, present_pair, strict=True):
            if aliased(present) != past:
                raise BackendError(
                    f"{name} does not update {past} in place ({present} aliases "
                    f"{aliased(present)!r}); TensorScatter was not imported as the KV-cache "
                    "update layer: rebuild with TensorRT >= 10.15"
                )


def check_address(name: str, address: int) -> None:
    # TensorRT needs 256-byte aligned tensors; the KV arena's capacity is rounded so every
    # slot is, and the staging buffers come straight from cudaMalloc.
    if address % TENSOR_ALIGNMENT:
        raise BackendError(f"the address {address:#x} of {name} is not "
                           f"{TENSOR_ALIGNMENT}-byte aligned, as TensorRT requires")
