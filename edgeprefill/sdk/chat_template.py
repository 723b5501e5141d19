"""Chat messages -> prompt text, rendered exactly as transformers' `apply_chat_template`.

Chat templates are Jinja programs from the model's authors (untrusted code), so they run in
Jinja's immutable sandbox with the environment transformers builds in
`transformers/utils/chat_template_utils.py` (`_cached_compile_jinja_template`): trim_blocks
and lstrip_blocks, loop controls, the `{% generation %}` tag, `raise_exception`,
`strftime_now`, a `tojson` that neither sorts keys nor escapes HTML, and a `namespace` that
refuses underscore names. The variables are the same too: `messages`, `tools`, `documents`,
`add_generation_prompt`, every named special token, and the caller's extra keywords.

Any failure of a template (its own `raise_exception`, a syntax error, a type error inside
it) is a `RequestError("chat template: ...")`: the caller's request cannot be rendered, and
the server answers 400 with the template's message.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from edgeprefill import json_numbers
from edgeprefill.errors import BundleError, EdgeprefillError, ExportError, RequestError
from edgeprefill.json_file import optional_json_object

if TYPE_CHECKING:  # jinja2 is imported when a template is first compiled
    from jinja2 import Template, nodes
    from jinja2.parser import Parser
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

# transformers' PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES (5.x): the named tokens.
NAMED_SPECIAL_TOKENS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)
# transformers' _REASONING_FIELDS: a message's reasoning is aliased under all of these.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# What export renders once to refuse a template that cannot serve a plain chat. No system
# turn: Gemma's and Mistral's templates refuse one, and they are valid templates.
SAMPLE_CONVERSATION = (
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Tell me a joke."},
)


class ChatTemplate:
    """One chat template with the special tokens it sees as variables.

    Compiled on first use, so a bundle whose template is broken still serves text prompts;
    a chat request then gets the template's error."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens)
        self._compiled: Template | None = None

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None, **extra: Any,
    ) -> str:
        """The prompt text for `messages`; extra keywords become template variables and
        win over special tokens of the same name (as in transformers)."""
        chat = _messages(messages)
        variables = {**self.special_tokens, **extra}
        try:
            return self._template().render(
                messages=chat, tools=_plain(_dicts(tools, "tools")),
                documents=_plain(_dicts(documents, "documents")),
                add_generation_prompt=add_generation_prompt, **_plain(variables),
            )
        except EdgeprefillError:
            raise
        except Exception as err:  # the template is code: any failure is its message
            raise RequestError(f"chat template: {_describe(err)}") from None

    def _template(self) -> Template:
        if self._compiled is None:
            from jinja2.exceptions import TemplateSyntaxError

            try:
                self._compiled = _environment().from_string(self.source)
            except TemplateSyntaxError as err:
                raise RequestError(
                    f"chat template: {err.message} (template line {err.lineno})"
                ) from None
        return self._compiled


def with_default_system(messages: Sequence[Mapping[str, Any]],
                        system: str | None) -> Sequence[Mapping[str, Any]]:
    """`messages` with the bundle's default system message first where the first is not
    a system message, as Ollama's chat and generate handlers put a model's SYSTEM
    (server/routes.go: `req.Messages[0].Role != "system"`); as they are where the bundle
    has none. A request that wants no system message at all sends an empty one."""
    if system is None or not isinstance(messages, Sequence) or not messages or \
            not isinstance(messages[0], Mapping) or messages[0].get("role") == "system":
        return messages  # malformed or empty: render's checks say so, as without one
    return [{"role": "system", "content": system}, *messages]


@functools.lru_cache(maxsize=8)
def reads_variable(source: str, name: str) -> bool:
    """Whether a chat template reads the top-level variable `name` (a request's `tools`,
    say), parsed with the environment that renders it (its `{% generation %}` tag and loop
    controls). A template that does not parse: whether the name appears in it at all."""
    from jinja2 import meta
    from jinja2.exceptions import TemplateSyntaxError

    try:
        parsed = _environment().parse(source)
    except TemplateSyntaxError:
        return name in source
    return name in meta.find_undeclared_variables(parsed)


def special_tokens(
    folder: Path, fallback: Mapping[str, str | None] | None = None
) -> dict[str, str]:
    """The special tokens transformers' tokenizer would pass to the template, read from a
    checkpoint's or bundle's `special_tokens_map.json` and `tokenizer_config.json` (the
    latter wins): the named tokens, any other `*_token` string, and `extra_special_tokens`
    given by name. `fallback` fills names neither file has."""
    tokens = {k: v for k, v in (fallback or {}).items() if v is not None}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        raw = optional_json_object(folder / name, BundleError)
        named = raw.get("extra_special_tokens")
        entries = {**raw, **(named if isinstance(named, dict) else {})}
        for key, value in entries.items():
            text = _token_text(value)
            if text is not None and (key in NAMED_SPECIAL_TOKENS or key.endswith("_token")):
                tokens[key] = text
    return tokens


