"""A PEFT LoRA adapter, merged into the base model's weights as the export reads them.

A fine-tune with PEFT (LoRA, QLoRA, Unsloth) saves an adapter folder beside the base model:
`adapter_config.json` and `adapter_model.safetensors` (or `.bin`). Its tensors are named
`base_model.model.<module>.<part>`, the adapter's own name dropped on save:

  <module>.lora_A.weight [r, in], <module>.lora_B.weight [out, r]   a Linear's (Conv1D's) delta
  <module>.lora_B.bias [out]                                         lora_bias: a bias delta
  <module>.lora_embedding_A [r, vocab], <module>.lora_embedding_B [width, r]   an Embedding's
  <module>.base_layer.<param>, <module>.<param>   full tensors: modules_to_save, bias "all" /
      "lora_only", an embedding table saved with the adapter: they replace the base's

Merging is peft's `LoraLayer.get_delta_weight`: W' = W + scale * B @ A, scale = alpha / r
(alpha / sqrt(r) with use_rslora), r and alpha per module by rank_pattern / alpha_pattern;
an Embedding's delta is (B @ A)^T, and a GPT-2 Conv1D's, stored [in, out], is transposed
likewise (peft's fan_in_fan_out, which it sets per module: on for Conv1D, off for Linear,
whatever the config says). The merge happens on each tensor as it is read, one at a time:
`Checkpoint` asks `merged(name, stored)`; the whole model is never in memory.

A LoRA on parameters (target_parameters: an MoE's fused experts, a router's weight) is
peft's ParamWrapper's, merged as dense deltas into the tensors stored for the parameter
(export/lora_parameters.py): which parameter a LoRA wraps is known only once the model
transformers builds is (`bind_parameters`), so its modules' LoRAs wait until then.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy: bf16 adapters)
import numpy as np
from safetensors import SafetensorError, safe_open

from edgeprefill.errors import ExportError
from edgeprefill.export.lora_parameters import (
    ParameterDelta,
    StoredDeltas,
    parameter_deltas,
    rank_and_scale,
)
from edgeprefill.export.module_names import Parameter

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
PREFIX = "base_model.model."
# adapter_config.json keys whose (truthy) value changes the forward beyond W + scale * B @ A
UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "use_bdlora": "block-diagonal LoRA (use_bdlora)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    "layer_replication": "layer replication (layer_replication)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "arrow_config": "Arrow routing (arrow_config)",
}
LORA_PARTS = ("lora_A.weight", "lora_B.weight", "lora_B.bias", "lora_embedding_A",
              "lora_embedding_B")


@dataclass(frozen=True)
class Delta:
    """One module's low-rank update: scale * B @ A, as peft adds it to the weight."""

    a: np.ndarray  # [r, in] (an Embedding's: [r, vocab])
    b: np.ndarray  # [out, r] (an Embedding's: [width, r])
    scale: float
    embedding: bool

    def shape(self) -> tuple[int, int]:
        """The weight's [out, in] shape (an Embedding's [vocab, width])."""
        out, r_in = self.b.shape[0], self.a.shape[1]
        return (r_in, out) if self.embedding else (out, r_in)

    def weight(self, stored_transposed: bool) -> np.ndarray:
        """The delta in the layout the checkpoint stores the weight: an Embedding's
        (B @ A)^T is [vocab, width]; a Conv1D's is [in, out] (fan_in_fan_out)."""
        product = self.b.astype(np.float32) @ self.a.astype(np.float32)
        return (product.T if self.embedding or stored_transposed else product) * self.scale


