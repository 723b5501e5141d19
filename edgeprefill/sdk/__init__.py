"""The runtime: Engine, Session, scheduler, KV cache, sampler, metrics."""

from edgeprefill.sdk.config import EngineConfig, StepTrace
from edgeprefill.sdk.engine import Engine
from edgeprefill.sdk.metrics import EngineMetrics, RequestMetrics
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.sdk.scheduler import POLICIES, SchedulerConfig
from edgeprefill.sdk.session import Session
from edgeprefill.sdk.stream import TokenEvent, TokenStream

__all__ = [
    "POLICIES",
    "Engine",
    "EngineConfig",
    "EngineMetrics",
    "GenerationParams",
    "RequestMetrics",
    "SchedulerConfig",
    "Session",
    "StepTrace",
    "TokenEvent",
    "TokenStream",
]
