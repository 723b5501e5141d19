"""A tool call's arguments that a client sends back in the conversation (an earlier
reply's call), read for the chat template: as JSON text (OpenAI's chat
`function.arguments`, the Responses API's `function_call.arguments`) or as an object
(Anthropic's `tool_use.input`, Ollama's `function.arguments`).

The template renders them into the prompt, so they must be what the model wrote: text is
read by edgeprefill/json_numbers.py (a number a float cannot hold keeps its text, and
`1e400` is rendered as `1e400`, not `inf`), and an object comes from the request body,
read the same way (server/body.py). `NaN` and `Infinity` are not JSON, so arguments
holding one are a 400 naming the field (text here; an object's by the body's reader, which
refuses them anywhere in a request), as is text that is not JSON or nests deeper than
json_numbers.MAX_DEPTH (an object is bounded by the body's own limit).
"""

from __future__ import annotations

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
    return arguments
