"""Run the server on a background thread: for tests, and for apps that embed both an
engine and its HTTP endpoint in one process."""

from __future__ import annotations

import threading
import time

import uvicorn
from starlette.types import ASGIApp

from edgeprefill.errors import EdgeprefillError
from edgeprefill.server.transport import HttpTimeouts, quiet_fd_exhaustion, uvicorn_config


class ServerThread:
    """`with ServerThread(app, port=8000) as server: ...` serves until the block ends."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 8000,
                 timeouts: HttpTimeouts | None = None) -> None:
        quiet_fd_exhaustion()
        self.server = uvicorn.Server(uvicorn_config(app, host, port, timeouts or HttpTimeouts()))
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self.server.run, name="edgeprefill-server",
                                        daemon=True)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise EdgeprefillError(f"the server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
