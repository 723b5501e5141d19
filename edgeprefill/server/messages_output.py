"""A Messages API reply's content blocks, and the stream events that build them.

The chat route's deltas (server/responses.py: `content`, the reasoning fields,
`tool_calls`) are re-shaped into Anthropic's blocks, in the order the model wrote them:
- a `thinking` block (a bundle that thinks), its `signature` empty: there is nothing to
  sign, and this server reads a thinking block sent back without checking one;
- a `text` block;
- a `tool_use` block per call, its `id` the chat route's call id (what the client's
  `tool_result` names), its `input` the arguments parsed (`{}` where max_tokens cut them
  before they were whole JSON).
Each block streams as Anthropic streams it: `content_block_start` with the block empty,
`content_block_delta`s (`text_delta`, `thinking_delta`, `input_json_delta`), then
`content_block_stop`. A whole reply is built by the same code from the whole text, so it
is what the streamed one adds up to.

Blanks the model writes before a call open no text block (the chat route sends no
content for them either); a reply of blanks alone, or of nothing, is a text block all
the same, so a client always finds one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from edgeprefill import json_numbers
from edgeprefill.server.reply_parts import ReplyParts

Kind = Literal["text", "thinking", "tool_use"]
DELTAS = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking"),
          "tool_use": ("input_json_delta", "partial_json")}
# The chat route's finish reason -> Anthropic's stop_reason ("stop": end_turn, or
# stop_sequence where a stop string ended the reply).
STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}


@dataclass
class Block:
    kind: Kind
    index: int
    text: str = ""  # the text, the thinking, or the call's arguments as JSON text
    id: str = ""  # tool_use
    name: str = ""  # tool_use

    def body(self, whole: bool = True) -> dict[str, Any]:
        """The block, whole or as content_block_start opens it (empty)."""
        text = self.text if whole else ""
        if self.kind == "text":
            return {"type": "text", "text": text}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": text, "signature": ""}
        return {"type": "tool_use", "id": self.id, "name": self.name,
                "input": _input(text) if whole else {}}


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json_numbers.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class ContentBlocks(ReplyParts[Block]):
    """The blocks of one reply, fed the chat route's deltas (`feed`: server/reply_parts.py);
    `feed` and `finish` return the events that stream them."""

    TEXT, REASONING, CALL = "text", "thinking", "tool_use"

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[Block] = []

    def finish(self) -> list[dict[str, Any]]:
        """Close the last block (opening a text block if there is none)."""
        events = []
        if not self.blocks:
            events = [*self._open("text"), *self._delta(self.blanks)]
        return [*events, *self._close()]

    def content(self) -> list[dict[str, Any]]:
        return [block.body() for block in self.blocks]

    def _begin_call(self, call_id: str, name: str) -> list[dict[str, Any]]:
        self.blanks = ""  # blanks before a call are no text block
        closed = self._close()
        block = Block("tool_use", len(self.blocks), id=call_id, name=name)
        return [*closed, *self._start(block)]

    def _open(self, kind: Kind) -> list[dict[str, Any]]:
        return self._start(Block(kind, len(self.blocks)))

    def _start(self, block: Block) -> list[dict[str, Any]]:
        self.blocks.append(block)
        self.open = block
        return [{"type": "content_block_start", "index": block.index,
                 "content_block": block.body(whole=False)}]

    def _delta(self, text: str) -> list[dict[str, Any]]:
        block = self.open
        if not text or block is None:
            return []
        block.text += text
        kind, key = DELTAS[block.kind]
        return [{"type": "content_block_delta", "index": block.index,
                 "delta": {"type": kind, key: text}}]

    def _close(self) -> list[dict[str, Any]]:
        block, self.open = self.open, None
        if block is None:
            return []
        return [{"type": "content_block_stop", "index": block.index}]


def stop_reason(finish_reason: str | None, stop_string: str | None) -> str:
    """Anthropic's stop_reason for the chat route's finish reason."""
    if finish_reason in STOP_REASONS:
        return STOP_REASONS[finish_reason]
    return "stop_sequence" if stop_string is not None else "end_turn"
