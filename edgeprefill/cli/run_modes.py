"""The three ways `edgeprefill run` drives the engine: one prompt, a chat, many requests."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from typing import IO, NamedTuple

import click

from edgeprefill.cli.report import backend_line, engine_lines, request_line
from edgeprefill.errors import RequestError
from edgeprefill.sdk import Engine, GenerationParams, TokenStream
from edgeprefill.sdk.priority import parse_priority


class Job(NamedTuple):
    prompt: str
    params: GenerationParams
    priority: int
    delay_s: float  # submit this long after the first request


def _as_prompt(text: str, chat: bool):
    return [{"role": "user", "content": text}] if chat else text


def _stream_out(stream: TokenStream) -> None:
    for event in stream:
        click.echo(event.text, nl=False)
    click.echo()
    if stream.finish_reason == "error":
        raise RequestError(f"generation failed: {stream.error}")


def single(engine: Engine, prompt: str, params: GenerationParams, chat: bool, stats: bool):
    stream = engine.generate(_as_prompt(prompt, chat), params)
    _stream_out(stream)
    if stats:
        click.echo(request_line(stream.metrics), err=True)
        for line in [*engine_lines(engine.metrics()), backend_line(engine.backend)]:
            click.echo(line, err=True)


def interactive(engine: Engine, params: GenerationParams, chat: bool, stats: bool):
    """A multi-turn chat: the session keeps its KV, so each turn prefills only what's new."""
    use_chat = chat or engine.manifest.tokenizer.chat_template is not None
    session = engine.session()
    click.echo("edgeprefill chat: type a message, an empty line or /exit to quit", err=True)
    while True:
        try:
            text = click.prompt("you", prompt_suffix="> ", default="", show_default=False,
                                err=True)
        except (EOFError, click.exceptions.Abort):
            break
        if text.strip() in ("", "/exit", "/quit"):
            break
        stream = session.chat(text, params) if use_chat else session.generate(text, params)
        click.echo("model> ", nl=False, err=True)
        _stream_out(stream)
        if stats:
            click.echo(request_line(stream.metrics), err=True)
    session.close()


def read_requests(handle: IO[str], params: GenerationParams, priority: int = 0) -> list[Job]:
    jobs = []
    for number, line in enumerate(handle, 1):
        line = line.strip()
        if not line:
            continue
        if not line.startswith("{"):
            jobs.append(Job(line, params, priority, 0.0))
            continue
        try:
            raw = json.loads(line)
            job_params = replace(params, **{
                k: raw[k] for k in ("max_new_tokens", "temperature", "seed") if k in raw
            })
            job_priority = parse_priority(raw.get("priority", priority))
            jobs.append(Job(str(raw["prompt"]), job_params, job_priority,
                            float(raw.get("delay_s", 0.0))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, RequestError) as err:
            raise RequestError(f"--prompts line {number}: {err}") from None
    if not jobs:
        raise RequestError("--prompts file holds no requests")
    return jobs


def concurrent(engine: Engine, jobs: list[Job], stats: bool, chat: bool = False) -> None:
    """Submit every job (after its delay), collect all, print each result in order."""
    streams: list[TokenStream | None] = [None] * len(jobs)
    errors: list[str | None] = [None] * len(jobs)
    start = time.perf_counter()

    def submit(i: int, job: Job) -> None:
        time.sleep(max(0.0, job.delay_s - (time.perf_counter() - start)))
        try:
            stream = engine.generate(_as_prompt(job.prompt, chat), job.params,
                                     priority=job.priority)
            streams[i] = stream.result()
        except RequestError as err:
            errors[i] = str(err)

    threads = [threading.Thread(target=submit, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (job, stream) in enumerate(zip(jobs, streams, strict=True)):
        click.echo(f"--- request {i} (priority {job.priority})")
        if stream is None:
            click.echo(f"rejected: {errors[i]}")
            continue
        click.echo(stream.text)
        if stats:
            click.echo(request_line(stream.metrics), err=True)
    if stats:
        for line in [*engine_lines(engine.metrics()), backend_line(engine.backend)]:
            click.echo(line, err=True)
