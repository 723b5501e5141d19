"""JSON read and written so that every number comes back as valid JSON (RFC 8259), as it
was written: the numbers of tool calls' arguments, the model's and those a client sends
back in the conversation.

JSON has no range limit, Python's floats have: `json.loads` reads `1e400` as inf (and
`1e-400` as 0.0), and `json.dumps` writes inf as `Infinity`, which is not JSON (browsers'
JSON.parse, Go's encoding/json and the OpenAI SDKs refuse it), and a chat template would
render it into the prompt so. So a number literal that a float cannot hold (out of range,
or a nonzero one that reads as zero), or an integer with more digits than Python
converts, is read here as a `WrittenNumber` that keeps its text, and `dumps` (and a chat
template's `tojson`, sdk/chat_template.py) writes it back as that text. `NaN`, `Infinity`
and `-Infinity`, which Python's json reads but JSON does not have, are invalid JSON here
(a ValueError) as anything else that is not JSON.

Nesting is bounded (MAX_DEPTH): Python's reader overflows the stack on 100,000 `[`
(RecursionError, which is no ValueError), and so would every later consumer of a value
nested too deep; here that is invalid JSON too.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass
from typing import Any

# A JSON number's text (RFC 8259, section 6).
JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
# The deepest nesting `loads` reads (arrays and objects inside each other): the request
# body's limit (server/body.py), far below the recursion limit of every later consumer.
MAX_DEPTH = 64


@dataclass(frozen=True, repr=False)
class WrittenNumber:
    """A JSON number kept as the text it was written in. Neither a float nor a str, so that
    json.dumps refuses it (TypeError) rather than write `Infinity` or a string: `dumps`
    writes it bare, and a template's `{{ value }}` (and an error message's repr) shows its
    text."""

    text: str

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def _float(text: str) -> float | WrittenNumber:
    number = float(text)
    if math.isinf(number) or (number == 0 and re.search("[1-9]", _mantissa(text))):
        return WrittenNumber(text)
    return number


def _int(text: str) -> int | WrittenNumber:
    try:
        return int(text)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
        return WrittenNumber(text)


def _mantissa(text: str) -> str:
    return re.split("[eE]", text)[0]


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Python's JSON reader with the hooks above: raw_decode and decode as json's own.
DECODER = json.JSONDecoder(parse_float=_float, parse_int=_int, parse_constant=_not_json)


def loads(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """JSON text's value, its unholdable numbers as WrittenNumber; ValueError if the text
    is not JSON (NaN and Infinity included) or nests deeper than `max_depth`."""
    try:
        return _shallow(DECODER.decode(text), max_depth)
    except RecursionError:
        raise _too_deep(max_depth) from None


def raw_decode(text: str, at: int, max_depth: int = MAX_DEPTH) -> tuple[Any, int]:
    """The JSON value starting at `at` and where it ends, as `loads` reads it."""
    try:
        value, end = DECODER.raw_decode(text, at)
    except RecursionError:
        raise _too_deep(max_depth) from None
    return _shallow(value, max_depth), end


def read_request(raw: bytes | str) -> Any:
    """A request body's value, its unholdable numbers as WrittenNumber (a tool call's
    arguments sent back keep them; a setting reads one as a float would). `NaN` and
    `Infinity` are read as Python reads them, so that the 400 refusing them names the
    field's path (server/body.py's check_text). Not bounded in depth: RecursionError past
    the stack."""
    return json.loads(raw, parse_float=_float, parse_int=_int)


def number(text: str) -> float | int | WrittenNumber:
    """A number's text as `loads` reads it; ValueError unless it is a JSON number."""
    if not JSON_NUMBER.fullmatch(text):
        raise ValueError(f"{text!r} is not a JSON number")
    return _float(text) if re.search("[.eE]", text) else _int(text)


def depth(value: Any) -> int:
    """How many arrays and objects nest in `value` (a scalar: 0). Iterative, so any depth
    is measured."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list | tuple):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return deepest


def _shallow(value: Any, max_depth: int) -> Any:
    if depth(value) > max_depth:
        raise _too_deep(max_depth)
    return value


def _too_deep(max_depth: int) -> ValueError:
    return ValueError(f"JSON nested deeper than {max_depth} levels")


def dumps(value: Any, separators: tuple[str, str] = (", ", ": ")) -> str:
    """JSON text of `value` (non-ASCII kept), a WrittenNumber written bare; ValueError for
    a float json cannot write (nan, inf)."""
    return dumps_as_json(value, ensure_ascii=False, allow_nan=False, separators=separators)


def dumps_as_json(value: Any, **options: Any) -> str:
    """`json.dumps(value, **options)` (indent, separators, ...), each WrittenNumber written
    bare: json writes a unique placeholder string for it, replaced by its text after."""
    texts: list[str] = []
    mark = uuid.uuid4().hex

    def placeholder(item: Any) -> str:
        if not isinstance(item, WrittenNumber):
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
        texts.append(item.text)
        return f"\0{mark}{len(texts) - 1}\0"

    text = json.dumps(value, default=placeholder, **options)
    if not texts:
        return text
    return re.sub(rf'"\\u0000{mark}(\d+)\\u0000"', lambda m: texts[int(m[1])], text)
