"""With the real engine, interleaving never changes what a request generates."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgeprefill.sdk import Engine, GenerationParams

PARAMS = GenerationParams(max_new_tokens=12, ignore_eos=True)
REQUESTS = [  # (prompt length, priority, chunk size, submit after this many steps)
    (333, 0, 16, 0),
    (17, 1, None, 0),
    (100, 0, 64, 3),
    (5, 5, 16, 4),
    (200, 2, None, 9),
    (64, 0, 1, 12),
]


def prompt(length: int, seed: int) -> list[int]:
    return [1] + [int(t) for t in np.random.default_rng(seed).integers(3, 120, size=length - 1)]


def all_finished(streams: dict) -> bool:
    return all(s.metrics.finish_reason for s in streams.values())


@pytest.mark.parametrize("flavor", ["ort", "standard"])
def test_interleaved_output_equals_each_request_alone(bundle, flavor):
    path = bundle("llama", flavor)
    alone_engine = Engine.load(path, threads=2, background=False, prefix_reuse=False)
    alone = [alone_engine.generate(prompt(n, i), PARAMS).result().token_ids
             for i, (n, *_rest) in enumerate(REQUESTS)]
    alone_engine.close()
    for policy in ("chunked+priority", "chunked", "fcfs"):
        engine = Engine.load(path, threads=2, background=False, kv_slots=3, policy=policy)
        streams: dict[int, object] = {}
        step = 0
        while len(streams) < len(REQUESTS) or not all_finished(streams):
            for i, (n, priority, chunk, at) in enumerate(REQUESTS):
                if at == step and i not in streams:
                    streams[i] = engine.generate(prompt(n, i), PARAMS, priority=priority,
                                                 chunk_size=chunk)
            engine.step()
            step += 1
        got = [streams[i].result().token_ids for i in range(len(REQUESTS))]
        assert got == alone, policy
        engine.check_integrity()
        assert engine.kv.usage().active == 0
        engine.close()


def test_concurrent_consumers_on_the_background_loop(bundle):
    """Streams iterated from several threads while the engine's own thread steps."""
    path = bundle("llama", "ort")
    with Engine.load(path, threads=2, prefix_reuse=False) as reference:
        expected = [reference.generate(prompt(n, i), PARAMS).result().token_ids
                    for i, (n, *_rest) in enumerate(REQUESTS)]
    results: dict[int, list[int]] = {}
    with Engine.load(path, threads=2, kv_slots=2) as engine:
        def consume(i: int, n: int, priority: int, chunk: int | None) -> None:
            stream = engine.generate(prompt(n, i), PARAMS, priority=priority, chunk_size=chunk)
            results[i] = [e.token_id for e in stream if e.token_id is not None]

        threads = [threading.Thread(target=consume, args=(i, n, p, c))
                   for i, (n, p, c, _at) in enumerate(REQUESTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert [results[i] for i in range(len(REQUESTS))] == expected
        engine.check_integrity()
