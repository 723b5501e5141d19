"""The Responses API's `instructions` and `input` -> the chat messages the chat route
renders through the bundle's chat template.

- `input` is a string (one user message) or a list of items:
  - messages (`type` "message", or no type), role `user`, `system`, `developer` or
    `assistant`, content a string or a list of `input_text` / `output_text` parts;
  - `function_call` items (an earlier reply's calls) and `function_call_output` items
    (their results), for a tool loop run by the client;
  - `reasoning` items (an earlier reply's thinking), so templates that replay it get it.
- `instructions` becomes a system message in front, as vLLM and llama.cpp's server do.
- `developer` is `system`: chat templates know no other role for it.

An earlier reply comes back as several items (its reasoning, its message, its calls);
consecutive items of the assistant's become one assistant message, as the chat route
would have received it (llama.cpp's converter merges them the same way). The server is
stateless: an `item_reference` (an item stored by an earlier response) is a 400.
"""

from __future__ import annotations

from typing import Any

from edgeprefill.server.errors import ApiError
from edgeprefill.server.history_arguments import read_arguments

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text")


def input_messages(input_value: Any, instructions: Any) -> list[dict[str, Any]]:
    """Chat messages for the request's `instructions` and `input`."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(400, "'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    if isinstance(input_value, str):
        if not input_value.strip():  # as a user message without text (_add_message)
            raise ApiError(400, "'input' is empty", "input")
        return [*messages, {"role": "user", "content": input_value}]
    if not isinstance(input_value, list) or not input_value:
        raise ApiError(400, "'input' must be a string or a non-empty list of items", "input")
    names: dict[str, str] = {}  # call_id -> function name, for the results' `name`
    for index, item in enumerate(input_value):
        _add_item(messages, item, f"input[{index}]", names)
    return messages


def _add_item(messages: list[dict[str, Any]], item: Any, param: str,
              names: dict[str, str]) -> None:
    if not isinstance(item, dict):
        raise ApiError(400, f"{param} must be an object", param)
    kind = item.get("type", "message")
    if kind == "message":
        _add_message(messages, item, param)
    elif kind == "function_call":
        call = _call(item, param)
        names[call["id"]] = call["function"]["name"]
        _assistant(messages).setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        messages.append(_call_output(item, param, names))
    elif kind == "reasoning":
        text = _reasoning_text(item, param)
        if text:
            _assistant(messages)["reasoning_content"] = text
    elif kind == "item_reference":
        raise ApiError(400, f"{param}: an item_reference names an item stored by an "
                       "earlier response; this server is stateless: send the item itself",
                       param)
    else:
        raise ApiError(400, f"{param}: item type {kind!r} is not supported (message, "
                       "function_call, function_call_output, reasoning)", f"{param}.type")


def _add_message(messages: list[dict[str, Any]], item: dict, param: str) -> None:
    role = item.get("role")  # a list or an object is no key of ROLES: not looked up
    role = ROLES.get(role) if isinstance(role, str) else None
    if role is None:
        raise ApiError(400, f"{param}.role must be one of {', '.join(ROLES)}", f"{param}.role")
    content = _text(item.get("content"), f"{param}.content")
    if item["role"] == "user" and not content.strip():
        # the reply would follow the template's scaffolding alone ('input': "" is refused too)
        raise ApiError(400, f"{param}.content is empty: a user message needs text",
                       f"{param}.content")
    if role != "assistant":
        messages.append({"role": role, "content": content})
        return
    message = _assistant(messages)
    message["content"] = message.get("content", "") + content


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message the next item of an earlier reply belongs to: the last
    message if it is the assistant's (a reply's reasoning, message and calls are
    consecutive items), else a new one."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{param} must be a string or a list of text parts", param)
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or \
                not isinstance(part.get("text"), str):
            raise ApiError(400, f"{param}[{index}]: only text parts are supported "
                           f"({', '.join(TEXT_PARTS)})", f"{param}[{index}]")
        texts.append(part["text"])
    return "".join(texts)


def _call(item: dict, param: str) -> dict[str, Any]:
    """A function_call item as a chat message's tool call (the chat route's shape)."""
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str):
            raise ApiError(400, f"{param}.{name} must be a string", f"{param}.{name}")
    arguments = read_arguments(item["arguments"], f"{param}.arguments")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": arguments}}


def _call_output(item: dict, param: str, names: dict[str, str]) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise ApiError(400, f"{param}.call_id must be a string", f"{param}.call_id")
    message = {"role": "tool", "tool_call_id": call_id,
               "content": _text(item.get("output"), f"{param}.output")}
    if call_id in names:  # some templates print the function's name beside its result
        message["name"] = names[call_id]
    return message


def _reasoning_text(item: dict, param: str) -> str:
    """The reasoning a reasoning item carries in its `content` (this server's replies put
    it there; a summary is not the reasoning, and encrypted content cannot be read)."""
    content = item.get("content")
    if content is None:
        return ""
    if not isinstance(content, list) or not all(
            isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        raise ApiError(400, f"{param}.content must be a list of reasoning_text parts",
                       f"{param}.content")
    return "".join(p["text"] for p in content)
