"""The OpenAI-compatible HTTP server behind `edgeprefill serve` (extra: `[serve]`)."""

from edgeprefill.server.app import create_app
from edgeprefill.server.config import ServerConfig
from edgeprefill.server.thread import ServerThread

__all__ = ["ServerConfig", "ServerThread", "create_app"]
