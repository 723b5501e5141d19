"""Ollama's chat `messages` -> the chat messages the chat route renders through the
bundle's chat template.

A message is `{role, content, thinking, images, tool_calls, tool_name, tool_call_id}`
(api.Message):
- `thinking` (an earlier reply's) is its reasoning, so templates that replay it get it;
- an assistant's `tool_calls` are `{id?, function: {index?, name, arguments}}` with the
  arguments an object (OpenAI sends them as JSON text); a call without an id gets one
  here, so that its result can name it;
- a `tool` message names its call by `tool_call_id`, or only by `tool_name` (as older
  clients do): it then answers the earliest unanswered call of that name (or the
  earliest unanswered call) of the assistant turn before it, for templates that pair
  results with calls by id;
- `images` are refused: this server reads text only.
"""

from __future__ import annotations

from typing import Any

from edgeprefill.server.errors import ApiError
from edgeprefill.server.history_arguments import read_arguments

ROLES = ("system", "user", "assistant", "tool")


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of messages")
    unanswered: list[tuple[str, str]] = []  # (id, name) of the last turn's calls
    out = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ApiError(400, f"{param} must be an object with role system, user, "
                           "assistant or tool")
        if message.get("images"):
            raise ApiError(400, f"{param}: images are not supported: this server reads "
                           "text only")
        converted = {"role": message["role"], "content": string_field(message, "content", param)}
        thinking = string_field(message, "thinking", param)
        if thinking:
            converted["reasoning_content"] = thinking
        if message["role"] == "assistant" and message.get("tool_calls"):
            converted["tool_calls"] = _calls(message["tool_calls"], index, param)
            unanswered = [(c["id"], c["function"]["name"]) for c in converted["tool_calls"]]
        if message["role"] == "tool":
            converted.update(_result(message, param, unanswered))
        out.append(converted)
    return out


def _calls(calls: Any, index: int, param: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise ApiError(400, f"{param}.tool_calls must be a list")
    out = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments", {}), (dict, str)):
            raise ApiError(400, f"{param}.tool_calls[{number}] must be {{\"function\": "
                           "{\"name\", \"arguments\": {...}}}")
        call_id = call.get("id") or f"call_{index}_{number}"
        if not isinstance(call_id, str):
            raise ApiError(400, f"{param}.tool_calls[{number}].id must be a string")
        arguments = read_arguments(function.get("arguments", {}),
                                   f"{param}.tool_calls[{number}].function.arguments")
        out.append({"id": call_id, "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def _result(message: dict, param: str, unanswered: list[tuple[str, str]]) -> dict[str, str]:
    """A tool message's `tool_call_id` and `name` (the chat route's fields)."""
    call_id = string_field(message, "tool_call_id", param)
    name = string_field(message, "tool_name", param)
    match = next((c for c in unanswered if c[0] == call_id), None) if call_id else \
        next((c for c in unanswered if c[1] == name), None) or \
        (unanswered[0] if unanswered else None)
    if match is not None:
        unanswered.remove(match)
        call_id, name = call_id or match[0], name or match[1]
    fields = {"tool_call_id": call_id, "name": name}
    return {key: value for key, value in fields.items() if value}


def string_field(body: dict, name: str, param: str | None = None) -> str:
    """`body[name]`, "" where absent; a 400 naming it (`param.name`, or `'name'` at the
    top level) where it is no string."""
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ApiError(400, f"{param}.{name} must be a string" if param is not None
                       else f"'{name}' must be a string")
    return value
