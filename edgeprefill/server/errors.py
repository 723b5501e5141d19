"""Errors in the OpenAI error schema: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from starlette.responses import JSONResponse

# HTTP status -> the OpenAI error `type` clients switch on.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


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
            "error": {"message": self.message, "type": kind, "param": self.param,
                      "code": self.code}
        }

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)
