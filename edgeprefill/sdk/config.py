"""Typed, frozen configuration of the runtime, checked once, and the step trace record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from edgeprefill.engines.base import COMPUTES
from edgeprefill.errors import RequestError
from edgeprefill.sdk.known_fields import known_fields
from edgeprefill.sdk.scheduler import SchedulerConfig
from edgeprefill.values import is_int


class StepTrace(NamedTuple):
    """One engine call, for timelines: which requests, how many tokens, when. A fused
    call (decode rows and a prefill chunk together) is recorded twice, once per kind, with
    the same times and `fused` set."""

    kind: str  # "prefill" or "decode"
    start: float  # time.perf_counter()
    end: float
    request_ids: tuple[int, ...]
    tokens: int
    fused: bool = False


@known_fields
@dataclass(frozen=True)
class EngineConfig:
    backend: str = "onnxruntime"
    device: str = "cpu"
    threads: int | None = None  # None: the machine's physical cores
    # compute threads busy-wait between ops within a step (BackendOptions; None: on unless
    # EDGEPREFILL_SPIN=off)
    spin: bool | None = None
    compute: str = "fp32"  # "bf16": projections, prefill attention, KV in bf16 (BackendOptions)
    kv_slots: int = 4  # conversations whose KV is held at once
    kv_budget_bytes: int | None = None  # if set, slots = budget // bytes per slot
    max_context: int | None = None  # positions per slot; None: the bundle's max context
    background: bool = True  # run the step loop in a thread (False: call step())
    verify_checksums: bool = False  # sha256 every bundle file at load
    prefix_reuse: bool = True  # lend retained slots' common prefixes to new requests
    trace: bool = False  # record every engine call in Engine.trace (for timelines)
    warm_up: bool = True  # at load, one chunk call and one decode call (StepRunner.warm_up)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        for name in ("kv_slots", "threads", "max_context", "kv_budget_bytes"):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                raise RequestError(f"{name} must be an integer, got {value!r}", name)
        if self.spin is not None and not isinstance(self.spin, bool):
            raise RequestError(f"spin must be True, False or None, got {self.spin!r}", "spin")
        for name in ("background", "verify_checksums", "prefix_reuse", "trace",
                     "warm_up"):  # "no" would be truthy
            if not isinstance(getattr(self, name), bool):
                raise RequestError(f"{name} must be True or False, got "
                                   f"{getattr(self, name)!r}", name)
        if not is_int(self.kv_slots):  # the one integer field without a None
            raise RequestError(f"kv_slots must be an integer, got {self.kv_slots!r}",
                               "kv_slots")
        if self.kv_slots < 1:
            raise RequestError(f"kv_slots must be >= 1, got {self.kv_slots}", "kv_slots")
        if self.threads is not None and self.threads < 1:
            raise RequestError(f"threads must be >= 1, got {self.threads}", "threads")
        # 0 is no "default": None says that (a 0 had been read as the bundle's context)
        if self.max_context is not None and self.max_context < 2:
            raise RequestError(f"max_context must be >= 2, got {self.max_context}",
                               "max_context")
        if self.compute not in COMPUTES:
            raise RequestError(f"compute must be one of {', '.join(COMPUTES)}, "
                               f"got {self.compute!r}", "compute")
