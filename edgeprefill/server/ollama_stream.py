"""An Ollama reply (`/api/chat`, `/api/generate`), whole or as NDJSON lines.

Streamed, each line is one JSON object: `{model, created_at, message: {role, content,
thinking?, tool_calls?}, done: false}` on /api/chat, `{model, created_at, response,
thinking?, done: false}` on /api/generate; the last one is `done: true` with the
`done_reason` (`stop`, or `length` where num_predict or the context cut the reply) and
the timings in nanoseconds (api.Metrics):
- `load_duration`: arrival until the engine scheduled the request (tokenizing, the
  queue; the model itself is loaded once, when the server starts);
- `prompt_eval_duration`: then until the first token (the prefill);
- `eval_duration`: the first token until the last; `total_duration`: all of it.
`prompt_eval_count` and `eval_count` are the chat route's usage counts.

The chat route's deltas (server/responses.py) are re-shaped: `content` and the
reasoning go out as they come; a tool call goes out whole, once its arguments are (the
next call begins, or the reply ends), its `arguments` an object as Ollama sends them; a
call whose arguments are no JSON object (num_predict cut them, NaN in them) goes out as
text, `{"name": ..., "arguments": ...}`, as Ollama leaves a call it cannot parse in the
content: a client runs every tool call it gets. The whole reply is built
by the same code from the whole text, so it is what the streamed lines add up to. A
reply that fails mid-way ends with an `{"error": "..."}` line, as Ollama's does.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from edgeprefill import json_numbers
from edgeprefill.server.choices import Choices
from edgeprefill.server.errors import generation_failure
from edgeprefill.server.responses import Shape

Part = dict[str, Any]  # some of {"content", "thinking", "tool_calls"}


class OllamaReply:
    def __init__(self, stream: Choices, shape: Shape, model: str, chat: bool) -> None:
        self.stream = stream
        self.shape = shape  # the chat route's (or, for a raw generate, completions')
        self.model = model  # as the client named it (with or without `:latest`)
        self.chat = chat  # /api/chat, not /api/generate
        self.calls = 0
        self.call: dict[str, str] | None = None  # the call whose arguments are arriving

    def feed(self, text: str) -> list[Part]:
        return [p for d in self.shape.deltas(text) for p in self._parts(d)]

    def finish(self) -> tuple[list[Part], str]:
        """The parts the reply still held back, and its done_reason."""
        deltas, reason = self.shape.last_deltas(self.stream.finish_reason)
        parts = [p for d in deltas for p in self._parts(d)]
        return [*parts, *self._flush()], "length" if reason == "length" else "stop"

    def line(self, part: Part, done: bool = False) -> dict[str, Any]:
        """One object of the reply: on /api/chat a message, on /api/generate a response."""
        head = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message = {"role": "assistant", "content": part.get("content", "")}
            message.update({k: part[k] for k in ("thinking", "tool_calls") if part.get(k)})
            return {**head, "message": message, "done": done}
        body = {**head, "response": part.get("content", "")}
        body.update({k: part[k] for k in ("thinking", "tool_calls") if part.get(k)})
        return {**body, "done": done}

    def last(self, part: Part, reason: str) -> dict[str, Any]:
        return {**self.line(part, done=True), "done_reason": reason, **self.stats()}

    def stats(self) -> dict[str, int]:
        m, end = self.stream.metrics, time.perf_counter()
        scheduled = m.scheduled if m.scheduled is not None else end
        first = m.token_times[0] if m.token_times else end
        last = m.token_times[-1] if m.token_times else end
        return {"total_duration": _ns(end - m.arrival),
                "load_duration": _ns(scheduled - m.arrival),
                "prompt_eval_count": self.stream.prompt_tokens,
                "prompt_eval_duration": _ns(first - scheduled),
                "eval_count": self.stream.completion_tokens,
                "eval_duration": _ns(last - first)}

    def whole(self) -> dict[str, Any]:
        parts = self.feed(self.stream.streams[0].text)
        rest, reason = self.finish()
        merged: Part = {"content": "", "thinking": "", "tool_calls": []}
        for part in [*parts, *rest]:
            for key, value in part.items():
                merged[key] += value
        return self.last(merged, reason)

    def _parts(self, delta: dict[str, Any]) -> list[Part]:
        if "tool_calls" in delta:
            piece = delta["tool_calls"][0]
            if "id" not in piece:  # more of the arriving call's arguments
                assert self.call is not None
                self.call["arguments"] += piece["function"].get("arguments", "")
                return []
            done = self._flush()
            self.call = {"id": piece["id"], "name": piece["function"]["name"],
                         "arguments": piece["function"].get("arguments", "")}
            return done
        text = delta.get("content") or ""
        thinking = delta.get("reasoning_content") or ""
        part = {"thinking": thinking} if thinking else {"content": text} if text else None
        return [*self._flush(), *([part] if part else [])]

    def _flush(self) -> list[Part]:
        call, self.call = self.call, None
        if call is None:
            return []
        arguments = _arguments(call["arguments"])
        if arguments is None:
            # Arguments that are no JSON object (cut by num_predict, NaN in them): Ollama's
            # clients run every tool call they get, and `{}` in their place ran the tool
            # without them. Ollama leaves a call it cannot parse in the text: so here.
            return [{"content": f'{{"name": {json.dumps(call["name"])}, "arguments": '
                                f'{call["arguments"]}}}'}]
        self.calls += 1
        return [{"tool_calls": [{"id": call["id"], "function": {
            "index": self.calls - 1, "name": call["name"], "arguments": arguments}}]}]


async def ollama_lines(reply: OllamaReply, constraint_param: str | None
                       ) -> AsyncIterator[bytes]:
    async for token in reply.stream:
        for part in reply.feed(token.text):
            yield line(reply.line(part))
    if reply.stream.finish_reason == "error":
        yield line(generation_failure(reply.stream.failed, constraint_param).ollama_body())
        return
    parts, reason = reply.finish()
    for part in parts:
        yield line(reply.line(part))
    yield line(reply.last({}, reason))


def load_reply(model: str, chat: bool) -> dict[str, Any]:
    """Ollama's answer to a request with nothing to generate: the model is loaded."""
    body: dict[str, Any] = {"model": model, "created_at": created_at()}
    body.update({"message": {"role": "assistant", "content": ""}} if chat else
                {"response": ""})
    return {**body, "done": True, "done_reason": "load"}


# Characters JSON may hold raw that Python's str.splitlines (which httpx's iter_lines, and
# so the ollama client, splits NDJSON with) takes for line ends: a reply holding one came
# apart into two halves that are no JSON. Escaped, as Go's encoding/json escapes U+2028/9.
# (Below U+0020 JSON escapes every character already.)
LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def line(data: dict[str, Any]) -> bytes:
    text = json_numbers.dumps(data, (",", ":"))
    for char, escaped in LINE_BREAKS.items():  # only ever inside a string: safe to swap
        text = text.replace(char, escaped)
    return (text + "\n").encode()


def created_at() -> str:
    """Now, as Go writes a UTC time.Time in JSON (RFC 3339, with fractions)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _arguments(text: str) -> dict[str, Any] | None:
    """A call's arguments as the object Ollama sends; None where they are none (cut short
    before or inside their object, or no JSON)."""
    try:
        value = json_numbers.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))
