"""The embedding routes of an embedding bundle (sdk/embedding.py, Engine.submit_embedding):

    POST /v1/embeddings    OpenAI's: `input` a string, a list of strings, a list of token
                           ids or a list of such lists (at most 2048 items, OpenAI's
                           limit); `model`; `encoding_format` float
                           or base64 (little-endian float32, what the openai client asks
                           for by default); `dimensions` (the first N, normalized again
                           where the bundle normalizes); `user` (accepted, unused);
                           `prompt_name` (not OpenAI's: text-embeddings-inference's, one of
                           the model's named prompts put before each text);
                           `usage.prompt_tokens`
    POST /api/embed        Ollama's: `input` a string or a list of strings; `truncate`
                           (default true, null too: a text past the context is cut to it, as
                           Ollama cuts it; false: a 400); `dimensions`; reply `embeddings`
                           and `prompt_eval_count`
    POST /api/embeddings   Ollama's older route: `prompt` -> `embedding`

A text is tokenized as sentence-transformers does (stripped, the tokenizer's
post-processor applied) in a prompt worker, after the prompt `prompt_name` names (each
route takes it) or else the model's default prompt, if its folder named one (as
sentence-transformers' `encode` puts it: sdk/embedding.py); token ids are taken as they
are, with no prompt. The vectors
are the model's as the bundle defines them: L2-normalized where its sentence-transformers
folder had a Normalize module (Ollama's /api/embed normalizes every model's; the models
this exports are all normalized). Ollama's `options.num_ctx` holds the texts to a
shorter context, as Ollama's does (cut to it, or refused past it where truncate is false;
one longer than the bundle's is a 400); its other options and `keep_alive` are accepted
and unused (nothing samples; the model stays loaded), an option Ollama does not know
warned of. An empty `input` / `prompt` asks a load, answered at once with no vectors, as
Ollama answers it. On a generation or score bundle each
route is a 400 in one line; on an embedding bundle the generating routes are (app.py).
"""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeprefill.errors import EdgeprefillError, EngineClosedError, RequestError
from edgeprefill.sdk import embedding, scoring
from edgeprefill.sdk.stream import TokenStream
from edgeprefill.server.body import only_fields
from edgeprefill.server.errors import ApiError
from edgeprefill.server.ollama_request import embedding_context, model_of
from edgeprefill.server.prompt_worker import PromptTimeout
from edgeprefill.server.schemas import bool_field
from edgeprefill.values import is_int

if TYPE_CHECKING:
    from edgeprefill.server.app import OpenAIApi

OPENAI_FIELDS = frozenset({"input", "model", "encoding_format", "dimensions", "user",
                           "prompt_name"})
MAX_INPUTS = 2048  # OpenAI's limit on the items of one request's `input`
ENCODINGS = ("float", "base64")


