"""A Messages API reply, whole or as server-sent events.

Streamed, the events are Anthropic's: `message_start` (the Message with no content yet
and the prompt's token count), `ping`, each block's events (server/messages_output.py),
`message_delta` with the stop_reason, the stop_sequence and the output token count, then
`message_stop`. Each goes out as `event: <type>` + `data: <json>`, as Anthropic sends it.
A reply that fails mid-way ends with an `error` event (`{"type": "error", "error":
{"type", "message"}}`), and no `message_stop`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from edgeprefill.server.choices import Choices
from edgeprefill.server.errors import ApiError, generation_failure
from edgeprefill.server.messages_output import ContentBlocks, stop_reason
from edgeprefill.server.responses import Shape


class MessageReply:
    """One request's reply as a Message: the chat route's deltas (`shape`) re-shaped into
    content blocks."""

    def __init__(self, stream: Choices, shape: Shape, model: str) -> None:
        self.stream = stream
        self.shape = shape
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model
        self.blocks = ContentBlocks()

    def feed(self, text: str) -> list[dict[str, Any]]:
        return [e for d in self.shape.deltas(text) for e in self.blocks.feed(d)]

    def finish(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The events that end the reply's blocks, and the stop fields of the Message."""
        deltas, reason = self.shape.last_deltas(self.stream.finish_reason)
        events = [e for d in deltas for e in self.blocks.feed(d)]
        events += self.blocks.finish()
        stop_string = self.stream.streams[0].stop_string
        said = stop_reason(reason, stop_string)
        # Anthropic names the sequence only where it is the reason (a stop string that ended
        # a tool call's turn: stop_reason "tool_use", stop_sequence null)
        stop = {"stop_reason": said,
                "stop_sequence": stop_string if said == "stop_sequence" else None}
        return events, stop

    def message(self, content: list[dict[str, Any]], stop: dict[str, Any],
                output_tokens: int) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": None, "stop_sequence": None, **stop,
                "usage": {"input_tokens": self.stream.prompt_tokens,
                          "output_tokens": output_tokens}}

    def whole(self) -> dict[str, Any]:
        """The Message of a finished reply, built as the streamed one is."""
        self.feed(self.stream.streams[0].text)
        _, stop = self.finish()
        return self.message(self.blocks.content(), stop, self.stream.completion_tokens)


async def message_events(reply: MessageReply, constraint_param: str | None
                         ) -> AsyncIterator[bytes]:
    yield event({"type": "message_start", "message": reply.message([], {}, 0)})
    yield event({"type": "ping"})
    async for token in reply.stream:
        for block_event in reply.feed(token.text):
            yield event(block_event)
    if reply.stream.finish_reason == "error":
        yield error_event(generation_failure(reply.stream.failed, constraint_param))
        return
    events, stop = reply.finish()
    for block_event in events:
        yield event(block_event)
    yield event({"type": "message_delta", "delta": stop,
                 "usage": {"output_tokens": reply.stream.completion_tokens}})
    yield event({"type": "message_stop"})


def event(data: dict[str, Any]) -> bytes:
    payload = json.dumps(data, separators=(",", ":"))
    return f"event: {data['type']}\ndata: {payload}\n\n".encode()


def error_event(error: ApiError) -> bytes:
    """A failure after the first byte, when the status can no longer change."""
    return event(error.anthropic_body())
