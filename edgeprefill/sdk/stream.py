"""A request's output stream: iterate it from any thread, or `async for` it."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import NamedTuple

from edgeprefill.sdk.metrics import RequestMetrics


class TokenEvent(NamedTuple):
    token_id: int | None  # None: a last, text-only event (text held back until the end)
    text: str  # the text this token settled (may be empty: held back or mid-character)
    logprob: float | None = None  # when the request asked for logprobs
    top_logprobs: list[tuple[int, str, float]] | None = None  # (id, text, logprob), best first
    token_text: str | None = None  # the token's own text, when logprobs were asked for


class _End(NamedTuple):
    finish_reason: str
    error: str | None


FINISH_REASONS = ("stop", "length", "cancelled", "error")


class TokenStream:
    """Tokens of one request as they are produced.

    The engine's loop pushes events; the caller iterates. With no background loop, the
    iterator drives the engine itself (`pump`), so single-threaded embedding just works.
    """

    def __init__(
        self, request_id: int, metrics: RequestMetrics,
        cancel: Callable[[], None], pump: Callable[[], None] | None,
    ) -> None:
        self.request_id = request_id
        self.metrics = metrics
        self._cancel = cancel
        self._pump = pump
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Event()
        self.token_ids: list[int] = []
        self.logprobs: list[TokenEvent] = []  # the token events, when logprobs were asked for
        self.text = ""
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.eos_token_id: int | None = None  # the EOS token that ended generation, if one

    # -- producer side (engine loop) --------------------------------------------------

    def _put(self, event: TokenEvent) -> None:
        self._queue.put(event)

    def _finish(self, reason: str, error: str | None = None) -> None:
        self._queue.put(_End(reason, error))

    # -- consumer side ----------------------------------------------------------------

    def __iter__(self):
        while not self.done:  # a finished stream iterates as empty, never blocks
            item = self._next_item()
            if isinstance(item, _End):
                self._close(item)
                return
            self._record(item)
            yield item

    async def __aiter__(self):
        while not self.done:
            item = await asyncio.to_thread(self._next_item)
            if isinstance(item, _End):
                self._close(item)
                return
            self._record(item)
            yield item

    def _next_item(self):
        if self._pump is None:
            return self._queue.get()
        while True:  # no loop thread: run engine steps until this stream has something
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                self._pump()

    def _record(self, event: TokenEvent) -> None:
        if event.token_id is not None:
            self.token_ids.append(event.token_id)
            if event.logprob is not None:
                self.logprobs.append(event)
        self.text += event.text

    def _close(self, end: _End) -> None:
        self.finish_reason, self.error = end.finish_reason, end.error
        self._done.set()

    def result(self) -> TokenStream:
        """Consume the rest of the stream; returns self (with text and finish_reason)."""
        for _ in self:
            pass
        return self

    def cancel(self) -> None:
        """Stop generating at the next step boundary and free the request's KV."""
        self._cancel()

    @property
    def done(self) -> bool:
        return self._done.is_set()
