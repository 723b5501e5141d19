"""Where edgeprefill keeps what it makes on the user's machine: `$XDG_CACHE_HOME/edgeprefill/`
(or `~/.cache/edgeprefill/`), one folder per kind (the native kernels, derived weights)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(kind: str) -> Path:
    """The folder for `kind`; RuntimeError where the user has no home folder (Path.home)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "edgeprefill" / kind
