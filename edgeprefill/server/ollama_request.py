"""An Ollama API body (`POST /api/chat`, `POST /api/generate`, Ollama's native API) ->
the chat or completions route's CompletionRequest.

Ollama's API is chat under other names, so its body is translated into a chat (or, for
`raw` generate, a completions) body and read by `parse_chat` / `parse_completion`: one
set of checks and defaults for every route. Field names follow Ollama's api/types.go.

- `model`: required, the served name with or without the `:latest` tag (a 404 else);
- chat `messages` (server/ollama_messages.py) and `tools` (the chat route's function
  tools); generate `prompt` + `system`, rendered by the chat template as a system and a
  user message, or with `raw: true` sent as it is (the completions route);
- `stream` defaults to true, as in Ollama;
- `options` (OPTIONS): the sampling fields under Ollama's names; `num_predict` is
  max_tokens (-1, -2 or 0: no limit, the reply runs to EOS or the context); edgeprefill's
  `ignore_eos` rides along as on the other routes; `num_ctx` is
  checked against the bundle's context, which is fixed at export; `typical_p`, and
  `repeat_last_n` under a penalty, are 400s (no sampler here applies them). An option
  Ollama does not know (OLLAMA_OPTIONS) is ignored with one warning in the server's log
  naming it, as Ollama's api.Options.FromMap logs "invalid option provided"; its
  load-time options are ignored silently (api.Runner: num_thread, num_gpu, num_batch,
  use_mmap, ...), and so is num_keep (what a context shift keeps: this server never
  shifts);
- `format`: "json" (a JSON object) or a JSON schema: the chat route's structured output;
- `think`: true / false is the chat template's `enable_thinking`; "low", "medium",
  "high" or "max" is the chat route's `reasoning_effort`; any but false is a 400 where the
  server sends no `thinking` (a model without think tags or harmony, or
  `--reasoning-parser none`), as Ollama refuses it for a model without the capability
  (`/api/show` lists it), so that clients ask again without it;
- `keep_alive`, `truncate` and `shift` are accepted and ignored: the model stays loaded
  while the server runs, and a prompt past the context is a 400, never cut;
- `images`, `suffix`, `template`, `context` and `logprobs` are 400s when set: this server
  reads text only, fills no middle, renders only the bundle's template, keeps no
  conversation by token ids, and sends no logprobs in Ollama's shape.
- Other top-level fields are ignored, as Ollama's JSON decoder ignores them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

from edgeprefill.server.body import json_object
from edgeprefill.server.errors import ApiError
from edgeprefill.server.ollama_messages import chat_messages, string_field
from edgeprefill.server.schemas import (
    CompletionRequest,
    bool_field,
    parse_chat,
    parse_completion,
)
from edgeprefill.values import is_int

log = logging.getLogger("edgeprefill.server")

# Ollama's option -> the chat route's field of the same meaning.
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
           "min_p": "min_p", "seed": "seed", "stop": "stop",
           "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty",
           "ignore_eos": "ignore_eos"}  # edgeprefill's, as on the other routes
# The chat route's field names in its errors -> Ollama's.
RENAMES = {**{ours: f"options.{theirs}" for theirs, ours in OPTIONS.items()},
           "max_tokens": "options.num_predict", "response_format": "format",
           "json_schema": "format"}
# The names Ollama knows, the json tags of its api.Options and the api.Runner embedded in it
# (github.com/ollama/ollama api/types.go, at fb30760996871fa9460115c753afd2c60d4ab0f7): any
# other name is a client's mistake, which Options.FromMap logs as "invalid option provided".
OLLAMA_OPTIONS = frozenset({
    # Options
    "num_keep", "seed", "num_predict", "top_k", "top_p", "min_p", "typical_p",
    "repeat_last_n", "temperature", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "stop",
    # Runner
    "num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread",
    "draft_num_predict",
})
PENALTIES = ("repeat_penalty", "presence_penalty", "frequency_penalty")
THINK_LEVELS = ("low", "medium", "high", "max")
UNLIMITED = (-1, -2, 0)  # num_predict: infinite, fill the context; 0 is unlimited too
# Fields this server cannot honour: refused when set (not empty, not false).
REFUSED = {
    "images": "images are not supported: this server reads text only",
    "suffix": "'suffix' (fill-in-the-middle) is not supported by this server",
    "template": "'template' is not supported: prompts render with the bundle's chat "
                "template",
    "context": "'context' (the deprecated token-id memory) is not supported: send the "
               "conversation as /api/chat messages",
    "logprobs": "'logprobs' is not supported on Ollama's API here: use "
                "/v1/chat/completions",
    "top_logprobs": "'top_logprobs' is not supported on Ollama's API here: use "
                    "/v1/chat/completions",
}


def parse_ollama_chat(body: Any, model_name: str, context: int,
                      thinks: bool = True, calls_tools: bool = True) -> CompletionRequest:
    """`thinks`: the server splits the replies' reasoning (the `thinking` capability);
    `calls_tools`: the chat template renders tools (the `tools` capability). Ollama has no
    tool_choice: tools sent to a model without the capability are refused as Ollama
    refuses them, not with the chat route's advice to send one."""
    body = json_object(body)
    _check_model(body, model_name)
    _refuse(body)
    chat = _common(body, context, thinks)
    chat["messages"] = chat_messages(body.get("messages"))
    if body.get("tools") is not None:
        if not calls_tools and body["tools"] != []:
            raise ApiError(400, f"{json.dumps(body['model'])} does not support tools")
        chat["tools"] = body["tools"]
    return _parsed(parse_chat, chat, body)


