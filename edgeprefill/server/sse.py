"""Server-sent events: a TokenStream as OpenAI `data:` chunks, cancelled if the client leaves."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import suppress

import anyio
import anyio.lowlevel
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from edgeprefill.sdk.stream import TokenStream
from edgeprefill.server.choices import Choices
from edgeprefill.server.errors import generation_failure
from edgeprefill.server.responses import Shape


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


async def completion_events(
    stream: TokenStream | Choices, shape: Shape, include_usage: bool,
    constraint_param: str | None = None,
) -> AsyncIterator[bytes]:
    """The chunks of one reply (of each of n choices, tagged by index), then
    `data: [DONE]`. A failure after the first byte can no longer change the status code,
    so it is sent as an error event (as OpenAI does)."""
    choices = stream if isinstance(stream, Choices) else Choices([stream])
    if shape.chat:
        for i in range(len(choices.streams)):
            yield sse(shape.chunk(None, index=i))  # the role, at once: clients show "typing"
    offsets = [0] * len(choices.streams)
    async for i, event in choices.indexed():
        if event.logprob is not None:
            # one chunk per token, as OpenAI streams logprobs
            yield sse(shape.token_chunk(event, offsets[i], index=i))
        else:
            for chunk in shape.chunks(event.text, index=i):  # text, reasoning, tool calls
                yield sse(chunk)
        offsets[i] += len(event.text)
    if choices.finish_reason == "error":
        yield sse(generation_failure(choices.failed, constraint_param).body())
    else:
        for i, s in enumerate(choices.streams):
            for chunk in shape.last_chunks(s.finish_reason, index=i):
                yield sse(chunk)
        if include_usage:
            yield sse(shape.usage_chunk(stream))
    yield sse("[DONE]")


class EventStreamResponse(StreamingResponse):
    """A streaming response (server-sent events; Ollama's NDJSON) that always listens for
    the client leaving and then stops.

    Starlette watches for disconnects only under ASGI spec < 2.4; with 2.4 it notices one
    at the next write, which never comes while a request waits in the queue. Here the
    stream is cancelled the moment the client goes, and `on_close` runs on every path
    (even if the body never started), so the request's KV slot is always freed.

    `on_close` runs first before the first chunk sent once `ended()` holds (generation is
    over): it gives back the request's place under --max-pending and records its metrics,
    which had waited for the response to end after its last bytes, so that a client's
    next request (a 429) or a scrape (a request not yet counted, 16 of 200 right after
    `[DONE]`) could come first. It must be idempotent.
    """

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None],
                 ended: Callable[[], bool], media_type: str = "text/event-stream") -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(_closed_once_ended(content, ended, on_close), media_type=media_type,
                         headers=headers)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream_then_stop() -> None:
                    with suppress(OSError):  # the socket closed under a write
                        await self.stream_response(_yielding(send))
                    group.cancel_scope.cancel()

                group.start_soon(stream_then_stop)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self.on_close()


async def _closed_once_ended(content: AsyncIterator[bytes], ended: Callable[[], bool],
                             close: Callable[[], None]) -> AsyncIterator[bytes]:
    """`content`, with `close` run before each chunk sent once `ended()` holds."""
    async for chunk in content:
        if ended():
            close()
        yield chunk


def _yielding(send: Send) -> Send:
    """`send`, then one turn of the event loop. With tokens already queued the stream
    writes without ever waiting, so a lost connection's news (asyncio schedules it on the
    loop) came only after every queued chunk had gone to the dead socket, past the fifth
    with a "socket.send() raised exception." warning each. After one turn uvicorn knows,
    its send returns at once, and the disconnect listener stops the stream."""

    async def send_then_yield(message: Message) -> None:
        await send(message)
        await anyio.lowlevel.checkpoint()

    return send_then_yield
