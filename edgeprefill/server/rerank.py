"""The rerank routes of a score bundle (sdk/scoring.py, Engine.submit_embedding):

    POST /v1/rerank, /rerank   the Jina/Cohere shape vLLM and llama.cpp serve: `query` a
                           string; `documents` strings or {"text": ...} objects (at most
                           MAX_DOCUMENTS); `top_n` (the best N; 0 or absent: all,
                           as vLLM reads its default 0; scoring.top_n, Engine.rerank's
                           check); `return_documents` (default
                           false: each result then carries its `document` as
                           {"text": ...}); `model`.
                           Reply `results: [{index, relevance_score, document?}]` best
                           first (ties in input order), `usage: {prompt_tokens,
                           total_tokens}` (the pairs' tokens).
    the same paths, a body with `texts` (and no `documents`; both: a 400)
                           text-embeddings-inference's (TEI's) shape: `query`; `texts`
                           strings; `raw_scores` (default false: the relevance; true:
                           the logit whose sigmoid it is, ScoreHead.logit); `return_text`;
                           `truncate` (absent: true, TEI's server default) and
                           `truncation_direction` (server/tei.py): a pair past the context
                           cut to it as TEI cuts one (the longer text first, the special
                           tokens kept; a pair read through a template is not cut, and is
                           refused with a 422), or with truncate false a 422 as TEI
                           answers; reply
                           `[{index, score, text?}]` best first.

Each (query, document) pair is tokenized as the bundle reads a pair (its template, or the
tokenizer's pair encoding) in a prompt worker, prefilled between other requests' steps,
and scored by the bundle's head; a relevance is sigmoid of one label, sigmoid(yes - no)
of two. A pair past the context (TEI's shape: a 422), a bundle whose head has more
labels (no one relevance), or an embedding or generation bundle is a 400 in one line; on
a score bundle the generating and embedding routes are (app.py, server/embeddings.py).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeprefill.errors import EdgeprefillError, RequestError
from edgeprefill.sdk import scoring
from edgeprefill.server.body import json_object, only_fields
from edgeprefill.server.embeddings import hidden_rows
from edgeprefill.server.errors import ApiError
from edgeprefill.server.prompt_worker import PromptTimeout
from edgeprefill.server.schemas import bool_field
from edgeprefill.server.tei import tei_status, truncation

if TYPE_CHECKING:
    from edgeprefill.server.app import OpenAIApi

FIELDS = frozenset({"model", "query", "documents", "top_n", "return_documents"})
TEI_FIELDS = frozenset({"model", "query", "texts", "raw_scores", "return_text", "truncate",
                        "truncation_direction"})
MAX_DOCUMENTS = 1000  # Cohere's limit on one request's documents


class RerankRoutes:
    def __init__(self, api: OpenAIApi) -> None:
        self.api = api
        self.engine = api.engine

    def routes(self) -> list[Route]:
        return [Route(path, self.rerank, methods=["POST"]) for path in ("/v1/rerank", "/rerank")]

    async def rerank(self, request: Request) -> Response:
        try:
            body = json_object(await self.api.read(request))
            if "texts" in body:
                if "documents" in body:
                    raise ApiError(400, "give 'documents' (Jina's and Cohere's shape) or "
                                   "'texts' (text-embeddings-inference's), not both", "texts")
                return await self._tei(body)
            return await self._jina(only_fields(body, FIELDS))
        except ApiError as err:
            return err.response(request.url.path)

    async def _jina(self, body: dict) -> Response:
        self.api.check_model(body.get("model"))
        self.head()
        query, documents = _query(body.get("query")), _documents(body.get("documents"))
        top_n, give_back = _top_n(body.get("top_n")), bool_field(body, "return_documents")
        relevance, count = await self.scored([(query, d) for d in documents], "documents")
        results = []
        for index, score in scoring.ranked(relevance, top_n):
            result: dict[str, Any] = {"index": index, "relevance_score": score}
            if give_back:
                result["document"] = {"text": documents[index]}
            results.append(result)
        return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}",
                             "model": self.api.config.model_name, "results": results,
                             "usage": {"prompt_tokens": count, "total_tokens": count}})

    async def _tei(self, body: dict) -> Response:
        """TEI's shape: [{index, score, text?}] best first; `raw_scores` the logit."""
        try:
            body = only_fields(body, TEI_FIELDS)
            self.api.check_model(body.get("model"))
            self.head()
            query, documents = _query(body.get("query")), texts(body.get("texts"), "texts")
            raw, give_back = bool_field(body, "raw_scores"), bool_field(body, "return_text")
            pairs = [(query, d) for d in documents]
            values, _ = await self.scored(pairs, "texts", truncation(body), raw)
        except ApiError as err:
            raise tei_status(err) from None
        ranks = []
        for index, score in scoring.ranked(values, None):
            rank: dict[str, Any] = {"index": index, "score": score}
            if give_back:
                rank["text"] = documents[index]
            ranks.append(rank)
        return JSONResponse(ranks)

    async def scored(self, pairs: list[tuple[str, str]], field: str,
                     truncate: str | None = None, raw: bool = False) -> tuple[np.ndarray, int]:
        """Each (query, document) pair's relevance (or with `raw` its logit:
        ScoreHead.logit), and the pairs' tokens; `truncate`: the direction a pair past
        the context is cut from (TEI's), else refused naming `field`."""
        head = self.head()
        ids = [await self._pair_ids(head.info, query, document, field, truncate)
               for query, document in pairs]
        scores = head.scores(await hidden_rows(self.api, ids, field))
        values = head.logit(scores) if raw else head.relevance(scores)
        return values, sum(len(tokens) for tokens in ids)

    def head(self) -> scoring.ScoreHead:
        """The score bundle's head; another bundle, or a head of no one relevance: a 400."""
        head = self.engine.score_head
        if head is None:
            raise ApiError(400, scoring.scoring_only(self.engine.manifest))
        try:
            head.check_ranks()
        except RequestError as err:
            raise ApiError(400, str(err)) from None
        return head

    async def _pair_ids(self, info: Any, query: str, document: str, field: str,
                        truncate: str | None) -> list[int]:
        """A pair's ids in a prompt worker; past the context a 400 naming `field`."""
        try:
            encoded = await self.api.prompts.call("score_bounded", info, query, document,
                                                  self.engine.capacity, truncate)
        except PromptTimeout as err:
            raise ApiError(400, str(err), field, "prompt_timeout") from None
        except RequestError as err:
            code = "context_length_exceeded" if "exceeds the context" in str(err) else None
            raise ApiError(400, f"a query and document: {err}", field, code) from None
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
    if isinstance(value, list):
        value = [d.get("text") if isinstance(d, dict) and set(d) == {"text"} else d
                 for d in value]
    return texts(value, "documents", " (or {\"text\": ...} objects)")


def texts(value: Any, field: str, objects: str = "") -> list[str]:
    """A non-empty list of at most MAX_DOCUMENTS strings (`objects`: what else the
    field takes, for the refusal); else a 400 naming `field`."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"'{field}' must be a non-empty list of strings{objects}", field)
    if len(value) > MAX_DOCUMENTS:
        raise ApiError(400, f"'{field}' holds {len(value)} items; at most "
                       f"{MAX_DOCUMENTS} a request", field)
    bad = next((i for i, t in enumerate(value) if not isinstance(t, str)), None)
    if bad is not None:
        raise ApiError(400, f"{field}[{bad}] must be a string{objects}", field)
    return value


def _top_n(value: Any) -> int | None:
    try:
        return scoring.top_n(value)  # the SDK's check: Engine.rerank takes the same
    except RequestError as err:
        raise ApiError(400, str(err), "top_n") from None

