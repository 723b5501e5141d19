"""`edgeprefill run` on an embedding bundle: each text's vector (Engine.embed) printed to
stdout as a JSON list, one line per text, in the order given: the PROMPT (or
--prompt/--prompt-file) is one text, each line of --prompts one (plain text, or a JSON
string), each after the model's prompt --prompt-name names (else its default prompt, if
any). The generation options (sampling, chat, --interactive, --sessions) do not apply
and are refused in one line, not ignored."""

from __future__ import annotations

import json
import time
from collections.abc import Collection

import click

from edgeprefill.errors import RequestError

# run's options that only generation reads
GENERATION_OPTIONS = ("chat", "system", "interactive", "sessions", "max_new_tokens",
                      "temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop",
                      "ignore_eos", "thinking_budget", "think", "hide_thinking")


def refuse_generation_options(given: Collection[str], kind: str = "an embedding bundle",
                              prints: str = "each text's vector") -> None:
    """`given`: the options set on the command line; `kind` the bundle's (a score bundle's
    run, cli/score_run.py, prints other things)."""
    for name in GENERATION_OPTIONS:
        if name in given:
            option = "--think/--no-think" if name == "think" else f"--{name.replace('_', '-')}"
            raise RequestError(f"{option} does not apply to {kind} (it generates nothing): "
                               f"`run` prints {prints}")


def texts_of(prompt: str | None, lines: list[str] | None,
             kind: str = "an embedding bundle") -> list[str]:
    """The texts to embed (or score, on `kind` a score bundle): the prompt, or each
    non-blank line of --prompts."""
    if prompt is not None:
        return [prompt]
    texts = []
    for number, line in enumerate(lines or [], 1):
        line = (line.lstrip("\ufeff") if number == 1 else line).strip()
        if not line:
            continue
        try:
            text = json.loads(line)
        except json.JSONDecodeError:
            text = line
        if not isinstance(text, str):
            raise RequestError(f"--prompts line {number}: {kind} reads one text a line "
                               "(plain text or a JSON string)")
        texts.append(text)
    if not texts:
        raise RequestError("--prompts file holds no texts")
    return texts


def print_vectors(bundle: str, texts: list[str], dimensions: int | None,
                  prompt_name: str | None, priority: int, stats: bool, engine: dict) -> None:
    from edgeprefill.sdk import Engine

    with Engine.load(bundle, **engine) as loaded:
        began = time.perf_counter()
        vectors = loaded.embed(texts, dimensions=dimensions, prompt_name=prompt_name,
                               priority=priority)
        took = time.perf_counter() - began
        for row in vectors:
            click.echo(json.dumps(row.tolist()))
        if stats:
            tokens = loaded.metrics().prefill_tokens
            click.echo(f"embedded {len(texts)} text{'s' * (len(texts) > 1)} ({tokens} tokens, "
                       f"{vectors.shape[1]} dimensions) in {took:.3f} s", err=True)
