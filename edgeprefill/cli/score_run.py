"""`edgeprefill run` on a score bundle (a reranker, a classifier, a reward model): the
texts (the PROMPT, or each line of --prompts: plain text or a JSON string) scored by
Engine.score, each text's raw head outputs printed as a JSON list, one line per text in
the order given; with --query the texts are documents ranked for it by Engine.rerank,
printed as 'INDEX RELEVANCE' lines (the document's 0-based place in the texts, its
relevance in 0..1), best first. The generation options are refused in one line."""

from __future__ import annotations

import json
import time

import click


def print_scores(bundle: str, texts: list[str], query: str | None, priority: int,
                 stats: bool, engine: dict) -> None:
    from edgeprefill.sdk import Engine

    with Engine.load(bundle, **engine) as loaded:
        began = time.perf_counter()
        if query is None:
            for row in loaded.score(texts, priority=priority):
                click.echo(json.dumps(row.tolist()))
        else:
            for index, relevance in loaded.rerank(query, texts, priority=priority):
                click.echo(f"{index} {relevance:.6f}")
        took = time.perf_counter() - began
        if stats:
            tokens = loaded.metrics().prefill_tokens
            click.echo(f"scored {len(texts)} text{'s' * (len(texts) > 1)} ({tokens} tokens) "
                       f"in {took:.3f} s", err=True)
