"""A loaded TensorRT engine: one execution context per optimization profile.

`EngineRuntime` is what the TensorRT backend drives: bind every tensor of a call by address
and shape, run it on the device's stream. `TrtRuntime` implements it with TensorRT; the
backend's tests implement it with a fake that records the calls. Everything here beyond
`open_runtime`'s lookup is a direct call into TensorRT.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Protocol

from edgeprefill.bundle import Manifest
from edgeprefill.engines.base import BackendOptions
from edgeprefill.engines.gpu_libs import require_tensorrt
from edgeprefill.engines.trt.cache import ENGINES_DIR, DeviceInfo, find_engine, usable_records
from edgeprefill.engines.trt.cuda import CudaDevice, DeviceMemory
from edgeprefill.engines.trt.plan import ProfilePlan, profile_plan
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
    info = DeviceInfo(*device.info(), trt.__version__)
    engines_dir = options.engine_dir or bundle_dir / ENGINES_DIR
    engine, plan = choose_engine(engines_dir, manifest, info, bundle_dir)
    return TrtRuntime(trt, engine, plan, device, manifest)


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
        self, trt: ModuleType, engine_path: Path, plan: ProfilePlan, device: CudaDevice,
        manifest: Manifest,
    ) -> None:
        self.trt, self.plan, self.device = trt, plan, device
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(engine_path.read_bytes())
        if self.engine is None:
            raise BackendError(f"TensorRT could not load {engine_path}; rebuild it with "
                               "`edgeprefill build --force`")
        if self.engine.num_optimization_profiles != len(plan.profiles):
            raise BackendError(f"{engine_path} has {self.engine.num_optimization_profiles} "
                               f"profiles, expected {len(plan.profiles)}; rebuild it")
        self._check_aliasing(manifest)
        self._inputs = set(manifest.graph.inputs)
        # Steps run one at a time on one stream, so every context shares one scratch buffer
        # (the largest profile's) instead of each holding its own.
        self._scratch_bytes = int(self.engine.device_memory_size_v2)
        self._scratch = device.alloc(self._scratch_bytes)
        self.contexts = [self._context(i) for i in range(len(plan.profiles))]
        device.synchronize()

    def _context(self, profile: int):
        strategy = self.trt.ExecutionContextAllocationStrategy.USER_MANAGED
        context = self.engine.create_execution_context(strategy)
        setter = getattr(context, "set_device_memory", None)  # (memory, size) in newer 10.x
        if setter is not None:
            setter(self._scratch, self._scratch_bytes)
        else:
            context.device_memory = self._scratch
        if not context.set_optimization_profile_async(profile, self.device.stream):
            raise BackendError(f"TensorRT refused optimization profile {profile}")
        return context

    def _check_aliasing(self, manifest: Manifest) -> None:
        """Each present KV output must alias its past input (the in-place update)."""
        aliased = getattr(self.engine, "get_aliased_input_tensor", None)
        if aliased is None:
            return  # older bindings cannot say; the backend binds both to one address anyway
        graph = manifest.graph
        for past_pair, present_pair in zip(graph.kv_inputs, graph.kv_outputs, strict=True):
            for past, present in zip(past_pair, present_pair, strict=True):
                if aliased(present) != past:
                    raise BackendError(
                        f"the engine does not update {past} in place (TensorScatter was not "
                        "imported as the KV-cache update layer); rebuild with TensorRT >= 10.15"
                    )

    def execute(self, profile: int, bindings: dict[str, TensorBinding]) -> None:
        context = self.contexts[profile]
        for name, binding in bindings.items():
            if name in self._inputs and not context.set_input_shape(name, binding.shape):
                raise BackendError(f"shape {binding.shape} of {name} is outside profile "
                                   f"{self.plan.profiles[profile].name}")
            context.set_tensor_address(name, binding.address)
        if not context.execute_async_v3(self.device.stream):
            raise BackendError(f"TensorRT failed to run profile {self.plan.profiles[profile].name}")

    def close(self) -> None:
        self.contexts = []
        if self._scratch:
            self.device.synchronize()
            self.device.free(self._scratch)
            self._scratch = 0
