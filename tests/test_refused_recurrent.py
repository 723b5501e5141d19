"""Recurrent and hybrid model types close to supported ones that export refuses, each in
one line that says what it does not support."""

from __future__ import annotations

import pytest

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig


@pytest.mark.parametrize("model_type, reason", (
    ("glm5_next", "linear attention layers with forget gates"),
    ("inkling2_text", "block attention residuals.*dynamic short convolutions.*sinks"),
    ("inkling2", "block attention residuals.*dynamic short convolutions.*sinks"),
))
def test_a_refused_recurrent_type_is_refused_in_one_line(model_type, reason):
    with pytest.raises(ExportError, match=f"^model_type '{model_type}': .*{reason}.* not "
                                          "supported$") as refused:
        ModelConfig.from_hf({"model_type": model_type, "hidden_size": 64})
    assert "\n" not in str(refused.value)

