"""The mixed-workload protocol both mixed runners follow (standard library only: each
runner runs in its own venv).

A runner reads the spec (`python RUNNER SPEC.json`), plays the scenario once with the
warm-up ids and once with the measured ids, and prints one JSON line: the time every
token became known, in seconds from the start of the measured scenario:

    1. `sessions` requests start and decode (one token per step each);
    2. once each has 2 tokens, the long prompt arrives ("arrival");
    3. when the long prompt has `reply_tokens` tokens the scenario ends.

mixed_workload.py turns the stamps into the same figures for every runtime.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

from common import log, package_versions, rss_mib

__all__ = ["Stamps", "log", "print_result", "read_spec"]


class Stamps(NamedTuple):
    """One measured scenario: perf_counter seconds, shifted to its start by print_result."""

    start: float
    arrival: float
    long: list[float]
    sessions: list[list[float]]


def read_spec() -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    return spec


def print_result(stamps: Stamps, packages: list[str], extra: dict[str, Any]) -> None:
    def shift(times: list[float]) -> list[float]:
        return [t - stamps.start for t in times]

    result = {
        "arrival_s": stamps.arrival - stamps.start,
        "long_token_s": shift(stamps.long),
        "session_token_s": [shift(s) for s in stamps.sessions],
        "peak_rss_mib": rss_mib()["VmHWM"],
        "versions": package_versions(packages),
        **extra,
    }
    print(json.dumps(result), flush=True)
