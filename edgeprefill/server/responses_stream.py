"""A Responses API reply, whole or as server-sent events.

Streamed, the events are OpenAI's: `response.created` and `response.in_progress` (the
Response with no output yet), each item's events (server/responses_output.py), then
`response.completed`, or `response.incomplete` where max_output_tokens cut the reply,
with the whole Response and its usage. Each event carries `type` and a
`sequence_number` counting from 0, and goes out as `event: <type>` + `data: <json>`,
as OpenAI sends it. There is no `data: [DONE]`: the terminal event ends the stream.
A reply that fails mid-way ends with an `error` event and `response.failed`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from edgeprefill import json_numbers
from edgeprefill.server.choices import Choices
from edgeprefill.server.errors import ERROR_TYPES, ApiError, generation_failure
from edgeprefill.server.responses import Shape
from edgeprefill.server.responses_output import (
    OutputItems,
    ResponseHead,
    response_status,
    response_usage,
)


class Reply:
    """One request's reply as Responses output: the chat route's deltas (`shape`)
    re-shaped into items. `count_tokens` counts the reasoning's tokens for usage."""

    def __init__(self, stream: Choices, shape: Shape, head: ResponseHead,
                 count_tokens: Callable[[str], int]) -> None:
        self.stream = stream
        self.shape = shape
        self.head = head
        self.count_tokens = count_tokens
        self.items = OutputItems()

    def feed(self, text: str) -> list[dict[str, Any]]:
        return [e for d in self.shape.deltas(text) for e in self.items.feed(d)]

    def finish(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The events that end the reply's items, and the finished Response."""
        deltas, reason = self.shape.last_deltas(self.stream.finish_reason)
        events = [e for d in deltas for e in self.items.feed(d)]
        status = response_status(reason)
        events += self.items.finish(incomplete=status == "incomplete")
        reasoning = self.items.reasoning
        usage = response_usage(self.stream, self.count_tokens(reasoning) if reasoning else 0)
        return events, self.head.body(status, self.items.output(), usage)

    def whole(self) -> dict[str, Any]:
        """The Response of a finished reply, built as the streamed one is."""
        self.feed(self.stream.streams[0].text)
        return self.finish()[1]


async def response_events(reply: Reply, constraint_param: str | None) -> AsyncIterator[bytes]:
    numbered = Numbered()
    start = reply.head.body("in_progress", [])
    yield numbered({"type": "response.created", "response": start})
    yield numbered({"type": "response.in_progress", "response": start})
    async for event in reply.stream:
        for item_event in reply.feed(event.text):
            yield numbered(item_event)
    if reply.stream.finish_reason == "error":
        error = generation_failure(reply.stream.failed, constraint_param)
        reply.items.cut()
        for failure in failed(reply, error):
            yield numbered(failure)
        return
    events, response = reply.finish()
    for item_event in events:
        yield numbered(item_event)
    terminal = "response.completed" if response["status"] == "completed" else \
        "response.incomplete"
    yield numbered({"type": terminal, "response": response})


def failed(reply: Reply, error: ApiError) -> list[dict[str, Any]]:
    """OpenAI's two events for a reply that failed: `error` (what the chat route's
    stream sends as its error chunk) and `response.failed`, the Response as it stood."""
    code = error.code or ERROR_TYPES.get(error.status, "invalid_request_error")
    body = error.body()["error"]
    response = reply.head.body("failed", reply.items.output(),
                               error={"code": code, "message": body["message"]})
    return [{"type": "error", "code": code, "message": body["message"],
             "param": error.param},
            {"type": "response.failed", "response": response}]


class Numbered:
    """Numbers a stream's events from 0 and frames each as a server-sent event."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self, event: dict[str, Any]) -> bytes:
        event = {**event, "sequence_number": self.next}
        self.next += 1
        # the response it echoes holds the request's fields: a 1e400 there as it was sent
        data = json_numbers.dumps_as_json(event, separators=(",", ":"))
        return f"event: {event['type']}\ndata: {data}\n\n".encode()
