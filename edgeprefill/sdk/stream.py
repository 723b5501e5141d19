"""A request's output stream: iterate it from any thread, or `async for` it.

What a reader can rely on:
- every stream ends: with the request's finish reason, or `cancelled` when the engine
  closes first; a finished stream iterates as empty and never blocks;
- leaving a `for` / `async for` loop early (break, return, an exception) cancels the
  request at the next step boundary and frees its KV slot;
- several readers at once (threads or tasks) share the stream: each event goes to exactly
  one of them, the end reaches all of them, and `token_ids` / `text` / `logprobs` hold every
  event in the order it was produced, whoever read it;
- an `async for` waits on the event loop itself, holding no thread (any number of streams
  can be read at once), and a read that is cancelled (`asyncio.wait_for`, a task
  cancelled) takes no event: the next read gets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

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
        self._queue: queue.SimpleQueue[TokenEvent | _End] = queue.SimpleQueue()
        self._done = threading.Event()
        self.token_ids: list[int] = []
        self.logprobs: list[TokenEvent] = []  # the token events, when logprobs were asked for
        self.text = ""
        self.finish_reason: str | None = None
        self.error: str | None = None
        # With an error the request itself caused (a constraint that fails mid-reply), the
        # GenerationParams field it is about; None for a failure of the engine's own.
        self.error_field: str | None = None
        self.eos_token_id: int | None = None  # the EOS token that ended generation, if one
        self.stop_string: str | None = None  # the stop string that ended it, if one
        # An embedding request's (Engine.submit_embedding): the hidden state of its last
        # token, float32 [hidden], set before it ends with "stop"; it streams no events.
        self.embedding: np.ndarray | None = None
        # `async for` readers waiting for the next event: (their loop, a future to set).
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._waiters_lock = threading.Lock()

    # -- producer side (engine loop) --------------------------------------------------

    def _put(self, event: TokenEvent) -> None:
        # Recorded here, in production order, so that several readers cannot reorder it.
        if event.token_id is not None:
            self.token_ids.append(event.token_id)
            if event.logprob is not None:
                self.logprobs.append(event)
        self.text += event.text
        self._queue.put(event)
        self._wake_waiters()

    def _finish(self, reason: str, error: str | None = None, field: str | None = None) -> None:
        self.finish_reason, self.error, self.error_field = reason, error, field
        self._done.set()
        self._queue.put(_End(reason, error))
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        # After the put: a reader that registered before it is woken, one that registers
        # after it finds the event when it looks at the queue again (_AsyncReader).
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits
                loop.call_soon_threadsafe(_set_once, future)

    # -- consumer side ----------------------------------------------------------------

    def __iter__(self) -> _Reader:
        return _Reader(self)

    def __aiter__(self) -> _AsyncReader:
        return _AsyncReader(self)

    def _next_item(self) -> TokenEvent | _End:
        item = self._take()
        if isinstance(item, _End):
            self._queue.put(item)  # the end stays in the queue: every reader sees it
        return item

    def _take(self) -> TokenEvent | _End:
        if self._pump is None:
            return self._queue.get()
        while True:  # no loop thread: run engine steps until this stream has something
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                self._pump()

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
        """True once the engine has ended the request (every event is then queued)."""
        return self._done.is_set()


class _Loop:
    """One loop over a stream. Dropped before the end (break, exception), it cancels the
    request: nobody reads the tokens any more."""

    def __init__(self, stream: TokenStream) -> None:
        self.stream = stream
        self.ended = False

    def __del__(self) -> None:
        if not self.ended and not self.stream.done:
            self.stream.cancel()


class _Reader(_Loop):
    """One `for` loop over a stream."""

    def __iter__(self) -> _Reader:
        return self

    def __next__(self) -> TokenEvent:
        if self.ended:
            raise StopIteration
        item = self.stream._next_item()
        if isinstance(item, _End):
            self.ended = True
            raise StopIteration
        return item


class _AsyncReader(_Loop):
    """One `async for` loop over a stream."""

    def __aiter__(self) -> _AsyncReader:
        return self

    async def __anext__(self) -> TokenEvent:
        if self.ended:
            raise StopAsyncIteration
        item = await self._next()
        if isinstance(item, _End):
            self.stream._queue.put(item)  # the end stays in the queue: every reader sees it
            self.ended = True
            raise StopAsyncIteration
        return item

    async def _next(self) -> TokenEvent | _End:
        """The next event, taken only on the event loop's thread: a cancelled wait has
        taken nothing."""
        stream = self.stream
        while True:
            try:
                return stream._queue.get_nowait()
            except queue.Empty:
                pass
            if stream._pump is not None:  # no loop thread: run a step, off the event loop
                await asyncio.to_thread(stream._pump)
                continue
            future = asyncio.get_running_loop().create_future()
            waiter = (asyncio.get_running_loop(), future)
            with stream._waiters_lock:
                stream._waiters.append(waiter)
            try:
                if stream._queue.empty():  # else an event came between the two looks
                    await future
            finally:
                with stream._waiters_lock:
                    if waiter in stream._waiters:
                        stream._waiters.remove(waiter)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled wait leaves a done future
        future.set_result(None)
