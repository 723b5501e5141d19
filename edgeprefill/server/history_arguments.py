"""A tool call's arguments that a client sends back in the conversation (an earlier
reply's call), read for the chat template: as JSON text (OpenAI's chat
`function.arguments`, the Responses API's `function_call.arguments`) or as an object
(Anthropic's `tool_use.input`, Ollama's `function.arguments`).

The template renders them into the prompt, so they must be what the model wrote: text is
read by edgeprefill/json_numbers.py (a number a float cannot hold keeps its text, and
`1e400` is rendered as `1e400`, not `inf`), and an object comes from the request body,
read the same way (server/body.py). `NaN` and `Infinity` are not JSON, so arguments
holding one are a 400 naming the field, as is text that is not JSON or nests deeper than
json_numbers.MAX_DEPTH (an object is bounded by the body's own limit).
"""

from __future__ import annotations

import math
from typing import Any

from edgeprefill import json_numbers
from edgeprefill.server.errors import ApiError


def read_arguments(arguments: Any, param: str) -> Any:
    """The arguments as the template gets them (an object where they are JSON text); a
    400 naming `param` where they are not JSON."""
    if isinstance(arguments, str):
        try:
            return json_numbers.loads(arguments)
        except ValueError as err:
            raise ApiError(400, f"{param} is not valid JSON ({err})", param) from None
    if _holds_nan_or_infinity(arguments):
        raise ApiError(400, f"{param} holds NaN or Infinity, which are not JSON", param)
    return arguments


def _holds_nan_or_infinity(value: Any) -> bool:
    """Whether a value from the body holds a float NaN or infinity: the body reader reads
    a number too big for a float as a WrittenNumber, so these were `NaN` or `Infinity`."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict | list):
            stack.extend(item.values() if isinstance(item, dict) else item)
    return False
