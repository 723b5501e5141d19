"""An output file (bench's --json and --plot) written whole or not at all."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` for the block to write; renamed over `path` when the
    block ends, removed when it raises. A write that fails part-way (a full disk, Ctrl-C,
    matplotlib failing mid-figure) leaves neither a half-written file nor a destroyed older
    one, where writing `path` itself had truncated it first."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