class Adapter:
    """An adapter folder's deltas and replacement tensors, keyed by the base tensor they
    change (`<module>.weight`, `<module>.bias`), as transformers names the module."""

    def __init__(self, folder: Path, config: dict, tensors: dict[str, np.ndarray],
                 sha256: str) -> None:
        self.folder = folder
        self.base_model = config.get("base_model_name_or_path")
        self.sha256 = sha256
        self.deltas: dict[str, Delta] = {}
        self.bias_deltas: dict[str, np.ndarray] = {}  # lora_bias: scale * lora_B.bias
        self.replacements: dict[str, np.ndarray] = {}
        self._base_copies: set[str] = set()  # replacements saved as `<module>.base_layer.`
        self.target_parameters: list[str] = list(config.get("target_parameters") or [])
        self.parameter_deltas: dict[str, ParameterDelta] = {}  # the loaded parameter's name
        self.stored_deltas: StoredDeltas | None = None  # theirs, keyed by the names read
        self._config = config
        self._pending: dict[str, dict[str, np.ndarray]] = {}  # LoRAs until bind_parameters
        self._sort(config, tensors)

    @classmethod
    def load(cls, folder: Path) -> Adapter:
        config = read_config(folder)
        path = next((folder / f for f in WEIGHT_FILES if (folder / f).is_file()), None)
        if path is None:
            raise ExportError(f"{folder} has no {' or '.join(WEIGHT_FILES)}")
        return cls(folder, config, _read_tensors(path), _sha256(path))

    def _sort(self, config: dict, tensors: dict[str, np.ndarray]) -> None:
        """Split the saved tensors into deltas, bias deltas and replacements."""
        modules: dict[str, dict[str, np.ndarray]] = {}
        for key, tensor in tensors.items():
            if not key.startswith(PREFIX):
                raise ExportError(f"{self.folder}: the tensor {key!r} is not named as a PEFT "
                                  f"adapter's ({PREFIX}<module>...)")
            name = key.removeprefix(PREFIX)
            part = next((p for p in LORA_PARTS if name.endswith("." + p)), None)
            if part is None:  # a full tensor: `base_layer.` is peft's wrapper, not the model's
                self.replacements[name.replace(".base_layer.", ".")] = tensor
                if ".base_layer." in name:
                    self._base_copies.add(name.replace(".base_layer.", "."))
            else:
                modules.setdefault(name.removesuffix("." + part), {})[part] = tensor
        if self.target_parameters:  # a module's LoRA or a parameter's: known once bound
            self._pending = modules
            return
        for module, parts in modules.items():
            self._add_delta(config, module, parts)

    def bind_parameters(self, loaded: dict[str, list[Parameter]]) -> None:
        """Sort the LoRAs of an adapter with target_parameters into the modules' and the
        parameters' (`loaded`: each module's parameters, as transformers builds the model)."""
        self.parameter_deltas, modules = parameter_deltas(self._pending, self._config, loaded)
        for module, parts in modules.items():
            self._add_delta(self._config, module, parts)
        self._pending = {}

    def _add_delta(self, config: dict, module: str, parts: dict[str, np.ndarray]) -> None:
        embedding = "lora_embedding_A" in parts or "lora_embedding_B" in parts
        a_key, b_key = (("lora_embedding_A", "lora_embedding_B") if embedding
                        else ("lora_A.weight", "lora_B.weight"))
        if a_key not in parts or b_key not in parts:
            raise ExportError(f"{self.folder}: {module} has {' and '.join(sorted(parts))} "
                              f"but not both of {a_key} and {b_key}")
        a, b = parts[a_key], parts[b_key]
        r, scale = rank_and_scale(config, module)
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != r or b.shape[1] != r:
            raise ExportError(f"{self.folder}: {module}'s {a_key} {tuple(a.shape)} and "
                              f"{b_key} {tuple(b.shape)} disagree with its rank r={r}")
        self.deltas[module + ".weight"] = Delta(a, b, scale, embedding)
        if "lora_B.bias" in parts:
            self.bias_deltas[module + ".bias"] = parts["lora_B.bias"].astype(np.float32) * scale

    def renamed(self, read_name: Callable[[str], str | None],
                left_out: tuple[str, ...] = (),
                unmatched: Callable[[str], str | None] = lambda name: None) -> None:
        """Key every tensor by the name the checkpoint reads it as (`read_name`: the
        transformers name -> the checkpoint's, None where it holds none). A delta whose
        module the base lacks is refused; a replacement the base lacks (modules_to_save's
        lm_head over a tied checkpoint that stores none) keeps its own name.

        Over a tied checkpoint that stores no head, peft's `ensure_weight_tying` saves the
        head's tied copies of the embedding's: its LoRA (A and B the embedding's B^T and
        A^T) and its base table. The head reads the embedding's merged table instead, as
        peft's unmerged model computes (its merge_and_unload adds the delta to the one
        shared table twice): the copies are dropped.

        What the adapter changes under a `left_out` prefix (an image-text checkpoint's
        vision tower, which "all-linear" targets too) is left out with it, in one line.
        `unmatched` says why a module reads as no tensor where the checkpoint can tell."""
        self._leave_out(left_out)
        for name in [n for n in self.deltas if read_name(n) is None and self._tied(n)]:
            del self.deltas[name]
        for name in [n for n in self._base_copies if read_name(n) is None]:
            del self.replacements[name]
        for table in (self.deltas, self.bias_deltas):
            for name in list(table):
                found = read_name(name)
                if found is None:
                    raise ExportError(
                        unmatched(name) or f"the adapter's LoRA on "
                        f"{name.removesuffix('.weight')} matches no tensor of the base "
                        f"model: is it the adapter of another model ({self.base_model})?")
                table[found] = table.pop(name)
        self.replacements = {read_name(n) or n: t for n, t in self.replacements.items()}

    def _leave_out(self, left_out: tuple[str, ...]) -> None:
        if not left_out:
            return
        dropped = 0
        for table in (self.deltas, self.bias_deltas, self.replacements):
            for name in [n for n in table if n.startswith(left_out)]:
                del table[name]
                dropped += 1
        if dropped:
            log.warning("the adapter's changes to %d tensor%s the bundle leaves out (the "
                        "vision tower's) are left out with them", dropped, "s" * (dropped > 1))

    def _tied(self, name: str) -> bool:
        """Whether the delta `name` is an embedding's, tied: ensure_weight_tying's head."""
        delta = self.deltas[name]
        return not delta.embedding and any(
            other.embedding and np.array_equal(delta.a, other.b.T)
            and np.array_equal(delta.b, other.a.T) and other.scale == delta.scale
            for other in self.deltas.values())

    def check_shapes(self, stored_shape: Callable[[str], tuple[int, ...]],
                     transposed: Callable[[str], bool]) -> None:
        """Each delta of the shape of the base tensor it changes."""
        for name, delta in self.deltas.items():
            want = delta.shape()[::-1] if transposed(name) else delta.shape()
            self._same_shape(name, "its LoRA delta", want, stored_shape(name))
        for name, bias in self.bias_deltas.items():
            self._same_shape(name, "its lora_B.bias", bias.shape, stored_shape(name))

    def check_replacement(self, name: str, stored: tuple[int, ...]) -> None:
        self._same_shape(name, "the adapter's copy", self.replacements[name].shape, stored)

    def _same_shape(self, name: str, what: str, shape: tuple[int, ...],
                    stored: tuple[int, ...]) -> None:
        if tuple(shape) != tuple(stored):
            raise ExportError(f"the base model's {name} has shape {tuple(stored)}, but {what} "
                              f"in {self.folder} has {tuple(shape)}: is it the adapter of "
                              f"another model ({self.base_model})?")

    def touches(self, name: str) -> bool:
        return (name in self.deltas or name in self.bias_deltas or name in self.replacements
                or self.dense(name))

    def dense(self, name: str) -> bool:
        """Whether the tensor `name` gets a dense delta: a LoRA on a parameter's."""
        return self.stored_deltas is not None and name in self.stored_deltas

    def merged(self, name: str, stored: np.ndarray, stored_transposed: bool) -> np.ndarray:
        """The tensor `name` as the merged model holds it, in the checkpoint's layout:
        `stored` or the adapter's copy of it, plus its delta (then float32)."""
        tensor = self.replacements.get(name, stored)  # (an embedding's table saved with
        # its LoRA is both: the copy, plus the delta)
        delta = (self.deltas[name].weight(stored_transposed) if name in self.deltas
                 else self.dense_delta(name) if self.dense(name)
                 else self.bias_deltas.get(name))
        return tensor if delta is None else tensor.astype(np.float32) + delta

    def dense_delta(self, name: str) -> np.ndarray:
        """The dense delta of the tensor `name` (a LoRA on a parameter's), as stored."""
        assert self.stored_deltas is not None
        return self.stored_deltas.delta(name)

    def record(self) -> dict[str, str | None]:
        """What the bundle's manifest says of the adapter."""
        return {"path": str(self.folder.resolve()), "sha256": self.sha256,
                "base_model": self.base_model}


