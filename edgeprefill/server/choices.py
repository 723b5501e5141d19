"""The n streams of one request (OpenAI's `n`), read as one: merged events tagged with
their choice index, one cancel, one finish reason."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from edgeprefill.sdk.metrics import RequestMetrics
from edgeprefill.sdk.stream import TokenEvent, TokenStream


class Choices:
    def __init__(self, streams: list[TokenStream]) -> None:
        self.streams = streams

    async def indexed(self) -> AsyncIterator[tuple[int, TokenEvent]]:
        """(choice index, event) in the order the engine produced them."""
        if len(self.streams) == 1:
            async for event in self.streams[0]:
                yield 0, event
            return
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, stream: TokenStream) -> None:
            async for event in stream:
                await merged.put((index, event))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self.streams)]
        done = asyncio.ensure_future(asyncio.gather(*tasks))
        getter: asyncio.Future | None = None
        try:
            while not (done.done() and merged.empty()):
                getter = asyncio.ensure_future(merged.get())
                await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            done.result()  # re-raise a failure while reading, if any
        finally:
            # A client that leaves early: the pumps are cancelled, and the gather then holds
            # a CancelledError that asyncio would log with a traceback unless it is read.
            done.add_done_callback(_read_outcome)
            done.cancel()
            if getter is not None:  # the client left while it waited: no task left behind
                getter.cancel()

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        async for _, event in self.indexed():
            yield event

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()

    @property
    def done(self) -> bool:
        return all(s.done for s in self.streams)

    @property
    def metrics(self) -> RequestMetrics:
        return self.streams[0].metrics  # latency metrics: the first choice's

    @property
    def finish_reason(self) -> str | None:
        errors = [s for s in self.streams if s.finish_reason == "error"]
        return "error" if errors else self.streams[0].finish_reason

    @property
    def failed(self) -> TokenStream | None:
        """The first choice that ended in error."""
        return next((s for s in self.streams if s.finish_reason == "error"), None)

    @property
    def prompt_tokens(self) -> int:
        return self.streams[0].metrics.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.streams)


def _read_outcome(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
