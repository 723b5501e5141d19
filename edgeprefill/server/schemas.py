"""OpenAI request bodies -> one typed `CompletionRequest`, checked field by field.

Every known field is type-checked (a wrong type is a 400 naming the field, never a
silent coercion). A field this server does not act on is a 400 that names it, unless it
is at its "off" value or only bookkeeping for OpenAI's platform (IGNORED): nothing that
would change the output is silently dropped. edgeprefill's own fields ride along as
extensions: `priority`, `chunk_size`, `top_k`, `min_p`, `repetition_penalty`,
`ignore_eos`; structured output also comes as vLLM's `guided_*` and llama.cpp's
`grammar` / `json_schema` (server/structured.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from edgeprefill.errors import RequestError
from edgeprefill.json_numbers import WrittenNumber
from edgeprefill.sdk.chat_template import REASONING_FIELDS
from edgeprefill.sdk.constraints import Constraint
from edgeprefill.sdk.params import MAX_LOGPROBS, GenerationParams
from edgeprefill.sdk.priority import parse_priority
from edgeprefill.sdk.tokenizer import Prompt
from edgeprefill.server.body import json_object
from edgeprefill.server.errors import ApiError
from edgeprefill.server.structured import READERS, parse_constraint
from edgeprefill.server.tools import ToolRequest, message_fields, parse_tools
from edgeprefill.values import is_finite, is_int, is_number

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_SEED = 2**63 - 1
# Sampling fields whose absence means the bundle's generation_config.json value.
BUNDLE_DEFAULTED = ("temperature", "top_p", "top_k", "repetition_penalty")

# Fields we accept only at their "off" values: rejecting the rest beats ignoring them.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "functions": ([],),
    "function_call": ("none",),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
    "verbosity": (),
    "guided_decoding_backend": (),
    "guided_whitespace_pattern": (),
}
# OpenAI platform bookkeeping that cannot change a local model's output.
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key",
                     "safety_identifier"})
# Every field some part of this server reads; any other field is a 400 naming it.
KNOWN = frozenset({
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "seed", "stop",
    "stream", "stream_options", "ignore_eos", "priority", "chunk_size", "response_format",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "grammar",
    "json_schema", "n", "tools", "tool_choice", "parallel_tool_calls",
    "chat_template_kwargs", "add_generation_prompt", "reasoning_effort",
    "thinking_token_budget",
}) | IGNORED | frozenset(UNSUPPORTED)
# `reasoning_effort`'s values: OpenAI's (openai-python's ReasoningEffort), which are
# vLLM's (its "max" is DeepSeek V4's).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
MAX_COMPLETION_LOGPROBS = 5  # /v1/completions' `logprobs` limit (OpenAI)
MAX_N = 16  # choices per request: each takes a KV slot


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None  # None: the server's only model
    prompt: Prompt  # text, token ids, or chat messages
    params: GenerationParams
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with token counts
    priority: int
    chunk_size: int | None
    prompt_field: str  # "prompt" or "messages": the `param` of errors about the prompt
    n: int = 1  # choices: one prefill of the prompt, n decodes
    # The sampling fields the body set; the others take the bundle's generation_config.
    given: frozenset[str] = frozenset()
    tools: ToolRequest | None = None  # chat: tools and tool_choice (server/tools.py)
    # The field that gave the structured-output constraint: the `param` of its errors.
    constraint_field: str | None = None
    # Chat: variables for the chat template (vLLM's chat_template_kwargs, e.g.
    # enable_thinking; add_generation_prompt; reasoning_effort), beside the tools.
    template_kwargs: dict[str, Any] = field(default_factory=dict)


# Fields only a chat request (messages through the template) reads.
CHAT_FIELDS = ("tools", "tool_choice", "chat_template_kwargs", "add_generation_prompt",
               "reasoning_effort")


def chat_field_given(body: dict) -> str | None:
    """The first chat-only field `body` sets, or None; an empty `tools` list (which clients
    send by habit) is as good as none."""
    for name in CHAT_FIELDS:
        value = body.get(name)
        if value is not None and not (name == "tools" and value == []):
            return name
    return None


def parse_completion(body: Any) -> CompletionRequest:
    body = json_object(body)
    name = chat_field_given(body)
    if name is not None:
        raise ApiError(400, f"'{name}' is a chat field: use /v1/chat/completions", name)
    return _request(body, _prompt(body.get("prompt")), COMPLETION_DEFAULT_MAX_TOKENS, "prompt")


def parse_chat(body: Any) -> CompletionRequest:
    body = json_object(body)
    messages = parse_messages(body.get("messages"))
    for index, message in enumerate(body["messages"]):  # /tokenize takes them all
        if message["role"] == "user":
            _check_user_text(message.get("content"), f"messages[{index}]")
    tools = parse_tools(body)
    # Chat replies run to EOS or the context limit unless capped, as with OpenAI.
    request = replace(_request(body, messages, None, "messages"),
                      template_kwargs=template_kwargs(body))
    if tools is None:
        return request
    if tools.forced and request.params.thinking_budget is not None:
        raise ApiError(400, "'thinking_token_budget' cannot be combined with a tool_choice "
                       "that forces a call: its grammar governs the whole reply, which has "
                       "no reasoning to cap", "thinking_token_budget")
    return replace(request, tools=tools, params=tools.constrain(request.params))


# -- the shared fields --------------------------------------------------------------------


def _request(
    body: dict, prompt: Prompt, default_max_tokens: int | None, prompt_field: str
) -> CompletionRequest:
    _refuse_unsupported(body)
    for name in ("user", "service_tier", "prompt_cache_key", "safety_identifier"):
        _str(body, name)  # ignored, but a client sending the wrong type has a bug to hear of
    max_tokens = _int(body, "max_completion_tokens", None, low=1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", default_max_tokens, low=1)
    stream_options = _stream_options(body)
    try:
        params = GenerationParams(
            max_new_tokens=max_tokens,
            temperature=_number(body, "temperature", 1.0, low=0.0, high=2.0),
            top_p=_number(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True),
            top_k=_int(body, "top_k", 0, low=0),
            repetition_penalty=_number(
                body, "repetition_penalty", 1.0, low=0.0, high=10.0, low_open=True
            ),
            seed=_int(body, "seed", None, low=0, high=MAX_SEED),
            stop=_stop(body.get("stop")),
            ignore_eos=bool_field(body, "ignore_eos", False),
            min_p=_number(body, "min_p", 0.0, low=0.0, high=1.0),
            presence_penalty=_number(body, "presence_penalty", 0.0, low=-2.0, high=2.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, low=-2.0, high=2.0),
            logit_bias=_logit_bias(body.get("logit_bias")),
            logprobs=_logprobs(body, chat=prompt_field == "messages"),
            constraint=_constraint(body, chat=prompt_field == "messages"),
            # vLLM's name for the budget (its SamplingParams.thinking_token_budget)
            thinking_budget=_int(body, "thinking_token_budget", None, low=0),
        )
    except RequestError as err:  # a check the fields above do not repeat
        if err.field == "thinking_budget":  # with a constraint: in the request's names
            raise ApiError(400, str(err).replace("thinking_budget", "'thinking_token_budget'"),
                           "thinking_token_budget") from None
        raise ApiError(400, str(err), err.field) from None
    return CompletionRequest(
        model=_str(body, "model"),
        prompt=prompt,
        params=params,
        stream=bool_field(body, "stream", False),
        include_usage=bool_field(stream_options, "include_usage", False),
        priority=_priority(body.get("priority", 0)),
        chunk_size=_int(body, "chunk_size", None, low=1),
        prompt_field=prompt_field,
        n=_int(body, "n", 1, low=1, high=MAX_N),
        constraint_field=next((n for n in READERS if body.get(n) is not None), None),
        given=frozenset(k for k in BUNDLE_DEFAULTED if body.get(k) is not None),
    )


def _constraint(body: dict, chat: bool) -> Constraint | None:
    """The structured-output constraint; a chat reply's holds its answer, after any think
    block (sdk/think_first.py). The server lets it govern the whole reply again where
    the reply is not split as reasoning (app.py `_answer_grammar`)."""
    constraint = parse_constraint(body)
    return constraint.thinking_first() if chat and constraint is not None else constraint


def _refuse_unsupported(body: dict) -> None:
    for name, value in body.items():
        if name not in KNOWN:
            raise ApiError(400, f"unknown field '{name}': this server does not support it",
                           name)
        if name in UNSUPPORTED and value is not None and value not in UNSUPPORTED[name]:
            raise ApiError(400, f"'{name}' is not supported by this server", name)


def _logit_bias(value: Any) -> dict[int, float] | None:
    """OpenAI sends {"token id as a string": bias in [-100, 100]}."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, "'logit_bias' must be an object of token id -> bias", "logit_bias")
    bias = {}
    for key, v in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):  # not "²", "١"
            raise ApiError(400, f"'logit_bias' keys are token ids, got {key!r}", "logit_bias")
        if not is_finite(v) or not -100 <= v <= 100:
            raise ApiError(400, "'logit_bias' values must be numbers in [-100, 100]",
                           "logit_bias")
        bias[int(key)] = float(v)
    return bias


