"""Tokenization and chat-template rendering in child processes, with a time limit.

On the event loop, one 3.8 MB prompt froze every other client for seconds, and a crafted
chat template froze the server for good (and with it SIGTERM). A thread would free the
loop but cannot be stopped: a template that loops for ever keeps its thread and a share
of the GIL until the process dies, and a template that multiplies strings in C cannot be
interrupted even by a trace hook. A process can be killed. So each worker is a small
spawned process holding its own copy of the bundle's tokenizer; the server sends it a
call, waits up to the time limit on a pipe, and on overrun kills it and starts a new one.
Workers are started as `python -c` of this module's `child_main`, not with
multiprocessing's spawn: spawn re-runs the parent's main script, which breaks any app
that embeds the server in a script without an `if __name__ == "__main__"` guard.

Costs are measured in docs/benchmarks.md (round trip, resident memory, restart time).
Workers run in their own session (a terminal's Ctrl-C is the parent's to handle) and exit
when the parent's end of their socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

from edgeprefill.errors import EdgeprefillError, RequestError


class PromptTimeout(RequestError):
    """The worker did not finish in time (a huge prompt or a runaway chat template)."""


class Encoded(NamedTuple):
    """A prompt's ids (or only their count, past the limit) and, for chat, whether the
    rendered prompt leaves a think block open for the reply (server/reasoning.py)."""

    ids: list[int] | int
    opens_think: bool = False


class _Reply(NamedTuple):
    ok: bool
    value: Any  # the method's result, or the one-line error message
    user_error: bool  # the request's fault (400) rather than the server's (500)


class PromptWorker:
    """One child process; calls are serialized by PromptWorkers, never concurrent."""

    def __init__(self, bundle_dir: Path, start_timeout: float = 120.0) -> None:
        ours, theirs = socket.socketpair()
        # The child imports the same edgeprefill as the parent, whatever set its path.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD_MAIN, str(theirs.fileno()), str(bundle_dir)],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
            start_new_session=True)  # a terminal's Ctrl-C is for the parent to handle
        theirs.close()
        self.conn = Connection(ours.detach())
        # Wait for its tokenizer to load, so the time limit of calls is all theirs.
        ready = self.conn.poll(start_timeout) and self._recv()
        if not (ready and ready.ok):
            self.kill()
            why = ready.value if ready else f"not ready after {start_timeout:g} s"
            raise EdgeprefillError(f"the prompt worker did not start: {why}")

    def _recv(self) -> _Reply | None:
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def call(self, method: str, args: tuple, kwargs: dict, timeout: float) -> Any:
        """Blocking: run `tokenizer.<method>(*args, **kwargs)` in the child."""
        self.conn.send((method, args, kwargs))
        if not self.conn.poll(timeout):
            raise PromptTimeout(f"tokenizing the prompt or rendering the chat template took "
                                f"over {timeout:g} s; the work was stopped")
        reply = self._recv()
        if reply is None:  # the child died (out of memory, killed by the OS)
            raise EdgeprefillError("the prompt worker died while tokenizing")
        if reply.ok:
            return reply.value
        raise (RequestError if reply.user_error else EdgeprefillError)(reply.value)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


class PromptWorkers:
    """A small pool: `await workers.call("encode", prompt)` off the event loop."""

    def __init__(self, bundle_dir: Path, count: int, timeout: float) -> None:
        self.bundle_dir = bundle_dir
        self.count = count
        self.timeout = timeout
        self.restarts = 0  # workers killed for overrunning (or dead) and replaced
        # None in the queue: a worker to (re)start on first use, so a kill never waits
        # for a spawn, and nothing is spawned during shutdown.
        self._idle: asyncio.Queue[PromptWorker | None] | None = None
        self._all: set[PromptWorker] = set()
        self._closed = False

    async def start(self) -> None:
        """Returns when the workers have started (or failed to: such a one is started again
        on first use), so the server listens ready to serve. Started in the background
        instead, the first request right after startup waited ~0.2 s for a worker."""
        self._idle = asyncio.Queue()
        await self._start_all()

    async def _start_all(self) -> None:
        assert self._idle is not None
        for _ in range(self.count):
            try:
                worker = await self._spawn()
            except Exception:  # retried on first use, which reports it
                worker = None
            self._idle.put_nowait(worker)

    @property
    def running(self) -> int:
        """Worker processes alive now."""
        return sum(worker.process.poll() is None for worker in self._all)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        assert self._idle is not None, "PromptWorkers.start() was not awaited"
        worker = await self._idle.get()
        try:
            if worker is None:
                worker = await self._spawn()
            return await asyncio.to_thread(worker.call, method, args, kwargs, self.timeout)
        except BaseException as err:
            if worker is not None and (not isinstance(err, RequestError)
                                       or isinstance(err, PromptTimeout)):
                # Overran, died, or we were cancelled mid-call: its pipe may hold a late
                # reply, so it is never reused.
                self.restarts += 1
                self._kill(worker)
                worker = None
            raise
        finally:
            self._idle.put_nowait(worker)

    async def _spawn(self) -> PromptWorker:
        worker = await asyncio.to_thread(PromptWorker, self.bundle_dir)
        self._all.add(worker)
        if self._closed:  # started while the server was shutting down
            self._kill(worker)
        return worker

    def _kill(self, worker: PromptWorker) -> None:
        worker.kill()
        self._all.discard(worker)

    def close(self) -> None:
        self._closed = True
        for worker in list(self._all):
            self._kill(worker)


CHILD_MAIN = "from edgeprefill.server.prompt_worker import child_main; child_main()"


def child_main() -> None:
    """Entry point of a worker process: `<fd of its socket> <bundle dir>` in argv."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    _serve(Connection(int(sys.argv[1])), sys.argv[2])


