"""Chat users with one system prompt arriving together, under the default policy: the
scheduler's wait for a prefix being written (`Scheduler._writing_prefix_of`, stop 54)
against starting the second prompt beside the writer once its aging overtook it (the
scheduler before: the two took turns, each computing the shared part past the cache).

`--sessions` sessions are decoding when `--users` prompts arrive at once, each a common
`--system`-token system prompt and `--question` tokens of its own; every step has a budget
of `--budget` tokens, the decode rows' included (the mixed workload's setting). Both
variants run on one bundle in one process, an engine each, taking turns for `--rounds`
rounds with new token ids every round (the same ids for both variants in a round, so
neither finds the other's prefix cached). Reported, medians over the rounds: the users'
mean and last first token (from their arrival), the prompt tokens the engine computed
while they prefilled, and the sessions' longest gap between two tokens meanwhile.

    python benchmarks/shared_system_prompt.py BUNDLE [--rounds 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from edgeprefill.sdk import Engine, EngineConfig, GenerationParams, SchedulerConfig
from edgeprefill.sdk.request import Phase, Request
from edgeprefill.sdk.scheduler import Scheduler

NOW = Scheduler._pick_by_priority


def _pick_beside_the_writer(self: Scheduler) -> Request | None:
    """Scheduler._pick_by_priority as it was before stop 54: the best queued prompt starts
    even where a started one is writing its prefix."""
    key = self._priority_key
    best = min(self.queued + self.prefilling, key=key, default=None)
    if best is not None and best.phase is Phase.QUEUED and not self._start(best):
        best = min(self.prefilling, key=key, default=None)
    return best


VARIANTS = {"starts beside the writer (before)": _pick_beside_the_writer,
            "waits for the prefix (now)": NOW}


def one_round(engine: Engine, rng: np.random.Generator, args: argparse.Namespace) -> dict:
    vocab = engine.manifest.model.vocab_size

    def ids(n: int) -> list[int]:
        return [int(i) for i in rng.integers(10, vocab - 10, n)]

    long = GenerationParams(max_new_tokens=2000, ignore_eos=True)
    sessions = [engine.generate(ids(16), long) for _ in range(args.sessions)]
    while any(s.metrics.generated_tokens < 2 for s in sessions):
        engine.step()
    system = ids(args.system)
    before = engine.metrics().prefill_tokens
    start = time.perf_counter()
    users = [engine.generate(system + ids(args.question),
                             GenerationParams(max_new_tokens=args.new, ignore_eos=True))
             for _ in range(args.users)]
    while not all(u.done for u in users):
        engine.step()
    firsts = [u.metrics.token_times[0] for u in users]
    computed = engine.metrics().prefill_tokens - before
    gaps = [b - a for s in sessions for a, b in zip(s.metrics.token_times,
                                                    s.metrics.token_times[1:], strict=False)
            if a >= start and a <= max(firsts)]
    for s in sessions:
        s.cancel()
    while engine.scheduler.live():
        engine.step()
    return {"ttft_mean": statistics.mean(t - u.metrics.arrival
                                         for t, u in zip(firsts, users, strict=True)),
            "ttft_last": max(firsts) - start, "computed": computed,
            "max_gap": max(gaps, default=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument("--system", type=int, default=1024)
    parser.add_argument("--question", type=int, default=32)
    parser.add_argument("--new", type=int, default=4)
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compute", default="bf16")
    args = parser.parse_args()
    config = EngineConfig(threads=args.threads, compute=args.compute, kv_slots=8,
                          background=False,
                          scheduler=SchedulerConfig(max_step_tokens=args.budget))
    engines = {name: Engine(args.bundle, config) for name in VARIANTS}
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            Scheduler._pick_by_priority = VARIANTS[name]  # type: ignore[method-assign]
            try:
                results[name].append(one_round(engines[name], np.random.default_rng(r), args))
            finally:
                Scheduler._pick_by_priority = NOW  # type: ignore[method-assign]
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"CPU: {cpu}; {args.threads} threads; --compute {args.compute}; {args.bundle.name}")
    print(f"{args.sessions} sessions decoding, {args.users} users: {args.system}-token system "
          f"prompt + {args.question} own tokens; budget {args.budget} tokens a step; "
          f"medians of {args.rounds} rounds")
    print("| scheduler | users' mean TTFT | last TTFT | prompt tokens computed "
          "| sessions' longest gap |")
    print("|---|---|---|---|---|")
    base = None
    for name, rows in results.items():
        med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        base = base or med
        print(f"| {name} | {med['ttft_mean'] * 1e3:.0f} ms "
              f"({med['ttft_mean'] / base['ttft_mean']:.2f}x) | "
              f"{med['ttft_last'] * 1e3:.0f} ms ({med['ttft_last'] / base['ttft_last']:.2f}x) "
              f"| {med['computed']:.0f} | {med['max_gap'] * 1e3:.0f} ms |")
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
