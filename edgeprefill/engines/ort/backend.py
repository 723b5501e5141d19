"""ONNX Runtime backend: one InferenceSession, the KV arena bound in place with IOBinding.

Every KV input and its present output are bound to the same address (a layer whose value
is its key, multi-head latent attention: its key and value pairs to one, value_cache.py),
which makes GroupQueryAttention share the buffer and TensorScatter update it in place: no
step copies the cache. Bindings are cached per (first slot, rows), so a step rebinds only
the three small inputs. On the CUDA and TensorRT providers the arena lives in device
memory and is bound by pointer the same way: the backend holds one `KVArena` (ort.arena,
host or device) and never branches on where it lives; GPU options come from
ort.providers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeprefill.bundle import MANIFEST_FILE, Manifest, load_graph, resolve_inside
from edgeprefill.contract import (
    CAPACITY,
    INPUT_IDS,
    PAST_LENS,
    VALID_LENS,
    check_loaded_io,
    kv_buffers,
    kv_dims,
    kv_pairs,
    state_pairs,
    step_output,
)
from edgeprefill.engines.base import Backend, BackendOptions, StepBatch, spin_default
from edgeprefill.engines.ort.arena import DeviceArena, HostArena, KVArena
from edgeprefill.engines.ort.bf16_compute import choose as choose_compute
from edgeprefill.engines.ort.device_states import DeviceStates
from edgeprefill.engines.ort.f32_projections import choose as choose_f32
from edgeprefill.engines.ort.fusing import quantized_ops, stock_attention
from edgeprefill.engines.ort.fusing import why_not as why_not_fused
from edgeprefill.engines.ort.gpu_shapes import padded
from edgeprefill.engines.ort.gpu_shapes import warm_up_steps as gpu_warm_up_steps
from edgeprefill.engines.ort.host_total import (
    HOST_TOTAL,
    feed_total_from_host,
    feeds_total,
    host_total,
)
from edgeprefill.engines.ort.int4_decode import choose as choose_int4_decode
from edgeprefill.engines.ort.int4_prefill import choose as choose_int4_prefill
from edgeprefill.engines.ort.int4_prefill import every_row_as_decode
from edgeprefill.engines.ort.int8_rows import choose as choose_int8_rows
from edgeprefill.engines.ort.int8_rows import why_not as int8_rows_why_not
from edgeprefill.engines.ort.int8_unsigned import Int8Unsigned
from edgeprefill.engines.ort.int8_unsigned import choose as choose_int8_unsigned
from edgeprefill.engines.ort.providers import (
    KV_WRITE_OP,
    GpuSettings,
    check_placement,
    configure_gpu_session,
    dimension_overrides,
    gpu_settings,
    load_cuda_libraries,
    missing_kernel,
    missing_provider,
    provider_options,
    refuse_device,
)
from edgeprefill.engines.ort.state_arena import StateArena, StatePairs
from edgeprefill.engines.ort.switches import merge_switches
from edgeprefill.engines.ort.value_cache import shared_layers
from edgeprefill.errors import BackendError
from edgeprefill.kernels.build import library_path
from edgeprefill.kernels.rms_norm import fold_norms
from edgeprefill.kernels.select import choose as choose_kernels
from edgeprefill.kernels.select import takes_every_attention
from edgeprefill.kernels.select import why_not as kernels_why_not
from edgeprefill.kernels.swiglu import fold_gated

log = logging.getLogger(__name__)

PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}


# Where an op of the ort flavour reads its cos table: GroupQueryAttention rotating inside,
# or RotaryEmbedding where a family rotates outside attention (HunYuan).
COS_INPUT = {"GroupQueryAttention": 7, "RotaryEmbedding": 2}


def _check_rotary_positions(graph: Any, max_context: int) -> None:
    """The rotary tables hold max_context + 1 positions (export.flavors): a manifest whose
    max_context claims more was edited, and its first long request would fail mid-run."""
    sizes = {t.name: t.dims[0] for t in graph.graph.initializer if t.dims}
    for node in graph.graph.node:
        at = COS_INPUT.get(node.op_type)
        if at is not None and len(node.input) > at and \
                sizes.get(node.input[at], max_context + 1) < max_context + 1:
            raise BackendError(
                f"{MANIFEST_FILE} says max_context {max_context}, but the graph's rotary "
                f"tables hold {sizes[node.input[at]] - 1} positions: the manifest was "
                "edited; re-export the bundle")


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def physical_cores() -> int:
    """Cores, not hyper-threads: ORT's intra-op pool scales with physical cores."""
    try:
        ids, physical = set(), "0"
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("physical id"):
                    physical = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    ids.add((physical, line.split(":")[1].strip()))
    except OSError:
        ids = set()
    return len(ids) or os.cpu_count() or 1


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, bundle_dir: Path, manifest: Manifest, options: BackendOptions) -> None:
        super().__init__(bundle_dir, manifest, options)
        import onnxruntime as ort

        self._ort = ort
        if options.device not in PROVIDERS:
            raise BackendError(
                f"unknown device {options.device!r}; choose one of: {', '.join(PROVIDERS)}"
            )
        refuse_device(options.device)
        self._gpu: GpuSettings | None = None  # GPU provider settings; None on the CPU
        self._libraries_said = ""  # what loading the CUDA libraries printed (providers.py)
        if options.device != "cpu":
            self._gpu = gpu_settings(bundle_dir, manifest, options.engine_dir)
            wanted = PROVIDERS[options.device][0]
            problem = missing_provider(wanted, ort.get_available_providers())
            if manifest.graph.flavor == "standard":
                problem = problem or missing_kernel(
                    ort, wanted, KV_WRITE_OP, manifest.graph.opsets.get("", 24))
            if problem:
                raise BackendError(problem)
            self._libraries_said = load_cuda_libraries(ort)
        graph_path = resolve_inside(bundle_dir, manifest.graph.file)
        graph = load_graph(bundle_dir, manifest)  # refuses external data outside the bundle
        _check_rotary_positions(graph, manifest.max_context)
        # Multi-head latent attention: one buffer as a layer's key and value caches.
        self._value_is_key = shared_layers(graph, manifest, options.device)
        self._kv_buffers = kv_buffers(manifest.graph, bool(self._value_is_key))
        self.threads = options.threads or physical_cores()
        if self.threads > _usable_cpus():
            log.warning("%d compute threads on %d usable CPUs: they wait for each other "
                        "(with --spin several times slower); the default is the physical "
                        "cores", self.threads, _usable_cpus())
        providers = PROVIDERS[options.device]
        session_options = self._session_options()
        # Whether the native library runs here (built, this CPU, an ort float32 bundle, not
        # turned off). Every rewrite to its ops asks this, not whether an attention layer
        # took the kernels: a graph whose attention they do not take (a smooth softmax)
        # still gets the native projections, and `inspect`, which asks the same, says what
        # runs.
        native = kernels_why_not(manifest.graph.flavor, manifest.graph.dtype,
                                 options.device) is None
        # int4 bundles: a faster prefill projection than decode's (engines.ort.int4_prefill),
        # each row quantized on its own where the native MatMulInt8 will run.
        rows = manifest.graph.quantization == "int4" and int8_rows_why_not(native) is None
        self.int4_prefill = choose_int4_prefill(
            graph, bundle_dir, manifest.graph.flavor, options.device, session_options, rows,
            manifest.graph.dtype)
        # The native attention kernels where their library is built (edgeprefill.kernels).
        self.kernels = choose_kernels(graph, manifest.graph.flavor, manifest.graph.dtype,
                                      options.device)
        # --compute bf16: float32 projections (MatMulBf16) and prefill attention in bf16,
        # and a bf16 KV cache where only that attention reads it.
        self._kv_pairs = kv_pairs(manifest.graph)
        self.compute = choose_compute(
            graph, bundle_dir, options.compute, self.kernels.described, native,
            session_options, self._kv_pairs,
        )
        # float32 projections (--compute fp32, the default): MatMulF32 where the native
        # kernels run, for its decode steps' bandwidth.
        self.f32 = choose_f32(graph, bundle_dir, options.compute, native, session_options)
        # int4 bundles' decode projections: MatMulInt4 where the native kernels run (VNNI or AVX2).
        every_row = manifest.graph.quantization == "int4" and every_row_as_decode()
        self.int4_decode = choose_int4_decode(graph, bundle_dir, native, session_options,
                                              every_row)
        # int8 bundles' projections: MatMulInt8, each row quantized on its own (VNNI).
        self.int8_rows = choose_int8_rows(graph, bundle_dir, native, session_options)
        projections = ((rows and self.int4_prefill.rewritten) or self.compute.rewritten
                       or self.f32.rewritten
                       or self.int4_decode.rewritten or self.int8_rows.rewritten)
        if self.kernels.library is not None or projections:  # the library's ops run
            session_options.register_custom_ops_library(str(library_path()))
        # The DynamicQuantizeMatMul left (int8 bundles, int4 prefill's derived int8) on uint8
        # weights where this CPU's int8 GEMM would saturate (no VNNI: int8_unsigned.py).
        self.int8_unsigned = (choose_int8_unsigned(graph, bundle_dir, session_options)
                              if options.device == "cpu" else Int8Unsigned(0, ""))
        # A chunk and other requests' decode rows share a call where that changes no row's
        # numbers (engines/ort/fusing.py); else this says why not.
        self._why_not_fused = why_not_fused(manifest.graph, stock_attention(graph),
                                            quantized_ops(graph), takes_every_attention(graph))
        # int4 prefill switches projections on "the chunk is one token": one If per step.
        self.switches = merge_switches(graph)
        # A SwiGlu after a native gate/up projection runs inside it (kernels/swiglu.py);
        # after the merge, which puts an int4 prefill's projection beside its SwiGlu.
        self.gated = fold_gated(graph)
        # And a SkipRmsNorm before one runs inside it too (kernels/rms_norm.py).
        self.norms = fold_norms(graph)
        # BitNet's ternary projections as integer GEMMs (export/bitlinear.py), for --stats.
        self.integer_projections = sum(n.op_type == "MatMulInteger" for n in graph.graph.node)
        # On a GPU provider GroupQueryAttention's total length is bound from the host
        # (engines/ort/host_total.py: the in-graph one gave wrong logits on CUDA).
        self.host_total = feeds_total(options.device) and feed_total_from_host(graph)
        rewritten = bool(self.kernels.library is not None or projections
                         or self.int4_prefill.rewritten or self.switches.merged
                         or self.int8_unsigned.rewritten or self.host_total)
        model = loadable(graph_path, graph, rewritten, session_options)
        self.session = ort.InferenceSession(
            model, session_options, providers=providers,
            provider_options=self._provider_options(providers),
        )
        self._check_providers()
        check_loaded_io(manifest,
                        [i.name for i in self.session.get_inputs() if i.name != HOST_TOTAL],
                        [o.name for o in self.session.get_outputs()])
        self.arena: KVArena | None = None  # host memory on the CPU, device memory on a GPU
        self._capacity = 0  # allocate_kv's
        # the state layers' (LFM2, Qwen3.5): host memory on the CPU, device memory on a GPU
        self.state: StateArena | DeviceStates | None = None
        self._bindings: dict[tuple[int, int], Any] = {}  # ort.IOBinding per (first, rows)
        # logits, or an embedding bundle's hidden states (contract.step_output)
        self._output = step_output(manifest)
        self._logits = np.empty((0, self._output.width), np.float32)

    @property
    def why_not_fused(self) -> str | None:
        return self._why_not_fused

    @property
    def kv_dtype(self) -> np.dtype:
        return self.compute.kv_dtype or super().kv_dtype

    @property
    def value_is_key(self) -> list[int]:
        return self._value_is_key

    def _session_options(self) -> Any:
        ort = self._ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if self.options.optimize
            else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
        so.log_severity_level = 3  # errors only: ORT's warnings are not the user's concern
        spin = spin_default() if self.options.spin is None else self.options.spin
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        # Spin only while a step runs: threads spinning between steps would take the core
        # the engine needs to sample, stream and schedule (on 2 cores, the slow mode).
        so.add_session_config_entry("session.force_spinning_stop", "1")
        if self._gpu is not None:
            configure_gpu_session(ort, so)
            for axis, size in dimension_overrides(self.options.device, self._gpu).items():
                so.add_free_dimension_override_by_name(axis, size)
        return so

    def _provider_options(self, providers: list[str]) -> list[dict[str, str]]:
        if self._gpu is None:
            return [{} for _ in providers]
        return provider_options(providers, self.manifest, self._gpu)

    def _check_providers(self) -> None:
        # ONNX Runtime silently falls back to the CPU when a GPU provider fails to load.
        wanted = PROVIDERS[self.options.device][0]
        got = self.session.get_providers()
        if wanted not in got:
            said = f" (loading them: {self._libraries_said[:400]})" if self._libraries_said else ""
            raise BackendError(
                f"ONNX Runtime could not use {wanted} (it fell back to {', '.join(got)}); "
                f"check the onnxruntime-gpu install and the CUDA libraries{said}"
            )
        if self._gpu is not None:
            check_placement(self.session, wanted)

    def allocate_kv(self, slots: int, capacity: int) -> None:
        shapes = [(slots, heads, capacity, dim)
                  for heads, dim in kv_dims(self.manifest.graph, self._kv_buffers)]
        self.arena = None  # free the old arena before the new one
        self._capacity = capacity  # positions per slot: how far a padded chunk may write
        self._bindings.clear()
        if self._gpu is None:
            self.arena = HostArena(shapes, self.kv_dtype, slots)
        else:
            self.arena = self._device_arena(shapes, slots)
        pairs = state_pairs(self.manifest.graph)
        self.state = None
        if pairs:
            self.state = (StateArena(pairs, self.manifest.graph.inputs, slots)
                          if self._gpu is None else self._device_states(pairs, slots))
        self._logits = np.empty((slots, self._output.width), np.float32)

    def _device_arena(self, shapes: Sequence[tuple[int, ...]], slots: int) -> DeviceArena:
        assert self._gpu is not None, "a device arena is for the GPU providers"
        pinned = dimension_overrides(self.options.device, self._gpu).get(CAPACITY)
        capacity = shapes[0][2] if shapes else None  # None: no KV (Mamba-2)
        if pinned is not None and capacity is not None and pinned != capacity:
            raise BackendError(
                f"the TensorRT provider runs the graph at a KV capacity of {pinned} (the "
                f"bundle's max context), not {capacity}; run with max_context {pinned}"
            )
        return DeviceArena(self._ort, shapes, self.kv_dtype, slots,
                           self.session.get_providers())

    def _device_states(self, pairs: StatePairs, slots: int) -> DeviceStates:
        return DeviceStates(self._ort, pairs, self.manifest.graph.inputs, slots,
                            self.session.get_providers())

    def kv_arrays(self) -> list[np.ndarray]:
        """The arena, layer-major [K0, V0, K1, V1, ...], a layer whose value is its key with
        one array (CPU numpy, for inspection; a copy when the arena is on a GPU)."""
        return self.arena.host_arrays() if self.arena is not None else []

    def _slot_count(self) -> int:
        return self.arena.slots if self.arena is not None else 0

    def warm_up_steps(self, length: int, slots: int) -> list[StepBatch]:
        """On a GPU provider every shape the runtime sends (engines/ort/gpu_shapes.py);
        on the CPU the default two calls."""
        if self._gpu is None:
            return super().warm_up_steps(length, slots)
        self._allocated()
        return gpu_warm_up_steps(self.manifest.chunks, self._capacity, slots)

    def run(self, step: StepBatch) -> np.ndarray:
        if self._gpu is not None:  # a bucket's width: a shape the load ran (gpu_shapes.py)
            step = padded(step, self.manifest.chunks, self._capacity)
        binding = self._binding(step.first_slot, step.rows)
        binding.bind_cpu_input(INPUT_IDS, step.input_ids)
        binding.bind_cpu_input(PAST_LENS, step.past_lens)
        binding.bind_cpu_input(VALID_LENS, step.valid_lens)
        if self.host_total:
            binding.bind_cpu_input(HOST_TOTAL, host_total(step))
        self.session.run_with_iobinding(binding)
        if self.state is not None:
            self.state.store(step.first_slot, step.rows)
        return self._logits[: step.rows]

    def _binding(self, first: int, rows: int) -> Any:
        key = (first, rows)
        if key not in self._bindings:
            if first < 0 or first + rows > self._slot_count():
                raise BackendError(f"slots {first}..{first + rows - 1} are not allocated")
            self._bindings[key] = self._bind_buffers(first, rows)
        return self._bindings[key]

    def _bind_buffers(self, first: int, rows: int) -> Any:
        binding = self.session.io_binding()
        logits = self._logits[:rows]
        binding.bind_output(self._output.name, "cpu", 0, np.float32, logits.shape,
                            logits.ctypes.data)
        self._allocated().bind(binding, self._kv_buffers, first, rows)
        if self.state is not None:
            self.state.bind(binding, first, rows)
        return binding

    def copy_kv(self, src_slot: int, dst_slot: int, length: int) -> None:
        self._allocated().copy(src_slot, dst_slot, length)
        if self.state is not None:
            self.state.copy(src_slot, dst_slot)

    def swap_kv(self, a: int, b: int, length: int) -> None:
        self._allocated().swap(a, b, length)
        if self.state is not None:
            self.state.swap(a, b)

    def save_state(self, slot: int) -> object:
        return self._states().save(slot)

    def restore_state(self, saved: object, slot: int) -> None:
        assert isinstance(saved, list), "a snapshot is StateArena.save's list of rows"
        self._states().restore(saved, slot)

    def _states(self) -> StateArena | DeviceStates:
        if self.state is None:
            raise BackendError("this bundle's layers carry no recurrent state (or "
                               "allocate_kv was not called)")
        return self.state

    def _allocated(self) -> KVArena:
        if self.arena is None:
            raise BackendError("allocate_kv must be called before the KV cache is used")
        return self.arena

    def close(self) -> None:
        # Drop the session too: its weights would otherwise stay until a GC cycle.
        self._bindings.clear()
        self.arena = None
        self.state = None
        self.session = None


def loadable(graph_path: Path, graph: Any, rewritten: bool, session_options: Any) -> str | bytes:
    """What InferenceSession loads: the bundle's graph file where no load-time rewrite
    changed `graph`, else `graph`'s bytes, serialized once after all of them; the weights
    stay in the bundle's files either way."""
    if not rewritten:
        return str(graph_path)
    session_options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(graph_path.parent)
    )
    serialized: bytes = graph.SerializeToString()
    return serialized
