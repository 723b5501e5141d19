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
from typing import Any, NamedTuple

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
from edgeprefill.engines.trt.cuda import device_info
from edgeprefill.engines.trt.graph import (
    parser_ready_graph,
    refuse_state,
    require_standard,
)
from edgeprefill.engines.trt.logger import capturing_logger
from edgeprefill.engines.trt.plan import ProfilePlan, aligned_capacity, profile_plan
from edgeprefill.engines.trt.runtime import check_engine
from edgeprefill.errors import BackendError

Echo = Callable[[str], None]
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
BUNDLE_PRECISION = {"float16": "fp16", "float32": "fp32"}  # the default: the bundle's own


@dataclass(frozen=True)
class BuildOptions:
    precision: str | None = None  # None: the bundle's dtype (fp16 or fp32)
    workspace_mib: int | None = None  # builder workspace limit; None: TensorRT's default
    max_batch: int = 8  # decode profile B = 1..max_batch
    capacity: int | None = None  # KV positions per slot; None: the bundle's max context
    force: bool = False  # rebuild even when a matching engine is cached

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
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
    precision: str  # fp16, fp32 or int8 (the option, or the bundle's dtype)
    requested_capacity: int  # before rounding to keep KV slots aligned (plan.capacity)
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
            # the precision this bundle's weights build at (a float32 one's fp16 is refused)
            own = "fp16" if bundle_dtype == "float16" else "fp32"
            raise BackendError(
                "--precision int8 needs a graph with QuantizeLinear/DequantizeLinear nodes "
                "(TensorRT 10 deprecates implicit INT8 calibration) and this bundle has none; "
                f"build with --precision {own}, the precision of its weights"
            )
        return NetworkTyping(True, ())
    wanted = {"fp16": "float16", "fp32": "float32"}[precision]
    if wanted == bundle_dtype:
        return NetworkTyping(True, ())
    if precision == "fp32":
        raise BackendError("the bundle's weights are float16; build with --precision fp16 "
                           "or re-export with --dtype fp32")
    # A float32 graph built at fp16 is refused, not weakly typed: the KV cache is a float32
    # network input and output, so fp16 KV-cache update layers would need reformat copies
    # around the cache (no longer in place) and TensorRT 11 drops the flag anyway.
    # `weak_typing` stays a parameter so the refusal says the same on every version.
    del weak_typing
    raise BackendError("a float32 bundle builds at fp32 only (fp16 layers would copy its "
                       "float32 KV cache instead of updating it in place): build with "
                       "--precision fp32, or re-export with --dtype fp16 for an fp16 engine")


def prepare_build(bundle_dir: Path, options: BuildOptions) -> BuildInputs:
    """The CPU half of a build: read and check the bundle, plan the profiles."""
    manifest = load_manifest(bundle_dir, verify_checksums=True)  # weights go into the engine
    require_standard(manifest)
    refuse_state(manifest)
    requested = options.capacity or manifest.max_context
    capacity = aligned_capacity(manifest, requested)
    plan = profile_plan(manifest, capacity, options.max_batch)
    graph = parser_ready_graph(bundle_dir, manifest, capacity)
    quantized = any(node.op_type in QDQ_OPS for node in graph.graph.node)
    precision = options.precision or BUNDLE_PRECISION[manifest.graph.dtype]
    typing = network_typing(manifest.graph.dtype, precision, quantized)
    graph_path = resolve_inside(bundle_dir, manifest.graph.file)
    return BuildInputs(manifest, plan, precision, requested, graph.SerializeToString(),
                       graph_path, quantized, typing)


def build_engine(bundle_dir: Path, options: BuildOptions, echo: Echo) -> BuildResult:
    start = time.perf_counter()
    inputs = prepare_build(bundle_dir, options)
    if inputs.plan.capacity != inputs.requested_capacity:
        echo(f"KV capacity {inputs.requested_capacity} rounded to {inputs.plan.capacity} so "
             "that every KV slot starts 256-byte aligned (run with that max_context)")
    trt = require_tensorrt()
    weak = version_tuple(trt.__version__) < (11,)
    typing = network_typing(inputs.manifest.graph.dtype, inputs.precision, inputs.quantized, weak)
    inputs = inputs._replace(typing=typing)
    name, capability = device_info()
    device = DeviceInfo(name, capability, trt.__version__)
    key = engine_key(inputs.manifest, device, inputs.precision, inputs.plan)
    engines_dir = bundle_dir / ENGINES_DIR
    cached = find_engine(engines_dir, key)
    if cached is not None and not options.force:
        return BuildResult(cached, time.perf_counter() - start, reused=True)
    echo(f"building a TensorRT {trt.__version__} engine for {name} (sm {capability}), "
         f"{inputs.precision}, profiles: {', '.join(p.name for p in inputs.plan.profiles)}")
    blob = compile_engine(trt, inputs, options, echo)
    seconds = time.perf_counter() - start
    path = save_engine(engines_dir, key, blob, {"built_at": time.time(), "seconds": seconds})
    for stale in prune_stale(engines_dir, inputs.manifest):
        echo(f"removed stale engine file {stale.name}")
    return BuildResult(path, seconds, reused=False)


