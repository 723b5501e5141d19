"""A Messages API body (`POST /v1/messages`, Anthropic's) -> the chat route's
CompletionRequest.

The Messages API is chat under other names, so its body is translated into a chat body
and read by `parse_chat`: one set of checks and defaults for every route.

- `system` and `messages`: chat messages (server/messages_input.py);
- `max_tokens` is required, as in Anthropic's API (a 400 without it);
- `stop_sequences` is `stop`; `temperature`, `top_p`, `top_k` and `stream` are the same;
- `tools` are `{name, description, input_schema}` (custom tools; Anthropic's server tools,
  such as web search, run on Anthropic's side: a 400); `tool_choice` is `{"type": "auto"}`,
  `"any"` (the chat route's `required`), `"tool"` with a `name`, or `"none"`, and its
  `disable_parallel_tool_use` is `parallel_tool_calls: false`;
- `thinking`: `{"type": "enabled"}` turns the chat template's `enable_thinking` on,
  `"disabled"` off, `"adaptive"` leaves the template's default; a template without the
  switch renders as without the field. With `enabled`, `budget_tokens` is the reply's
  thinking budget (the chat route's `thinking_token_budget`, sdk/thinking_budget.py): its
  reasoning is closed after that many tokens and the reply goes on as the answer;
  `max_tokens` still bounds the whole reply. A forced tool_choice (`any`, `tool`) with a
  budget is a 400, as in Anthropic's API: its grammar governs the whole reply;
- edgeprefill's extensions of the chat route ride along: `min_p`, `repetition_penalty`,
  `ignore_eos`, `seed`, `priority`, `chunk_size`;
- `metadata`, `service_tier` and `cache_control` (here and on blocks) are accepted and
  ignored: the prefix cache reuses a prompt's prefix unasked; the `anthropic-version` and
  `anthropic-beta` headers are not read.
- Anything else is a 400 naming it, as on the other routes.

`POST /v1/messages/count_tokens` reads the prompt fields only (`count_body`).
"""

from __future__ import annotations

from typing import Any

from edgeprefill.server.body import json_object
from edgeprefill.server.errors import ApiError
from edgeprefill.server.messages_input import chat_messages
from edgeprefill.server.schemas import CompletionRequest, parse_chat
from edgeprefill.values import is_int

# Same name and meaning on the chat route (edgeprefill's extensions after `stream`).
SHARED = ("model", "temperature", "top_p", "top_k", "stream", "min_p", "repetition_penalty",
          "ignore_eos", "seed", "priority", "chunk_size")
# Bookkeeping for Anthropic's platform; `cache_control` asks for prompt caching, which
# the prefix cache does here unasked.
IGNORED = ("metadata", "service_tier", "cache_control")
PROMPT_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking")
KNOWN = frozenset({*SHARED, *IGNORED, *PROMPT_FIELDS, "max_tokens", "stop_sequences"})
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
TOOL_KEYS = frozenset({"name", "description", "input_schema", "type", "cache_control",
                       "strict"})
THINKING_SWITCH = {"enabled": True, "disabled": False, "adaptive": None}


def parse_messages_api(body: Any) -> CompletionRequest:
    body = json_object(body)
    _known(body, KNOWN)
    if body.get("max_tokens") is None:
        raise ApiError(400, "'max_tokens' is required (the most tokens the reply may have)",
                       "max_tokens")
    _check_ignored(body)
    return _parse(body, body["max_tokens"])


def count_body(body: Any) -> CompletionRequest:
    """A count_tokens body (the prompt fields) as a request whose prompt is counted."""
    body = json_object(body)
    _known(body, frozenset(PROMPT_FIELDS))
    return _parse(body, None)


def _parse(body: dict, max_tokens: Any) -> CompletionRequest:
    chat: dict[str, Any] = {name: body[name] for name in SHARED if name in body}
    chat["messages"] = chat_messages(body.get("system"), body.get("messages"))
    chat["max_tokens"] = max_tokens
    chat["stop"] = _stop_sequences(body.get("stop_sequences"))
    chat["tools"] = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"))
    if not chat["tools"] and choice.get("tool_choice") == "auto":
        choice = {}  # auto without tools asks for nothing (the chat route would refuse it)
    chat.update(choice)
    chat["chat_template_kwargs"] = _thinking(body.get("thinking"))
    chat["thinking_token_budget"] = _budget(body.get("thinking"))
    try:
        return parse_chat(chat)
    except ApiError as err:
        raise messages_error(err) from None


