"""The routes beside the OpenAI ones, in the shapes llama-server and vLLM give them.

    POST /tokenize          text (`prompt`: vLLM, `content`: llama-server) or chat
                            `messages` -> token ids, their count and the context length
    POST /detokenize        token ids -> text (as `prompt`, vLLM, and `content`, llama-server)
    GET  /v1/models/{id}    one model, or 404
    GET  /version           the edgeprefill version and backend

Tokenizing runs off the event loop (`TokenizerCall`: a worker thread, or the server's
prompt workers where it has them): a long text or chat template must not hold up the loop
that streams everyone's tokens.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeprefill import __version__
from edgeprefill.errors import RequestError
from edgeprefill.sdk.engine import Engine
from edgeprefill.server.body import only_fields
from edgeprefill.server.errors import ApiError, unknown_model
from edgeprefill.server.schemas import (
    bool_field,
    chat_field_given,
    parse_messages,
    template_kwargs,
)
from edgeprefill.server.tools import calls_in_content
from edgeprefill.values import is_int

ReadJson = Callable[[Request], Awaitable[Any]]
# `await call("encode", prompt, **template_vars)`: a BundleTokenizer method, off the loop.
TokenizerCall = Callable[..., Awaitable[Any]]

# Each route's accepted fields: anything else is a 400 naming it, not silently ignored.
TOKENIZE_FIELDS = frozenset({"model", "prompt", "content", "messages", "add_special_tokens",
                             "add_special", "add_generation_prompt", "tools",
                             "chat_template_kwargs", "reasoning_effort",
                             "return_token_strs", "with_pieces"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens", "skip_special_tokens"})


def model_card(engine: Engine, model_name: str, created: int) -> dict:
    """The model object of /v1/models and /v1/models/{id}."""
    return {"id": model_name, "object": "model", "created": created,
            "owned_by": "edgeprefill", "context_length": engine.capacity}


class ExtraRoutes:
    def __init__(self, engine: Engine, model_name: str, created: int, read_json: ReadJson,
                 tokenizer_call: TokenizerCall | None = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.created = created
        self.read_json = read_json
        self.call = tokenizer_call or self._thread_call

    async def _thread_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(getattr(self.engine.tokenizer, method), *args, **kwargs)

    def routes(self) -> list[Route]:
        return [
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
        ]

    async def tokenize(self, request: Request) -> Response:
        try:
            body = self._checked(await self.read_json(request), TOKENIZE_FIELDS)
            ids = await self._encode(body)
            body_out: dict[str, Any] = {"count": len(ids), "max_model_len": self.engine.capacity}
            body_out["tokens"] = self._pieces(ids) if bool_field(body, "with_pieces") else ids
            if bool_field(body, "return_token_strs"):
                body_out["token_strs"] = [self._piece(i) for i in ids]
        except ApiError as err:
            return err.response()
        return JSONResponse(body_out)

    async def detokenize(self, request: Request) -> Response:
        try:
            body = self._checked(await self.read_json(request), DETOKENIZE_FIELDS)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(is_int(t) for t in ids):
                raise ApiError(400, "'tokens' must be a list of token ids", "tokens")
            skip = bool_field(body, "skip_special_tokens")
            text = await run_in_threadpool(self._decode, ids, skip)
        except ApiError as err:
            return err.response()
        return JSONResponse({"prompt": text, "content": text})

    async def model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if model_id != self.model_name:
            return unknown_model(model_id, self.model_name).response()
        return JSONResponse(model_card(self.engine, self.model_name, self.created))

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": __version__, "backend": self.engine.config.backend,
                             "device": self.engine.config.device})

    # -- helpers ----------------------------------------------------------------------

    def _checked(self, body: Any, allowed: frozenset[str]) -> dict:
        body = only_fields(body, allowed)
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise unknown_model(model, self.model_name)
        return body

    async def _encode(self, body: dict) -> list[int]:
        given = [k for k in ("prompt", "content", "messages") if body.get(k) is not None]
        if len(given) != 1:
            raise ApiError(400, "send exactly one of 'prompt', 'content' or 'messages'")
        field = given[0]
        if field == "messages":
            messages = calls_in_content(_messages(body), self.engine.manifest)
            method, args, kwargs = "encode", (messages,), _chat_options(body)
        else:
            chat = chat_field_given(body)
            if chat is not None:  # read only through the chat template
                raise ApiError(400, f"'{chat}' is a chat field: send 'messages'", chat)
            text = body[field]
            if not isinstance(text, str):
                raise ApiError(400, f"'{field}' must be a string", field)
            # vLLM adds the special tokens (BOS) unless told not to; llama-server does not.
            special = bool_field(body, "add_special_tokens", True) if field == "prompt" else \
                bool_field(body, "add_special", False)
            method, args, kwargs = "encode" if special else "encode_plain", (text,), {}
        try:
            return await self.call(method, *args, **kwargs)
        except RequestError as err:  # no tokenizer or template, a template error, too slow
            raise ApiError(400, str(err), field) from None

    def _decode(self, ids: list[int], skip_special: bool) -> str:
        tokenizer = self.engine.tokenizer
        bad = [t for t in ids if not 0 <= t < tokenizer.input_vocab_size]
        if bad:
            raise ApiError(400, f"token ids out of range [0, {tokenizer.input_vocab_size}): "
                           f"{bad[:5]}", "tokens")
        if tokenizer.tokenizer is None:
            raise ApiError(400, "this bundle has no tokenizer", "tokens")
        return tokenizer.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def _piece(self, token_id: int) -> str:
        tokenizer = self.engine.tokenizer.tokenizer
        return (tokenizer.id_to_token(token_id) if tokenizer is not None else None) or ""

    def _pieces(self, ids: list[int]) -> list[dict]:
        return [{"id": i, "piece": self._piece(i)} for i in ids]


def _messages(body: dict) -> list[dict]:
    # What the chat route renders (content parts joined, tool calls' arguments parsed), so
    # /tokenize shows the prompt a chat request would run.
    return parse_messages(body["messages"])


def _chat_options(body: dict) -> dict:
    # The chat route's template variables, so that /tokenize renders what it would run.
    options: dict[str, Any] = {"add_generation_prompt": True, **template_kwargs(body)}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ApiError(400, "'tools' must be a list of tool specs", "tools")
        options["tools"] = tools
    return options
