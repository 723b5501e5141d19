"""The whole replies whose tool calls' arguments are objects (Anthropic's `input`,
Ollama's `arguments`), written by edgeprefill/json_numbers.py: their numbers as the model
wrote them, valid JSON."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from edgeprefill import json_numbers


class JsonNumbersResponse(JSONResponse):
    """Starlette's JSON response (compact, non-ASCII kept, no NaN), written by
    json_numbers.dumps."""

    def render(self, content: Any) -> bytes:
        return json_numbers.dumps(content, (",", ":")).encode("utf-8")