def _logprobs(body: dict, chat: bool) -> int | None:
    """GenerationParams.logprobs from chat's `logprobs` (bool) + `top_logprobs` (0..20),
    or from /v1/completions' `logprobs` (0..5: the number of top alternatives)."""
    if not chat:
        return _int(body, "logprobs", None, low=0, high=MAX_COMPLETION_LOGPROBS)
    top = _int(body, "top_logprobs", None, low=0, high=MAX_LOGPROBS)
    if not bool_field(body, "logprobs", False):
        if top:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return top or 0


def _prompt(value: Any) -> Prompt:
    """A string or a list of token ids; a one-element batch of either is unwrapped."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise ApiError(400, "the prompt is empty", "prompt")
        return value
    if isinstance(value, list) and all(is_int(t) for t in value):
        if not value:
            raise ApiError(400, "the prompt is empty", "prompt")
        return value
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        raise ApiError(400, "send one prompt per request (batched prompts are not supported)",
                       "prompt")
    raise ApiError(400, "'prompt' must be a string or a list of token ids", "prompt")


def parse_messages(value: Any) -> list[dict[str, str]]:
    """Chat messages as the chat route (and /tokenize) hand them to the template."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list of messages", "messages")
    return [_message(m, i) for i, m in enumerate(value)]


