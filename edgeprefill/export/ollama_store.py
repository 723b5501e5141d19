"""`ollama:NAME[:TAG]` -> the GGUF file Ollama's store holds for that model, with what its
manifest carries beside it (parameters, system message, licenses).

Ollama keeps a pulled model as an OCI-style manifest, `manifests/<host>/<namespace>/<model>/
<tag>`, whose layers name content-addressed blobs, `blobs/sha256-<hex>`; the layer of media
type `application/vnd.ollama.image.model` is the GGUF file. The rules below are Ollama's own
(github.com/ollama/ollama: types/model/name.go's ParseName, manifest/paths.go,
envconfig.Models, server/images.go's GetModel), so a name resolves here as `ollama run`
resolves it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeprefill.errors import ExportError

log = logging.getLogger(__name__)

PREFIX = "ollama:"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
HOME_STORE = Path("~/.ollama/models")
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")  # the Linux install's service user
MEDIA = "application/vnd.ollama.image."
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
LISTED = 8  # names shown where a model is not found
MISSING = "!MISSING!"  # name.go's MissingPart: an empty part a separator promises
# name.go's isValidLen: a host up to 350 bytes, every other part up to 80.
MAX_LEN = {"host": 350, "namespace": 80, "model": 80, "tag": 80}


@dataclass(frozen=True)
class OllamaName:
    """A fully qualified Ollama model name, as name.go's ParseName fills one."""

    host: str
    namespace: str
    model: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> OllamaName:
        """ParseNameBare, then the defaults (registry.ollama.ai/library/?:latest);
        ExportError where a part is not valid (name.go's IsValid)."""
        host, namespace, model, tag = _bare_parts(text)
        name = cls(host or DEFAULT_HOST, namespace or DEFAULT_NAMESPACE, model,
                   tag or DEFAULT_TAG)
        bad = [kind for kind, part in name.parts().items() if not _valid_part(kind, part)]
        if bad:
            raise ExportError(f"{PREFIX}{text} is not an Ollama model name (its {bad[0]} is "
                              "not valid): [host/][namespace/]model[:tag], e.g. "
                              f"{PREFIX}qwen3:0.6b")
        return name

    def parts(self) -> dict[str, str]:
        return {"host": self.host, "namespace": self.namespace, "model": self.model,
                "tag": self.tag}

    def manifest(self, store: Path) -> Path:
        return store / "manifests" / self.host / self.namespace / self.model / self.tag

    def shortest(self) -> str:
        """name.go's DisplayShortest: `qwen3:0.6b`, `user/model:tag`, `hf.co/org/repo:tag`."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"


def _bare_parts(text: str) -> tuple[str, str, str, str]:
    """name.go's ParseNameBare -> (host, namespace, model, tag), "" where absent: the tag
    after the last ':' past the last '/', then model, namespace and host from the right,
    a scheme (`https://`) before the host dropped. A part a separator promises but that is
    empty is MISSING, which no part validates."""
    host = namespace = tag = ""
    if text.rfind(":") > text.rfind("/"):
        text, tag = _cut_promised(text, ":")
    if "/" not in text:
        return host, namespace, text, tag
    text, model = _cut_promised(text, "/")
    if "/" not in text:
        return host, text, model, tag
    text, namespace = _cut_promised(text, "/")
    host = text.split("://", 1)[1] if "://" in text else text
    return host, namespace, model, tag


def _cut_promised(text: str, sep: str) -> tuple[str, str]:
    """name.go's cutPromised, where `sep` is in `text`."""
    before, _, after = text.rpartition(sep)
    return before or MISSING, after or MISSING


def _valid_part(kind: str, part: str) -> bool:
    """name.go's isValidPart: 1 to MAX_LEN bytes, starting with a letter, digit or '_', then
    those and '_', '-', '.' (not in a namespace) and ':' (a host's port)."""
    if not 1 <= len(part) <= MAX_LEN[kind] or not _word(part[0]):
        return False
    extra = {"_", "-"} | ({":"} if kind == "host" else set()) | \
        (set() if kind == "namespace" else {"."})
    return all(_word(c) or c in extra for c in part[1:])


def _word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


@dataclass(frozen=True)
class OllamaModel:
    """What an Ollama manifest holds for a model: its GGUF blob and what travels with it."""

    name: OllamaName
    gguf: Path  # blobs/sha256-<hex>
    digest: str  # the model layer's, "sha256:<hex>"
    params: dict[str, Any] = field(default_factory=dict)  # the params layer's JSON
    system: str | None = None  # the system layer's text
    licenses: tuple[str, ...] = ()  # the license layers' texts

    def record(self) -> dict[str, str]:
        """What the bundle manifest's `source.ollama` records."""
        return {"name": self.name.shortest(), "digest": self.digest}


def is_ollama_name(source: str | Path) -> bool:
    """`ollama:...`, unless a file or folder of that name is there (then it is exported)."""
    return str(source).startswith(PREFIX) and not Path(source).exists()


