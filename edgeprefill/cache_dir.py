"""Where edgeprefill keeps what it makes on the user's machine: `$XDG_CACHE_HOME/edgeprefill/`
(or `~/.cache/edgeprefill/`), one folder per kind (the native kernels, derived weights)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(kind: str) -> Path:
    """The folder for `kind`; RuntimeError where the user has no home folder (Path.home).
    A relative `XDG_CACHE_HOME` is ignored, as the XDG Base Directory spec says: taken, it
    put a cache in whatever folder each process started in."""
    given = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(given) if os.path.isabs(given) else Path.home() / ".cache"
    return base / "edgeprefill" / kind
