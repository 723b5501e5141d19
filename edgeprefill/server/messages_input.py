"""The Messages API's `system` and `messages` -> the chat messages the chat route renders
through the bundle's chat template.

- `system` is a string or a list of text blocks: a system message in front.
- A message's `content` is a string or a list of blocks:
  - `text` blocks (either role): the message's text, joined;
  - `tool_use` blocks (the assistant's): its tool calls, `input` as the arguments;
  - `tool_result` blocks (the user's): one `tool` message each, in place, its content a
    string or text blocks (`is_error` is accepted; the template has no place for it);
  - `thinking` blocks (the assistant's, an earlier reply's): its reasoning, so templates
    that replay it get it; `redacted_thinking` holds nothing readable and is skipped.
  - `image` and `document` blocks: a 400, as this server reads text only.
- `cache_control` and `citations` on a block are accepted and ignored (Anthropic's
  prompt caching is automatic here: the prefix cache).

A user message's tool results come first in Anthropic's API (the results of the turn
before, then any text); they become `tool` messages before the user's text, the order
chat templates expect.
"""

from __future__ import annotations

from typing import Any

from edgeprefill.server.errors import ApiError
from edgeprefill.server.history_arguments import read_arguments

ROLES = ("user", "assistant")
BLOCK_KEYS = {"text": ("text",), "tool_use": ("id", "name", "input"),
              "tool_result": ("tool_use_id",), "thinking": ("thinking",)}
REFUSED = ("image", "document", "search_result", "container_upload")


def chat_messages(system: Any, messages: Any) -> list[dict[str, Any]]:
    """Chat messages for the request's `system` and `messages`."""
    out: list[dict[str, Any]] = []
    if system is not None:
        text = _text(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of messages", "messages")
    names: dict[str, str] = {}  # tool_use id -> tool name, for the results' `name`
    for index, message in enumerate(messages):
        out.extend(_message(message, f"messages[{index}]", names))
    return out


def _message(message: Any, param: str, names: dict[str, str]) -> list[dict[str, Any]]:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ApiError(400, f"{param} must be an object with role 'user' or 'assistant'",
                       f"{param}.role")
    role, content = message["role"], message.get("content")
    if role == "user":
        _check_user_text(content, param)
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ApiError(400, f"{param}.content must be a string or a list of content blocks",
                       f"{param}.content")
    blocks = [_block(b, f"{param}.content[{i}]", role) for i, b in enumerate(content)]
    if role == "assistant":
        return [_assistant(blocks, names)]
    results = [_result(b, names) for b in blocks if b["type"] == "tool_result"]
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    return [*results, *([{"role": "user", "content": "".join(texts)}] if texts else [])]


def _check_user_text(content: Any, param: str) -> None:
    """Anthropic's rules for a user turn: its content is not empty, and none of its text
    blocks is blank (the reply would follow the template's scaffolding alone)."""
    if content in ("", []):
        raise ApiError(400, f"{param}: all messages must have non-empty content except for "
                       "the optional final assistant message", f"{param}.content")
    if isinstance(content, str) and not content.strip():
        raise ApiError(400, f"{param}: text content must contain non-whitespace text",
                       f"{param}.content")
    if isinstance(content, list):
        for index, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "text" and \
                    isinstance(block.get("text"), str) and not block["text"].strip():
                raise ApiError(400, f"{param}.content[{index}]: text content blocks must "
                               "contain non-whitespace text", f"{param}.content[{index}]")


def _block(block: Any, param: str, role: str) -> dict[str, Any]:
    """A content block, checked: its type is one this server reads, and its fields are
    of the right types."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in REFUSED:
        raise ApiError(400, f"{param}: {kind} blocks are not supported; this server reads "
                       "text only", f"{param}.type")
    allowed = ("text", "tool_use", "thinking", "redacted_thinking") if role == "assistant" \
        else ("text", "tool_result")
    if kind not in allowed:
        raise ApiError(400, f"{param}: a {role} message's blocks are {', '.join(allowed)}, "
                       f"not {kind!r}", f"{param}.type")
    assert isinstance(block, dict)
    for key in BLOCK_KEYS.get(str(kind), ()):
        want = dict if key == "input" else str
        if not isinstance(block.get(key), want):
            kind_name = "an object" if want is dict else "a string"
            raise ApiError(400, f"{param}.{key} must be {kind_name}", f"{param}.{key}")
    if kind == "tool_result":
        return {**block, "content": _text(block.get("content", ""), f"{param}.content")}
    if kind == "tool_use":
        return {**block, "input": read_arguments(block["input"], f"{param}.input")}
    return block


def _assistant(blocks: list[dict[str, Any]], names: dict[str, str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(
        b["text"] for b in blocks if b["type"] == "text")}
    thinking = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
    if thinking:
        message["reasoning_content"] = thinking
    calls = [b for b in blocks if b["type"] == "tool_use"]
    for call in calls:
        names[call["id"]] = call["name"]
    if calls:  # as the chat route's tool_calls, the arguments the object as it was sent
        message["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c["input"]}}
            for c in calls]
    return message


def _result(block: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    call_id = block["tool_use_id"]
    message = {"role": "tool", "tool_call_id": call_id, "content": block["content"]}
    if call_id in names:  # some templates print the tool's name beside its result
        message["name"] = names[call_id]
    return message


def _text(value: Any, param: str) -> str:
    """A string, or text blocks joined (`system`, a tool result's content)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ApiError(400, f"'{param}' must be a string or a list of text blocks", param)
    texts = []
    for index, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or \
                not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else None
            raise ApiError(400, f"{param}[{index}]: only text blocks are supported here, "
                           f"not {kind!r}", f"{param}[{index}]")
        texts.append(block["text"])
    return "".join(texts)