def compile_engine(
    trt: ModuleType, inputs: BuildInputs, options: BuildOptions, echo: Echo
) -> bytes:
    """Parse the graph, build the serialized engine and check it (direct TensorRT calls).
    Every failure is one BackendError line carrying what TensorRT's logger said."""
    logger = capturing_logger(trt)
    try:
        blob = _build(trt, logger, inputs, options, echo)
    except BackendError:
        raise
    except Exception as err:  # noqa: BLE001 - TensorRT's bindings raise their own types
        raise BackendError(logger.captured.explain(
            f"TensorRT failed to build the engine ({err})")) from None
    verify_built(trt, logger, blob, inputs)
    return blob


def _build(
    trt: ModuleType, logger: Any, inputs: BuildInputs, options: BuildOptions, echo: Echo
) -> bytes:
    parsed = parse_network(trt, logger, inputs)
    builder, network = parsed.builder, parsed.network
    check_kv_layers(trt, network, inputs.manifest)
    config = builder.create_builder_config()
    if options.workspace_mib:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    for flag in inputs.typing.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    for profile in inputs.plan.profiles:
        optimization = builder.create_optimization_profile()
        for name, shapes in profile.shapes.items():
            optimization.set_shape(name, shapes.min, shapes.opt, shapes.max)
        if config.add_optimization_profile(optimization) < 0:
            raise BackendError(logger.captured.explain(
                f"TensorRT rejected the optimization profile {profile.name}"))
    config.progress_monitor = progress_monitor(trt, echo)
    logger.captured.clear()  # what follows explains a failed build
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise BackendError(logger.captured.explain("TensorRT failed to build the engine"))
    return bytes(blob)


class Parsed(NamedTuple):
    builder: Any
    network: Any
    parser: Any  # owns the weights the network refers to: keep it alive with the network


def parse_network(trt: ModuleType, logger: Any, inputs: BuildInputs) -> Parsed:
    """The network TensorRT's ONNX parser makes of the prepared graph."""
    builder = trt.Builder(logger)
    flags = 0
    strongly = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if inputs.typing.strongly_typed and strongly is not None:  # None: always strong (11.x)
        flags = 1 << int(strongly)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(inputs.graph, str(inputs.graph_path)):
        errors = [" ".join(str(parser.get_error(i)).split()) for i in range(parser.num_errors)]
        raise BackendError("TensorRT's ONNX parser rejected the graph: " + "; ".join(errors[:3]))
    return Parsed(builder, network, parser)


def verify_built(trt: ModuleType, logger: Any, blob: bytes, inputs: BuildInputs) -> None:
    """Load the engine just built and check its profiles and in-place KV aliasing, so a
    wrong engine fails the build rather than the first request."""
    engine = trt.Runtime(logger).deserialize_cuda_engine(blob)
    if engine is None:
        raise BackendError(logger.captured.explain("TensorRT cannot load the engine it built"))
    check_engine(engine, inputs.manifest, inputs.plan, "the built engine")


def check_kv_layers(trt: ModuleType, network: Any, manifest: Manifest) -> None:
    """Exactly one KV-cache update layer (in place) per KV tensor: each TensorScatter was
    imported as one, not as a generic scatter that copies the whole cache each step."""
    found = count_kv_layers(trt, network)
    expected = 2 * manifest.model.kv_layers  # a layer without KV (Llama-Nemotron's) has none
    if found != expected:
        raise BackendError(f"TensorRT imported {found} KV-cache update layers, expected "
                           f"{expected} (one per K and V of each layer with KV): the engine "
                           "would copy the cache every step or miss a write")


def count_kv_layers(trt: ModuleType, network: Any) -> int:
    """KV-cache update layers (IKVCacheUpdateLayer) in a parsed network."""
    # The Python enum name is not documented where we could check: match it by name.
    kinds = [v for n, v in trt.LayerType.__members__.items() if "KV" in n and "CACHE" in n]
    if not kinds:
        raise BackendError("this TensorRT has no KV-cache update layer; it needs >= 10.15")
    return sum(network.get_layer(i).type == kinds[0] for i in range(network.num_layers))


def progress_monitor(trt: ModuleType, echo: Echo) -> Any:
    """A trt.IProgressMonitor printing the builder's top-level phases and their times."""

    class Progress(trt.IProgressMonitor):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.started: dict[str, float] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self.started[phase_name] = time.perf_counter()
            if parent_phase is None:
                echo(f"  {phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True  # never cancel

        def phase_finish(self, phase_name: str) -> None:
            began = self.started.pop(phase_name, None)
            if began is not None and not self.started:
                echo(f"  {phase_name} done in {time.perf_counter() - began:.1f} s")

    return Progress()
