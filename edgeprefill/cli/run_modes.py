"""How `edgeprefill run` drives the engine for one prompt or many concurrent requests (the
interactive chat is cli/chat.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import fields, replace
from typing import NamedTuple

import click

from edgeprefill.cli.report import backend_line, engine_lines, request_line
from edgeprefill.cli.thinking import ThinkingView, reply_text, show_reply, think_kwargs
from edgeprefill.errors import RequestError
from edgeprefill.sdk import Engine, GenerationParams, TokenStream
from edgeprefill.sdk.priority import parse_priority
from edgeprefill.values import is_number


class Job(NamedTuple):
    prompt: str
    params: GenerationParams
    priority: int
    delay_s: float  # submit this long after the first request


class Turn(NamedTuple):
    """How a prompt text becomes the engine's prompt."""

    chat: bool  # through the bundle's chat template, as a user message
    system: str | None = None  # a system message first (chat only)
    think: bool | None = None  # the template's enable_thinking (chat only; None: its default)

    def prompt(self, text: str) -> str | list[dict[str, str]]:
        if not self.chat:
            return text
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        return [*system, {"role": "user", "content": text}]

    def submit(self, engine: Engine, text: str, params: GenerationParams,
               priority: int = 0) -> tuple[TokenStream, list[int]]:
        """The request for `text`, and its prompt's token ids."""
        arrival = time.perf_counter()  # TTFT counts rendering and tokenizing, as ever
        if not self.chat and not text:
            raise RequestError("the prompt is empty")
        tokens = engine.tokenizer.encode(self.prompt(text), **think_kwargs(self.think))
        return engine.submit(tokens, params, priority, None, arrival=arrival), tokens


PLAIN = Turn(chat=False)
PRINTED = ThinkingView()  # replies printed as generated, think tags and all


def single(engine: Engine, prompt: str, params: GenerationParams, turn: Turn, stats: bool,
           view: ThinkingView = PRINTED) -> None:
    stream, tokens = turn.submit(engine, prompt, params)
    show_reply(stream, lambda text: click.echo(text, nl=False), view,
               view.parser(engine.tokenizer, tokens, turn.chat))
    if stats:
        click.echo(request_line(stream.metrics), err=True)
        for line in [*engine_lines(engine.metrics()), backend_line(engine.backend)]:
            click.echo(line, err=True)


# The keys of a --prompts line besides GenerationParams' fields.
JOB_KEYS = ("prompt", "priority", "delay_s")
# GenerationParams fields a line cannot use: a Constraint is a Python object, and `run`
# prints no logprobs.
NOT_FROM_JSON = ("constraint", "logprobs")
MAX_DELAY_S = 86400.0


def read_requests(
    handle: Iterable[str], params: GenerationParams, priority: int = 0,
) -> list[Job]:
    """One Job per line: a JSON object (keys JOB_KEYS and GenerationParams fields, which
    override the command line's), a JSON string (the prompt) or plain text (the prompt);
    other JSON (a number, a list, true, null) is an error. An unknown key is an error, not a
    silently ignored setting. `priority` is the default of lines that give none."""
    jobs = []
    for number, line in enumerate(handle, 1):
        # Notepad and PowerShell start a UTF-8 file with a byte-order mark.
        line = (line.lstrip("\ufeff") if number == 1 else line).strip()
        if not line:
            continue
        try:
            jobs.append(_job(line, params, priority))
        except (json.JSONDecodeError, TypeError, ValueError, RequestError) as err:
            raise RequestError(f"--prompts line {number}: {err}") from None
    if not jobs:
        raise RequestError("--prompts file holds no requests")
    return jobs


