"""Peak resident memory of this process over a block, sampled by a background thread.

The process-lifetime peak (`ru_maxrss`) cannot tell one run of a sweep from the next,
so the resident size is sampled every few milliseconds instead (psutil, the `[bench]`
extra). Without psutil the peak is unknown (None), never a wrong number.
"""

from __future__ import annotations

import threading

SAMPLE_EVERY_S = 0.005


class PeakRSS:
    def __init__(self) -> None:
        self.peak_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRSS:
        try:
            import psutil
        except ImportError:
            return self
        process = psutil.Process()
        self.peak_bytes = process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, args=(process,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self, process) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.peak_bytes = max(self.peak_bytes or 0, process.memory_info().rss)
