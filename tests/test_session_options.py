"""What the export and the engine hand to ONNX Runtime for speed and memory."""

from __future__ import annotations

import onnx
import pytest

from edgeprefill.sdk import Engine
from tests.test_cli_errors import cli


@pytest.mark.parametrize("spin, expected", [(None, "1"), (True, "1"), (False, "0")])
def test_spin_reaches_the_onnxruntime_session(bundle, spin, expected):
    options = {} if spin is None else {"spin": spin}
    with Engine.load(bundle("llama"), background=False, **options) as engine:
        session_options = engine.backend.session.get_session_options()
        entry = session_options.get_session_config_entry("session.intra_op.allow_spinning")
        # Spinning only while a Run is under way, never between the engine's steps.
        stop = session_options.get_session_config_entry("session.force_spinning_stop")
    assert (entry, stop) == (expected, "1")


def test_no_spin_generates_the_same_text(bundle):
    runs = [cli("run", bundle("llama"), "--prompt", "w5 w6 w7", "--max-new-tokens", "4", flag)
            for flag in ("--spin", "--no-spin")]
    assert all(r.returncode == 0 for r in runs), runs[1].stderr
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.strip()


def test_tied_lm_head_does_not_share_the_gather_table(tiny_bundle):
    """ONNX Runtime repacks a Gemm's weight; a table shared with the Gather would then be
    resident twice. The LM head reads its own copy, the Gather reads nothing else's."""
    graph = onnx.load(str(tiny_bundle / "model.onnx"), load_external_data=False).graph
    consumers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    assert consumers["model.embed_tokens.weight"] == {"Gather"}
    assert consumers["lm_head.weight"] == {"Gemm"}