class EmbeddingRoutes:
    def __init__(self, api: OpenAIApi) -> None:
        self.api = api
        self.engine = api.engine
        self.model_name = api.config.model_name

    def routes(self) -> list[Route]:
        return [
            Route("/v1/embeddings", self.openai, methods=["POST"]),
            Route("/api/embed", self.ollama_embed, methods=["POST"]),
            Route("/api/embeddings", self.ollama_embeddings, methods=["POST"]),
        ]

    async def openai(self, request: Request) -> Response:
        try:
            body = only_fields(await self.api.read(request), OPENAI_FIELDS)
            self.api.check_model(body.get("model"))
            self.require_embedding()
            encoding = body.get("encoding_format", "float")
            if encoding not in ENCODINGS:
                raise ApiError(400, f"'encoding_format' must be float or base64, got "
                               f"{encoding!r}", "encoding_format")
            dimensions = self.dimensions(body)
            inputs = openai_inputs(body.get("input"))
            prompt = self.texts_prompt(body, inputs)
            ids = [self.token_ids(tokens) if isinstance(tokens, list) else
                   await self.ids(prompt + tokens, truncate=False, field="input")
                   for tokens in inputs]
            vectors = await self.vectors(ids, dimensions)
        except ApiError as err:
            return err.response(request.url.path)
        count = sum(len(tokens) for tokens in ids)
        data = [{"object": "embedding", "index": i, "embedding": _encoded(row, encoding)}
                for i, row in enumerate(vectors)]
        return JSONResponse({"object": "list", "data": data, "model": self.model_name,
                             "usage": {"prompt_tokens": count, "total_tokens": count}})

    async def ollama_embed(self, request: Request) -> Response:
        began = time.perf_counter()
        try:
            body = await self.api.read(request)
            model = model_of(body, self.model_name)
            self.require_embedding()
            texts = body.get("input")
            if texts in (None, "", []):  # a load: the model is always loaded
                return JSONResponse({"model": model, "embeddings": []})
            texts = [texts] if isinstance(texts, str) else texts
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise ApiError(400, "'input' must be a string or a list of strings", "input")
            refuse_blank(texts, "input")  # (all of it empty asks a load, above)
            truncate = bool_field(body, "truncate", True)  # null: the default, as Ollama's
            dimensions = self.dimensions(body)
            prompt = self.prompt(body)
            context = embedding_context(body, self.engine.capacity)
            ids = [await self.ids(prompt + text, truncate, "input", context) for text in texts]
            vectors = await self.vectors(ids, dimensions)
        except ApiError as err:
            return err.response(request.url.path)
        took = int((time.perf_counter() - began) * 1e9)
        return JSONResponse({"model": model, "embeddings": vectors.tolist(),
                             "total_duration": took, "load_duration": 0,
                             "prompt_eval_count": sum(len(tokens) for tokens in ids)})

    async def ollama_embeddings(self, request: Request) -> Response:
        try:
            body = await self.api.read(request)
            model_of(body, self.model_name)
            self.require_embedding()
            prompt = body.get("prompt")
            if prompt in (None, ""):  # a load
                return JSONResponse({"embedding": []})
            if not isinstance(prompt, str):
                raise ApiError(400, "'prompt' must be a string", "prompt")
            refuse_blank([prompt], "prompt")
            context = embedding_context(body, self.engine.capacity)
            text = self.prompt(body) + prompt
            vectors = await self.vectors([await self.ids(text, False, "prompt", context)],
                                          None)
        except ApiError as err:
            return err.response(request.url.path)
        return JSONResponse({"embedding": vectors[0].tolist()})

    # -- the parts ------------------------------------------------------------------------

    def dimensions(self, body: dict) -> int | None:
        try:
            return embedding.check_dimensions(body.get("dimensions"),
                                              self.engine.manifest.model.hidden_size)
        except RequestError as err:
            raise ApiError(400, str(err), "dimensions") from None

    def prompt(self, body: dict) -> str:
        """The prompt `prompt_name` names, or the model's default one ("" if none)."""
        try:
            return embedding.prompt_of(self.engine.manifest.embedding, body.get("prompt_name"))
        except RequestError as err:
            raise ApiError(400, str(err), "prompt_name") from None

    def texts_prompt(self, body: dict, inputs: list[str | list[int]]) -> str:
        """The prompt (`prompt`) of inputs that may hold token ids, which take none."""
        if body.get("prompt_name") is not None and any(isinstance(i, list) for i in inputs):
            raise ApiError(400, "'prompt_name' applies to texts; token ids are taken as "
                           "they are", "prompt_name")
        return self.prompt(body)

    def require_embedding(self) -> None:
        if self.engine.manifest.task == "score":
            raise ApiError(400, scoring.score_only(self.engine.manifest))
        if self.engine.manifest.task != "embed":
            raise ApiError(400, embedding.generation_only(self.engine.manifest))

    def token_ids(self, tokens: list[int], truncate: str | None = None,
                  field: str = "input") -> list[int]:
        """Token ids as given; more than the context: a 400 naming `field`, or with
        `truncate` (a direction: TEI's) cut to it, keeping the first ids or ("left") the
        last (their range: the engine)."""
        capacity = self.engine.capacity
        if truncate is not None and len(tokens) > capacity:
            return tokens[:capacity] if truncate == "right" else tokens[-capacity:]
        if len(tokens) > capacity:
            raise ApiError(400, f"an input of {len(tokens)} tokens exceeds the context of "
                           f"{capacity} tokens; shorten it", field, "context_length_exceeded")
        return tokens

    async def ids(self, text: str, truncate: bool, field: str,
                  context: int | None = None, direction: str = "right") -> list[int]:
        """A text's ids in a prompt worker; past the context (the bundle's, or a smaller
        one Ollama's num_ctx asks for) a 400, or cut to it (its end; "left": its start)."""
        capacity = self.engine.capacity if context is None else context
        try:
            encoded = await self.api.prompts.call("embedding_bounded", text, capacity,
                                                  truncate, direction)
        except PromptTimeout as err:
            raise ApiError(400, str(err), field, "prompt_timeout") from None
        except RequestError as err:
            raise ApiError(400, str(err), field) from None
        except EdgeprefillError as err:
            raise ApiError(500, str(err), code="prompt_worker_error") from None
        if isinstance(encoded.ids, int):
            raise ApiError(400, f"a text of {encoded.ids} tokens exceeds the context of "
                           f"{capacity} tokens; shorten it", field, "context_length_exceeded")
        return encoded.ids

    async def vectors(self, ids: list[list[int]], dimensions: int | None,
                      normalize: bool | None = None, field: str = "input") -> np.ndarray:
        """The texts' vectors (hidden_rows, truncated and normalized per the bundle, or
        per `normalize` where given: TEI's)."""
        if normalize is None:
            normalize = embedding.normalizes(self.engine.manifest)
        rows = await hidden_rows(self.api, ids, field)
        return embedding.vectors(rows, normalize, dimensions)


