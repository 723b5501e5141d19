"""A TensorRT logger that keeps what TensorRT said, so a failure is one line that says why.

TensorRT reports why the builder or the runtime failed through its logger and returns only
None or False to the caller. `capturing_logger` keeps the last errors for the one-line
BackendError and passes warnings on to Python logging (shown once each, not swallowed).
"""

from __future__ import annotations

import logging
from collections import deque
from types import ModuleType
from typing import Any

log = logging.getLogger("edgeprefill")
KEPT_ERRORS = 3  # the last few: TensorRT's first lines are often the generic ones


class Captured:
    """The messages a capturing logger kept (plain Python: testable without TensorRT)."""

    def __init__(self) -> None:
        self.errors: deque[str] = deque(maxlen=KEPT_ERRORS)
        self.warned: set[str] = set()

    def error(self, message: str) -> None:
        self.errors.append(" ".join(message.split()))  # one line

    def warning(self, message: str) -> None:
        text = " ".join(message.split())
        if text not in self.warned:
            self.warned.add(text)
            log.warning("TensorRT: %s", text)

    def clear(self) -> None:
        self.errors.clear()

    def explain(self, failure: str) -> str:
        """`failure`, followed by what TensorRT said about it when it said anything."""
        if not self.errors:
            return f"{failure} (TensorRT gave no reason)"
        return f"{failure}: {'; '.join(self.errors)}"


def capturing_logger(trt: ModuleType) -> Any:
    """A trt.ILogger whose `.captured` holds its errors; hand it to Builder and Runtime."""
    severity = trt.ILogger.Severity
    errors = {severity.INTERNAL_ERROR, severity.ERROR}

    class CapturingLogger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.captured = Captured()

        def log(self, level: Any, message: str) -> None:
            if level in errors:
                self.captured.error(message)
            elif level == severity.WARNING:
                self.captured.warning(message)

    return CapturingLogger()