def read_config(folder: Path) -> dict:
    """adapter_config.json, refused in one line unless it is a LoRA adapter this merges."""
    path = folder / ADAPTER_CONFIG
    if not path.is_file():
        raise ExportError(f"{path} not found: is {folder} a PEFT adapter folder?")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ExportError(f"{path} is not readable JSON: {err}") from None
    if not isinstance(config, dict):
        raise ExportError(f"{path} is not a JSON object")
    kind = config.get("peft_type")
    if kind != "LORA":
        raise ExportError(f"{folder} is a {kind or 'non-LoRA'} adapter: export merges LoRA "
                          "adapters only")
    refused = [why for key, why in UNSUPPORTED.items() if config.get(key)]
    if refused:
        raise ExportError(f"{folder} uses {refused[0]}, which export cannot merge")
    return config


def adapter_hint(folder: Path, model_files: tuple[str, ...]) -> str | None:
    """For a folder given as the model that is an adapter (an adapter_config.json, none of
    `model_files`: some trainers save a config.json beside the adapter too): one line
    naming --adapter."""
    path = folder / ADAPTER_CONFIG
    if not path.is_file() or any((folder / name).is_file() for name in model_files):
        return None
    try:
        base = json.loads(path.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        base = None
    return (f"{folder} is a PEFT adapter, not a model: export its base model"
            f"{f' ({base})' if base else ''} with --adapter {folder}")


def quantized_base(raw_config: dict) -> str | None:
    """The quant_method of a quantized base checkpoint's config.json (or its text
    config's), None for float weights."""
    for config in (raw_config, raw_config.get("text_config") or {}):
        quant = config.get("quantization_config") if isinstance(config, dict) else None
        if isinstance(quant, dict):
            return str(quant.get("quant_method", "quantized"))
    return None


def _read_tensors(path: Path) -> dict[str, np.ndarray]:
    # An adapter is small (megabytes): read whole. Adapters trained in bf16 store bfloat16,
    # which numpy reads once ml_dtypes has registered the type (imported above), as the
    # checkpoint's own tensors are read: no torch needed.
    if path.suffix == ".bin":
        from edgeprefill.export.checkpoint import TorchFile

        torch_file = TorchFile(path)
        return {k: torch_file.get_tensor(k) for k in torch_file.keys()}
    try:
        with safe_open(str(path), framework="numpy") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as err:
        raise ExportError(f"{path} is not a readable safetensors file: {err}") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
