"""`edgeprefill bench`: the mixed workload (sessions decoding while a long prompt
arrives) swept over scheduling policies and chunk sizes, as a table and a timeline."""

from edgeprefill.bench.workload import (
    SWEEP_POLICIES,
    RunResult,
    RunSpec,
    Timeline,
    Workload,
    run_isolated,
    run_mixed,
    sweep_specs,
)

__all__ = [
    "SWEEP_POLICIES", "RunResult", "RunSpec", "Timeline", "Workload", "run_isolated", "run_mixed",
    "sweep_specs",
]
