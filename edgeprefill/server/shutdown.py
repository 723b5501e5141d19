"""What a client sees when the server stops under it, and how `serve` stops.

On SIGTERM or Ctrl-C uvicorn stops accepting, lets running requests go on for the
graceful-shutdown timeout, then cancels them. Without care each cancelled request is a
traceback in the log and a connection cut without a word. `ShutdownCut` turns that into
a reply: 503 in the route's error schema (OpenAI's, Anthropic's on the Messages API,
Ollama's on /api/...)
when nothing was sent yet, the end of the stream otherwise. `run_until_signalled` makes
SIGTERM end `serve` the way Ctrl-C does: the engine is closed and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgeprefill.server.errors import OLLAMA_PREFIX, ApiError, is_anthropic
from edgeprefill.server.messages_stream import error_event
from edgeprefill.server.ollama_stream import line
from edgeprefill.server.sse import sse

STREAMED = (b"text/event-stream", b"application/x-ndjson")  # Ollama's streams: NDJSON


class ShutdownCut:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = streaming = ended = False

        async def tracking_send(message: Message) -> None:
            nonlocal started, streaming, ended
            if message["type"] == "http.response.start":
                started = True
                streaming = any(
                    k.lower() == b"content-type" and v.split(b";")[0] in STREAMED
                    for k, v in message.get("headers", []))
            elif message["type"] == "http.response.body":
                ended = not message.get("more_body", False)
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            # The only canceller of a request task is uvicorn's shutdown timeout.
            error = ApiError(503, "the server is shutting down; retry on another instance "
                             "or after it restarts", code="shutting_down")
            if not started:
                response = error.response(scope["path"])
                response.headers["Connection"] = "close"
                await response(scope, receive, send)
            elif streaming and not ended:
                # An error event and [DONE], as a stream that fails mid-way ends: it had
                # stopped mid-body, a chunked reply without its last chunk.
                await send({"type": "http.response.body", "more_body": False,
                            "body": _last_event(scope["path"], error)})


class Terminated(Exception):
    """SIGTERM arrived: a normal stop, like Ctrl-C."""


def run_until_signalled(server, sockets: list[socket.socket] | None = None) -> None:
    """`server.run(sockets)` (a uvicorn.Server, on sockets bound already, if given);
    returns normally after SIGTERM or Ctrl-C.

    uvicorn handles both signals itself and, once shut down, re-raises the one it got
    through the handler that was installed before it: SIGINT's raises KeyboardInterrupt,
    and this installs one for SIGTERM, so neither kills the process before the caller's
    cleanup (closing the engine) runs."""

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        server.run(sockets)
    except (KeyboardInterrupt, Terminated):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


class ForcedStop(logging.Filter):
    """A second Ctrl-C makes uvicorn leave at once; asyncio then cancels Starlette's
    lifespan task, which reports the CancelledError as a failed shutdown, and uvicorn
    logged its traceback at ERROR. The stop was asked for (`serve` says "stopped")."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("Traceback") and "lifespan" in text
                    and text.rstrip().endswith("CancelledError"))


def quiet_forced_stop() -> None:
    """Install ForcedStop on uvicorn's error logger, where its lifespan logs (idempotent)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ForcedStop) for f in logger.filters):
        logger.addFilter(ForcedStop())


def _last_event(path: str, error: ApiError) -> bytes:
    """The end of a stream cut mid-way: an error event and [DONE] as the OpenAI routes'
    streams end, Anthropic's error event on the Messages API's, an `{"error"}` line on
    Ollama's."""
    if is_anthropic(path):
        return error_event(error)
    if path.startswith(OLLAMA_PREFIX):
        return line(error.ollama_body())
    return sse(error.body()) + sse("[DONE]")