async def hidden_rows(api: OpenAIApi, ids: list[list[int]], field: str = "input"
                      ) -> np.ndarray:
    """The last hidden rows of texts' ids [n, hidden] (an embedding or score bundle's):
    one place of the server's max_pending held, a window of the texts in the engine at a
    time (Engine._embed_rows' window); ids the engine refuses: a 400 naming `field`."""
    if api.pending + 1 > api.config.max_pending:
        raise ApiError(429, f"the server is busy ({api.pending} of "
                       f"{api.config.max_pending} places taken); retry shortly",
                       code="queue_full")
    api.pending += 1
    engine = api.engine
    window = 2 * len(engine.kv.slots)
    streams: list[TokenStream] = []
    rows: list[np.ndarray] = []
    try:
        for tokens in ids:
            streams.append(engine.submit_embedding(tokens))
            if len(streams) - len(rows) >= window:
                rows.append(await _row(streams[len(rows)]))
        for stream in streams[len(rows):]:
            rows.append(await _row(stream))
    except EngineClosedError as err:
        raise ApiError(503, str(err), code="engine_closed") from None
    except RequestError as err:
        full = "queue is full" in str(err)
        raise ApiError(429 if full else 400, str(err),
                       None if full else field, "queue_full" if full else None
                       ) from None
    finally:
        api.pending -= 1
        for stream in streams[len(rows):]:
            stream.cancel()  # refused part way, or the client left: the rest runs for nobody
    return np.stack(rows)


async def _row(stream: TokenStream) -> np.ndarray:
    async for _ in stream:  # an embedding request streams no events: it ends
        pass
    return embedding.row_of(stream)


def openai_inputs(value: Any, field: str = "input") -> list[str | list[int]]:
    """OpenAI's `input` (and TEI's `inputs`): a text, texts, token ids, or lists of token
    ids."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(is_int(v) for v in value):
        items = [value]
    elif isinstance(value, list) and value and all(
            isinstance(v, str) or (isinstance(v, list) and v and all(is_int(t) for t in v))
            for v in value):
        items = value
    else:
        raise ApiError(400, f"'{field}' must be a non-empty string, a list of strings, a "
                       "list of token ids or a list of such lists", field)
    if len(items) > MAX_INPUTS:  # before any is tokenized: each costs a worker's call
        raise ApiError(400, f"'{field}' holds {len(items)} items; at most {MAX_INPUTS} a "
                       "request", field)
    refuse_blank(items, field)
    return items


def refuse_blank(texts: list[Any], field: str) -> None:
    """A text that is empty or only whitespace is refused (a 400 naming `field`): stripped
    as sentence-transformers strips it, it would embed or score the tokenizer's special
    tokens alone (token ids are taken as given)."""
    if any(isinstance(text, str) and not text.strip() for text in texts):
        raise ApiError(400, f"an '{field}' text is empty or only whitespace", field)


def _encoded(row: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return row.tolist()
