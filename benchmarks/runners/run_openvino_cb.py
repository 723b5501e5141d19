"""OpenVINO GenAI ContinuousBatchingPipeline on the mixed workload (mixed_common.py).

Run by benchmarks/mixed_workload.py inside the openvino venv:  python run_openvino_cb.py SPEC
The pipeline is driven step by step (add_request / step / read each handle), so the time
each token becomes known is the end of the step that made it, as in edgeprefill's engine.
SchedulerConfig: `budget` tokens per step with dynamic split-fuse (decode tokens first, the
rest of the budget a slice of the long prompt), no prefix caching, a KV cache that holds
everything. Spec options: "precision_hint" (INFERENCE_PRECISION_HINT, absent = the
plugin's default) and "kv_precision" (KV_CACHE_PRECISION, absent = the plugin's default).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import openvino as ov
import openvino_genai as ov_genai
from mixed_common import Stamps, log, print_result, read_spec

CACHE_GB = 1  # the whole scenario needs ~0.2 GB of f32 KV for the 135M shape


def make_pipeline(spec: dict[str, Any]) -> ov_genai.ContinuousBatchingPipeline:
    scheduler = ov_genai.SchedulerConfig()
    scheduler.max_num_batched_tokens = spec["budget"]
    scheduler.dynamic_split_fuse = True
    scheduler.enable_prefix_caching = False  # every run computes the long prompt in full
    scheduler.cache_size = CACHE_GB
    scheduler.max_num_seqs = spec["sessions"] + 1
    properties: dict[str, Any] = {"INFERENCE_NUM_THREADS": spec["threads"]}
    options = spec.get("options", {})
    if options.get("precision_hint"):
        properties["INFERENCE_PRECISION_HINT"] = options["precision_hint"]
    if options.get("kv_precision"):
        properties["KV_CACHE_PRECISION"] = options["kv_precision"]
    return ov_genai.ContinuousBatchingPipeline(spec["artifact_dir"], scheduler, "CPU",
                                               properties)


def config(tokens: int) -> ov_genai.GenerationConfig:
    gen = ov_genai.GenerationConfig()
    gen.max_new_tokens = gen.min_new_tokens = tokens  # never stop on EOS
    gen.do_sample = False
    return gen


class Driver:
    """Adds requests and steps the pipeline, stamping each handle's new tokens."""

    def __init__(self, pipe: ov_genai.ContinuousBatchingPipeline) -> None:
        self.pipe, self.next_id = pipe, 0
        self.handles: list[Any] = []
        self.times: list[list[float]] = []

    def add(self, ids: list[int], tokens: int) -> int:
        tensor = ov.Tensor(np.asarray([ids], dtype=np.int64))
        self.handles.append(self.pipe.add_request(self.next_id, tensor, config(tokens)))
        self.times.append([])
        self.next_id += 1
        return len(self.handles) - 1

    def step(self) -> None:
        self.pipe.step()
        now = time.perf_counter()
        for handle, times in zip(self.handles, self.times, strict=True):
            if handle.can_read():
                for output in handle.read().values():
                    times.extend([now] * len(output.generated_ids))

    def until(self, done: Any) -> None:
        while not done():
            if not self.pipe.has_non_finished_requests():
                raise RuntimeError("the pipeline finished before the scenario did")
            self.step()

    def drop_all(self) -> None:
        for handle in self.handles:
            handle.cancel()
        while self.pipe.has_non_finished_requests():
            self.pipe.step()


def scenario(pipe: ov_genai.ContinuousBatchingPipeline, ids: dict[str, Any],
             spec: dict[str, Any]) -> Stamps:
    driver = Driver(pipe)
    start = time.perf_counter()
    sessions = [driver.add(p, spec["session_max_tokens"]) for p in ids["sessions"]]
    driver.until(lambda: all(len(driver.times[s]) >= 2 for s in sessions))
    arrival = time.perf_counter()
    long = driver.add(ids["long"], spec["reply_tokens"])
    driver.until(lambda: len(driver.times[long]) >= spec["reply_tokens"])
    stamps = Stamps(start, arrival, driver.times[long], [driver.times[s] for s in sessions])
    driver.drop_all()
    return stamps


def main() -> None:
    spec = read_spec()
    started = time.perf_counter()
    pipe = make_pipeline(spec)
    log(f"{spec['runtime']}: loaded in {time.perf_counter() - started:.2f} s")
    scenario(pipe, spec["warmup_ids"], spec)
    stamps = scenario(pipe, spec["ids"], spec)
    options = spec.get("options", {})
    extra = {"precision_hint": options.get("precision_hint") or "plugin default",
             "kv_precision": options.get("kv_precision") or "plugin default"}
    print_result(stamps, ["openvino-genai", "openvino", "numpy"], extra)


if __name__ == "__main__":
    main()
