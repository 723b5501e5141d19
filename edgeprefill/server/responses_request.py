"""A Responses API body (`POST /v1/responses`) -> the chat route's CompletionRequest.

The Responses API is chat under other names, so its body is translated into a chat body
and read by `parse_chat`: one set of checks, defaults and extensions for both routes.
Errors then name the Responses field (`responses_error`).

- `input` and `instructions`: messages (server/responses_input.py);
- `max_output_tokens` is `max_tokens`; `text.format` is `response_format`, its
  `json_schema` flat (`name`, `schema`, `strict` beside `type`);
- `tools` are function tools with `name`, `description` and `parameters` at the top
  level, and `tool_choice` names a function as `{"type": "function", "name": ...}`;
- `reasoning.effort` is the chat route's `reasoning_effort` (the chat template's
  `reasoning_effort` and `enable_thinking`, server/schemas.py); `reasoning.summary` is
  accepted and ignored (the reasoning item carries the whole text); the Response echoes
  both;
- `store` is accepted and nothing is stored, as vLLM does by default (it keeps
  responses only behind VLLM_ENABLE_RESPONSES_API_STORE, and then forever) and as
  llama.cpp's server does: OpenAI's default is true, so clients send it without meaning
  to come back, and the reply says `"store": false`. What a stored response would be
  for, `previous_response_id` and `conversation`, is a 400 naming the field (llama.cpp
  refuses `previous_response_id` the same way): the client sends the whole input.
- `thinking_token_budget` (vLLM's name, as on the chat route) caps the reasoning;
- `metadata`, `user`, `service_tier`, `prompt_cache_key`, ... are bookkeeping, accepted.
- Anything else is a 400 naming it, as on the chat route.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.server.body import json_object
from edgeprefill.server.errors import ApiError
from edgeprefill.server.responses_input import input_messages
from edgeprefill.server.schemas import CompletionRequest, parse_chat

# Same name and meaning on both routes (edgeprefill's extensions among them).
SHARED = ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "user",
          "metadata", "service_tier", "prompt_cache_key", "safety_identifier", "priority",
          "chunk_size", "top_k", "min_p", "repetition_penalty", "ignore_eos", "seed",
          "chat_template_kwargs", "thinking_token_budget")
# Need responses kept by the server, which keeps none.
STATEFUL = ("previous_response_id", "conversation")
# Accepted only at their "off" values (none: any value but null is refused).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "background": (False,),  # runs after the reply, to be fetched later: needs a store
    "max_tool_calls": (),
    "prompt": (),  # a prompt template stored on OpenAI's platform
    "top_logprobs": (0,),
    "truncation": ("disabled",),  # "auto" would drop input items to fit the context
    "context_management": (),
    "moderation": (),
}
# Read here, or accepted with nothing to do: `include` may ask for encrypted reasoning,
# which has no use here (the reasoning item carries its text, nothing is stored).
READ_HERE = frozenset({"input", "instructions", "max_output_tokens", "text", "tools",
                       "tool_choice", "reasoning", "store", "include", "stream_options",
                       "prompt_cache_retention"})
INCLUDABLE = ("reasoning.encrypted_content",)
SUMMARIES = ("auto", "concise", "detailed")  # reasoning.summary's values in OpenAI's API
# The Response object echoes these request fields (OpenAI's defaults where absent).
ECHOED_DEFAULTS: dict[str, Any] = {
    "instructions": None, "max_output_tokens": None, "metadata": {},
    "parallel_tool_calls": True, "temperature": None, "top_p": None, "tool_choice": "auto",
    "tools": [], "text": {"format": {"type": "text"}}, "user": None,
}


def parse_responses(body: Any) -> CompletionRequest:
    body = json_object(body)
    _refuse(body)
    chat: dict[str, Any] = {name: body[name] for name in SHARED if name in body}
    chat["messages"] = input_messages(body.get("input"), body.get("instructions"))
    chat["max_tokens"] = body.get("max_output_tokens")  # checked as max_tokens, renamed
    chat["response_format"] = _text_format(body.get("text"))
    chat["tools"] = _tools(body.get("tools"))
    chat["tool_choice"] = _tool_choice(body.get("tool_choice"))
    chat["reasoning_effort"] = (body.get("reasoning") or {}).get("effort")
    try:
        request = parse_chat(chat)
    except ApiError as err:
        raise responses_error(err) from None
    # Errors about the structured output (at submit, or mid-reply) name `text.format`.
    if request.constraint_field == "response_format":
        request = replace(request, constraint_field="text.format")
    return replace(request, prompt_field="input")


def response_echo(body: dict) -> dict[str, Any]:
    """The request fields a Response object repeats, as the client sent them."""
    echo = {name: body.get(name) for name in ECHOED_DEFAULTS}
    for name, default in ECHOED_DEFAULTS.items():
        if echo[name] is None:
            echo[name] = default
    return {**echo, "reasoning": _reasoning_echo(body.get("reasoning"))}


def _reasoning_echo(reasoning: dict | None) -> dict[str, Any]:
    """`reasoning` as OpenAI's Response repeats it: `effort` and `summary`, null where
    not sent (`generate_summary` is the deprecated name of `summary`)."""
    reasoning = reasoning or {}
    summary = reasoning.get("summary")
    return {"effort": reasoning.get("effort"),
            "summary": reasoning.get("generate_summary") if summary is None else summary}


def responses_error(err: ApiError) -> ApiError:
    """An error of the chat route's checks (its parser, or the submit) in the Responses
    API's names (`max_tokens` is `max_output_tokens`, `messages` is `input`, ...)."""
    param = err.param
    if param is not None:
        param = _param(param)
    message = err.message.replace("max_tokens", "max_output_tokens").replace(
        "'response_format'", "'text.format'").replace("'reasoning_effort'",
                                                      "'reasoning.effort'")
    return ApiError(err.status, message, param, err.code)


