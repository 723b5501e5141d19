"""`edgeprefill build`: the bundle's standard chunk graph -> one cached TensorRT engine.

Everything that can be checked without a GPU is checked first (flavour, operators, capacity,
precision), so a CPU machine reports a bundle problem before it reports missing TensorRT.
Then the graph goes through TensorRT's ONNX parser into one network with a profile per
chunk bucket plus the decode profile, weights stored once, and the serialized engine is
cached under BUNDLE/engines/ (see trt.cache).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from edgeprefill.bundle import Manifest, load_manifest, resolve_inside
from edgeprefill.engines.gpu_libs import require_tensorrt, version_tuple
from edgeprefill.engines.trt.cache import (
    ENGINES_DIR,
    PRECISIONS,
    DeviceInfo,
    engine_key,
    find_engine,
    prune_stale,
    save_engine,
)
from edgeprefill.engines.trt.cuda import CudaDevice
from edgeprefill.engines.trt.graph import parser_ready_graph, require_standard
from edgeprefill.engines.trt.plan import ProfilePlan, profile_plan
from edgeprefill.errors import BackendError

Echo = Callable[[str], None]
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass(frozen=True)
class BuildOptions:
    precision: str = "fp16"
    workspace_mib: int | None = None  # builder workspace limit; None: TensorRT's default
    max_batch: int = 8  # decode profile B = 1..max_batch
    capacity: int | None = None  # KV positions per slot; None: the bundle's max context
    force: bool = False  # rebuild even when a matching engine is cached

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise BackendError(
                f"unknown precision {self.precision!r}; choose one of: {', '.join(PRECISIONS)}"
            )
        if self.workspace_mib is not None and self.workspace_mib < 1:
            raise BackendError(f"--workspace must be at least 1 MiB, got {self.workspace_mib}")


@dataclass(frozen=True)
class NetworkTyping:
    strongly_typed: bool  # types come from the graph (STRONGLY_TYPED network)
    builder_flags: tuple[str, ...]  # trt.BuilderFlag names to set


class BuildInputs(NamedTuple):
    manifest: Manifest
    plan: ProfilePlan
    graph: bytes  # serialized, parser-ready graph
    graph_path: Path  # where the parser resolves the external weights from
    quantized: bool  # the graph has Q/DQ nodes
    typing: NetworkTyping  # as TensorRT 10 would build it; rechecked against the real one


class BuildResult(NamedTuple):
    engine: Path
    seconds: float
    reused: bool  # a matching engine was already cached


def network_typing(
    bundle_dtype: str, precision: str, quantized: bool, weak_typing: bool = True
) -> NetworkTyping:
    """How the network gets the requested precision from a graph of `bundle_dtype`.
    `weak_typing`: the TensorRT at hand still has precision builder flags (10.x; 11 removed
    them)."""
    if precision == "int8":
        if not quantized:
            raise BackendError(
                "--precision int8 needs a graph with QuantizeLinear/DequantizeLinear nodes "
                "(TensorRT 10 deprecates implicit INT8 calibration) and this bundle has none; "
                "build with --precision fp16"
            )
        return NetworkTyping(True, ())
    wanted = {"fp16": "float16", "fp32": "float32"}[precision]
    if wanted == bundle_dtype:
        return NetworkTyping(True, ())
    if precision == "fp32":
        raise BackendError("the bundle's weights are float16; build with --precision fp16 "
                           "or re-export with --dtype fp32")
    if not weak_typing:
        raise BackendError("this TensorRT builds strongly typed networks only, so a float32 "
                           "bundle builds in fp32; for fp16 re-export with --dtype fp16")
    # A float32 graph built in fp16: the weakly typed FP16 flag (deprecated in TensorRT 10
    # but supported); exporting with --dtype fp16 gives a strongly typed build instead.
    return NetworkTyping(False, ("FP16",))


def prepare_build(bundle_dir: Path, options: BuildOptions) -> BuildInputs:
    """The CPU half of a build: read and check the bundle, plan the profiles."""
    manifest = load_manifest(bundle_dir, verify_checksums=True)  # weights go into the engine
    require_standard(manifest)
    capacity = options.capacity or manifest.max_context
    plan = profile_plan(manifest, capacity, options.max_batch)
    graph = parser_ready_graph(bundle_dir, manifest, capacity)
    quantized = any(node.op_type in QDQ_OPS for node in graph.graph.node)
    typing = network_typing(manifest.graph.dtype, options.precision, quantized)
    graph_path = resolve_inside(bundle_dir, manifest.graph.file)
    return BuildInputs(manifest, plan, graph.SerializeToString(), graph_path, quantized, typing)


def build_engine(bundle_dir: Path, options: BuildOptions, echo: Echo) -> BuildResult:
    start = time.perf_counter()
    inputs = prepare_build(bundle_dir, options)
    trt = require_tensorrt()
    weak = version_tuple(trt.__version__) < (11,)
    typing = network_typing(inputs.manifest.graph.dtype, options.precision, inputs.quantized, weak)
    inputs = inputs._replace(typing=typing)
    name, capability = CudaDevice().info()
    device = DeviceInfo(name, capability, trt.__version__)
    key = engine_key(inputs.manifest, device, options.precision, inputs.plan)
    engines_dir = bundle_dir / ENGINES_DIR
    cached = find_engine(engines_dir, key)
    if cached is not None and not options.force:
        return BuildResult(cached, time.perf_counter() - start, reused=True)
    echo(f"building a TensorRT {trt.__version__} engine for {name} (sm {capability}), "
         f"{options.precision}, profiles: {', '.join(p.name for p in inputs.plan.profiles)}")
    blob = compile_engine(trt, inputs, options, echo)
    seconds = time.perf_counter() - start
    path = save_engine(engines_dir, key, blob, {"built_at": time.time(), "seconds": seconds})
    for stale in prune_stale(engines_dir, inputs.manifest):
        echo(f"removed stale engine file {stale.name}")
    return BuildResult(path, seconds, reused=False)


def compile_engine(trt: ModuleType, inputs: BuildInputs, options: BuildOptions, echo: Echo):
    """Parse the graph and build the serialized engine (direct TensorRT calls)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    strongly = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if inputs.typing.strongly_typed and strongly is not None:  # None: always strong (11.x)
        flags = 1 << int(strongly)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(inputs.graph, str(inputs.graph_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise BackendError("TensorRT's ONNX parser rejected the graph: " + "; ".join(errors[:3]))
    _check_kv_layers(trt, network, inputs.manifest)
    config = builder.create_builder_config()
    if options.workspace_mib:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    for flag in inputs.typing.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    for profile in inputs.plan.profiles:
        optimization = builder.create_optimization_profile()
        for name, shapes in profile.shapes.items():
            optimization.set_shape(name, shapes.min, shapes.opt, shapes.max)
        config.add_optimization_profile(optimization)
    config.progress_monitor = progress_monitor(trt, echo)
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise BackendError("TensorRT failed to build the engine (see its messages above)")
    return bytes(blob)


def _check_kv_layers(trt: ModuleType, network, manifest: Manifest) -> None:
    """Every TensorScatter must have become a KV-cache update layer (in place), not a
    generic scatter that copies the whole cache each step."""
    # The Python enum name is not documented where we could check: match it by name.
    kinds = [v for n, v in trt.LayerType.__members__.items() if "KV" in n and "CACHE" in n]
    if not kinds:
        return
    kind = kinds[0]
    found = sum(network.get_layer(i).type == kind for i in range(network.num_layers))
    expected = 2 * manifest.model.num_layers
    if found != expected:
        raise BackendError(f"TensorRT imported {found} of {expected} KV writes as in-place "
                           "KV-cache updates; the engine would copy the cache every step")


def progress_monitor(trt: ModuleType, echo: Echo):
    """A trt.IProgressMonitor printing the builder's top-level phases and their times."""

    class Progress(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.started: dict[str, float] = {}

        def phase_start(self, phase_name, parent_phase, num_steps) -> None:
            self.started[phase_name] = time.perf_counter()
            if parent_phase is None:
                echo(f"  {phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name, step) -> bool:
            return True  # never cancel

        def phase_finish(self, phase_name) -> None:
            began = self.started.pop(phase_name, None)
            if began is not None and not self.started:
                echo(f"  {phase_name} done in {time.perf_counter() - began:.1f} s")

    return Progress()
