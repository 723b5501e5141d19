"""JSON read and written so that every number comes back as valid JSON (RFC 8259), as the
model wrote it: the numbers of tool calls' arguments.

JSON has no range limit, Python's floats have: `json.loads` reads `1e400` as inf (and
`1e-400` as 0.0), and `json.dumps` writes inf as `Infinity`, which is not JSON (browsers'
JSON.parse, Go's encoding/json and the OpenAI SDKs refuse it). So a number literal that a
float cannot hold (out of range, or a nonzero one that reads as zero), or an integer with
more digits than Python converts, is read here as a `WrittenNumber` that keeps its text,
and `dumps` writes it back as that text. `NaN`, `Infinity` and `-Infinity`, which
Python's json reads but JSON does not have, are invalid JSON here (a ValueError) as
anything else that is not JSON.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

# A JSON number's text (RFC 8259, section 6).
JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


@dataclass(frozen=True)
class WrittenNumber:
    """A JSON number kept as the text the model wrote. Neither a float nor a str, so that
    json.dumps refuses it (TypeError) rather than write `Infinity` or a string: `dumps`
    writes it bare."""

    text: str


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


def loads(text: str) -> Any:
    """JSON text's value, its unholdable numbers as WrittenNumber; ValueError if the text
    is not JSON (NaN and Infinity included)."""
    return DECODER.decode(text)


def number(text: str) -> float | int | WrittenNumber:
    """A number's text as `loads` reads it; ValueError unless it is a JSON number."""
    if not JSON_NUMBER.fullmatch(text):
        raise ValueError(f"{text!r} is not a JSON number")
    return _float(text) if re.search("[.eE]", text) else _int(text)


def dumps(value: Any, separators: tuple[str, str] = (", ", ": ")) -> str:
    """JSON text of `value` (non-ASCII kept), a WrittenNumber written bare; ValueError for
    a float json cannot write (nan, inf)."""
    try:  # json's own writer where it can (no WrittenNumber inside): the fast one
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=separators)
    except TypeError:
        return _dumps(value, separators)


def _dumps(value: Any, separators: tuple[str, str]) -> str:
    if isinstance(value, WrittenNumber):
        return value.text
    if isinstance(value, dict):
        comma, colon = separators
        return "{" + comma.join(f"{_key(k)}{colon}{_dumps(v, separators)}"
                                for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + separators[0].join(_dumps(v, separators) for v in value) + "]"
    return _scalar(value)


def _scalar(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _key(key: Any) -> str:
    """A key as json writes it (a number or true as a string; TypeError where json's)."""
    return json.dumps({key: 0}, ensure_ascii=False)[1:-4]


class JsonNumbersResponse(JSONResponse):
    """Starlette's JSON response (compact, non-ASCII kept, no NaN), written by `dumps`: a
    whole reply whose tool calls' arguments are objects (Anthropic's `input`, Ollama's
    `arguments`)."""

    def render(self, content: Any) -> bytes:
        return dumps(content, (",", ":")).encode("utf-8")
