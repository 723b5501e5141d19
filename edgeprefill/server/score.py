"""vLLM's score routes of a score bundle (its pairs scored as server/rerank.py scores them)
and of an embedding bundle (the cosine similarity of each pair's vectors):

    POST /score, /v1/score   two sides, each a string or a list of strings (at most
                           MAX_DOCUMENTS), named as any vLLM release names them: `text_1`
                           and `text_2`, `queries` and `documents`, `queries` and `items`,
                           or `data_1` and `data_2` (one pair of names a request). One
                           first text and N second ones score N pairs (1:N), N and N
                           score them in order (N:N); other lengths are a 400, as vLLM
                           refuses them. `use_activation` (default true: each pair's
                           relevance, sigmoid of its logit, what vLLM's score gives a
                           one-label classifier and a token reranker it made one label of
                           yes - no; false: that logit); `model`; `user` (accepted,
                           unused). Reply `data: [{index, object: "score", score}]` in
                           the pairs' order, `usage: {prompt_tokens, total_tokens,
                           completion_tokens: 0}`, `id`, `object: "list"`, `created`,
                           `model`.

vLLM's other fields (truncate_prompt_tokens, priority, mm_processor_kwargs, ...) are
refused naming them: nothing here would honour them. A pair past the context, a head of
no one relevance, or a generation bundle is a 400 in one line; so is an empty text on an
embedding bundle, as its embedding routes refuse one. An embedding bundle scores
a pair as vLLM scores an embedding model's: the cosine similarity of the two texts'
vectors (`use_activation` then changes nothing, as in vLLM, where it only skips a
normalization the cosine makes anyway).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeprefill.server.body import only_fields
from edgeprefill.server.embeddings import EmbeddingRoutes, refuse_blank
from edgeprefill.server.errors import ApiError
from edgeprefill.server.rerank import RerankRoutes, texts
from edgeprefill.server.schemas import bool_field

if TYPE_CHECKING:
    from edgeprefill.server.app import OpenAIApi

# The names of the two sides in vLLM's releases: text_1/text_2 first, then the others.
PAIRS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
         ("data_1", "data_2"))
SIDES = frozenset(name for pair in PAIRS for name in pair)
FIELDS = frozenset({"model", "user", "use_activation"}) | SIDES


class ScoreRoutes:
    def __init__(self, api: OpenAIApi) -> None:
        self.api = api
        self.pairs = RerankRoutes(api)
        self.embeddings = EmbeddingRoutes(api)

    def routes(self) -> list[Route]:
        return [Route(path, self.score, methods=["POST"]) for path in ("/v1/score", "/score")]

    async def score(self, request: Request) -> Response:
        try:
            body = only_fields(await self.api.read(request), FIELDS)
            self.api.check_model(body.get("model"))
            embeds = self.api.engine.manifest.task == "embed"
            if not embeds:
                self.pairs.head()
            first, second = _sides(body)
            firsts, seconds = _side(body, first), _side(body, second)
            pairs = _pairs(firsts, seconds, first)
            raw = not bool_field(body, "use_activation", True)
            if embeds:  # a blank text's vector would be the special tokens' alone
                refuse_blank(firsts, first)
                refuse_blank(seconds, second)
                values, count = await self._cosines(firsts, seconds, first, second)
            else:
                if not all(firsts):  # the query, which /v1/rerank and Engine.rerank refuse
                    raise ApiError(400, f"a '{first}' text (a query) is empty", first)
                values, count = await self.pairs.scored(pairs, second, raw=raw)
        except ApiError as err:
            return err.response(request.url.path)
        data = [{"index": i, "object": "score", "score": float(value)}
                for i, value in enumerate(values)]
        return JSONResponse({
            "id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": self.api.config.model_name, "data": data,
            "usage": {"prompt_tokens": count, "total_tokens": count, "completion_tokens": 0}})

    async def _cosines(self, firsts: list[str], seconds: list[str], first: str,
                       field: str) -> tuple[np.ndarray, int]:
        """An embedding bundle's scores, as vLLM scores an embedding model's pairs: the
        cosine similarity of the two texts' vectors (the model's default prompt before
        each, as on the embedding routes), and the texts' tokens; a text past the
        context is refused naming its side."""
        prompt = self.embeddings.prompt({})
        ids = [await self.embeddings.ids(prompt + text, False, name)  # a long text's side
               for name, side in ((first, firsts), (field, seconds)) for text in side]
        vectors = await self.embeddings.vectors(ids, None, True, field)
        cosines = (vectors[:len(firsts)] * vectors[len(firsts):]).sum(axis=1)
        return cosines, sum(len(tokens) for tokens in ids)


def _sides(body: dict) -> tuple[str, str]:
    """The request's pair of side names; none, half of one, or two: a 400."""
    given = {name for name in SIDES if name in body}
    for pair in PAIRS:
        if given == set(pair):
            return pair
    named = ", ".join(sorted(given)) or "none"
    raise ApiError(400, "give one pair of sides: text_1 and text_2, queries and documents, "
                   f"queries and items, or data_1 and data_2 (given: {named})",
                   min(given) if given else "text_1")


def _side(body: dict, name: str) -> list[str]:
    value = body[name]
    return texts([value] if isinstance(value, str) else value, name, " (or a string)")


def _pairs(firsts: list[str], seconds: list[str], name: str) -> list[tuple[str, str]]:
    """1:1, 1:N or N:N pairs, as vLLM pairs its sides."""
    if len(firsts) == 1:
        return [(firsts[0], second) for second in seconds]
    if len(firsts) != len(seconds):
        raise ApiError(400, f"the sides hold {len(firsts)} and {len(seconds)} texts; they "
                       "must be 1:1, 1:N or N:N", name)
    return list(zip(firsts, seconds, strict=True))

