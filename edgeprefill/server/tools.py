"""`tools` and `tool_choice` of a chat request: checked, rendered through the chat
template, and turned into the parser that finds the calls in the reply.

- `tool_choice: "auto"` (the default with tools): the bundle's chat template shows the
  model the tools; calls it writes in its family's format (server/tool_parsers.py) become
  `message.tool_calls`, the rest stays `content`.
- `"none"`: the tools are not rendered and nothing is parsed.
- `"required"` or `{"type": "function", "function": {"name": ...}}`: the reply is forced
  to JSON by a JSON-schema constraint, as vLLM does (the arguments object of the named
  function, or a list of `{"name", "parameters"}`), then parsed; a reply max_tokens cut
  is still its calls, the last with the arguments it got (tool_parsers' `cut_short`).
  That needs the constraint engine (`edgeprefill.sdk.constraints`); without it these
  choices are a 400.
- `"auto"` with a tool whose `function.strict` is true: free text, but a call the model
  starts follows a lazy grammar (server/strict_tools.py): a listed tool's name and the
  strict tool's arguments schema. Applied at submit, where the call format is known.

Assistant messages with `tool_calls` and `tool` messages go into the template as
transformers passes them (arguments as objects, not JSON text: server/history_arguments.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from edgeprefill import json_numbers
from edgeprefill.bundle import Manifest
from edgeprefill.errors import RequestError
from edgeprefill.sdk.chat_template import reads_variable
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.server.errors import ApiError
from edgeprefill.server.history_arguments import read_arguments
from edgeprefill.server.strict_tools import lazy_call_constraint, strict_given
from edgeprefill.server.tool_parsers import (
    PARSERS,
    FirstCallOnly,
    ForcedNamedParser,
    ForcedRequiredParser,
    PythonicParser,
    ToolParser,
)

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
CHOICES = ("none", "auto", "required")

# A template marker -> the call format the model was trained on; first match wins (Qwen3.5's
# and Qwen3-Coder's templates show `<function=` inside `<tool_call>`).
TEMPLATE_FORMATS = (("<function=", "qwen3_xml"), ("<tool_call>", "hermes"),
                    ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json"),
                    ("ipython", "llama3_json"),
                    ("<|tool_call_start|>", "pythonic"), ("<|tool_list_start|>", "pythonic"))
# Without a marker: the family's usual format.
FAMILY_FORMATS = {"qwen2": "hermes", "qwen3": "hermes", "llama": "llama3_json",
                  "mistral": "mistral", "lfm2": "pythonic", "qwen3_5": "qwen3_xml",
                  "qwen3_5_text": "qwen3_xml"}


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[dict, ...]  # OpenAI function tools, as sent
    choice: str  # "none", "auto", "required", or "function" (a named one)
    function: str | None = None  # the named function
    parallel: bool = True  # parallel_tool_calls: False allows one call per reply

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")

    @property
    def strict_auto(self) -> bool:
        """Under auto, some tool is strict: calls follow a lazy grammar."""
        return self.choice == "auto" and any(strict_given(t) for t in self.tools)

    def template_vars(self) -> dict[str, Any]:
        """What the chat template gets: the tools, unless the model must not call one."""
        return {} if self.choice == "none" else {"tools": list(self.tools)}

    def parser(self, manifest: Manifest, format_name: str | None = None) -> ToolParser | None:
        """A fresh parser for one reply (None: nothing to parse)."""
        make = self.parser_factory(manifest, format_name)
        return None if make is None else make()

    def parser_factory(
        self, manifest: Manifest, format_name: str | None = None
    ) -> Callable[[], ToolParser] | None:
        """What makes a parser per reply (None: nothing to parse)."""
        if self.choice == "none":
            return None
        fmt = format_name or call_format(manifest)
        make: Callable[[], ToolParser]
        if self.choice == "function":
            name = self.function or ""
            make = lambda: ForcedNamedParser(name)  # noqa: E731
        elif self.choice == "required":
            make = ForcedRequiredParser
        else:
            make = PARSERS[fmt]
        short_ids, one_call = fmt == "mistral", not self.parallel
        schemas = {t["function"]["name"]: _parameters(t["function"]) for t in self.tools}

        def configured() -> ToolParser:
            parser = make()
            parser.short_ids, parser.schemas = short_ids, schemas
            return FirstCallOnly(parser) if one_call else parser

        return configured

    def constrain(self, params: GenerationParams) -> GenerationParams:
        """The params with the JSON-schema constraint a forced choice needs."""
        if not self.forced:
            return params
        if getattr(params, "constraint", None) is not None:
            raise ApiError(400, f"tool_choice {self._choice_text()} forces the reply's format, "
                           "so it cannot be combined with response_format or another "
                           "constraint", "tool_choice")
        constraint = _json_schema_constraint()
        if constraint is None:
            raise ApiError(
                400, f"tool_choice {self._choice_text()} needs constrained decoding "
                "(edgeprefill.sdk.constraints), which this build does not have yet; use "
                "tool_choice 'auto'", "tool_choice", "unsupported_tool_choice")
        try:
            return replace(params, constraint=constraint(self.schema()))
        except RequestError as err:  # e.g. ignore_eos, or a tool schema the engine refuses
            raise ApiError(400, f"tool_choice {self._choice_text()}: {err}",
                           "tool_choice") from None

    def constrain_auto(self, params: GenerationParams, fmt: str,
                       special_ids: Mapping[str, int] | None = None,
                       thinks: bool = False) -> GenerationParams:
        """The params with the lazy grammar strict tools need under auto in the call
        format `fmt` (as they were without a strict tool); `special_ids`: the tokenizer's
        special tokens, text -> id (Mistral's call marker is one in its tokenizers);
        `thinks`: the bundle's replies may open with a think block."""
        if not self.strict_auto:
            return params
        if getattr(params, "constraint", None) is not None:
            raise ApiError(400, "a strict tool under tool_choice auto constrains the reply's "
                           "calls, so it cannot be combined with response_format or another "
                           "constraint", "tools")
        if _json_schema_constraint() is None:
            raise ApiError(400, "function.strict needs constrained decoding "
                           "(edgeprefill.sdk.constraints), which this build does not have",
                           "tools")
        constraint = lazy_call_constraint(self.tools, fmt, self.parallel, special_ids, thinks)
        return replace(params, constraint=constraint)

    def schema(self) -> dict:
        """The JSON schema a forced reply follows (vLLM's)."""
        specs = {t["function"]["name"]: t["function"] for t in self.tools}
        if self.choice == "function":
            return _parameters(specs[self.function or ""])
        calls = [{"type": "object", "properties": {
                      "name": {"type": "string", "enum": [name]},
                      "parameters": _parameters(spec)},
                  "required": ["name", "parameters"]} for name, spec in specs.items()]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        return schema if self.parallel else {**schema, "maxItems": 1}

    def _choice_text(self) -> str:
        return f"naming {self.function!r}" if self.choice == "function" else repr(self.choice)


def call_format(manifest: Manifest) -> str:
    """The call format of the bundle's model: from its chat template, else its family."""
    template = manifest.tokenizer.chat_template or ""
    for marker, name in TEMPLATE_FORMATS:
        if marker in template:
            return name
    return FAMILY_FORMATS.get(manifest.model.family, "hermes")


def parse_tools(body: Mapping[str, Any]) -> ToolRequest | None:
    """The request's `tools` and `tool_choice`, checked; None when it sends no tools."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise ApiError(400, "'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of function tools", "tools")
    checked = tuple(_tool(t, i) for i, t in enumerate(tools))
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise ApiError(400, "two tools have the same name", "tools")
    request = _choice(choice if choice is not None else "auto", names, checked)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be true or false",
                       "parallel_tool_calls")
    return replace(request, parallel=parallel)


def template_vars(tools: ToolRequest | None, manifest: Manifest) -> dict[str, Any]:
    """The chat template's variables for a request's tools (none without tools)."""
    if tools is None:
        return {}
    if tools.choice == "auto" and not renders_tools(manifest.tokenizer.chat_template or ""):
        raise ApiError(400, "this bundle's chat template does not render tools, so the model "
                       "would never see them; send tool_choice 'none', 'required' or a named "
                       "function", "tools")
    return tools.template_vars()


def calls_in_content(messages: list[dict[str, Any]], manifest: Manifest
                     ) -> list[dict[str, Any]]:
    """The messages the template renders. LFM2's templates render an assistant turn's
    content only, never its `tool_calls`: there the calls go into the content as the model
    writes them (`<|tool_call_start|>[name(key=value)]<|tool_call_end|>`), else the model
    would see a tool's result without its own call before it (llama.cpp's LFM2 template
    renders them so)."""
    template = manifest.tokenizer.chat_template or ""
    if call_format(manifest) != "pythonic" or "tool_calls" in template:
        return messages
    return [_with_calls_written(m) if m.get("tool_calls") else m for m in messages]


def _with_calls_written(message: dict[str, Any]) -> dict[str, Any]:
    calls = ", ".join(_python_call(c["function"]) for c in message["tool_calls"])
    written = f"{PythonicParser.open_tag}[{calls}]{PythonicParser.close_tag}"
    return {**message, "content": message.get("content", "") + written}


def _python_call(function: dict[str, Any]) -> str:
    """`name(key=value, ...)`, each value as JSON (strings in double quotes, as LFM2 writes
    them; PythonicParser reads JSON's true/false/null too)."""
    arguments = function["arguments"] if isinstance(function["arguments"], dict) else {}
    keywords = ", ".join(f"{key}={json_numbers.dumps(value)}"
                         for key, value in arguments.items())
    return f"{function['name']}({keywords})"


def renders_tools(template: str) -> bool:
    """Whether the chat template reads the top-level `tools` variable. A substring test
    was fooled by Phi-4-mini's `message['tools']`, which a request's tools never reach."""
    return reads_variable(template, "tools")


def reply_parser(
    tools: ToolRequest | None, manifest: Manifest
) -> Callable[[], ToolParser] | None:
    """What makes a parser for each reply's tool calls (None: nothing to parse)."""
    return None if tools is None else tools.parser_factory(manifest)


def _tool(tool: Any, index: int) -> dict:
    param = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or \
            not isinstance(tool.get("function"), dict):
        raise ApiError(400, f"{param} must be {{\"type\": \"function\", \"function\": {{...}}}}",
                       param)
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise ApiError(400, f"{param}.function.name must be 1-64 letters, digits, _ or -",
                       f"{param}.function.name")
    if not isinstance(function.get("description", ""), str):
        raise ApiError(400, f"{param}.function.description must be a string",
                       f"{param}.function.description")
    if function.get("strict") not in (None, True, False):
        raise ApiError(400, f"{param}.function.strict must be true or false",
                       f"{param}.function.strict")
    if not isinstance(function.get("parameters", {}), dict):
        raise ApiError(400, f"{param}.function.parameters must be a JSON schema object",
                       f"{param}.function.parameters")
    return tool


def _choice(choice: Any, names: list[str], tools: tuple[dict, ...]) -> ToolRequest:
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ApiError(400, f"'tool_choice' must be one of {', '.join(CHOICES)} or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                           "tool_choice")
        return ToolRequest(tools, choice)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and \
        isinstance(choice.get("function"), dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or name is None:
        raise ApiError(400, "'tool_choice' must be a string or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}", "tool_choice")
    if name not in names:
        raise ApiError(400, f"tool_choice names {name!r}, which is not in 'tools' "
                       f"({', '.join(names)})", "tool_choice")
    return ToolRequest(tools, "function", name)


def _parameters(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


def _json_schema_constraint() -> Callable[[dict], Any] | None:
    """`Constraint.json_schema` if the SDK has constrained decoding, else None."""
    try:
        from edgeprefill.sdk.constraints import Constraint
    except ImportError:
        return None
    if "constraint" not in {f.name for f in fields(GenerationParams)}:
        return None
    return Constraint.json_schema


# -- messages: the tool parts of chat history ------------------------------------------


def message_fields(message: Mapping[str, Any], param: str) -> dict[str, Any]:
    """The tool fields of a request message, as the chat template reads them: an
    assistant's `tool_calls` (arguments parsed to objects, as transformers expects) and a
    tool result's `tool_call_id` and `name`."""
    out: dict[str, Any] = {}
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise ApiError(400, f"{param}.tool_calls must be a list", f"{param}.tool_calls")
        out["tool_calls"] = [_history_call(c, f"{param}.tool_calls[{i}]")
                             for i, c in enumerate(calls)]
    for name in ("tool_call_id", "name"):
        value = message.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise ApiError(400, f"{param}.{name} must be a string", f"{param}.{name}")
            out[name] = value
    return out


def _history_call(call: Any, param: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, f"{param} must be {{\"id\", \"type\": \"function\", "
                       "\"function\": {\"name\", \"arguments\"}}", param)
    arguments = read_arguments(function.get("arguments", "{}"), f"{param}.function.arguments")
    return {"id": call.get("id"), "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}