def _message(message: Any, index: int) -> dict[str, str]:
    param = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ApiError(400, f"{param} must be an object with a string 'role'", param)
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text parts carry anything for us
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise ApiError(400, f"{param}.content: only text parts are supported",
                           f"{param}.content")
        content = "".join(p["text"] for p in content)
    if content is None:
        content = ""  # an assistant turn that only called tools
    if not isinstance(content, str):
        raise ApiError(400, f"{param}.content must be a string or a list of text parts",
                       f"{param}.content")
    return {"role": message["role"], "content": content, **message_fields(message, param),
            **_reasoning(message, param)}


def _check_user_text(content: Any, param: str) -> None:
    """A user message with no text gives the model nothing to answer: the reply would
    follow the template's scaffolding alone (OpenAI refuses the empty array too)."""
    if content == []:
        raise ApiError(400, f"{param}.content is an empty array: send at least one text "
                       "part", f"{param}.content")
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        content = "".join(p.get("text") or "" for p in content)
    if content is None or isinstance(content, str) and not content.strip():
        raise ApiError(400, f"{param}.content is empty: a user message needs text",
                       f"{param}.content")


def _reasoning(message: dict, param: str) -> dict[str, str]:
    """An earlier reply's reasoning, sent back as this server returned it: templates that
    replay it (Qwen3's, for the turns after the last user message) find it under each of
    its names (ChatTemplate aliases them)."""
    out: dict[str, str] = {}
    for name in REASONING_FIELDS:
        value = message.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ApiError(400, f"{param}.{name} must be a string", f"{param}.{name}")
        out[name] = value
    return out


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise ApiError(400, "'stop' must be a non-empty string or a list of them", "stop")
    return tuple(value)


