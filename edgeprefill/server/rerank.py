"""The rerank routes of a score bundle (sdk/scoring.py, Engine.submit_embedding):

    POST /v1/rerank, /rerank   the Jina/Cohere shape vLLM and llama.cpp serve: `query` a
                           string; `documents` strings or {"text": ...} objects (at most
                           MAX_DOCUMENTS); `top_n` (the best N; 0 or absent: all, as
                           vLLM reads 0); `return_documents` (default false: each result
                           then carries its `document` as {"text": ...}); `model`.
                           Reply `results: [{index, relevance_score, document?}]` best
                           first (ties in input order), `usage: {prompt_tokens,
                           total_tokens}` (the pairs' tokens).

Each (query, document) pair is tokenized as the bundle reads a pair (its template, or the
tokenizer's pair encoding) in a prompt worker, prefilled between other requests' steps,
and scored by the bundle's head; a relevance is sigmoid of one label, sigmoid(yes - no)
of two. A pair past the context, a bundle whose head has more labels (no one relevance),
or an embedding or generation bundle is a 400 in one line; on a score bundle the
generating and embedding routes are (app.py, server/embeddings.py).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeprefill.errors import EdgeprefillError, RequestError
from edgeprefill.sdk import scoring
from edgeprefill.server.body import only_fields
from edgeprefill.server.embeddings import hidden_rows
from edgeprefill.server.errors import ApiError
from edgeprefill.server.prompt_worker import PromptTimeout
from edgeprefill.values import is_int

if TYPE_CHECKING:
    from edgeprefill.server.app import OpenAIApi

FIELDS = frozenset({"model", "query", "documents", "top_n", "return_documents"})
MAX_DOCUMENTS = 1000  # Cohere's limit on one request's documents


class RerankRoutes:
    def __init__(self, api: OpenAIApi) -> None:
        self.api = api
        self.engine = api.engine

    def routes(self) -> list[Route]:
        return [Route(path, self.rerank, methods=["POST"]) for path in ("/v1/rerank", "/rerank")]

    async def rerank(self, request: Request) -> Response:
        try:
            body = only_fields(await self.api.read(request), FIELDS)
            self.api.check_model(body.get("model"))
            head = self._head()
            query, documents = _query(body.get("query")), _documents(body.get("documents"))
            top_n, give_back = _top_n(body.get("top_n")), _flag(body, "return_documents")
            ids = [await self._pair_ids(head.info, query, document) for document in documents]
            relevance = head.relevance(head.scores(await hidden_rows(self.api, ids)))
        except ApiError as err:
            return err.response(request.url.path)
        results = []
        for index, score in scoring.ranked(relevance, top_n):
            result: dict[str, Any] = {"index": index, "relevance_score": score}
            if give_back:
                result["document"] = {"text": documents[index]}
            results.append(result)
        count = sum(len(tokens) for tokens in ids)
        return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}",
                             "model": self.api.config.model_name, "results": results,
                             "usage": {"prompt_tokens": count, "total_tokens": count}})

    def _head(self) -> scoring.ScoreHead:
        head = self.engine.score_head
        if head is None:
            raise ApiError(400, scoring.scoring_only(self.engine.manifest))
        try:
            head.check_ranks()
        except RequestError as err:
            raise ApiError(400, str(err)) from None
        return head

    async def _pair_ids(self, info: Any, query: str, document: str) -> list[int]:
        """A pair's ids in a prompt worker; past the context a 400 naming `documents`."""
        try:
            encoded = await self.api.prompts.call("score_bounded", info, query, document,
                                                  self.engine.capacity)
        except PromptTimeout as err:
            raise ApiError(400, str(err), "documents", "prompt_timeout") from None
        except RequestError as err:
            code = "context_length_exceeded" if "exceeds the context" in str(err) else None
            raise ApiError(400, f"a query and document: {err}", "documents", code) from None
        except EdgeprefillError as err:
            raise ApiError(500, str(err), code="prompt_worker_error") from None
        assert isinstance(encoded.ids, list), "score_bounded refuses past the limit"
        return encoded.ids


def _query(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ApiError(400, "'query' must be a non-empty string", "query")
    return value


def _documents(value: Any) -> list[str]:
    """`documents`: strings, or {"text": ...} objects (Jina's and Cohere's)."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'documents' must be a non-empty list of strings or "
                       "{\"text\": ...} objects", "documents")
    if len(value) > MAX_DOCUMENTS:
        raise ApiError(400, f"'documents' holds {len(value)} items; at most "
                       f"{MAX_DOCUMENTS} a request", "documents")
    texts = [d.get("text") if isinstance(d, dict) and set(d) == {"text"} else d
             for d in value]
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise ApiError(400, f"documents[{bad}] must be a string or a {{\"text\": ...}} "
                       "object", "documents")
    return texts


def _top_n(value: Any) -> int | None:
    if value is None:
        return None
    if not is_int(value) or value < 0:
        raise ApiError(400, f"'top_n' must be an integer >= 0, got {value!r}", "top_n")
    return value or None  # vLLM's 0: all


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false", name)
    return value
