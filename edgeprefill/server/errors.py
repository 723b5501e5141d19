"""Errors in the OpenAI error schema: `{"error": {"message", "type", "param", "code"}}`,
on the Messages API's paths in Anthropic's: `{"type": "error", "error": {"type",
"message"}}`, and on Ollama's (/api/...) in Ollama's: `{"error": "message"}`, with the
same HTTP status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import JSONResponse

if TYPE_CHECKING:
    from edgeprefill.sdk.stream import TokenStream

# HTTP status -> the OpenAI error `type` clients switch on.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}

# HTTP status -> the Anthropic error `type` (Anthropic's API reference, "Errors").
ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)  # and the paths under it (count_tokens)
OLLAMA_PREFIX = "/api/"  # Ollama's native API (server/ollama_request.py)


class ApiError(Exception):
    """A request the server answers with an error status instead of a completion."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error")
        return {
            "error": {"message": _printable(self.message), "type": kind, "param": self.param,
                      "code": self.code}
        }

    def anthropic_body(self) -> dict:
        kind = ANTHROPIC_TYPES.get(self.status, "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": _printable(self.message)}}

    def ollama_body(self) -> dict:
        return {"error": _printable(self.message)}

    def response(self, path: str = "") -> JSONResponse:
        """The error response; on the Messages API's paths in Anthropic's schema, on
        Ollama's in Ollama's."""
        body = self.anthropic_body() if is_anthropic(path) else \
            self.ollama_body() if path.startswith(OLLAMA_PREFIX) else self.body()
        headers = {}
        if self.status in (429, 503):
            headers["Retry-After"] = "1"
        if self.status in CLOSES_CONNECTION:
            headers["Connection"] = "close"
        return JSONResponse(body, status_code=self.status, headers=headers or None)


def unknown_model(model: object, served: str) -> ApiError:
    """A request for another model than the one served (404, OpenAI's model_not_found)."""
    return ApiError(404, f"model {model!r} does not exist; this server serves {served!r} "
                    "(see GET /v1/models)", "model", "model_not_found")


def is_anthropic(path: str) -> bool:
    """Whether `path` is the Messages API's, whose clients read Anthropic's errors."""
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)


def generation_failure(stream: TokenStream | None, constraint_param: str | None) -> ApiError:
    """A reply that ended in error. The request's own fault (a constraint that llguidance
    refuses mid-reply) is a 400 naming its field (`constraint_param`: the request field
    that gave the constraint); anything else is the engine's 500."""
    field = stream.error_field if stream is not None else None
    message = (stream.error if stream is not None else None) or "generation failed"
    if field is not None:
        return ApiError(400, message, constraint_param if field == "constraint" else field)
    return ApiError(500, message, code="engine_error")


# Answered before the body was read whole: the rest of it may still be on its way, so the
# connection is closed rather than kept alive for a client that is still sending.
CLOSES_CONNECTION = frozenset({401, 408, 413})


# Refusals quote the value they refuse (a model name, a block type): one 90 KB string in
# any such field made a 90 KB error line. Its head and tail still say what was wrong.
MAX_MESSAGE_CHARS = 1000


def _printable(message: str) -> str:
    """A message that echoes a client's text must still encode as UTF-8 (no 500 over a
    lone surrogate in the error about it), and stay one readable line however long the
    text it quotes."""
    if len(message) > MAX_MESSAGE_CHARS:
        half = MAX_MESSAGE_CHARS // 2
        cut = len(message) - 2 * half
        message = f"{message[:half]} [... {cut} characters cut ...] {message[-half:]}"
    return message.encode("utf-8", "backslashreplace").decode("utf-8")
