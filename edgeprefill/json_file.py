"""The JSON files of a checkpoint or a bundle, read with one-line errors of the caller's
kind (ExportError while exporting, BundleError while loading)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeprefill.errors import EdgeprefillError


def load_json(path: Path, error: type[EdgeprefillError]) -> Any:
    """The parsed contents of `path`; `error` naming the file when it is not valid JSON."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise error(f"{path} is not valid JSON: {err}") from None
    except OSError as err:  # a file of another user's, kept private (umask 077, sudo)
        raise error(f"cannot read {path}: {err.strerror or err}") from None


def load_json_object(path: Path, error: type[EdgeprefillError]) -> dict[str, Any]:
    """A file that must hold a JSON object (config.json, the manifest, generation_config)."""
    raw = load_json(path, error)
    if not isinstance(raw, dict):
        raise error(f"{path} does not hold a JSON object")
    return raw


def optional_json_object(path: Path, error: type[EdgeprefillError]) -> dict[str, Any]:
    """An optional side file (tokenizer_config.json, special_tokens_map.json): {} when it is
    missing or holds something other than an object; `error` when it is not valid JSON."""
    if not path.is_file():
        return {}
    raw = load_json(path, error)
    return raw if isinstance(raw, dict) else {}