def parse_ollama_generate(body: Any, model_name: str, context: int,
                          thinks: bool = True) -> CompletionRequest:
    body = json_object(body)
    _check_model(body, model_name)
    _refuse(body)
    prompt, system = string_field(body, "prompt"), string_field(body, "system")
    chat = _common(body, context, thinks)
    if bool_field(body, "raw"):
        if system:
            raise ApiError(400, "'system' has no place in a raw prompt: write it into the "
                           "prompt, or drop raw")
        if body.get("think") is not None:
            raise ApiError(400, "'think' has no effect on a raw prompt: drop it or raw")
        chat["prompt"] = prompt
        return _parsed(parse_completion, chat, body)
    if not prompt.strip():  # "" asked for a load (is_load); blank text gives nothing to answer
        raise ApiError(400, "'prompt' is blank: send text, or an empty prompt to load the "
                       "model")
    chat["messages"] = [*([{"role": "system", "content": system}] if system else []),
                        {"role": "user", "content": prompt}]
    return _parsed(parse_chat, chat, body)


def model_of(body: Any, model_name: str) -> str:
    """The model a body names (`model`, or `name` as older clients send it), checked."""
    body = json_object(body)
    _check_model(body, model_name, also_name=True)
    return body.get("model") or body["name"]


def is_load(body: Any, prompt_field: str) -> bool:
    """An empty prompt (generate) or no messages (chat) asks Ollama to load the model:
    it answers `done_reason: load` at once, and so does this server, whose model is
    always loaded."""
    return isinstance(body, dict) and body.get(prompt_field) in (None, "", [])


def ollama_error(err: ApiError) -> ApiError:
    """An error of the chat route's checks in the names of Ollama's fields."""
    message = err.message
    for ours, theirs in RENAMES.items():
        message = message.replace(f"'{ours}'", f"'{theirs}'")
    # the context check's words (app.py: _check_context)
    message = message.replace("max_tokens (", "options.num_predict (").replace(
        "lower max_tokens", "lower options.num_predict")
    return ApiError(err.status, message, err.param, err.code)


# -- the parts -----------------------------------------------------------------------------


def _parsed(parse, chat: dict[str, Any], body: dict) -> CompletionRequest:
    try:
        request = parse(chat)
    except ApiError as err:
        raise ollama_error(err) from None
    if "num_predict" not in _options(body) or _options(body)["num_predict"] in UNLIMITED:
        # Ollama's default is no limit; the completions route's would be 16 tokens.
        request = replace(request, params=replace(request.params, max_new_tokens=None))
    if request.constraint_field is not None:
        request = replace(request, constraint_field="format")
    return request


def _common(body: dict, context: int, thinks: bool) -> dict[str, Any]:
    """The chat body's fields every Ollama request shares: stream, options, format,
    think."""
    chat: dict[str, Any] = {"stream": bool_field(body, "stream", True)}
    chat.update(_sampling(_options(body), context))
    chat.update(_format(body.get("format")))
    chat.update(_think(body.get("think")))
    if body.get("think") not in (None, False) and not thinks:
        raise ApiError(400, f"{json.dumps(body['model'])} does not support thinking")
    return chat


