"""One log line per HTTP request: method, path, status, prompt and completion tokens, TTFT
and duration, e.g.

    POST /v1/completions 200 prompt_tokens=31 completion_tokens=16 ttft_ms=42.0 duration_ms=180.3

The middleware sees every request (401s and 404s too) and times it until its last byte
is sent; a completion handler tells it which TokenStream served the request (`note`),
and the token counts and TTFT come from that stream. Seeing every status, it is also
where a refused request is counted (`on_reject`: the http_rejected metric).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgeprefill.sdk.stream import TokenStream
from edgeprefill.server.choices import Choices

LOGGER = logging.getLogger("edgeprefill.server")
# Liveness probes and metric scrapes come every few seconds: logged at debug only.
QUIET_PATHS = frozenset({"/health", "/metrics"})
_STREAM_KEY = "edgeprefill.stream"  # in the request's scope state


def note(request: Request, stream: TokenStream | Choices) -> None:
    """Record the stream that serves this request, for its log line."""
    request.scope.setdefault("state", {})[_STREAM_KEY] = stream


class AccessLog:
    """ASGI middleware: logs each HTTP request once it is answered (or fails)."""

    def __init__(self, app: ASGIApp, logger: logging.Logger = LOGGER,
                 on_reject: Callable[[int], None] = lambda status: None) -> None:
        self.app = app
        self.logger = logger
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500  # if the app fails before it answers

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        scope.setdefault("state", {})  # the dict request.state writes to, seen from here
        try:
            await self.app(scope, receive, sending)
        finally:
            stream = scope["state"].get(_STREAM_KEY)
            # Refused: an error status before any stream served it. An admitted request
            # that fails or is cut later is counted by its finish reason instead.
            if status >= 400 and stream is None:
                self.on_reject(status)
            level = logging.WARNING if status >= 500 else logging.INFO
            if scope["path"] in QUIET_PATHS and status < 400:
                level = logging.DEBUG
            self.logger.log(level, "%s", line(scope, status, stream,
                                              time.perf_counter() - began))


def line(scope: Scope, status: int, stream: TokenStream | Choices | None,
         seconds: float) -> str:
    prompt = completion = ttft = "-"
    if stream is not None:
        prompt = str(stream.metrics.prompt_tokens)
        completion = str(stream.completion_tokens if isinstance(stream, Choices)
                         else len(stream.token_ids))  # all n choices' tokens
        if stream.metrics.ttft is not None:
            ttft = f"{stream.metrics.ttft * 1000:.1f}"
    return (f"{scope['method']} {scope['path']} {status} prompt_tokens={prompt} "
            f"completion_tokens={completion} ttft_ms={ttft} duration_ms={seconds * 1000:.1f}")


def uvicorn_level(level: str) -> str:
    """uvicorn's own level for `serve --log-level`: its start-up and shutdown chatter
    only at debug (the serve command says where it listens)."""
    return "warning" if level == "info" else level


def configure_logging(level: str) -> None:
    """`serve --log-level`: our request lines and uvicorn's messages on stderr, in one
    format. Call it after uvicorn's Config, which sets up logging of its own."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    for name, at in (("edgeprefill", level), ("uvicorn", uvicorn_level(level))):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(at.upper())
        logger.propagate = False
