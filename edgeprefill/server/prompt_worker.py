"""Tokenization and chat-template rendering in child processes, with a time limit.

On the event loop, one 3.8 MB prompt froze every other client for seconds, and a crafted
chat template froze the server for good (and with it SIGTERM). A thread would free the
loop but cannot be stopped: a template that loops for ever keeps its thread and a share
of the GIL until the process dies, and a template that multiplies strings in C cannot be
interrupted even by a trace hook. A process can be killed. So each worker is a small
spawned process holding its own copy of the bundle's tokenizer; the server sends it a
call, waits up to the time limit on a pipe, and on overrun kills it and starts a new one.

Costs, measured on the CI machine (see docs/benchmarks.md): one round trip adds well
under a millisecond, a worker holds ~40-60 MB resident (the tokenizer and Python), and a
respawn after a kill takes ~0.5 s of one core. Workers ignore SIGINT (a Ctrl-C reaches
the whole process group; the parent decides) and exit when the parent's end of their
pipe closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

from edgeprefill.errors import EdgeprefillError, RequestError


class PromptTimeout(RequestError):
    """The worker did not finish in time (a huge prompt or a runaway chat template)."""


class _Reply(NamedTuple):
    ok: bool
    value: Any  # the method's result, or the one-line error message
    user_error: bool  # the request's fault (400) rather than the server's (500)


class PromptWorker:
    """One child process; calls are serialized by PromptWorkers, never concurrent."""

    def __init__(self, bundle_dir: Path, start_timeout: float = 120.0) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a threaded parent
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, str(bundle_dir)),
                                       name="edgeprefill-prompts", daemon=True)
        self.process.start()
        child.close()
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
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)


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

    async def start(self) -> None:
        self._idle = asyncio.Queue()
        for _ in range(self.count):
            self._idle.put_nowait(await self._spawn())

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
        return worker

    def _kill(self, worker: PromptWorker) -> None:
        worker.kill()
        self._all.discard(worker)

    def close(self) -> None:
        for worker in list(self._all):
            self._kill(worker)


def _serve(conn: Connection, bundle_dir: str) -> None:
    """The child's loop: one call at a time until the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from edgeprefill.bundle import load_manifest
    from edgeprefill.sdk.tokenizer import BundleTokenizer

    root = Path(bundle_dir)
    try:
        tokenizer = BundleTokenizer(root, load_manifest(root))
    except Exception as err:  # a bundle the parent loaded should load here too
        conn.send(_Reply(False, f"{type(err).__name__}: {err}", False))
        return
    conn.send(_Reply(True, None, False))
    while True:
        try:
            method, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(_run(tokenizer, method, args, kwargs))


def _run(tokenizer: Any, method: str, args: tuple, kwargs: dict) -> _Reply:
    from jinja2 import TemplateError

    try:
        return _Reply(True, getattr(tokenizer, method)(*args, **kwargs), False)
    except RequestError as err:
        return _Reply(False, str(err), True)
    except TemplateError as err:  # the template failed on these messages
        return _Reply(False, f"chat template: {err}", True)
    except (UnicodeError, ValueError, TypeError, RecursionError) as err:
        return _Reply(False, f"cannot tokenize this prompt: {err}", True)
    except Exception as err:  # anything else is ours: one line, the worker lives on
        return _Reply(False, f"{type(err).__name__}: {err}", False)