def _param(param: str) -> str:
    if param == "max_tokens":
        return "max_output_tokens"
    if param == "response_format":
        return "text.format"
    if param == "reasoning_effort":
        return "reasoning.effort"
    if param.startswith("messages") or param == "prompt":
        return "input"  # the messages are built from input items, not one to one
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".")
    return param


def _refuse(body: dict) -> None:
    for name, value in body.items():
        if value is None:
            continue
        if name in STATEFUL:
            raise ApiError(400, f"'{name}' needs responses stored by the server, and this "
                           "server is stateless: send the whole conversation as 'input'",
                           name)
        if name in UNSUPPORTED:
            if value not in UNSUPPORTED[name]:
                raise ApiError(400, f"'{name}' is not supported by this server", name)
        elif name not in SHARED and name not in READ_HERE:
            raise ApiError(400, f"unknown field '{name}': this server does not support it",
                           name)
    _check_accepted(body)


def _check_accepted(body: dict) -> None:
    """Fields accepted with nothing to do still get their types checked: a client
    sending the wrong type has a bug to hear of."""
    if not isinstance(body.get("store", False), (bool, type(None))):
        raise ApiError(400, "'store' must be true or false", "store")
    _known_keys(body.get("reasoning"), "reasoning", ("effort", "summary", "generate_summary"))
    for key in ("summary", "generate_summary"):  # echoed in the Response: one of OpenAI's
        value = (body.get("reasoning") or {}).get(key)
        if value is not None and value not in SUMMARIES:
            raise ApiError(400, f"'reasoning.{key}' must be one of {', '.join(SUMMARIES)}",
                           f"reasoning.{key}")
    _known_keys(body.get("stream_options"), "stream_options", ("include_obfuscation",))
    include = body.get("include") or []
    if not isinstance(include, list) or any(i not in INCLUDABLE for i in include):
        raise ApiError(400, f"'include' may list only {', '.join(INCLUDABLE)} here", "include")


def _known_keys(value: Any, name: str, known: tuple[str, ...]) -> None:
    """`value`, the object field `name`, holds only the keys this server knows."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ApiError(400, f"'{name}' must be an object", name)
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ApiError(400, f"'{name}.{unknown[0]}' is not supported by this server",
                       f"{name}.{unknown[0]}")


def _text_format(text: Any) -> dict | None:
    """`text.format` as the chat route's `response_format`."""
    if text is None:
        return None
    _known_keys(text, "text", ("format", "verbosity"))
    if text.get("verbosity") is not None:
        raise ApiError(400, "'text.verbosity' is not supported by this server",
                       "text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt  # text, json_object, or a type the chat route's reader refuses
    spec = {key: fmt[key] for key in ("name", "schema", "strict", "description")
            if fmt.get(key) is not None}
    return {"type": "json_schema", "json_schema": spec}


def _tools(tools: Any) -> list | None:
    """Responses function tools -> chat tools (the function spec one level down)."""
    if tools is None or not isinstance(tools, list):
        return tools  # parse_chat says what is wrong with a non-list
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise ApiError(400, f"tools[{index}]: only function tools are supported, not "
                           f"{kind!r}", f"tools[{index}].type")
        spec = {key: tool[key] for key in ("name", "description", "parameters", "strict")
                if tool.get(key) is not None}
        converted.append({"type": "function", "function": spec})
    return converted


def _tool_choice(choice: Any) -> Any:
    """`{"type": "function", "name": ...}` -> the chat route's nested form."""
    if not isinstance(choice, dict):
        return choice  # "none", "auto", "required", or what parse_chat refuses
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise ApiError(400, "'tool_choice' must be none, auto, required or "
                       "{\"type\": \"function\", \"name\": ...}", "tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}