def _sampling(options: dict[str, Any], context: int) -> dict[str, Any]:
    out = {OPTIONS[name]: value for name, value in options.items() if name in OPTIONS}
    predict = options.get("num_predict")
    if predict is not None:
        if not is_int(predict) or (predict < 1 and predict not in UNLIMITED):
            raise ApiError(400, "'options.num_predict' must be an integer >= 1, or -1 for "
                           "no limit")
        if predict >= 1:
            out["max_tokens"] = predict
    _check_num_ctx(options.get("num_ctx"), context)
    typical = options.get("typical_p")
    if typical is not None and typical != 1:
        raise ApiError(400, "'options.typical_p' is not supported by this server (use "
                       "top_p or min_p)")
    window = options.get("repeat_last_n")
    penalized = any(options.get(name) not in (None, 0, 1) for name in PENALTIES)
    if window not in (None, -1) and penalized:
        raise ApiError(400, "'options.repeat_last_n' is not supported: the penalties look "
                       "at the whole context (-1)")
    _warn_unknown(options)
    return out


def _warn_unknown(options: dict[str, Any]) -> None:
    """One warning per option Ollama itself does not know (a typo: `temprature`), as
    Ollama's Options.FromMap logs "invalid option provided"; the request goes on."""
    for name in options:
        if name not in OLLAMA_OPTIONS and name not in OPTIONS:
            # %r: a client's key, one line whatever it holds
            log.warning("invalid option provided: options %.80r is not one of Ollama's "
                        "options, and is ignored", name)


def embedding_context(body: dict, context: int) -> int:
    """The context an embedding request's texts are held to: `options.num_ctx` where it
    is given (Ollama truncates a text to it, or refuses one past it), else the bundle's
    `context`. Its other options mean nothing where nothing samples; one Ollama does not
    know is warned of, as on the generating routes."""
    options = _options(body)
    num_ctx = options.get("num_ctx")
    _check_num_ctx(num_ctx, context)
    _warn_unknown(options)
    return int(num_ctx) if num_ctx is not None else context


def _check_num_ctx(value: Any, context: int) -> None:
    """The bundle's context is fixed at export: a smaller num_ctx fits in it (replies
    are bounded by the whole context, not by num_ctx); a bigger one cannot be had."""
    if value is None:
        return
    if not is_int(value) or value < 1:
        raise ApiError(400, "'options.num_ctx' must be an integer >= 1")
    if value > context:
        raise ApiError(400, f"'options.num_ctx' {value} exceeds this model's context of "
                       f"{context} tokens, which is fixed when the bundle is exported; "
                       "export it with a longer max_context")


def _format(value: Any) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        return {"json_schema": value}
    raise ApiError(400, "'format' must be \"json\" or a JSON schema object")


def _think(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"chat_template_kwargs": {"enable_thinking": value}}
    if value in THINK_LEVELS:
        return {"reasoning_effort": value}
    raise ApiError(400, "'think' must be true, false, \"low\", \"medium\", \"high\" or "
                   "\"max\"")


def _check_model(body: dict, model_name: str, also_name: bool = False) -> None:
    model = body.get("model") or (body.get("name") if also_name else None)
    if model is None or model == "":
        raise ApiError(400, "model is required")
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string")
    if model not in (model_name, tagged(model_name)):
        raise ApiError(404, f"model '{model}' not found; this server serves "
                       f"'{tagged(model_name)}'")


def tagged(model_name: str) -> str:
    """The served name as Ollama lists it: `name:tag`, `latest` where it has no tag."""
    return model_name if ":" in model_name else f"{model_name}:latest"


def _refuse(body: dict) -> None:
    for name, message in REFUSED.items():
        if body.get(name) not in (None, "", [], False, 0):
            raise ApiError(400, message)
    for name in ("keep_alive",):  # ignored, but a type no Ollama accepts is a client bug
        if not isinstance(body.get(name, 0), (str, int, float, type(None))):
            raise ApiError(400, f"'{name}' must be a duration (\"5m\") or seconds")


def _options(body: dict) -> dict[str, Any]:
    options = body.get("options")
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ApiError(400, "'options' must be an object")
    return options
