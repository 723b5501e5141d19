"""A Responses API reply: its output items, the events that stream them, and the
Response object around them.

The chat route's deltas (server/responses.py: `content`, the reasoning fields,
`tool_calls`) are re-shaped into items, in the order the model wrote them:
- a `reasoning` item (a bundle that thinks): one `reasoning_text` content part;
- a `message` item: one `output_text` content part;
- a `function_call` item per call, its `call_id` the chat route's call id.
Each item streams as OpenAI streams it: `response.output_item.added`, its content part
added, text deltas (`response.output_text.delta`, `response.reasoning_text.delta`,
`response.function_call_arguments.delta`), then the `.done` events and
`response.output_item.done` with the whole item. A whole reply is built by the same
code from the whole text, so it is what the streamed one adds up to.

Blanks the model writes before a call open no message (the chat route sends no content
for them either); a reply of blanks alone, or of nothing, is a message all the same, so
a client always finds one.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from edgeprefill.server.choices import Choices
from edgeprefill.server.reply_parts import ReplyParts

Kind = Literal["message", "reasoning", "function_call"]
ID_PREFIXES = {"message": "msg", "reasoning": "rs", "function_call": "fc"}


@dataclass
class Item:
    kind: Kind
    id: str
    output_index: int
    text: str = ""  # the message's or the reasoning's text, or the call's arguments
    name: str = ""  # function_call: the function
    call_id: str = ""  # function_call: what the client's function_call_output names
    status: str = "in_progress"  # then completed, or incomplete where the reply was cut

    def body(self, status: str) -> dict[str, Any]:
        if self.kind == "message":
            return {"id": self.id, "type": "message", "status": status, "role": "assistant",
                    "content": [self.part()] if status != "in_progress" else []}
        if self.kind == "reasoning":
            return {"id": self.id, "type": "reasoning", "status": status, "summary": [],
                    "content": [self.part()] if status != "in_progress" else []}
        return {"id": self.id, "type": "function_call", "status": status,
                "call_id": self.call_id, "name": self.name,
                "arguments": self.text if status != "in_progress" else ""}

    def part(self, text: str | None = None) -> dict[str, Any]:
        text = self.text if text is None else text
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def where(self) -> dict[str, Any]:
        """The fields that place an event in its item (and content part)."""
        place = {"item_id": self.id, "output_index": self.output_index}
        return place if self.kind == "function_call" else {**place, "content_index": 0}


class OutputItems(ReplyParts[Item]):
    """The items of one reply, fed the chat route's deltas (`feed`: server/reply_parts.py);
    `feed` and `finish` return the events (without sequence numbers) that stream them."""

    TEXT, REASONING, CALL = "message", "reasoning", "function_call"

    def __init__(self) -> None:
        super().__init__()
        self.items: list[Item] = []

    def finish(self, incomplete: bool) -> list[dict[str, Any]]:
        """Close the last item: `incomplete` where max_output_tokens cut the reply (the
        items before it were whole)."""
        events = []
        if not self.items:  # a reply of blanks or of nothing is still a message
            events = [*self._open("message"), *self._delta(self.blanks)]
        return [*events, *self._close("incomplete" if incomplete else "completed")]

    def cut(self) -> None:
        """The reply failed: the item it was in is incomplete, and no event says so
        (`response.failed` carries the output as it stands)."""
        if self.open is not None:
            self.open.status, self.open = "incomplete", None

    def output(self) -> list[dict[str, Any]]:
        return [item.body(item.status) for item in self.items]

    @property
    def reasoning(self) -> str:
        return "".join(i.text for i in self.items if i.kind == "reasoning")

    # -- one item at a time ------------------------------------------------------------

    def _begin_call(self, call_id: str, name: str) -> list[dict[str, Any]]:
        self.blanks = ""  # blanks before a call are no message
        events = [*self._close("completed"), *self._open("function_call")]
        assert self.open is not None
        self.open.call_id, self.open.name = call_id, name
        events[-1]["item"] = self.open.body("in_progress")  # now with its name and id
        return events

    def _open(self, kind: Kind) -> list[dict[str, Any]]:
        item = Item(kind, f"{ID_PREFIXES[kind]}_{uuid.uuid4().hex}", len(self.items))
        self.items.append(item)
        self.open = item
        events = [{"type": "response.output_item.added", "output_index": item.output_index,
                   "item": item.body("in_progress")}]
        if kind != "function_call":
            events.append({"type": "response.content_part.added", **item.where(),
                           "part": item.part("")})
        return events

    def _delta(self, text: str) -> list[dict[str, Any]]:
        item = self.open
        if not text or item is None:
            return []
        item.text += text
        kind = {"message": "response.output_text.delta",
                "reasoning": "response.reasoning_text.delta",
                "function_call": "response.function_call_arguments.delta"}[item.kind]
        event = {"type": kind, **item.where(), "delta": text}
        return [{**event, "logprobs": []} if item.kind == "message" else event]

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return []
        item.status = status
        done = {"type": "response.output_item.done", "output_index": item.output_index,
                "item": item.body(status)}
        if item.kind == "function_call":
            return [{"type": "response.function_call_arguments.done", **item.where(),
                     "name": item.name, "arguments": item.text}, done]
        text_done = {"type": "response.output_text.done", **item.where(), "text": item.text,
                     "logprobs": []} if item.kind == "message" else \
            {"type": "response.reasoning_text.done", **item.where(), "text": item.text}
        part_done = {"type": "response.content_part.done", **item.where(),
                     "part": item.part()}
        return [text_done, part_done, done]


@dataclass(frozen=True)
class ResponseHead:
    """What every Response object of one request repeats: its id, time, model and the
    request fields it echoes."""

    id: str
    created_at: int
    model: str
    echo: dict[str, Any]

    @classmethod
    def new(cls, model: str, echo: dict[str, Any]) -> ResponseHead:
        return cls(f"resp_{uuid.uuid4().hex}", int(time.time()), model, echo)

    def body(self, status: str, output: list[dict[str, Any]],
             usage: dict[str, Any] | None = None,
             error: dict[str, Any] | None = None) -> dict[str, Any]:
        # `length` is max_output_tokens or the context filling up: OpenAI's reasons are
        # max_output_tokens and content_filter, and a full context is the former's kind.
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "error": error, "incomplete_details": incomplete,
                "model": self.model, "output": output, "previous_response_id": None,
                "store": False, "truncation": "disabled", **self.echo, "usage": usage}


def response_status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def response_usage(stream: Choices, reasoning_tokens: int) -> dict[str, Any]:
    prompt = stream.prompt_tokens
    output = stream.completion_tokens
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": stream.metrics.prefix_reused},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt + output}
