"""Read tensors of a Hugging Face checkpoint (single file or sharded) by name: safetensors,
or PyTorch's pickled `pytorch_model.bin` (older and community checkpoints), read with
torch's weights-only loader where torch is installed."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from edgeprefill.errors import ExportError
from edgeprefill.export import bnb as bnb_format
from edgeprefill.export.bnb import BnbScheme, QuantState
from edgeprefill.export.fp8 import (
    FLOAT8,
    SCALE_SUFFIX,
    UNUSED,
    Fp8Scheme,
    read_float8,
    safetensors_header,
)
from edgeprefill.export.int4_layouts import Int4Weight
from edgeprefill.export.interleaved_halves import Halves, HalvesRule
from edgeprefill.export.joined_tensors import Joined
from edgeprefill.export.lora import Adapter
from edgeprefill.export.lora_parameters import StoredDeltas
from edgeprefill.export.module_names import LoadedModel, ModuleNames, module_names
from edgeprefill.export.prequantized import LABELS, Int4Scheme

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TORCH_INDEX_FILE = "pytorch_model.bin.index.json"
TORCH_FILE = "pytorch_model.bin"
MODEL_FILES = (INDEX_FILE, SINGLE_FILE, TORCH_INDEX_FILE, TORCH_FILE)


# (GPT-2's Hub checkpoints keep their causal-mask buffers as `h.{i}.attn.bias`.)
# (MiniMax's lightning layers keep their decays, each a function of their slope_rate.)
BUFFERS = ("rotary_emb.inv_freq", "attention.bias", "attention.masked_bias", ".attn.bias",
           ".attn.masked_bias", "self_attn.query_decay", "self_attn.key_decay",
           "self_attn.diagonal_decay")
TORCH_DTYPES = {"torch.int8": "I8", "torch.uint8": "U8", "torch.float32": "F32",
                "torch.float16": "F16", "torch.bfloat16": "BF16"}  # safetensors' names
SAME_BLOCK = 1 << 24  # elements per block compared by Checkpoint.same (64 MB in float32)


class Checkpoint:
    """Lazy access to a checkpoint's tensors; each `get` reads one tensor from disk.

    bf16 and fp16 tensors are converted to the requested float dtype on read, so the
    exporter never holds more than one converted tensor per weight at a time.

    A multimodal checkpoint keeps its language model under a prefix (`language_model.model.`
    on the Hub): `renames` maps stored prefixes to the names read (first match wins), as
    transformers' weight renamings do, and tensors under a `left_out` prefix (a vision
    tower) are not the export's: they are counted in `left_out`, never read nor warned of.
    `segments` renames parts inside a name (Sarvam-MoE's `.attention.` is `.self_attn.`):
    each (stored, read as) pair in turn replaces every occurrence, after the prefixes.

    The weights of the modules in `transposed` are stored [in, out] (GPT-2's Conv1D); they
    are read, and their shapes given, as nn.Linear's [out, in], as every other family's.

    In a pre-quantized int4 checkpoint (`int4`, export/prequantized.py) a quantized layer
    stores its codes, scales and zero points instead of its `weight`: the weight's name
    still reads it (`has`, `shape`, and `get`, dequantized to float), and `int4_weight`
    gives it as it is stored, for a MatMulNBits (an act-order one's inputs in group order,
    `int4_order`).

    In a bitsandbytes checkpoint (`bnb`, export/bnb.py) a quantized layer's `weight` holds
    4-bit codes or int8 values beside its side tensors (quant_state, absmax, ... or SCB):
    the weight's name reads it dequantized to float, of the float weight's [out, in] shape
    (a Conv1D's too: bitsandbytes quantizes it as [out, in]), and reading it counts its
    side tensors as read.

    With a LoRA `adapter` (export/lora.py) every tensor is read merged: its delta added,
    or the adapter's copy in its place; a tensor only the adapter holds (modules_to_save's
    head over a tied checkpoint) is read as the checkpoint's own.
    """

    def __init__(self, hf_dir: Path, renames: tuple[tuple[str, str], ...] = (),
                 left_out: tuple[str, ...] = (), fp8: Fp8Scheme | None = None,
                 transposed: tuple[str, ...] = (), int4: Int4Scheme | None = None,
                 segments: tuple[tuple[str, str], ...] = (),
                 adapter: Adapter | None = None, bnb: BnbScheme | None = None,
                 model_types: tuple[str, ...] = (), base: str | None = None,
                 layout: Callable[[str], str] | None = None,
                 joined: tuple[tuple[str, tuple[str, ...]], ...] = (),
                 halves: tuple[HalvesRule, ...] = ()) -> None:
        """`fp8`: the checkpoint's FP8 scheme (export/fp8.py): float8 weights are read
        dequantized by the scales stored beside them. `int4`: its int4 scheme. `bnb`: its
        bitsandbytes scheme. `model_types`: config.json's and its language model's, by whose
        conversion mappings transformers names the stored tensors as it loads them, names
        an adapter may use (export/module_names.py). `base`: the prefix of the base model's
        tensors (`model.`), under which a checkpoint of the base model alone is read
        (_base_renames). `layout`: a family's own map of stored names to those read, after
        the renames (LongCat-Flash's two sublayers per layer: families/longcat.py).
        `joined`: names read as stored tensors concatenated (export/joined_tensors.py:
        Molmo 2's two embedding tables). `halves`: names read as the halves of a stored
        tensor whose rows interleave them (export/interleaved_halves.py: Inkling's image-text
        checkpoints' w13)."""
        self.dir = hf_dir
        self.fp8 = fp8
        self.int4 = int4
        self.bnb = bnb
        self._headers: dict[Path, dict] = {}  # safetensors headers, read for float8 tensors
        self._transposed = tuple(f".{module}.weight" for module in transposed)
        self._handles: dict[Path, object] = {}
        stored = _tensor_files(hf_dir, self._handles)
        renames = renames + _base_renames(stored, renames, base)
        self.left_out = sorted(n for n in stored if n.startswith(left_out)) if left_out else []
        skipped = set(self.left_out)
        # the name read -> (file, the name stored)
        self._layout = layout or (lambda name: name)
        self._file_of = {self._layout(_renamed(n, renames, segments)): (path, n)
                         for n, path in stored.items() if n not in skipped}
        # names read as made from stored tensors (joined, halved); theirs count as read
        self._derived: tuple[Joined | Halves, ...] = (
            Joined(joined, self._file_of.__contains__), Halves(halves, self._file_of))
        self.read: set[str] = set()  # the tensors the export took
        self.adapter: Adapter | None = None  # bound below, once the checkpoint is checked
        self._added: dict[str, np.ndarray] = {}  # the adapter's tensors the checkpoint lacks
        self._int4_modules = self._quantized_modules()  # `{module}.weight` -> module
        if self.int4 is not None and not self._int4_modules:  # a dequantized copy's config
            raise ExportError(
                f"config.json's quantization_config says {LABELS[self.int4.method]} int4, "
                f"but no tensor is stored as its codes (*.{self.int4.codes}): a float copy "
                "of a quantized model? Drop quantization_config from config.json to export "
                "its float weights")
        # bitsandbytes' layers: `X.weight` -> its kind and side tensors; the 4-bit ones' states
        self._bnb_layers = bnb_format.quantized_layers(self._file_of)
        self._bnb_states: dict[str, QuantState] = {}
        self._check_float8()  # before any weight is written: a bad checkpoint fails at once
        self._check_bnb(self._bnb_layers)
        if adapter is not None:
            read_as = {stored: n for n, (_, stored) in self._file_of.items()}
            self._bind(adapter, read_as, renames, segments, left_out,
                       module_names(model_types, read_as))
            self.adapter = adapter
            self._added = {n: t for n, t in adapter.replacements.items()
                           if n not in self._file_of}  # (a modules_to_save head)

    def _bind(self, adapter: Adapter, read_as: dict[str, str],
              renames: tuple[tuple[str, str], ...],
              segments: tuple[tuple[str, str], ...], left_out: tuple[str, ...],
              modules: ModuleNames) -> None:
        """Key the adapter's tensors by the names read here (a transformers module's name
        is the stored one, the read one, or the one transformers 5 renames the stored one
        to as it loads it), and check their shapes before any is read."""
        def read_name(name: str) -> str | None:
            stored = modules.renamed.get(name)
            for candidate in (name, read_as.get(name),
                              self._layout(_renamed(name, renames, segments)),
                              read_as.get(stored) if stored else None):
                if candidate is not None and candidate in self._file_of:
                    return candidate
            return None

        def unmatched(name: str) -> str | None:
            """Why a module the adapter changes reads as no tensor, where this can say."""
            fused = modules.split.get(name)
            if fused is not None:
                return (f"the adapter's LoRA on {name.removesuffix('.weight')} changes a part "
                        f"of the checkpoint's {fused.removesuffix('.weight')}, which "
                        "transformers splits into modules as it loads it: export cannot "
                        "merge a LoRA into a part of a stored tensor")
            shared = _other_application(name, read_as)
            if shared is not None:
                return (f"the adapter's LoRA on {name.removesuffix('.weight')} changes a "
                        f"block the checkpoint stores once ({shared.removesuffix('.weight')}) "
                        "and the model applies at several layers, with a LoRA of its own at "
                        "each: export cannot merge them into the one shared block")
            return None

        if adapter.target_parameters:
            self._bind_parameters(adapter, read_as)
        adapter.renamed(read_name, left_out, unmatched)
        adapter.check_shapes(self._unpacked_shape, self._is_transposed)
        for name in adapter.replacements:
            if name in self._file_of:
                adapter.check_replacement(name, self._unpacked_shape(name))

    def _bind_parameters(self, adapter: Adapter, read_as: dict[str, str]) -> None:
        """Key the deltas of a LoRA on parameters (target_parameters) by the stored tensors
        transformers saves each parameter as (its reverse conversion), checked against
        them before any is read."""
        model = LoadedModel.build(self.dir)
        adapter.bind_parameters(model.parameters())
        parts: dict[str, tuple[str, str]] = {}
        as_loaded: set[str] = set()  # parameters the checkpoint stores as loaded, fused
        for name, delta in adapter.parameter_deltas.items():
            shapes = model.stored_shapes(name, delta.parameter.shape)
            if name in read_as and not all(stored in read_as for stored in shapes):
                shapes = {name: delta.parameter.shape}
                as_loaded.add(name)
            for stored, shape in shapes.items():
                read = read_as.get(stored)
                if read is None:
                    raise ExportError(f"the adapter's LoRA on the parameter {name} changes "
                                      f"{stored}, as transformers saves it, which the "
                                      f"checkpoint in {self.dir} lacks: export cannot merge it")
                self._check_part(adapter, name, read, shape)
                parts[read] = (name, stored)
        adapter.stored_deltas = StoredDeltas(adapter.parameter_deltas, parts, model.stored,
                                             frozenset(as_loaded))

    def _check_part(self, adapter: Adapter, name: str, read: str,
                    shape: tuple[int, ...]) -> None:
        if self._is_transposed(read) or self.is_int4(read):
            raise ExportError(f"the adapter's LoRA on the parameter {name} changes {read}, "
                              "which the checkpoint stores transposed or in int4: export "
                              "cannot merge it")
        if self._unpacked_shape(read) != shape:
            raise ExportError(f"the base model's {read} has shape {self._unpacked_shape(read)}"
                              f", but the adapter's LoRA on the parameter {name} changes it as "
                              f"{shape}: is it the adapter of another model "
                              f"({adapter.base_model})?")

    def names(self) -> set[str]:
        return set(self._file_of) | set(self._int4_modules) | set(self._added) | \
            {name for derived in self._derived for name in derived.parts}

    def has(self, name: str) -> bool:
        return name in self._file_of or name in self._int4_modules or name in self._added \
            or self._derived_of(name) is not None

    def _derived_of(self, name: str) -> Joined | Halves | None:
        return next((derived for derived in self._derived if name in derived), None)

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._bnb_states:
            return self._bnb_states[name].shape
        if name in self._int4_modules:
            assert self.int4 is not None
            return self.int4.shape(self._int4_modules[name], self._stored_shape, self._stored)
        return self._stored_shape(name)

    def _stored_shape(self, name: str) -> tuple[int, ...]:
        derived = self._derived_of(name)
        if derived is not None:
            return derived.shape(name, self._stored_shape)
        added = self._added.get(name)
        shape = tuple(added.shape) if added is not None else self._file_shape(name)
        return shape[::-1] if self._is_transposed(name) else shape

    def _unpacked_shape(self, name: str) -> tuple[int, ...]:
        """The file's shape, a 4-bit bitsandbytes weight's [out, in] (stored packed)."""
        state = self._bnb_states.get(name)
        return state.shape if state is not None else self._file_shape(name)

    def _file_shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape as its file stores it (a Conv1D's [in, out])."""
        path, stored = self._require(name)
        return tuple(self._handle(path).get_slice(stored).get_shape())

    def stored_bytes(self, name: str) -> bool:
        """Whether the tensor is stored as uint8 (BitNet's packed ternary weights)."""
        path, stored = self._require(name)
        if path.suffix == ".bin":
            return self._handle(path).get_tensor(stored).dtype == np.uint8
        return self._header(path)[stored]["dtype"] == "U8"

    def _is_transposed(self, name: str) -> bool:
        return bool(self._transposed) and name.endswith(self._transposed) and \
            name not in self._bnb_layers

    def _require(self, name: str) -> tuple[Path, str]:
        found = self._file_of.get(name)
        if found is None:
            raise ExportError(f"the checkpoint in {self.dir} lacks the tensor {name!r}")
        return found

    def get(self, name: str, dtype: np.dtype = np.float32) -> np.ndarray:
        int4 = self.int4_weight(name)
        if int4 is not None:  # a float weight wanted of an int4 layer: its exact values
            return int4.dequantize().astype(dtype, copy=False)
        return _as_values(name, self._stored(name), dtype)

    def int4_weight(self, name: str) -> Int4Weight | None:
        """The weight `name` as the checkpoint stores it in 4 bits, or None for a float
        one. Its stored parts count as read."""
        module = self._int4_modules.get(name)
        if module is None:
            return None
        assert self.int4 is not None
        weight = self.int4.read(module, self._stored, self.has)
        self.read.add(name)
        return weight

    def int4_order(self, name: str) -> np.ndarray | None:
        """The input order of the int4 weight `name`'s codes (act-order,
        export/act_order.py), or None for the inputs in order; reads its g_idx only."""
        module = self._int4_modules[name]
        assert self.int4 is not None
        return self.int4.order(module, self._stored, self.has, self.shape(name)[1])

    def is_int4(self, name: str) -> bool:
        return name in self._int4_modules

    def _quantized_modules(self) -> dict[str, str]:
        """`{module}.weight` -> module, for each module stored as int4 codes."""
        if self.int4 is None:
            return {}
        suffix = "." + self.int4.codes
        return {n.removesuffix(suffix) + ".weight": n.removesuffix(suffix)
                for n in self._file_of if n.endswith(suffix)}

    def _stored(self, name: str) -> np.ndarray:
        """A tensor as stored (float8 ones dequantized, an adapter's merged), counted as
        read."""
        tensor = self._merged(name)
        self.read.add(name)
        return tensor.T if self._is_transposed(name) else tensor

    def _merged(self, name: str) -> np.ndarray:
        """A tensor in its file's layout, with the adapter's change merged."""
        added = self._added.get(name)
        tensor = added if added is not None else self._from_file(name)
        if self.adapter is None:
            return tensor
        return self.adapter.merged(name, tensor, self._is_transposed(name))

    def _from_file(self, name: str) -> np.ndarray:
        derived = self._derived_of(name)
        if derived is not None:
            return derived.values(name, self._stored)  # (what it is made of counts as read)
        path, stored = self._require(name)
        if self._float8(path, stored):
            return self._dequantized(name, path, stored)
        if name in self._bnb_layers:
            return self._bnb_dequantized(name)
        return self._as_stored(name)

    def _as_stored(self, name: str) -> np.ndarray:
        """A tensor as its file stores it (not counted as read)."""
        path, stored = self._require(name)
        try:
            return self._handle(path).get_tensor(stored)
        except (SafetensorError, OSError, ValueError) as err:
            raise ExportError(f"cannot read {name!r} from {path.name}: {err}") from None

    def get_index(self, name: str, index: int | slice,
                  dtype: np.dtype = np.float32) -> np.ndarray:
        """`name`[index] along its first axis, read alone (one expert of a fused [E, ...]
        tensor, or a slice of rows of DBRX's [E * I, H]: the whole tensor of a large
        model's layer is gigabytes)."""
        path, stored = self._require(name)
        if self._float8(path, stored) or name in self._bnb_layers:
            raise ExportError(f"{name!r} is a fused quantized tensor, which export cannot read "
                              "by parts")
        adapter = self.adapter
        if adapter is not None and adapter.touches(name) and not adapter.dense(name):
            raise ExportError(f"the adapter changes {name}, a fused tensor of MoE experts, "
                              "other than by a LoRA on it as a parameter: export cannot merge "
                              "it")
        try:
            tensor = np.asarray(self._handle(path).get_slice(stored)[index])
        except (SafetensorError, OSError, ValueError) as err:
            raise ExportError(f"cannot read {name!r} from {path.name}: {err}") from None
        self.read.add(name)
        if adapter is not None and adapter.dense(name):  # (a LoRA on fused experts)
            tensor = tensor.astype(np.float32) + adapter.dense_delta(name)[index]
        return _as_values(name, tensor, dtype)

    def _float8(self, path: Path, stored: str) -> bool:
        return path.suffix != ".bin" and self._header(path)[stored]["dtype"] in FLOAT8

    def _check_float8(self) -> None:
        """Every float8 weight has the fp8 scheme and a scale of the block grid's shape."""
        for name, (path, stored) in self._file_of.items():
            if not self._float8(path, stored) or name.endswith(SCALE_SUFFIX):
                continue
            if self.fp8 is None:
                raise ExportError(f"{stored} in {path.name} is stored as "
                                  f"{self._header(path)[stored]['dtype']}, but config.json "
                                  "has no fp8 quantization_config to say how to scale it")
            if not self.has(name + SCALE_SUFFIX):
                raise ExportError(f"the fp8 weight {name!r} has no {name + SCALE_SUFFIX!r} "
                                  "beside it")
            self.fp8.check(name, self.shape(name), self.shape(name + SCALE_SUFFIX))

    def _dequantized(self, name: str, path: Path, stored: str) -> np.ndarray:
        """A float8 weight times its `weight_scale_inv`; the module's unused activation
        scale counts as read."""
        assert self.fp8 is not None  # _check_float8
        weight = read_float8(path, stored, self._header(path))
        scale_name = name + SCALE_SUFFIX
        scale_path, scale_stored = self._require(scale_name)
        scale = (read_float8(scale_path, scale_stored, self._header(scale_path))
                 if self._header(scale_path)[scale_stored]["dtype"] in FLOAT8
                 else self.get(scale_name))
        self.read.add(scale_name)
        module = name.rsplit(".", 1)[0] + "."
        self.read.update(module + unused for unused in UNUSED if self.has(module + unused))
        return self.fp8.dequantize(weight, scale)

    def _check_bnb(self, layers: dict[str, bnb_format.Layer]) -> None:
        """Every layer stored by bitsandbytes has the scheme, its weight and side tensors,
        of the sizes its quant state implies; under the scheme, no integer weight is
        without them."""
        if layers and self.bnb is None:
            weight = min(layers)
            raise ExportError(f"{weight} is stored by bitsandbytes ({layers[weight].parts[0]} "
                              "beside it), but config.json has no bitsandbytes "
                              "quantization_config")
        for weight, layer in sorted(layers.items()):
            if weight not in self._file_of:
                raise ExportError(f"the checkpoint stores {layer.parts[0]} but not the "
                                  f"bitsandbytes weight {weight!r} it belongs to")
            if layer.kind == bnb_format.FOUR_BIT:
                state = bnb_format.quant_state(weight, layer.parts, self._as_stored,
                                               self._file_shape)
                bnb_format.check_packed(weight, state, self._nbytes(weight))
                self._bnb_states[weight] = state
            else:
                module = weight.removesuffix("weight")
                scb, layout = module + "SCB", module + "weight_format"
                bnb_format.check_int8(
                    weight, self._file_shape(weight), self._dtype(weight) == "I8",
                    math.prod(self._file_shape(scb)) if self.has(scb) else None,
                    self._as_stored(layout) if self.has(layout) else None)
        if self.bnb is not None:
            for name in sorted(self._file_of):
                if name.endswith(".weight") and name not in layers and \
                        self._dtype(name) in ("I8", "U8"):
                    raise ExportError(f"{name} is stored as {self._dtype(name)} with none of "
                                      "bitsandbytes' tensors beside it (a quant_state, an "
                                      "SCB): how to dequantize it is unknown")

    def _bnb_dequantized(self, name: str) -> np.ndarray:
        """A bitsandbytes layer's float32 weight (export/bnb.py); its side tensors count
        as read."""
        layer = self._bnb_layers[name]
        self.read.update(layer.parts)
        if layer.kind == bnb_format.INT8:
            return bnb_format.dequantize_int8(
                self._as_stored(name), self._as_stored(name.removesuffix("weight") + "SCB"))
        return bnb_format.dequantize_4bit(self._bytes(name), self._bnb_states[name],
                                          self._as_stored, name)

    def _dtype(self, name: str) -> str:
        """The tensor's dtype as safetensors names it (I8, U8, BF16, F32, ...)."""
        path, stored = self._require(name)
        if path.suffix == ".bin":
            return self._handle(path).dtype(stored)
        return self._header(path)[stored]["dtype"]

    def _nbytes(self, name: str) -> int:
        path, stored = self._require(name)
        if path.suffix == ".bin":
            return self._handle(path).nbytes(stored)
        start, end = self._header(path)[stored]["data_offsets"]
        return end - start

    def _bytes(self, name: str) -> np.ndarray:
        """The tensor's bytes, flat uint8, whatever dtype stores them (bitsandbytes'
        packed 4-bit codes may be stored as bf16 or float32: bnb_4bit_quant_storage)."""
        path, stored = self._require(name)
        if path.suffix == ".bin":
            return self._handle(path).get_bytes(stored)
        return np.ascontiguousarray(self._as_stored(name)).reshape(-1).view(np.uint8)

    def _header(self, path: Path) -> dict:
        if path not in self._headers:
            self._headers[path] = safetensors_header(path)
        return self._headers[path]

    def same(self, a: str, b: str) -> bool:
        """Whether two tensors of at least one dimension hold the same values (as
        torch.equal), read a block of rows at a time: an embedding and a head of a large
        vocabulary are never both in memory. Neither counts as read. The values are the
        checkpoint's, unmerged: transformers ties a head at load, before peft's adapter."""
        shape = self.shape(a)
        if shape != self.shape(b) or a in self._bnb_layers or b in self._bnb_layers:
            return False  # (a quantized head is never the float embedding it would tie to)
        step = max(1, SAME_BLOCK // max(1, math.prod(shape[1:])))
        blocks = [(start, min(start + step, shape[0])) for start in range(0, shape[0], step)]
        return all(np.array_equal(self._rows(a, *block), self._rows(b, *block))
                   for block in blocks)

    def _rows(self, name: str, start: int, stop: int) -> np.ndarray:
        # (only embeddings and LM heads are compared, never a transposed weight)
        path, stored = self._require(name)
        part = self._handle(path).get_slice(stored)
        # safetensors' slices do not clip: `stop` is within the tensor
        return np.asarray(part[start:stop], np.float32)  # bf16 and fp16 widen exactly

    def unused(self) -> list[str]:
        """Tensors the export did not take, beyond buffers transformers recomputes (rotary
        inv_freq, GPT-NeoX's causal-mask buffers): a config that disagrees with its
        checkpoint (num_hidden_layers 1 over two layers' weights) exports silently else."""
        taken = set(self._file_of) | set(self._added)
        return sorted(n for n in taken - self.read if not n.endswith(BUFFERS))

    def _handle(self, path: Path):
        if path not in self._handles:
            if path.suffix == ".bin":
                self._handles[path] = TorchFile(path)
                return self._handles[path]
            try:
                self._handles[path] = safe_open(str(path), framework="numpy")
            except (SafetensorError, OSError) as err:
                raise ExportError(f"{path} is not a readable safetensors file: {err}") from None
        return self._handles[path]


class TorchFile:
    """A `pytorch_model.bin` read as safe_open reads safetensors (get_tensor, get_slice's
    shape, keys). torch.load with weights_only unpickles tensors and plain containers
    only, never code, and mmap maps the tensors' bytes instead of reading them all."""

    def __init__(self, path: Path) -> None:
        try:
            import torch
        except ImportError:
            raise ExportError(
                f"{path.name} is a PyTorch pickle, which needs torch to read: pip install "
                "'edgeprefill[export]', or save the checkpoint as safetensors") from None
        try:
            tensors = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as err:  # noqa: BLE001 - torch raises many kinds for a bad file
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ExportError(f"{path} is not a readable PyTorch checkpoint: {first}") from None
        if not isinstance(tensors, dict) or not all(
                isinstance(t, torch.Tensor) for t in tensors.values()):
            raise ExportError(f"{path} holds no state dict (a mapping of names to tensors)")
        self.tensors = tensors

    def keys(self) -> list[str]:
        return list(self.tensors)

    def get_slice(self, name: str) -> TorchFile._Slice:
        return TorchFile._Slice(self.tensors[name])

    def get_tensor(self, name: str) -> np.ndarray:
        return _to_numpy(self.tensors[name])

    def get_bytes(self, name: str) -> np.ndarray:
        """The tensor's bytes, flat uint8."""
        import torch

        return self.tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy()

    def nbytes(self, name: str) -> int:
        tensor = self.tensors[name]
        return tensor.numel() * tensor.element_size()

    def dtype(self, name: str) -> str:
        """The tensor's dtype as safetensors names it (I8, U8, F32, BF16, ...)."""
        return TORCH_DTYPES.get(str(self.tensors[name].dtype), str(self.tensors[name].dtype))

    class _Slice:
        """A tensor's shape and rows, as safetensors' get_slice gives them."""

        def __init__(self, tensor) -> None:
            self.tensor = tensor

        def get_shape(self) -> tuple[int, ...]:
            return tuple(self.tensor.shape)

        def __getitem__(self, rows) -> np.ndarray:
            return _to_numpy(self.tensor[rows])


def _to_numpy(tensor) -> np.ndarray:
    import torch

    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: exactly widened
        tensor = tensor.float()
    return tensor.numpy()


def _other_application(name: str, stored: dict[str, str]) -> str | None:
    """The stored tensor of a shared block (Zamba's) that `name` is another layer's
    application of: the same name at another layer index; None if there is none."""
    match = re.search(r"\.layers\.\d+\.", name)
    if match is None:
        return None
    head, tail = name[:match.start()], name[match.end():]
    return next((n for n in stored if n.startswith(head + ".layers.") and n.endswith(tail)
                 and re.fullmatch(r"\d+", n[len(head) + 8:len(n) - len(tail) - 1])), None)


def _base_renames(stored: Iterable[str], renames: tuple[tuple[str, str], ...],
                  base: str | None) -> tuple[tuple[str, str], ...]:
    """A checkpoint saved from the base model (transformers' `base_model_prefix` left
    off: Qwen3-Embedding's `embed_tokens.weight`, `layers.0...`, `norm.weight`, no LM
    head) read under `base`, as transformers loads it into the causal LM: every tensor but
    an `lm_head.` one. Only where no stored name starts with `base` nor with a prefix the
    family renames (GPT-2's `h.`: a family's own layout)."""
    names = list(stored)
    sources = (base, *(source for source, _ in renames)) if base else ()
    if not base or not names or any(n.startswith(sources) for n in names):
        return ()
    return (("lm_head.", "lm_head."), ("", base))


def _renamed(name: str, renames: tuple[tuple[str, str], ...],
             segments: tuple[tuple[str, str], ...]) -> str:
    for stored, read_as in renames:
        if name.startswith(stored):
            name = read_as + name[len(stored):]
            break
    for stored, read_as in segments:
        name = name.replace(stored, read_as)
    return name


def _tensor_files(hf_dir: Path, handles: dict[Path, object]) -> dict[str, Path]:
    """Tensor name -> the file holding it: safetensors where the folder has them (a
    checkpoint may ship both), else PyTorch's files. A single PyTorch file is unpickled
    to list its names: kept in `handles`, so reading the tensors does not unpickle it
    again."""
    for index_file, single_file in ((INDEX_FILE, SINGLE_FILE), (TORCH_INDEX_FILE, TORCH_FILE)):
        if (hf_dir / index_file).is_file():
            return _indexed_files(hf_dir, index_file)
        if (hf_dir / single_file).is_file():
            return _single_file(hf_dir / single_file, handles)
    raise ExportError(
        f"no {SINGLE_FILE}, {INDEX_FILE}, {TORCH_FILE} or {TORCH_INDEX_FILE} in {hf_dir}")


def _indexed_files(hf_dir: Path, index_file: str) -> dict[str, Path]:
    index = hf_dir / index_file
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ExportError(f"{index} is malformed: {err}") from None
    if not isinstance(weight_map, dict) or not all(
            isinstance(f, str) for f in weight_map.values()):
        raise ExportError(f"{index} is malformed: weight_map must map tensor names to "
                          "file names")
    files = {name: hf_dir / file for name, file in weight_map.items()}
    for path in set(files.values()):
        if not path.is_file():
            raise ExportError(f"{path} is listed in {index_file} but missing")
    if index_file == INDEX_FILE:  # a stale index may name a tensor its shard lacks
        held = {path: set(_safetensors_names(path)) for path in set(files.values())}
        absent = next((name for name, path in files.items() if name not in held[path]), None)
        if absent is not None:
            raise ExportError(f"{index_file} lists {absent!r} in {files[absent].name}, "
                              "which does not hold it (an index of another download?)")
    return files


def _single_file(single: Path, handles: dict[Path, object]) -> dict[str, Path]:
    if single.suffix == ".bin":
        handle = handles[single] = TorchFile(single)
        return {name: single for name in handle.keys()}
    return {name: single for name in _safetensors_names(single)}


def _safetensors_names(path: Path) -> list[str]:
    """The tensors a safetensors file holds (its header alone is read)."""
    try:
        with safe_open(str(path), framework="numpy") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as err:
        raise ExportError(f"{path} is not a readable safetensors file: {err}") from None


def _as_values(name: str, tensor: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The tensor as `dtype`. An integer tensor wanted as floats is refused: every scheme
    export knows (int4, bitsandbytes, float8) is read before this, so integers here are a
    damaged header or an unknown quantization, whose codes would be exported as weights."""
    # (bfloat16, ml_dtypes' type, is no numpy floating kind: only integers are refused)
    if np.issubdtype(np.dtype(dtype), np.floating) and tensor.dtype.kind in "iub":
        raise ExportError(f"{name} is stored as {tensor.dtype}, not as floats: a damaged "
                          "checkpoint, or quantized in a format export does not read")
    return tensor.astype(dtype, copy=False)


def stored_apart(ckpt: Checkpoint, fused: str, first: str) -> bool:
    """Whether a fused projection (a gate_up module) is stored as its parts instead: the
    checkpoint lacks `fused`.weight and holds its first part's, `first`.weight (MiniMax-M3's
    Hub layout, gate_proj and up_proj, which transformers joins at load)."""
    return not ckpt.has(fused + ".weight") and ckpt.has(first + ".weight")
