"""Reading a request body as JSON: bounded in size and in time, and refused with a 4xx
(never a 500) when it is not text a tokenizer can take.

Three ways a body used to reach a 500 or hold a connection forever: JSON nested so deep
that the parser overflows the stack (RecursionError is no ValueError), a lone UTF-16
surrogate such as "\\ud800" (valid JSON, but no UTF-8 exists for it, so tokenizing or
echoing it fails), and a client that sends half a body and then nothing.

Numbers are read by edgeprefill/json_numbers.py: one a float cannot hold (`1e400`) is a
WrittenNumber, so that a tool call's arguments sent back as an object keep it as written
(server/history_arguments.py); a setting given one is no number (a 400 naming it).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from starlette.requests import ClientDisconnect, Request

from edgeprefill import json_numbers
from edgeprefill.server.errors import ApiError

# Deeper than any OpenAI request (messages -> content parts -> a JSON-schema tool) and far
# below the recursion limit, so the walk below and every later consumer stay safe.
MAX_DEPTH = json_numbers.MAX_DEPTH


async def read_json(request: Request, limit: int, timeout: float) -> object:
    """The parsed body; 413 over `limit` bytes, 408 when it takes over `timeout` seconds."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    try:
        async with asyncio.timeout(timeout):
            raw = await _read_bounded(request, limit)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s",
                       code="request_timeout") from None
    except ClientDisconnect:  # it hung up mid-body: nobody to answer (logged as 499)
        raise ApiError(499, "the client closed the connection before its body arrived",
                       code="client_closed") from None
    try:
        body = json_numbers.read_request(raw)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ApiError(400, f"the request body is not valid JSON: {err}",
                       code="invalid_json") from None
    except RecursionError:
        raise _too_deep() from None
    check_text(body)
    return body


async def _read_bounded(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():  # also bounds a body sent without a length
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def json_object(body: Any) -> dict:
    """The body a route reads as an object; anything else JSON can be, a 400."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def only_fields(body: Any, allowed: frozenset[str]) -> dict:
    """The body as an object of `allowed` fields; another field is a 400 naming it."""
    body = json_object(body)
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"'{unknown[0]}' is not a field of this route (known: "
                       f"{', '.join(sorted(allowed))})", unknown[0])
    return body


def check_text(body: object) -> None:
    """Refuse nesting deeper than MAX_DEPTH, strings with no UTF-8 form (lone surrogates),
    keys included, and NaN or Infinity anywhere (Python's reader takes them; JSON has no
    such numbers, and a field the server only echoes, such as the Responses API's
    metadata, could not be written back: that was a 500). A refusal names the field's
    path. Iterative, so the walk itself cannot overflow."""
    stack: list[tuple[object, int, str]] = [(body, 0, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            _check_string(value, path)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ApiError(400, f"'{path or 'the body'}' is {_spelled(value)}, which is no "
                           "JSON number: send a finite one", path or None)
        elif isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise _too_deep()
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    _check_string(key, path)
                stack.append((item, depth + 1, _child(path, key)))


def _child(path: str, key: object) -> str:
    """The field's path as the server's errors name it: `messages[0].content`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _spelled(value: float) -> str:
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def _check_string(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start]
        raise ApiError(400, f"the request holds a lone UTF-16 surrogate (U+{ord(bad):04X}) "
                       f"at position {err.start} of a string; send valid Unicode text",
                       path or None, code="invalid_unicode") from None


def _too_deep() -> ApiError:
    return ApiError(400, f"the request body nests JSON deeper than {MAX_DEPTH} levels",
                    code="invalid_json")


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes (the server's "
                    "limit, see --max-body-mb)", code="request_too_large")
