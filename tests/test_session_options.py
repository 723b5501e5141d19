"""What the export and the engine hand to ONNX Runtime for speed and memory."""

from __future__ import annotations

import onnx
import pytest

from edgeprefill.errors import BackendError
from edgeprefill.sdk import Engine
from tests.test_cli_errors import cli


def allow_spinning(engine: Engine) -> tuple[str, str]:
    options = engine.backend.session.get_session_options()
    # Spinning only while a Run is under way, never between the engine's steps.
    return (options.get_session_config_entry("session.intra_op.allow_spinning"),
            options.get_session_config_entry("session.force_spinning_stop"))


# The suite's conftest sets EDGEPREFILL_SPIN=off (its two processes share the cores): each
# case here sets the variable it means.
@pytest.mark.parametrize("env, spin, expected", [
    (None, None, "1"), ("", None, "1"), ("on", None, "1"), ("OFF", None, "0"),
    (None, True, "1"), (None, False, "0"),
    ("off", True, "1"), ("on", False, "0"),  # the caller's word beats the environment's
])
def test_spin_reaches_the_onnxruntime_session(bundle, monkeypatch, env, spin, expected):
    if env is None:
        monkeypatch.delenv("EDGEPREFILL_SPIN", raising=False)
    else:
        monkeypatch.setenv("EDGEPREFILL_SPIN", env)
    options = {} if spin is None else {"spin": spin}
    with Engine.load(bundle("llama"), background=False, **options) as engine:
        assert allow_spinning(engine) == (expected, "1")


def test_a_spin_setting_other_than_on_or_off_is_refused_in_one_line(bundle, monkeypatch):
    monkeypatch.setenv("EDGEPREFILL_SPIN", "sometimes")
    with pytest.raises(BackendError, match=r"^EDGEPREFILL_SPIN='sometimes': choose one of "
                                           r"on, off$"):
        Engine.load(bundle("llama"), background=False)
    run = cli("run", bundle("llama"), "--prompt", "w5", "--max-new-tokens", "1")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "EDGEPREFILL_SPIN='sometimes': choose one of on, off" in run.stderr


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