def messages_error(err: ApiError) -> ApiError:
    """An error of the chat route's checks in the Messages API's names."""
    message = err.message.replace("'stop'", "'stop_sequences'").replace(
        "function.parameters", "input_schema").replace(".function.", ".").replace(
        "'parallel_tool_calls'", "'tool_choice.disable_parallel_tool_use'").replace(
        "tool_choice 'required'", "tool_choice 'any'").replace(
        "'required' or a named function", "'any' or 'tool'").replace(
        "'thinking_token_budget'", "'thinking.budget_tokens'")
    param = "thinking.budget_tokens" if err.param == "thinking_token_budget" else err.param
    return ApiError(err.status, message, param, err.code)


def _known(body: dict, known: frozenset[str]) -> None:
    for name in body:
        if name not in known:
            raise ApiError(400, f"unknown field '{name}': this server does not support it",
                           name)


def _check_ignored(body: dict) -> None:
    """Ignored fields still get their types checked: a client sending the wrong type has
    a bug to hear of."""
    if not isinstance(body.get("metadata", {}), (dict, type(None))):
        raise ApiError(400, "'metadata' must be an object", "metadata")
    if not isinstance(body.get("service_tier", ""), (str, type(None))):
        raise ApiError(400, "'service_tier' must be a string", "service_tier")


def _stop_sequences(value: Any) -> list[str] | None:
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise ApiError(400, "'stop_sequences' must be a list of non-empty strings",
                       "stop_sequences")
    return value


def _tools(tools: Any) -> list | None:
    """Anthropic's custom tools -> chat function tools."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of tools", "tools")
    converted = []
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise ApiError(400, f"{param} must be an object", param)
        if tool.get("type", "custom") not in ("custom", None):
            raise ApiError(400, f"{param}: only custom tools (name, description, "
                           f"input_schema) are supported, not {tool['type']!r}",
                           f"{param}.type")
        unknown = sorted(set(tool) - TOOL_KEYS)
        if unknown:
            raise ApiError(400, f"{param}.{unknown[0]} is not supported by this server",
                           f"{param}.{unknown[0]}")
        if not isinstance(tool.get("input_schema"), dict):
            raise ApiError(400, f"{param}.input_schema must be a JSON schema object",
                           f"{param}.input_schema")
        spec = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            spec["description"] = tool["description"]
        if tool.get("strict") is not None:  # tool_choice any/tool force it; auto, lazily
            spec["strict"] = tool["strict"]
        converted.append({"type": "function", "function": spec})
    return converted


def _tool_choice(choice: Any) -> dict[str, Any]:
    """`tool_choice` as the chat route's `tool_choice` and `parallel_tool_calls`."""
    if choice is None:
        return {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in (*TOOL_CHOICES, "tool"):
        raise ApiError(400, "'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, "
                       "{\"type\": \"tool\", \"name\": ...} or {\"type\": \"none\"}",
                       "tool_choice")
    assert isinstance(choice, dict)
    out: dict[str, Any] = {"tool_choice": TOOL_CHOICES.get(kind)}
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise ApiError(400, "'tool_choice.name' must name a tool", "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None:
        if not isinstance(disable, bool):
            raise ApiError(400, "'tool_choice.disable_parallel_tool_use' must be true or "
                           "false", "tool_choice.disable_parallel_tool_use")
        out["parallel_tool_calls"] = not disable
    return out


def _thinking(thinking: Any) -> dict[str, Any] | None:
    """`thinking` as the chat template's `enable_thinking` (None: the template's own
    default)."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if not isinstance(kind, str) or kind not in THINKING_SWITCH:  # a list is no dict key
        raise ApiError(400, "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": "
                       "...}, {\"type\": \"disabled\"} or {\"type\": \"adaptive\"}",
                       "thinking")
    assert isinstance(thinking, dict)
    budget = thinking.get("budget_tokens")
    if budget is not None and (not is_int(budget) or budget < 1):
        raise ApiError(400, "'thinking.budget_tokens' must be an integer >= 1",
                       "thinking.budget_tokens")
    switch = THINKING_SWITCH[kind]
    return None if switch is None else {"enable_thinking": switch}


def _budget(thinking: Any) -> int | None:
    """`thinking.budget_tokens` of an `enabled` block (checked by `_thinking`)."""
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    budget: int | None = thinking.get("budget_tokens")
    return budget
