"""The OpenAI-compatible HTTP app around one Engine.

    POST /v1/completions         text or token-id prompt
    POST /v1/chat/completions    messages, rendered with the bundle's chat template
    POST /v1/responses           OpenAI's Responses API, stateless, through the chat path
    POST /v1/messages            Anthropic's Messages API, through the chat path
    POST /v1/messages/count_tokens   the token count of a Messages API prompt
    POST /api/chat, /api/generate    Ollama's native API, through the chat (or, raw, the
                                 completions) path; its other routes: server/ollama_routes.py
    POST /v1/embeddings, /api/embed, /api/embeddings   an embedding bundle's vectors
                                 (server/embeddings.py); on such a bundle the generating
                                 routes above answer 400
    POST /embed                  text-embeddings-inference's vectors (server/tei.py)
    POST /v1/rerank, /rerank     a score bundle's relevance of documents to a query
                                 (server/rerank.py: Jina's and Cohere's shape, or TEI's
                                 with `texts`); on such a bundle the generating and
                                 embedding routes answer 400
    POST /v1/score, /score       vLLM's scores of text pairs: a score bundle's relevance, an
                                 embedding bundle's cosine similarity (server/score.py)
    GET  /v1/models              the one model this server holds
    /tokenize, /detokenize, /v1/models/{id}, /version: server/routes_extra.py
    GET  /health                 liveness (never needs the API key)
    GET  /metrics                Prometheus text format

Handlers run on the event loop; the engine's own thread does the work, and prompt
worker processes tokenize and render chat templates under a time limit (see
server/prompt_worker.py), so no request can stall the loop. Every admitted request is
closed exactly once (finished, failed, or its client gone): that cancels it if it still
runs, which frees its KV slot, and records its metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, NamedTuple

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeprefill.errors import EdgeprefillError, EngineClosedError, RequestError
from edgeprefill.sdk.embedding import embedding_only
from edgeprefill.sdk.engine import Engine
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.sdk.scoring import score_only
from edgeprefill.sdk.stream import TokenStream
from edgeprefill.server import access_log
from edgeprefill.server.access_log import AccessLog
from edgeprefill.server.auth import ApiKeyMiddleware
from edgeprefill.server.body import read_json
from edgeprefill.server.choices import Choices
from edgeprefill.server.config import ServerConfig, body_limit
from edgeprefill.server.embeddings import EmbeddingRoutes
from edgeprefill.server.errors import ApiError, generation_failure, unknown_model
from edgeprefill.server.harmony import bundle_harmony, reply_harmony
from edgeprefill.server.json_numbers import JsonNumbersResponse
from edgeprefill.server.messages_request import count_body, parse_messages_api
from edgeprefill.server.messages_stream import MessageReply, message_events
from edgeprefill.server.metrics import ServerMetrics
from edgeprefill.server.ollama_request import (
    is_load,
    model_of,
    ollama_error,
    parse_ollama_chat,
    parse_ollama_generate,
)
from edgeprefill.server.ollama_routes import OllamaRoutes
from edgeprefill.server.ollama_stream import OllamaReply, load_reply, ollama_lines
from edgeprefill.server.prompt_worker import Encoded, PromptTimeout, PromptWorkers
from edgeprefill.server.reasoning import bundle_thinks, reply_reasoning
from edgeprefill.server.rerank import RerankRoutes
from edgeprefill.server.responses import Shape
from edgeprefill.server.responses_output import ResponseHead
from edgeprefill.server.responses_request import (
    parse_responses,
    response_echo,
    responses_error,
)
from edgeprefill.server.responses_stream import Reply, response_events
from edgeprefill.server.routes_extra import ExtraRoutes, model_card
from edgeprefill.server.schemas import CompletionRequest, parse_chat, parse_completion
from edgeprefill.server.score import ScoreRoutes
from edgeprefill.server.shutdown import ShutdownCut
from edgeprefill.server.sse import EventStreamResponse, completion_events
from edgeprefill.server.tei import TeiRoutes
from edgeprefill.server.tools import (
    call_format,
    calls_in_content,
    renders_tools,
    reply_parser,
    template_vars,
)


def create_app(engine: Engine, config: ServerConfig) -> Starlette:
    """An ASGI app serving `engine`; the caller owns the engine and closes it."""
    api = OpenAIApi(engine, config)
    extra = ExtraRoutes(
        engine, config.model_name, api.started,
        lambda request: read_json(request, api.max_body_bytes, config.body_timeout_s),
        api.prompts.call)
    ollama = OllamaRoutes(engine, config.model_name, api.read, api.splits_thinking,
                          api.renders_tools)
    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/responses", api.responses, methods=["POST"]),
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.prometheus, methods=["GET"]),
        Route("/api/chat", api.ollama_chat, methods=["POST"]),
        Route("/api/generate", api.ollama_generate, methods=["POST"]),
        *extra.routes(),
        *ollama.routes(),
        *EmbeddingRoutes(api).routes(),
        *RerankRoutes(api).routes(),
        *ScoreRoutes(api).routes(),
        *TeiRoutes(api).routes(),
    ]
    # AccessLog outermost, so that it logs what the client got: ShutdownCut answers a
    # request the shutdown cancelled with a 503 (inside it, the log said 500 or 200).
    # Both outside the key check: the 401s are logged too.
    # AccessLog counts every refusal (http_rejected), whichever layer answered it.
    middleware = [Middleware(AccessLog, on_reject=api.metrics.reject),
                  Middleware(ShutdownCut)]
    if config.cors.enabled:  # outside the key check: preflights carry no key
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(config.cors.origins),
            allow_origin_regex=config.cors.regex, allow_methods=["*"], allow_headers=["*"]))
    if config.api_key is not None:
        middleware.append(Middleware(ApiKeyMiddleware, key=config.api_key))
    handlers = {HTTPException: _http_error, Exception: _internal_error}
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=handlers,
                    lifespan=api.lifespan)
    # A trailing slash gets a 404 naming the path, not a 307 to a URL built from the
    # client's Host header (a POST redirect most clients do not follow anyway).
    app.router.redirect_slashes = False
    app.state.api = api
    return app


class OpenAIApi:
    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.metrics = ServerMetrics(engine)
        self.pending = 0  # admitted and not closed; only touched on the event loop
        self.started = int(time.time())
        self.max_body_bytes = body_limit(config, engine.capacity,
                                         batches=engine.manifest.task != "generate")
        self.prompts = PromptWorkers(engine.bundle_dir, config.prompt_workers,
                                     config.prompt_timeout_s)
        # Decided once per bundle (and whether a thinking budget has anything to cap); each
        # request then says whether its prompt opened the block and whether a grammar
        # governs the reply.
        self.thinks = bundle_thinks(engine.tokenizer)
        self.splits_reasoning = config.reasoning_parser == "auto" and self.thinks
        # gpt-oss's harmony replies (server/harmony.py): reasoning, content and calls
        self.splits_harmony = config.reasoning_parser == "auto" and \
            bundle_harmony(engine.tokenizer)
        self.splits_thinking = self.splits_reasoning or self.splits_harmony  # Ollama's
        # Ollama's `tools` capability: the chat template shows the model its tools
        self.renders_tools = renders_tools(engine.manifest.tokenizer.chat_template or "")

    @asynccontextmanager
    async def lifespan(self, app: Starlette):
        # Streams are read with `async for`, which waits on the event loop and holds no
        # thread: the default executor only runs the prompt workers' calls.
        await self.prompts.start()
        # anyio loads its asyncio backend (~8 ms of imports) on first use, which was the
        # first streaming request's (EventStreamResponse's task group): load it here.
        async with anyio.create_task_group():
            pass
        try:
            yield
        finally:
            self.prompts.close()

    # -- routes -----------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def models(self, request: Request) -> Response:
        model = model_card(self.engine, self.config.model_name, self.started)
        return JSONResponse({"object": "list", "data": [model]})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.config.model_name})

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    # -- one completion ---------------------------------------------------------------

    async def _complete(self, request: Request, chat: bool) -> Response:
        admitted = await self._admit(request, parse_chat if chat else parse_completion)
        if isinstance(admitted, Response):
            return admitted
        parsed, stream = admitted.request, admitted.stream
        shape = self._shape(admitted, chat)
        return await self._reply(
            request, admitted, "chat" if chat else "completions",
            lambda: completion_events(stream, shape, parsed.include_usage,
                                      parsed.constraint_field),
            lambda: shape.whole(stream))

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API: the chat route under other names (its request in
        server/responses_request.py, its reply in server/responses_stream.py)."""
        admitted = await self._admit(request, parse_responses, responses_error)
        if isinstance(admitted, Response):
            return admitted
        head = ResponseHead.new(self.config.model_name, response_echo(admitted.body))
        reply = Reply(admitted.stream, self._shape(admitted, chat=True), head,
                      lambda text: len(self.engine.tokenizer.encode_plain(text)))
        return await self._reply(
            request, admitted, "responses",
            lambda: response_events(reply, admitted.request.constraint_field), reply.whole)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API: the chat route under other names (its request in
        server/messages_request.py, its reply in server/messages_stream.py); its errors
        in Anthropic's schema (ApiError.response)."""
        admitted = await self._admit(request, parse_messages_api)
        if isinstance(admitted, Response):
            return admitted
        reply = MessageReply(admitted.stream, self._shape(admitted, chat=True),
                             self.config.model_name)
        return await self._reply(
            request, admitted, "messages",
            lambda: message_events(reply, admitted.request.constraint_field), reply.whole)

    async def count_tokens(self, request: Request) -> Response:
        """The tokens a Messages API prompt renders to: what the reply's
        usage.input_tokens would say."""
        try:
            body = await read_json(request, self.max_body_bytes, self.config.body_timeout_s)
            parsed = count_body(body)
            self.check_model(parsed.model)
            tokens = (await self._encode(parsed)).ids
        except ApiError as err:
            return err.response(request.url.path)
        count = tokens if isinstance(tokens, int) else len(tokens)
        return JSONResponse({"input_tokens": count})

    async def ollama_chat(self, request: Request) -> Response:
        return await self._ollama(request, chat=True)

    async def ollama_generate(self, request: Request) -> Response:
        return await self._ollama(request, chat=False)

    async def _ollama(self, request: Request, chat: bool) -> Response:
        """Ollama's /api/chat and /api/generate: the chat route (a raw generate: the
        completions route) under other names (its request in server/ollama_request.py,
        its reply, NDJSON, in server/ollama_stream.py); its errors in Ollama's shape."""
        try:
            body = await self.read(request)
            if is_load(body, "messages" if chat else "prompt"):
                return JSONResponse(load_reply(model_of(body, self.config.model_name), chat))
        except ApiError as err:
            return err.response(request.url.path)
        def parse(b: Any) -> CompletionRequest:
            if not chat:
                return parse_ollama_generate(b, self.config.model_name, self.engine.capacity,
                                             self.splits_thinking)
            return parse_ollama_chat(b, self.config.model_name, self.engine.capacity,
                                     self.splits_thinking, self.renders_tools)

        admitted = await self._admit_body(request, body, parse, ollama_error)
        if isinstance(admitted, Response):
            return admitted
        shape = self._shape(admitted, chat=admitted.request.prompt_field == "messages")
        reply = OllamaReply(admitted.stream, shape, body["model"], chat)
        return await self._reply(
            request, admitted, "api_chat" if chat else "api_generate",
            lambda: ollama_lines(reply, admitted.request.constraint_field), reply.whole,
            media_type="application/x-ndjson")

    async def read(self, request: Request) -> Any:
        return await read_json(request, self.max_body_bytes, self.config.body_timeout_s)

    async def _admit(self, request: Request, parse: Callable[[Any], CompletionRequest],
                     rename: Callable[[ApiError], ApiError] = lambda err: err,
                     ) -> Admitted | Response:
        """Read, check and submit a request; the error response if it is refused
        (`rename` puts a refusal at submit in the route's own field names)."""
        try:
            body = await self.read(request)
        except ApiError as err:
            return err.response(request.url.path)
        return await self._admit_body(request, body, parse, rename)

    async def _admit_body(self, request: Request, body: Any,
                          parse: Callable[[Any], CompletionRequest],
                          rename: Callable[[ApiError], ApiError] = lambda err: err,
                          ) -> Admitted | Response:
        """Check and submit a request read already; the error response if it is refused."""
        try:
            parsed = parse(body)
            self.check_model(parsed.model)
            try:
                stream, opens_think, governed = await self._submit(parsed)
            except ApiError as err:
                raise rename(err) from None
            access_log.note(request, stream)
        except ApiError as err:
            return err.response(request.url.path)
        return Admitted(body, parsed, stream, opens_think, governed)

    def _shape(self, admitted: Admitted, chat: bool) -> Shape:
        parsed = admitted.request
        # A reply whose grammar governs it whole (a forced tool_choice; structured output
        # where the reply is not split, `_answer_grammar`) is not split: it is the
        # content. Strict tools under auto, and structured output after the think block,
        # leave the reasoning free: split as ever.
        constrained = admitted.governed
        reasoning = reply_reasoning(self.splits_reasoning and chat, constrained,
                                    admitted.opens_think)
        harmony = reply_harmony(self.splits_harmony and chat, constrained)
        return Shape.new(chat, self.config.model_name,
                         reply_parser(parsed.tools, self.engine.manifest),
                         self.engine.tokenizer.token_bytes, reasoning, harmony)

    async def _reply(self, request: Request, admitted: Admitted, endpoint: str,
                     events: Callable[[], AsyncIterator[bytes]],
                     whole: Callable[[], dict[str, Any]],
                     media_type: str = "text/event-stream") -> Response:
        """Every generating route's reply: its `events` streamed, or the `whole` reply once
        generation is over (or the response that replaces it: `_wait`)."""
        close = self._closer(endpoint, admitted.stream)
        if admitted.request.stream:
            stream = admitted.stream
            return EventStreamResponse(events(), on_close=close, ended=lambda: stream.done,
                                       media_type=media_type)
        failed = await self._wait(admitted, request, close)
        return failed or JsonNumbersResponse(whole())

    async def _wait(self, admitted: Admitted, request: Request,
                    close: Callable[[], None]) -> Response | None:
        """Wait for a whole reply; the response to send instead of it if the client left
        or generation failed, None when the reply is there."""
        try:
            finished = await _finish_unless_client_leaves(admitted.stream, request)
        finally:
            close()
        if not finished:
            return Response(status_code=499)  # nobody is listening; the request is cancelled
        if admitted.stream.finish_reason == "error":
            return generation_failure(admitted.stream.failed, admitted.request.constraint_field
                                      ).response(request.url.path)
        return None

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.config.model_name:
            raise unknown_model(model, self.config.model_name)

    async def _submit(self, req: CompletionRequest) -> Submitted:
        task = self.engine.manifest.task
        if task != "generate":  # before its prompt is rendered
            raise ApiError(400, score_only(self.engine.manifest) if task == "score" else
                           embedding_only(self.engine.manifest))
        # `pending` counts choices: each of n runs as a request of its own in the engine,
        # whose queue is as long as max_pending (serve_cmd), so admitting n > 1 on one
        # place would let its later choices find the queue full halfway through.
        limit = self.config.max_pending
        if req.n > limit:
            raise ApiError(400, f"n={req.n} is more choices than this server runs at once "
                           f"(max_pending {limit}); ask for at most {limit}", "n")
        if self.pending + req.n > limit:
            raise ApiError(429, f"the server is busy ({self.pending} of {limit} places "
                           "taken); retry shortly", code="queue_full")
        self.pending += req.n  # held while tokenizing, so concurrent arrivals count it
        admitted = False
        arrival = time.perf_counter()  # TTFT counts tokenizing and rendering the template
        try:
            encoded = await self._encode(req)
            tokens = encoded.ids
            self._check_context(tokens if isinstance(tokens, int) else len(tokens),
                                req.params.max_new_tokens)
            assert isinstance(tokens, list)
            params = self.engine.generation_defaults.fill(req.params, req.given)
            if req.tools is not None and req.tools.strict_auto:  # the calls' lazy grammar
                # gpt-oss's calls are harmony headers, not the template's call format
                fmt = "harmony" if self.splits_harmony else call_format(self.engine.manifest)
                params = req.tools.constrain_auto(
                    params, fmt, self.engine.tokenizer.special_ids, self.thinks)
                req = replace(req, constraint_field="tools")  # its refusals name tools
            params = self._answer_grammar(params, req)
            # After the grammar: the server's default budget leaves a reply it governs be.
            params = self._thinking_budget(params, _is_chat(req.prompt))
            stream = Choices(self.engine.submit_n(
                tokens, params, req.n, req.priority, None, req.chunk_size, arrival=arrival))
            admitted = True  # from here the closer gives the place back
            governed = params.constraint is not None and not params.constraint.frees_reasoning
            return Submitted(stream, encoded.opens_think, governed)
        except EngineClosedError as err:  # shutting down: the request itself is fine
            raise ApiError(503, str(err), code="engine_closed") from None
        except RequestError as err:  # refused at submit: name the field it came from
            raise ApiError(400, str(err), _param_of(err, req)) from None
        finally:
            if not admitted:
                self.pending -= req.n

    def _answer_grammar(self, params: GenerationParams,
                        req: CompletionRequest) -> GenerationParams:
        """A chat request's structured output holds the answer after the think block
        where the reply is split as reasoning (sdk/think_first.py): the bundle thinks, the
        server splits (--reasoning-parser auto) and the request leaves thinking on.
        Elsewhere its grammar governs the whole reply, as it always did."""
        constraint = params.constraint
        if constraint is None or not constraint.after_thinking or self._thinks_first(req):
            return params
        try:
            # No think tags: the budget has nothing to cap (as in _thinking_budget).
            return replace(params, constraint=replace(constraint, after_thinking=False),
                           thinking_budget=params.thinking_budget if self.thinks else None)
        except RequestError:  # a budget beside a grammar over the whole reply
            raise ApiError(400, "'thinking_token_budget' cannot be combined with "
                           f"'{req.constraint_field}' here: the reply is not split as "
                           "reasoning (thinking is off, or --reasoning-parser none), so the "
                           "grammar governs it from the first token", "thinking_token_budget"
                           ) from None

    def _thinks_first(self, req: CompletionRequest) -> bool:
        """Whether the request's reply is split as reasoning (server/reasoning.py)."""
        return self.splits_reasoning and _is_chat(req.prompt) and \
            req.template_kwargs.get("enable_thinking") is not False

    def _thinking_budget(self, params: GenerationParams, chat: bool) -> GenerationParams:
        """The request's thinking budget, else the server's for a chat reply no grammar
        governs. None where the bundle knows no think tags: its replies have no reasoning
        to cap (the SDK would refuse the budget; clients such as Anthropic's send one
        whatever the model)."""
        budget = params.thinking_budget
        # strict tools' grammar, or structured output after the think block
        free = params.constraint is None or params.constraint.frees_reasoning
        if budget is None and chat and free and self.config.reasoning_budget >= 0:
            budget = self.config.reasoning_budget
        if not self.thinks:
            budget = None
        return params if budget == params.thinking_budget else \
            replace(params, thinking_budget=budget)

    async def _encode(self, req: CompletionRequest) -> Encoded:
        """Token ids of the prompt (text and chat go through a prompt worker), or only
        their count when they cannot fit the context."""
        if not isinstance(req.prompt, str) and not _is_chat(req.prompt):
            if len(req.prompt) > self.engine.capacity:
                return Encoded(len(req.prompt))  # refused for its length: ids unread
            try:
                return Encoded(self.engine.tokenizer.encode(req.prompt))  # a range check
            except RequestError as err:
                raise ApiError(400, str(err), req.prompt_field) from None
        prompt = req.prompt if isinstance(req.prompt, str) else \
            calls_in_content(list(req.prompt), self.engine.manifest)
        try:
            encoded = await self.prompts.call("encode_bounded", prompt, self.engine.capacity,
                                              **template_vars(req.tools, self.engine.manifest),
                                              **req.template_kwargs)
            if isinstance(prompt, str) and isinstance(encoded.ids, list) and \
                    self.engine.tokenizer.encodes_nothing(prompt, encoded.ids):
                # whitespace the tokenizer drops: the BOS alone, as Engine.generate refuses
                raise ApiError(400, "the prompt is empty (its whitespace is no token)",
                               req.prompt_field)
            return encoded
        except PromptTimeout as err:
            raise ApiError(400, str(err), req.prompt_field, "prompt_timeout") from None
        except RequestError as err:  # no chat template, the template raised, ...
            raise ApiError(400, str(err), req.prompt_field) from None
        except EdgeprefillError as err:
            raise ApiError(500, str(err), code="prompt_worker_error") from None

    def _check_context(self, prompt_tokens: int, max_tokens: int | None) -> None:
        context = self.engine.capacity
        if prompt_tokens + (max_tokens or 1) > context:
            asked = f"plus max_tokens ({max_tokens}) " if max_tokens else ""
            fix = "shorten the prompt or lower max_tokens" if max_tokens else \
                "shorten the prompt"
            raise ApiError(
                400, f"the prompt ({prompt_tokens} tokens) {asked}exceeds the context of "
                f"{context} tokens; {fix}", "max_tokens" if max_tokens else "prompt",
                "context_length_exceeded",
            )

    def _closer(self, endpoint: str, stream: Choices) -> Callable[[], None]:
        closed = False

        def close() -> None:
            nonlocal closed
            if closed:
                return
            closed = True
            cut = not stream.done
            if cut:
                stream.cancel()  # the client left, or the reply was cut short: free the KV
            self.pending -= len(stream.streams)
            # Cut while a choice still ran is `cancelled`, whatever the first choice's end.
            self.metrics.observe(endpoint, stream, cancelled=cut)

        return close