def template_source(folder: Path) -> str | None:
    """A checkpoint's chat template: `chat_template.jinja`, else tokenizer_config.json's
    `chat_template` (of named templates, the default one), as export records it."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise BundleError(f"{jinja} is not UTF-8 text: {err.reason} at byte "
                              f"{err.start}") from None
    config = optional_json_object(folder / "tokenizer_config.json", BundleError)
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def check_export_template(hf_dir: Path) -> None:
    """Refuse, in one line, a checkpoint whose chat template cannot render a sample chat:
    the runtime would fail every chat request with it."""
    try:
        source = template_source(hf_dir)
        if source is None:
            return
        ChatTemplate(source, special_tokens(hf_dir)).render(list(SAMPLE_CONVERSATION))
    except BundleError as err:  # a tokenizer file that is not JSON
        raise ExportError(str(err)) from None
    except RequestError as err:
        raise ExportError(
            f"{hf_dir}'s chat template fails on a sample conversation "
            f"(user, assistant, user): {str(err).removeprefix('chat template: ')}"
        ) from None


# -- the Jinja environment, as transformers builds it ---------------------------------------


def _environment() -> ImmutableSandboxedEnvironment:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text for training masks;
        rendering keeps the body as is."""

        tags = {"generation"}

        def parse(self, parser: Parser) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _namespace_class()
    return env


def _raise_exception(message: str) -> NoReturn:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson sorts keys and escapes <, >, & and ': templates expect plain JSON.
    # A number a float cannot hold, sent back in a tool call's arguments, as it was written.
    return json_numbers.dumps_as_json(x, ensure_ascii=ensure_ascii, indent=indent,
                                      separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` without the class itself, so templates cannot reach its attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _namespace_class() -> type[Namespace]:
    from jinja2.exceptions import SecurityError
    from jinja2.utils import Namespace

    def check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(
                "Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}. Please rename the attribute.")

    class TemplateNamespace(Namespace):
        # Namespaces refuse dunder attributes: no way into CPython internals.
        # Namespace's signature trick (no named self): `namespace(self=...)` works.
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                check(name)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check(name)
            Namespace.__setitem__(self, name, value)

    return TemplateNamespace


# -- the template's inputs -----------------------------------------------------------------


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """transformers' preparation: keys whose value is None dropped (OpenAI clients send
    `content: null` beside tool calls), plain JSON data only, reasoning aliased."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise RequestError("chat messages must be a non-empty list of objects")
    chat = []
    for m in messages:
        # transformers would render a missing role as nothing: that is never what was meant.
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise RequestError(f"each chat message must be an object with a string 'role', "
                               f"got {m!r:.60}")
        message = _plain({k: v for k, v in m.items() if v is not None})
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None),
                         None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


def check_template_kwargs(kwargs: Any) -> dict[str, Any]:
    """Chat template keywords as a caller gives them for every turn (Session's
    template_kwargs), checked once where they are taken: `tools` and `documents` as
    `render` checks them, so a bad one is refused in the same words when it is set."""
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise RequestError(f"template_kwargs must be a dict of template variables, got "
                           f"{type(kwargs).__name__}")
    for name in ("tools", "documents"):
        _dicts(kwargs.get(name), name)
    return dict(kwargs)


def _dicts(items: Any, name: str) -> Sequence[Any] | None:
    # Not a Sequence (a number, a set): iterating it had been a TypeError, reported as the
    # template's own failure.
    if items is not None and (not isinstance(items, Sequence) or isinstance(items, str | bytes)
                              or not all(isinstance(i, Mapping) for i in items)):
        raise RequestError(f"chat template {name} must be a list of JSON objects")
    return items


def _plain(value: Any) -> Any:
    """A copy made of JSON types only (transformers' _plain_template_data): objects with
    methods the sandbox does not know about never reach the template. A number a float
    cannot hold (json_numbers.WrittenNumber, immutable, its text its only field) stays
    one, so that the template writes it as it was written."""
    if value is None or type(value) in (str, int, float, bool, json_numbers.WrittenNumber):
        return value
    # Subclasses (str enums, IntEnum, ...) can carry methods: back to the base type.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _describe(err: Exception) -> str:
    from jinja2.exceptions import TemplateError

    text = str(err) if isinstance(err, TemplateError) else f"{type(err).__name__}: {err}"
    return " ".join(text.split()) or type(err).__name__  # one line


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # an AddedToken serialized as {"content": ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


