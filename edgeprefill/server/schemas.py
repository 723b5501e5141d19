"""OpenAI request bodies -> one typed `CompletionRequest`, checked field by field.

Every known field is type-checked (a wrong type is a 400 naming the field, never a
silent coercion); unknown fields are ignored, as OpenAI clients send new ones over time.
edgeprefill's own fields ride along as extensions: `priority`, `chunk_size`, `top_k`,
`repetition_penalty`, `ignore_eos`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edgeprefill.errors import RequestError
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.sdk.priority import parse_priority
from edgeprefill.sdk.tokenizer import Prompt
from edgeprefill.server.errors import ApiError

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_SEED = 2**63 - 1
# Sampling fields whose absence means the bundle's generation_config.json value.
BUNDLE_DEFAULTED = ("temperature", "top_p", "top_k", "repetition_penalty")

# Fields we accept only at their "off" values: rejecting the rest beats ignoring them.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "tools": ([],),
    "functions": ([],),
}


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
    # The sampling fields the body set; the others take the bundle's generation_config.
    given: frozenset[str] = frozenset()


def parse_completion(body: Any) -> CompletionRequest:
    body = _object(body)
    return _request(body, _prompt(body.get("prompt")), COMPLETION_DEFAULT_MAX_TOKENS, "prompt")


def parse_chat(body: Any) -> CompletionRequest:
    body = _object(body)
    messages = _messages(body.get("messages"))
    # Chat replies run to EOS or the context limit unless capped, as with OpenAI.
    return _request(body, messages, None, "messages")


# -- the shared fields --------------------------------------------------------------------


def _request(
    body: dict, prompt: Prompt, default_max_tokens: int | None, prompt_field: str
) -> CompletionRequest:
    for name, allowed in UNSUPPORTED.items():
        if body.get(name) is not None and body[name] not in allowed:
            raise ApiError(400, f"'{name}' is not supported by this server", name)
    max_tokens = _int(body, "max_completion_tokens", None, low=1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", default_max_tokens, low=1)
    stream_options = _dict(body, "stream_options")
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
            ignore_eos=_bool(body, "ignore_eos", False),
        )
    except RequestError as err:  # a check the fields above do not repeat
        raise ApiError(400, str(err)) from None
    return CompletionRequest(
        model=_str(body, "model"),
        prompt=prompt,
        params=params,
        stream=_bool(body, "stream", False),
        include_usage=_bool(stream_options, "include_usage", False),
        priority=_priority(body.get("priority", 0)),
        chunk_size=_int(body, "chunk_size", None, low=1),
        prompt_field=prompt_field,
        given=frozenset(k for k in BUNDLE_DEFAULTED if body.get(k) is not None),
    )


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _prompt(value: Any) -> Prompt:
    """A string or a list of token ids; a one-element batch of either is unwrapped."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise ApiError(400, "the prompt is empty", "prompt")
        return value
    if isinstance(value, list) and all(_is_int(t) for t in value):
        if not value:
            raise ApiError(400, "the prompt is empty", "prompt")
        return value
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        raise ApiError(400, "send one prompt per request (batched prompts are not supported)",
                       "prompt")
    raise ApiError(400, "'prompt' must be a string or a list of token ids", "prompt")


def _messages(value: Any) -> list[dict[str, str]]:
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
    return {"role": message["role"], "content": content}


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise ApiError(400, "'stop' must be a non-empty string or a list of them", "stop")
    return tuple(value)


# -- typed field readers: null means "not given" ------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _priority(value: object) -> int:
    try:
        return parse_priority(value)
    except RequestError as err:
        raise ApiError(400, str(err), "priority") from None


def _int(
    body: dict, name: str, default: int | None, low: int | None = None, high: int | None = None
) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise ApiError(400, f"'{name}' must be an integer", name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ApiError(400, f"'{name}' must be in [{low}, {high}], got {value}", name)
    return value


def _number(
    body: dict, name: str, default: float, low: float, high: float, low_open: bool = False
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be a number", name)
    # Python's JSON parser accepts NaN and Infinity; they are never valid settings.
    if not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a finite number", name)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ApiError(400, f"'{name}' must be in {bracket}{low}, {high}], got {value}", name)
    return float(value)


def _bool(body: dict, name: str, default: bool) -> bool:
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