class Submitted(NamedTuple):
    stream: Choices
    opens_think: bool  # the rendered chat prompt left a think block open for the reply
    governed: bool  # a grammar governs the whole reply (no reasoning to split)


class Admitted(NamedTuple):
    body: Any  # the request's JSON, as sent
    request: CompletionRequest
    stream: Choices
    opens_think: bool
    governed: bool


def _is_chat(prompt) -> bool:
    return bool(prompt) and all(isinstance(m, dict) for m in prompt)


def _param_of(err: RequestError, req: CompletionRequest) -> str | None:
    """The request field a submit-time refusal is about (the engine checks these when it
    builds the request's sampler: a constraint that does not compile, a logit_bias id)."""
    return req.constraint_field if err.field == "constraint" else err.field


async def _finish_unless_client_leaves(stream: TokenStream, request: Request) -> bool:
    """Read the whole stream; False if the client disconnected first (caller cancels)."""

    async def drain() -> None:
        async for _ in stream:
            pass

    async def client_gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    reading = asyncio.ensure_future(drain())
    watching = asyncio.ensure_future(client_gone())
    try:
        done, _ = await asyncio.wait({reading, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        reading.cancel()
        watching.cancel()
    if reading in done:
        reading.result()  # re-raise a failure while reading, if any
        return True
    return False


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no route {request.url.path}", 405: "method not allowed"}.get(
        exc.status_code, str(exc.detail))
    return ApiError(exc.status_code, message).response(request.url.path)


async def _internal_error(request: Request, exc: Exception) -> Response:
    response = ApiError(500, f"internal error: {type(exc).__name__}: {exc}").response(
        request.url.path)
    # Starlette raises the error again after this reply, and uvicorn then closes the
    # connection: said here, a client does not send its next request down a dead socket.
    response.headers["Connection"] = "close"
    return response