def resolve(source: str | Path) -> OllamaModel:
    """The model `ollama:NAME[:TAG]` names in the local Ollama store; ExportError, in one
    line, where the store, the model, or its GGUF blob is not there."""
    text = str(source).removeprefix(PREFIX)
    name = OllamaName.parse(text)
    store = store_dir()
    path = _manifest_path(name, store)
    if path is None:
        raise ExportError(f"{PREFIX}{text} is not in the Ollama store {store} (`ollama pull "
                          f"{text}` fetches it); it holds: {_listing(store)}")
    stored = OllamaName(*path.relative_to(store / "manifests").parts)  # its own casing
    return _read_manifest(stored, path, store)


def store_dir() -> Path:
    """envconfig.Models: $OLLAMA_MODELS if set, else ~/.ollama/models; then the Linux
    service's store, where Ollama runs as its own user."""
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        if not (Path(env) / "manifests").is_dir():
            raise ExportError(f"OLLAMA_MODELS={env} is not an Ollama model store (no "
                              "manifests/ folder in it)")
        return Path(env)
    for store in (HOME_STORE.expanduser(), SERVICE_STORE):
        if (store / "manifests").is_dir():
            return store
    raise ExportError(f"no Ollama model store found: looked in {HOME_STORE} and "
                      f"{SERVICE_STORE} (OLLAMA_MODELS is not set); set OLLAMA_MODELS to "
                      "the folder holding Ollama's manifests/ and blobs/")


def _manifest_path(name: OllamaName, store: Path) -> Path | None:
    """The name's manifest; else one whose name differs in case only (name.go's
    EqualFold: `ollama run Qwen3` finds what `ollama pull qwen3` stored)."""
    exact = name.manifest(store)
    if exact.is_file():
        return exact
    wanted = [part.lower() for part in name.parts().values()]
    root = store / "manifests"
    return next((p for p in sorted(root.glob("*/*/*/*")) if p.is_file() and
                 [part.lower() for part in p.relative_to(root).parts] == wanted), None)


def _listing(store: Path) -> str:
    """The first LISTED models of the store, as `ollama list` names them."""
    root = store / "manifests"
    names = sorted(OllamaName(*p.relative_to(root).parts).shortest()
                   for p in root.glob("*/*/*/*") if p.is_file())
    if not names:
        return "no models"
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def _read_manifest(name: OllamaName, path: Path, store: Path) -> OllamaModel:
    shown = f"{PREFIX}{name.shortest()}"
    layers = _layers(path, shown)
    kinds = [layer["mediaType"].removeprefix(MEDIA) for layer in layers]
    if "adapter" in kinds:
        raise ExportError(f"{shown} carries a LoRA adapter layer (ADAPTER in its Modelfile): "
                          "export the adapter's PEFT folder with --adapter over the Hugging "
                          "Face base model instead")
    models = [layer for layer, kind in zip(layers, kinds, strict=True) if kind == "model"]
    if len(models) != 1:
        what = "tensor layers (Ollama's safetensors import), not a GGUF" if "tensor" in kinds \
            else f"{len(models)} model layers"
        raise ExportError(f"{shown}: its manifest {path} holds {what}; edgeprefill exports "
                          "a model whose manifest names one GGUF model layer")
    if "projector" in kinds:
        log.warning("%s: its vision projector layer is left out: the bundle is text-only",
                    shown)
    texts = {kind: [_blob(store, layer, shown).read_text(errors="replace")
                    for layer, k in zip(layers, kinds, strict=True) if k == kind]
             for kind in ("params", "system", "license")}
    return OllamaModel(
        name, _gguf_blob(store, models[0], shown), models[0]["digest"],
        params=_params(texts["params"], shown),
        system=texts["system"][-1] if texts["system"] else None,
        licenses=tuple(texts["license"]))


def _layers(path: Path, shown: str) -> list[dict[str, Any]]:
    """The manifest's layers, each checked to have a media type and a sha256 digest."""
    try:
        layers = json.loads(path.read_text())["layers"]
        if not isinstance(layers, list):
            raise TypeError
        for layer in layers:
            if not isinstance(layer["mediaType"], str) or not DIGEST.fullmatch(layer["digest"]):
                raise ValueError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ExportError(f"{shown}: its manifest {path} is malformed (not Ollama's JSON "
                          "with layers of mediaType and sha256 digest)") from None
    return layers


def _blob(store: Path, layer: dict[str, Any], shown: str) -> Path:
    """manifest/paths.go's BlobsPath: `sha256:<hex>` -> blobs/sha256-<hex>."""
    blob = store / "blobs" / layer["digest"].replace(":", "-")
    if not blob.is_file():
        kind = layer["mediaType"].removeprefix(MEDIA)
        raise ExportError(f"{shown}: its {kind} blob {blob.name} is missing from "
                          f"{store / 'blobs'} (an interrupted pull? `ollama pull` it again)")
    return blob


def _gguf_blob(store: Path, layer: dict[str, Any], shown: str) -> Path:
    blob = _blob(store, layer, shown)
    with blob.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ExportError(f"{shown}: its model blob {blob.name} is not a GGUF file")
    return blob


def _params(texts: list[str], shown: str) -> dict[str, Any]:
    if not texts:
        return {}
    try:
        params = json.loads(texts[-1])
    except ValueError:
        params = None
    if not isinstance(params, dict):
        raise ExportError(f"{shown}: its params layer is not a JSON object")
    return params
