"""Stop-string matching per generated token: the automaton (sdk/stop_matcher.py) against
the per-token scan it replaced, on the same text pieces, in one process, taking turns.

    PYTHONPATH=. .venv/bin/python benchmarks/stop_strings.py
    PYTHONPATH=. .venv/bin/python benchmarks/stop_strings.py --pieces 3000 --rounds 5

"scan" is b91c511's TextStreamer logic (every stop string at every prefix length of the
held-back text, then `find` of each), copied below. Both run on the engine's thread for
every token of a request with stop strings, so their time is every client's time.
"""

from __future__ import annotations

import argparse
import random
import time

from comparison.report import cpu_name

from edgeprefill.sdk.params import MAX_STOP_CHARS, MAX_STOP_STRINGS
from edgeprefill.sdk.stop_matcher import StopMatcher

# -- b91c511's code, for "scan" ----------------------------------------------------------------


def scan_held_back(text: str, stop: tuple[str, ...]) -> int:
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


def scan_push(held: str, new: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    text = held + new
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    if hits:
        return "", True
    keep = scan_held_back(text, stop)
    return text[len(text) - keep:], False


# -- the workloads ---------------------------------------------------------------------------


def workloads(pieces: int) -> dict[str, tuple[tuple[str, ...], list[str]]]:
    """name -> (stop strings, the reply's text pieces, one per token)."""
    rng = random.Random(0)
    words = [" " + "".join(rng.choices("etaoinshrdlu", k=rng.randint(1, 7)))
             for _ in range(pieces)]
    at_limit = tuple("b" * 38 + f"{i:03d}"[-1] for i in range(MAX_STOP_STRINGS))
    assert sum(map(len, at_limit)) <= MAX_STOP_CHARS
    return {
        "4 OpenAI-style stops, words": (("\n\n", "User:", "###", "</s>"), words),
        f"{MAX_STOP_STRINGS} stops of 39 chars, words": (at_limit, words),
        f"{MAX_STOP_STRINGS} stops of 39 chars, forced 'b'": (at_limit, ["b"] * pieces),
        "100 x 38 'b' + 6,000 'a', forced 'a'": (
            tuple(["b" * 38] * 100 + ["a" * 6000]), ["a"] * pieces),
    }


def time_scan(stop: tuple[str, ...], pieces: list[str]) -> float:
    began, held = time.perf_counter(), ""
    for piece in pieces:
        held, stopped = scan_push(held, piece, stop)
        if stopped:
            break
    return time.perf_counter() - began


def time_automaton(stop: tuple[str, ...], pieces: list[str]) -> float:
    began = time.perf_counter()
    matcher = StopMatcher(stop)  # built at submit: counted here too
    for piece in pieces:
        if matcher.feed(piece) is not None:
            break
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pieces", type=int, default=1500, help="tokens per reply")
    parser.add_argument("--rounds", type=int, default=3, help="turns of each, best kept")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}; {args.pieces} tokens a reply, best of {args.rounds} turns")
    print(f"{'workload':<42} {'scan us/token':>14} {'automaton':>10} {'scan/automaton':>15}")
    for name, (stop, pieces) in workloads(args.pieces).items():
        scan, automaton = [], []
        for _ in range(args.rounds):  # taking turns, so both see the same machine
            scan.append(time_scan(stop, pieces))
            automaton.append(time_automaton(stop, pieces))
        per = 1e6 / len(pieces)
        print(f"{name:<42} {min(scan) * per:>14.1f} {min(automaton) * per:>10.2f} "
              f"{min(scan) / min(automaton):>14.0f}x")


if __name__ == "__main__":
    main()
