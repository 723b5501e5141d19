"""The bundle manifest (`edgeprefill.json`): what the exporter writes and the runtime reads.

The runtime takes every name, shape and size from here; nothing about a model is
hard-coded. Loading checks the format version, that every listed file is inside the
bundle with its recorded size, and (on request) its sha256.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeprefill.contract import check_graph_io
from edgeprefill.errors import BundleError

FORMAT_VERSION = 1
MANIFEST_FILE = "edgeprefill.json"


@dataclass(frozen=True)
class ModelInfo:
    family: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int


@dataclass(frozen=True)
class GraphInfo:
    file: str  # the ONNX graph, relative to the bundle
    data_file: str  # its external weights
    flavor: str  # "ort" or "standard"
    dtype: str  # weights, activations and KV cache: "float32" or "float16"
    opsets: dict[str, int]
    inputs: dict[str, list[Any]]  # name -> [dtype, shape]; str dims are symbolic
    outputs: dict[str, list[Any]]
    kv_inputs: list[list[str]]  # per layer: [past_key, past_value]
    kv_outputs: list[list[str]]  # per layer: [present_key, present_value]
    quantization: str | None = None  # None, "int8" or "int4" (linear layers' weights)


@dataclass(frozen=True)
class TokenizerInfo:
    file: str | None  # tokenizer.json, or None for a bundle that runs from token ids
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None


@dataclass(frozen=True)
class Manifest:
    model: ModelInfo
    graph: GraphInfo
    tokenizer: TokenizerInfo
    chunks: list[int]  # prefill chunk buckets, ascending
    max_context: int  # positions a session may hold (prompt + generated)
    eos_token_ids: list[int]
    bos_token_id: int | None
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> sha256, bytes
    source: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Manifest:
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise BundleError(
                f"bundle format version {version} is not supported by this edgeprefill "
                f"(expects {FORMAT_VERSION}); re-export it with `edgeprefill export`"
            )
        try:
            return cls(
                model=ModelInfo(**raw["model"]),
                graph=GraphInfo(**raw["graph"]),
                tokenizer=TokenizerInfo(**raw["tokenizer"]),
                **{k: v for k, v in raw.items() if k not in ("model", "graph", "tokenizer")},
            )
        except (KeyError, TypeError) as err:
            raise BundleError(f"{MANIFEST_FILE} is malformed: {err}") from None


def sha256_of(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_of(path), "bytes": path.stat().st_size}


def load_manifest(bundle_dir: str | Path, verify_checksums: bool = False) -> Manifest:
    """Read and check a bundle's manifest. Sizes are always checked (cheap); sha256 of
    every file only with `verify_checksums` (it reads all the weights)."""
    root = Path(bundle_dir)
    path = root / MANIFEST_FILE
    if not path.is_file():
        raise BundleError(f"{root} is not an edgeprefill bundle (no {MANIFEST_FILE})")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{path} does not hold a JSON object")
    manifest = Manifest.from_dict(raw)
    check_graph_io(manifest)
    for name, record in manifest.files.items():
        _check_file(root, name, record, verify_checksums)
    return manifest


def resolve_inside(root: Path, name: str) -> Path:
    """The path of a bundle file, refusing names that leave the bundle directory."""
    path = (root / name).resolve()
    if not path.is_relative_to(root.resolve()):
        raise BundleError(f"bundle file {name!r} points outside the bundle directory")
    return path


def load_graph(bundle_dir: Path, manifest: Manifest):
    """The bundle's ONNX graph without its weights (an onnx.ModelProto); refuses a corrupt
    file and external-data locations outside the bundle directory."""
    import onnx

    path = resolve_inside(bundle_dir, manifest.graph.file)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # onnx raises DecodeError and others for a corrupt file
        raise BundleError(f"{path} is not a readable ONNX model: {err}") from None
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                resolve_inside(bundle_dir, entry.value)
    return model


def _check_file(root: Path, name: str, record: dict[str, Any], full: bool) -> None:
    path = resolve_inside(root, name)
    if not path.is_file():
        raise BundleError(f"bundle file {name} is missing from {root}")
    if path.stat().st_size != record.get("bytes"):
        raise BundleError(f"bundle file {name} has the wrong size: the bundle is corrupt")
    if full and sha256_of(path) != record.get("sha256"):
        raise BundleError(f"bundle file {name} fails its checksum: the bundle is corrupt")
