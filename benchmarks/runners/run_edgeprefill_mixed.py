"""edgeprefill on the mixed workload (mixed_common.py), through the SDK.

Run by benchmarks/mixed_workload.py with the project's python:  python RUNNER SPEC.json
The engine is loaded as `edgeprefill bench` loads it (edgeprefill/bench/workload.py:
chunked policy at a fixed chunk, prefix reuse off, a KV slot per request), but the prompt
ids come from the spec so that every runtime is given the same tokens. Token times are
the SDK's own stamps (TokenStream.metrics, perf_counter at the end of the step).
"""

from __future__ import annotations

import time
from typing import Any

from mixed_common import Stamps, log, print_result, read_spec

from edgeprefill.bench.workload import POLL_S
from edgeprefill.sdk import Engine, GenerationParams


def wait(done: Any) -> None:
    while not done():
        time.sleep(POLL_S)


def scenario(engine: Engine, ids: dict[str, Any], spec: dict[str, Any]) -> Stamps:
    chat = GenerationParams(max_new_tokens=spec["session_max_tokens"], ignore_eos=True)
    reply = GenerationParams(max_new_tokens=spec["reply_tokens"], ignore_eos=True)
    start = time.perf_counter()
    sessions = [engine.generate(p, chat) for p in ids["sessions"]]
    wait(lambda: all(len(s.metrics.token_times) >= 2 for s in sessions))
    long = engine.generate(ids["long"], reply)
    long.result()
    for stream in sessions:
        stream.cancel()
    for stream in sessions:
        stream.result()
    return Stamps(start, long.metrics.arrival, list(long.metrics.token_times),
                  [list(s.metrics.token_times) for s in sessions])


def main() -> None:
    spec = read_spec()
    started = time.perf_counter()
    # The budget counts the decode rows' tokens too, as OpenVINO's max_num_batched_tokens.
    engine = Engine.load(spec["artifact_dir"], threads=spec["threads"], policy="chunked",
                         chunk_size=spec["budget"], max_step_tokens=spec["budget"],
                         kv_slots=spec["sessions"] + 1,
                         prefix_reuse=False,
                         compute=spec["options"].get("compute", "fp32"),
                         fuse_steps=spec["options"].get("fuse_steps") != "off")
    log(f"{spec['runtime']}: loaded in {time.perf_counter() - started:.2f} s")
    with engine:
        scenario(engine, spec["warmup_ids"], spec)
        stamps = scenario(engine, spec["ids"], spec)
    print_result(stamps, ["edgeprefill", "onnxruntime", "numpy"], {"policy": "chunked"})


if __name__ == "__main__":
    main()
