"""Ollama's native API routes that generate nothing, in the shapes of Ollama's
api/types.go (its generating routes, /api/chat and /api/generate, are in app.py):

    GET|HEAD /               "Ollama is running": what clients probe for a server
    GET  /api/version        the Ollama release whose API this server follows
    GET  /api/tags           the served model, as `name:latest`
    POST /api/show           the model's details, chat template, default system
                             message (Ollama's `system`) and capabilities
    GET  /api/ps             the served model, loaded for as long as the server runs

`/api/show`'s `parameters` are the bundle's sampling defaults (generation_config.json's,
an Ollama-exported bundle's Modelfile PARAMETERs) under Ollama's names, one a line as
Ollama writes them. The model's size is its bundle's files (the manifest's record of
them), its digest the sha256 of the manifest (which names every file's sha256), its
format "onnx"; a bundle does not record a parameter count, so `parameter_size` is empty.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from edgeprefill import __version__
from edgeprefill.bundle import MANIFEST_FILE
from edgeprefill.sdk.engine import Engine
from edgeprefill.server.errors import ApiError
from edgeprefill.server.ollama_request import model_of, tagged

# The Ollama release whose API (docs/api.md, api/types.go) these routes follow: clients
# gate features on it (a too-old version gets thinking or tools turned off).
OLLAMA_VERSION = "0.32.15"
# `expires_at` of a model that stays loaded: Ollama's keep_alive -1 reads the same way.
NEVER = "2318-01-01T00:00:00Z"
# GenerationDefaults' field -> Ollama's option (export/ollama_params.py maps them back)
PARAMETER_NAMES = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                   "repetition_penalty": "repeat_penalty"}

ReadJson = Callable[[Request], Awaitable[Any]]


class OllamaRoutes:
    def __init__(self, engine: Engine, model_name: str, read_json: ReadJson,
                 thinks: bool, calls_tools: bool) -> None:
        self.engine = engine
        self.model_name = model_name
        self.read_json = read_json
        self.thinks = thinks  # the server splits the model's reasoning from its answer
        self.calls_tools = calls_tools  # the chat template shows the model its tools
        path = engine.bundle_dir / MANIFEST_FILE
        self.digest = hashlib.sha256(path.read_bytes()).hexdigest()
        self.modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc
                                               ).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def routes(self) -> list[Route]:
        return [
            Route("/", self.root, methods=["GET", "HEAD"]),
            Route("/api/version", self.version, methods=["GET", "HEAD"]),
            Route("/api/tags", self.tags, methods=["GET", "HEAD"]),
            Route("/api/show", self.show, methods=["POST"]),
            Route("/api/ps", self.ps, methods=["GET"]),
        ]

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION, "edgeprefill": __version__})

    async def tags(self, request: Request) -> Response:
        return JSONResponse({"models": [{**self._model(), "modified_at": self.modified}]})

    async def ps(self, request: Request) -> Response:
        return JSONResponse({"models": [{**self._model(), "expires_at": NEVER,
                                         "size_vram": 0,
                                         "context_length": self.engine.capacity}]})

    async def show(self, request: Request) -> Response:
        try:
            model_of(await self.read_json(request), self.model_name)
        except ApiError as err:
            return err.response(request.url.path)
        return JSONResponse({
            "modelfile": "", "parameters": self._parameters(),
            "template": self.engine.manifest.tokenizer.chat_template or "",
            # Ollama's `system`, omitted where empty: the Modelfile's SYSTEM
            **_system(self.engine.manifest.tokenizer.default_system),
            "details": self._details(), "model_info": self._info(),
            "capabilities": self._capabilities(), "modified_at": self.modified})

    def _parameters(self) -> str:
        """The sampling defaults as Ollama's `parameters` text: `name` padded to 30
        columns, then the value as Go's %#v writes a JSON number (`1`, `0.9`)."""
        defaults = self.engine.generation_defaults.sampling()
        return "\n".join(f"{PARAMETER_NAMES[name]:<30} {_go_number(value)}"
                         for name, value in defaults.items())

    def _model(self) -> dict[str, Any]:
        name = tagged(self.model_name)
        size = sum(record.bytes for record in self.engine.manifest.files.values())
        return {"name": name, "model": name, "size": size, "digest": self.digest,
                "details": self._details()}

    def _details(self) -> dict[str, Any]:
        manifest = self.engine.manifest
        family = manifest.model.family
        return {"parent_model": "", "format": "onnx", "family": family,
                "families": [family], "parameter_size": "",
                "quantization_level": manifest.graph.quantization or manifest.graph.dtype}

    def _info(self) -> dict[str, Any]:
        """Ollama's model_info keys (GGUF's metadata names) for what the bundle knows."""
        model, family = self.engine.manifest.model, self.engine.manifest.model.family
        return {"general.architecture": family,
                f"{family}.context_length": self.engine.capacity,
                f"{family}.block_count": model.num_layers,
                f"{family}.embedding_length": model.hidden_size,
                f"{family}.attention.head_count": model.num_heads,
                f"{family}.attention.head_count_kv": model.num_kv_heads,
                f"{family}.vocab_size": model.vocab_size}

    def _capabilities(self) -> list[str]:
        if self.engine.manifest.task == "embed":  # Ollama's name for an embedding model
            return ["embedding"]
        if self.engine.manifest.task == "score":  # Ollama has none; vLLM's task name
            return ["rerank"]
        return ["completion", *(["tools"] if self.calls_tools else []),
                *(["thinking"] if self.thinks else [])]


def _system(system: str | None) -> dict[str, str]:
    return {"system": system} if system else {}


def _go_number(value: float) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)