def _job(line: str, params: GenerationParams, priority: int) -> Job:
    raw = _json_or_text(line)
    if isinstance(raw, str):
        if not raw.strip():
            raise ValueError("the prompt is empty")
        return Job(raw, params, priority, 0.0)
    if not isinstance(raw, dict):
        raise ValueError(f"JSON {json.dumps(raw)[:40]} is no request: give a JSON object "
                         '({"prompt": ...}), a JSON string, or plain text that is not JSON')
    settable = {f.name for f in fields(GenerationParams)} - set(NOT_FROM_JSON)
    unknown = sorted(set(raw) - settable - set(JOB_KEYS))
    if unknown:
        raise ValueError(f"unknown key {', '.join(map(repr, unknown))}; known keys: "
                         f"{', '.join([*JOB_KEYS, *sorted(settable)])}")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("'prompt' must be a non-empty string")
    given = {k: v for k, v in raw.items() if k in settable}
    if "max_new_tokens" in given:  # a line's own limit is a promise, as on the command line
        given.setdefault("fit_context", False)
    job_params = replace(params, **given)
    # A priority as people type it: an integer, or high / normal / low (lower first).
    delay = raw.get("delay_s", 0.0)
    if not is_number(delay) or not 0 <= delay <= MAX_DELAY_S:
        raise ValueError(f"'delay_s' must be a number of seconds in [0, {MAX_DELAY_S}], "
                         f"got {delay!r}")
    return Job(prompt, job_params, parse_priority(raw.get("priority", priority)), float(delay))


def _json_or_text(line: str) -> object:
    """The line's JSON value, or the line itself where it is plain text. A line starting
    with `{` is meant as an object, so its bad JSON is an error, not a prompt."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        if line.startswith("{"):
            raise
        return line


def concurrent(engine: Engine, jobs: list[Job], stats: bool, turn: Turn = PLAIN,
               view: ThinkingView = PRINTED) -> None:
    """Submit every job (after its delay), collect all, print each result in order. Any
    request refused: one error line at the end, after every result (a failing status).
    Ctrl-C cancels the rest and prints what each request had generated by then."""
    streams: list[TokenStream | None] = [None] * len(jobs)
    prompts: list[list[int]] = [[] for _ in jobs]
    errors: list[str | None] = [None] * len(jobs)
    start = time.perf_counter()
    interrupted = threading.Event()

    def submit(i: int, job: Job) -> None:
        if interrupted.wait(max(0.0, job.delay_s - (time.perf_counter() - start))):
            return  # Ctrl-C came first: never submitted
        try:
            stream, prompts[i] = turn.submit(engine, job.prompt, job.params, job.priority)
            streams[i] = stream
            if interrupted.is_set():  # submitted while Ctrl-C cancelled the others
                stream.cancel()
            stream.result()
        except RequestError as err:
            errors[i] = str(err)

    threads = [threading.Thread(target=submit, args=(i, j)) for i, j in enumerate(jobs)]
    try:  # Ctrl-C may land while the threads start: they are inside too
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        # Ctrl-C: stop what runs, then print what was generated (finished replies whole,
        # the others so far) before leaving as interrupted.
        interrupted.set()
        for stream in streams:
            if stream is not None:
                stream.cancel()
        for t in threads:
            if t.ident is not None:  # started (a thread never started cannot be joined)
                t.join()
    replies = [None if s is None else
               reply_text(s.text, view, view.parser(engine.tokenizer, p, turn.chat))
               for s, p in zip(streams, prompts, strict=True)]
    _print_results(engine, jobs, replies, errors, stats, streams)
    if interrupted.is_set():
        raise KeyboardInterrupt
    refused = sum(e is not None for e in errors)
    if refused:
        raise RequestError(f"{refused} of {len(jobs)} requests were rejected (see above)")


def _print_results(engine: Engine, jobs: list[Job], replies: list[str | None],
                   errors: list[str | None], stats: bool,
                   streams: list[TokenStream | None]) -> None:
    for i, (job, reply, stream) in enumerate(zip(jobs, replies, streams, strict=True)):
        click.echo(f"--- request {i} (priority {job.priority})")
        if reply is None or stream is None:
            click.echo("not submitted (interrupted)" if errors[i] is None
                       else f"rejected: {errors[i]}")
            continue
        click.echo(reply)
        if stats:
            click.echo(request_line(stream.metrics), err=True)
    if stats:
        for line in [*engine_lines(engine.metrics()), backend_line(engine.backend)]:
            click.echo(line, err=True)
