"""The HTTP connection layer under the app: timeouts, bounded shutdown, quiet fd exhaustion.

uvicorn closes idle keep-alive connections and can bound a graceful shutdown, but it has
no limit on how long a client may take to send its request headers: a socket that
connects and sends nothing, or half a header line, stays open for ever, before any API
key is ever looked at. `GuardedH11Protocol` adds that limit, and one on a client that
stops reading: a write then waits for it for ever, and a stream holds its place under
--max-pending (and every event the engine goes on producing) until it does. The body's
limit is the app's (it answers 408 in the OpenAI error schema, see server/body.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from edgeprefill.errors import RequestError

log = logging.getLogger("edgeprefill.server")


@dataclass(frozen=True)
class HttpTimeouts:
    """Seconds. Defaults follow uvicorn (keep-alive 5 s) and the common web-server
    practice for headers (Apache's RequestReadTimeout starts at 20 s, nginx at 60 s);
    llama-server's single read/write timeout is 600 s, too long for a device that
    holds a few dozen sockets."""

    header: float = 10.0  # from connect (or the end of the last reply) to a whole header
    keep_alive: float = 5.0  # an idle connection between requests
    graceful_shutdown: float = 5.0  # SIGTERM / Ctrl-C: unfinished requests are cut after it
    send: float = 30.0  # a reply the client leaves unread (the socket's buffers full)

    def __post_init__(self) -> None:
        for name in ("header", "keep_alive", "graceful_shutdown", "send"):
            if not getattr(self, name) > 0:
                raise RequestError(f"the {name.replace('_', ' ')} timeout must be positive, "
                                   f"got {getattr(self, name)}")


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a header-read timeout and a send timeout."""

    def __init__(self, *args, header_timeout: float, send_timeout: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self.send_timeout = send_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # what the client had not read when the send timer was armed

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.cycle.response_complete:
            self._arm_header_timer()  # the next request's headers get the same limit

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._header_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        # The transport's buffer is past its high-water mark: the client is not keeping up.
        super().pause_writing()
        if self._send_timer is None:
            self._arm_send_timer()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _arm_send_timer(self) -> None:
        self._unsent = self._unsent_bytes()
        self._send_timer = self.loop.call_later(self.send_timeout, self._reader_stalled)

    def _unsent_bytes(self) -> int:
        """What the client has not read yet: asyncio's buffer, plus the kernel's send queue
        where it tells (Linux). A client reading slowly empties the kernel's queue first;
        counted alone, asyncio's buffer did not move for it, and a client reading 2 KB/s
        through a small receive buffer was cut as one that read nothing."""
        unsent = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        try:
            import fcntl  # POSIX only
            import termios

            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4)
            unsent += int.from_bytes(queued, sys.byteorder)
        except (ImportError, AttributeError, OSError, ValueError):
            pass  # not a socket this platform tells of
        return unsent

    def _reader_stalled(self) -> None:
        self._send_timer = None
        if self.transport.get_write_buffer_size() == 0:
            return  # drained (or the connection is gone)
        unsent = self._unsent_bytes()
        if unsent < self._unsent:
            # A slow reader is still a reader: only a whole --send-timeout without a byte
            # read cuts it (a client reading 1 KB/s needs ~50 s to drain to resume_writing).
            self._arm_send_timer()
            return
        # Also when the transport is already closing: uvicorn's keep-alive close() after a
        # whole reply waits for ever to flush what the client never reads.
        done = self.cycle is not None and self.cycle.response_complete
        log.warning("a client read nothing of its reply for %.0f s (--send-timeout): its "
                    "connection is closed%s", self.send_timeout,
                    "" if done else ", its reply cut (and its request cancelled if it "
                    "was still generating)")
        # abort(), not close(): close() would wait to flush what the client never reads.
        # The app then hears the disconnect, cancels the stream and frees its place.
        self.transport.abort()

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        waiting_for = self.cycle  # a new request replaces self.cycle
        self._header_timer = self.loop.call_later(
            self.header_timeout, self._headers_overdue, waiting_for)

    def _headers_overdue(self, waiting_for) -> None:
        # No response is possible: h11 cannot answer a request it has not parsed.
        if self.cycle is waiting_for and not self.transport.is_closing():
            self.transport.close()


class GuardedLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, quiet and cheap when the process runs out of file descriptors.

    On EMFILE, asyncio logs a traceback, stops listening and schedules a retry in 1 s,
    but does not leave its accept loop: it goes on calling accept() up to `backlog`
    times in the same wake-up (2048 with uvicorn), each failure logged and each
    scheduling one more retry, so the errors multiply (11,697 tracebacks in 6 s with 150
    idle sockets over a limit of 96). Accepting one connection per wake-up keeps it to
    one error per retry; the selector reports the socket ready again at once, so
    accepting stays fast. A retry that fires after the server closed is dropped.
    """

    def _accept_connection(self, protocol_factory, sock, sslcontext=None, server=None,
                           backlog=100, *rest):
        super()._accept_connection(  # type: ignore[misc]
            protocol_factory, sock, sslcontext, server, 1, *rest)

    def _start_serving(self, protocol_factory, sock, *rest):
        if sock.fileno() == -1:  # closed by shutdown while a retry was pending
            return
        super()._start_serving(protocol_factory, sock, *rest)  # type: ignore[misc]


def uvicorn_config(app: ASGIApp, host: str, port: int, timeouts: HttpTimeouts,
                   log_level: str = "warning") -> uvicorn.Config:
    protocol = functools.partial(GuardedH11Protocol, header_timeout=timeouts.header,
                                 send_timeout=timeouts.send)
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on",
        loop=f"{__name__}:GuardedLoop",
        http=protocol,  # type: ignore[arg-type]  # uvicorn only calls it
        timeout_keep_alive=timeouts.keep_alive,  # type: ignore[arg-type]  # floats work
        timeout_graceful_shutdown=timeouts.graceful_shutdown,  # type: ignore[arg-type]
    )


class OutOfResources(logging.Filter):
    """One line per interval instead of a traceback per failed accept() when the
    process runs out of file descriptors (asyncio logs each one with its stack)."""

    MESSAGES = ("socket.accept() out of system resource",)

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self.last = -float("inf")
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not any(m in str(record.msg) for m in self.MESSAGES):
            return True
        now = time.monotonic()
        if now - self.last < self.interval:
            self.suppressed += 1
            return False
        self.last = now
        record.msg = (f"out of file descriptors: new connections wait (raise `ulimit -n` or "
                      f"lower the clients' concurrency); {self.suppressed} more such errors "
                      f"were not logged")
        record.args = ()
        record.exc_info = None
        record.exc_text = None
        self.suppressed = 0
        return True


def quiet_fd_exhaustion(interval: float = 10.0) -> OutOfResources:
    """Install the filter on asyncio's logger (idempotent); returns it."""
    logger = logging.getLogger("asyncio")
    for existing in logger.filters:
        if isinstance(existing, OutOfResources):
            return existing
    guard = OutOfResources(interval)
    logger.addFilter(guard)
    return guard