def _exit_with_parent(parent: int) -> None:
    """A worker busy in a runaway template never reads the EOF of a dead parent's
    socket: this thread notices the parent is gone and ends the process."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _serve(conn: Connection, bundle_dir: str) -> None:
    """The child's loop: one call at a time until the parent goes away."""
    from edgeprefill.bundle import load_manifest
    from edgeprefill.sdk.tokenizer import BundleTokenizer

    root = Path(bundle_dir)
    try:
        tokenizer = BundleTokenizer(root, load_manifest(root))
    except Exception as err:  # a bundle the parent loaded should load here too
        conn.send(_Reply(False, f"{type(err).__name__}: {err}", False))
        return
    if tokenizer.chat_template is not None:
        # Imported while the server starts rather than in the first chat request's time
        # (~20 ms); not rendered: a template runs only under a call's time limit.
        import jinja2.sandbox  # noqa: F401
    conn.send(_Reply(True, None, False))
    while True:
        try:
            method, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(_run(tokenizer, method, args, kwargs))


def encode_bounded(tokenizer: Any, prompt: Any, limit: int, **chat: Any) -> Encoded:
    """A text prompt or chat messages -> their ids, or only their count when there are
    more than `limit`: a prompt that cannot fit is refused anyway, and shipping a million
    ids back to the server would cost its event loop the time to unpickle them. `chat`:
    template variables (tools). Messages are rendered once, here, and the text tells
    whether the reply starts inside a think block."""
    from edgeprefill.server.reasoning import prompt_opens_think

    if isinstance(prompt, str):
        return _bounded(tokenizer.encode(prompt), limit, False)
    text = tokenizer.render_chat(prompt, **chat)
    return _bounded(tokenizer.encode_plain(text), limit, prompt_opens_think(text))


def _bounded(ids: list[int], limit: int, opens_think: bool) -> Encoded:
    return Encoded(ids if len(ids) <= limit else len(ids), opens_think)


def embedding_bounded(tokenizer: Any, text: Any, limit: int, truncate: bool,
                      direction: str = "right") -> Encoded:
    """A text to embed -> its ids as sentence-transformers gives them to the model
    (sdk/embedding.py); past `limit`: cut to it with `truncate` (its end, or with
    `direction` "left" its start), else only their count."""
    from edgeprefill.sdk.embedding import prepared, text_ids

    if truncate:
        return Encoded(text_ids(tokenizer, text, limit, truncate=True, direction=direction))
    return _bounded(tokenizer.encode(prepared(text)), limit, False)


def score_bounded(tokenizer: Any, info: Any, query: str, document: str,
                  limit: int, truncate: str | None = None) -> Encoded:
    """A (query, document) pair to score -> its ids as the score bundle reads a pair
    (sdk/scoring.py: its template, or the tokenizer's pair encoding); past `limit` refused
    (RequestError) without its ids, or with `truncate` (a direction) cut to it."""
    from edgeprefill.sdk.scoring import item_ids

    return Encoded(item_ids(tokenizer, info, (query, document), limit, truncate))


# Calls that are not BundleTokenizer methods: name -> function(tokenizer, *args).
EXTRA_CALLS = {"encode_bounded": encode_bounded, "embedding_bounded": embedding_bounded,
               "score_bounded": score_bounded}


def _run(tokenizer: Any, method: str, args: tuple, kwargs: dict) -> _Reply:
    from jinja2 import TemplateError

    try:
        if method in EXTRA_CALLS:
            return _Reply(True, EXTRA_CALLS[method](tokenizer, *args, **kwargs), False)
        return _Reply(True, getattr(tokenizer, method)(*args, **kwargs), False)
    except RequestError as err:
        return _Reply(False, str(err), True)
    except TemplateError as err:  # the template failed on these messages
        return _Reply(False, f"chat template: {err}", True)
    except (UnicodeError, ValueError, TypeError, RecursionError) as err:
        return _Reply(False, f"cannot tokenize this prompt: {err}", True)
    except Exception as err:  # anything else is ours: one line, the worker lives on
        return _Reply(False, f"{type(err).__name__}: {err}", False)
