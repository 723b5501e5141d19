"""Hugging Face text-embeddings-inference's (TEI's) embedding route, and the parts its
rerank shape (server/rerank.py, POST /rerank with `texts`) shares:

    POST /embed    `inputs` a string, a list of strings, token ids or a list of such lists
                   (at most 2048 items); `normalize` (default true: L2 after the cut,
                   whatever the bundle's own Normalize module says, as TEI does; false:
                   the model's pooled row as it is); `dimensions` (the first N);
                   `prompt_name` (one of the model's prompts; absent: its default one, as
                   TEI's --default-prompt-name); `truncate`, `truncation_direction`;
                   `model` (not TEI's: checked, as on every route).
                   Reply: the vectors, [[float]].

`truncate` absent or null is true, the default of TEI's server (its --auto-truncate): a
text past the context is cut to it, its end (`truncation_direction` "right", the
default) or its start ("left"), the tokenizer's special tokens kept; token ids are cut
as they are. With `truncate` false such a text is a 422, as TEI answers it (TEI's
"Validation" errors are 422s); a bad field is a 400 naming it, and every refusal is in
the OpenAI error shape, as on every route but Ollama's and Anthropic's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeprefill.server.body import only_fields
from edgeprefill.server.embeddings import EmbeddingRoutes, openai_inputs
from edgeprefill.server.errors import ApiError
from edgeprefill.server.schemas import bool_field

if TYPE_CHECKING:
    from edgeprefill.server.app import OpenAIApi

EMBED_FIELDS = frozenset({"model", "inputs", "normalize", "dimensions", "prompt_name",
                          "truncate", "truncation_direction"})
DIRECTIONS = {"right": "right", "Right": "right", "left": "left", "Left": "left"}  # serde's


class TeiRoutes:
    def __init__(self, api: OpenAIApi) -> None:
        self.embeddings = EmbeddingRoutes(api)

    def routes(self) -> list[Route]:
        return [Route("/embed", self.embed, methods=["POST"])]

    async def embed(self, request: Request) -> Response:
        routes = self.embeddings
        try:
            body = only_fields(await routes.api.read(request), EMBED_FIELDS)
            routes.api.check_model(body.get("model"))
            routes.require_embedding()
            direction = truncation(body)
            normalize = bool_field(body, "normalize", True)
            dimensions = routes.dimensions(body)
            inputs = openai_inputs(body.get("inputs"), "inputs")
            prompt = routes.texts_prompt(body, inputs)
            ids = [routes.token_ids(item, direction, "inputs") if isinstance(item, list) else
                   await routes.ids(prompt + item, direction is not None, "inputs",
                                    direction=direction or "right")
                   for item in inputs]
            vectors = await routes.vectors(ids, dimensions, normalize, "inputs")
        except ApiError as err:
            return tei_status(err).response(request.url.path)
        return JSONResponse(vectors.tolist())


def truncation(body: dict) -> str | None:
    """The direction a text past the context is cut from ("right": its end), or None
    where `truncate` is false (TEI's default true: its --auto-truncate)."""
    direction = direction_of(body)  # checked even where nothing is cut
    return direction if bool_field(body, "truncate", True) else None


def direction_of(body: dict) -> str:
    value = body.get("truncation_direction")
    if value is None:
        return "right"
    if not isinstance(value, str) or value not in DIRECTIONS:
        raise ApiError(400, f"'truncation_direction' must be right or left, got {value!r}",
                       "truncation_direction")
    return DIRECTIONS[value]


def tei_status(err: ApiError) -> ApiError:
    """TEI's status for a refusal: a text past the context is its "Validation" 422."""
    if err.status == 400 and err.code == "context_length_exceeded":
        return ApiError(422, err.message, err.param, err.code)
    return err