# -- typed field readers: null means "not given" ------------------------------------------


def _priority(value: object) -> int:
    try:
        return parse_priority(value)
    except RequestError as err:
        raise ApiError(400, str(err), "priority") from None


def template_kwargs(body: dict) -> dict[str, Any]:
    """The chat template's variables a request gives (chat route and /tokenize): its
    chat_template_kwargs, over those reasoning_effort implies."""
    kwargs = dict(_dict(body, "chat_template_kwargs"))
    reserved = sorted(set(kwargs) & {"messages", "tools", "documents"})
    if reserved or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise ApiError(400, "'chat_template_kwargs' names template variables (identifiers; "
                       "messages and tools come from their own fields)",
                       "chat_template_kwargs")
    if body.get("add_generation_prompt") is not None:
        kwargs["add_generation_prompt"] = bool_field(body, "add_generation_prompt", True)
    return {**effort_variables(body), **kwargs}


def effort_variables(body: dict) -> dict[str, Any]:
    """`reasoning_effort` as vLLM hands it to the chat template: the variable
    `reasoning_effort` (gpt-oss's template reads it) and `enable_thinking`, false for
    "none" (the switch of Qwen3's and SmolLM3's templates; true, their default, for the
    others, which turns on a template that thinks only when asked). A template reading
    neither renders as without the field. The caller lets chat_template_kwargs override
    these: it names the template's own variables, the more specific request."""
    effort = body.get("reasoning_effort")
    if effort is None:
        return {}
    if not isinstance(effort, str) or effort not in REASONING_EFFORTS:
        raise ApiError(400, f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}"
                       f", got {effort!r}", "reasoning_effort")
    return {"reasoning_effort": effort, "enable_thinking": effort != "none"}


def _stream_options(body: dict) -> dict:
    """OpenAI refuses stream_options without stream, and knows one option here."""
    options = _dict(body, "stream_options")
    if options and not bool_field(body, "stream", False):
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true",
                       "stream_options")
    unknown = sorted(set(options) - {"include_usage"})
    if unknown:
        raise ApiError(400, f"unknown stream option {', '.join(map(repr, unknown))}; this "
                       "server knows 'include_usage'", "stream_options")
    return options


def _int(
    body: dict, name: str, default: int | None, low: int | None = None, high: int | None = None
) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value):
        raise ApiError(400, f"'{name}' must be an integer", name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if low is not None and high is not None else (
            f">= {low}" if low is not None else f"<= {high}")
        raise ApiError(400, f"'{name}' must be {bounds}, got {value}", name)
    return value


def _number(
    body: dict, name: str, default: float, low: float, high: float, low_open: bool = False
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, WrittenNumber):  # a float reads it as inf (refused below) or 0.0
        value = float(value.text)
    if not is_number(value):
        raise ApiError(400, f"'{name}' must be a number", name)
    # A number a float cannot hold reads as inf (NaN and Infinity themselves the body's
    # reader refuses, server/body.py; callers other than the body may pass them).
    if not is_finite(value):
        raise ApiError(400, f"'{name}' must be a finite number", name)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ApiError(400, f"'{name}' must be in {bracket}{low}, {high}], got {value}", name)
    return float(value)


def bool_field(body: dict, name: str, default: bool = False) -> bool:
    """A boolean request field: absent or null is `default`, anything else but a bool a 400."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false", name)
    return value


def _str(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a string", name)
    return value


def _dict(body: dict, name: str) -> dict:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, f"'{name}' must be an object", name)
    return value
