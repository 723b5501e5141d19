"""The API key: `Authorization: Bearer <key>` or `x-api-key: <key>` on every path but the
liveness probes, in the error schema of the path's API."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from edgeprefill.server.errors import ApiError

# Answered without the API key (liveness probes; "/" is Ollama's).
OPEN_PATHS = frozenset({"/health", "/"})


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's)
    on every path but OPEN_PATHS, compared in constant time so the response time tells an
    attacker nothing about how much of a guess was right."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and not self._ok(scope):
            error = ApiError(401, "invalid or missing API key: send the header "
                             "'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                             code="invalid_api_key")
            await error.response(scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _ok(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        bearer = scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
        # Both compared, whichever is sent: the time taken says nothing about which.
        api_key = hmac.compare_digest(headers.get(b"x-api-key", b"").strip(), self.key)
        return bearer or api_key
