"""Copies of an exported bundle with one thing changed (the manifest kept consistent), and
a server over one."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import pytest

from edgeprefill.bundle import MANIFEST_FILE, file_record
from edgeprefill.sdk import Engine


def variant(src: Path, dst: Path, generation_config: dict | None = None,
            chat_template: str | None = None,
            graph_edit: Callable[[onnx.ModelProto], None] | None = None) -> Path:
    """`src` copied to `dst` with a new generation_config.json and/or chat template, and/or
    its graph (without weights) changed in place by `graph_edit`."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / MANIFEST_FILE).read_text())
    if graph_edit is not None:
        name = manifest["graph"]["file"]
        model = onnx.load(str(dst / name), load_external_data=False)
        graph_edit(model)
        onnx.save(model, str(dst / name))
        manifest["files"][name] = file_record(dst / name)._asdict()
    if generation_config is not None:
        (dst / "generation_config.json").write_text(json.dumps(generation_config))
        record = file_record(dst / "generation_config.json")
        manifest["files"]["generation_config.json"] = record._asdict()
    if chat_template is not None:
        manifest["tokenizer"]["chat_template"] = chat_template
    (dst / MANIFEST_FILE).write_text(json.dumps(manifest))
    return dst


@contextmanager
def serve(bundle: Path) -> Iterator[tuple[Engine, object]]:
    httpx = pytest.importorskip("httpx")
    from edgeprefill.server import ServerConfig, ServerThread, create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Engine.load(bundle, threads=2) as engine:
        with ServerThread(create_app(engine, ServerConfig(model_name="tiny")), port=port) as srv:
            with httpx.Client(base_url=srv.url, timeout=60) as http:
                yield engine, http
