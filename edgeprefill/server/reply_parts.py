"""The state machine both re-shaped reply formats share: the chat route's deltas
(server/responses.py: `content`, the reasoning fields, `tool_calls`) fed in order open,
extend and close the reply's parts — a text part, a reasoning part, one part per tool
call — as the model wrote them. The Responses API's items (server/responses_output.py)
and the Messages API's content blocks (server/messages_output.py) say what opening,
extending and closing a part sends.

Blanks the model writes before a call open no text part (the chat route sends no content
for them either): they are held until more text says what they are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, Protocol, TypeVar


class Part(Protocol):
    kind: Any  # the format's name for the part's kind


P = TypeVar("P", bound=Part)
Events = list[dict[str, Any]]


class ReplyParts(ABC, Generic[P]):
    """Feeds the chat deltas to a format's `_open`, `_delta`, `_close` and `_begin_call`;
    `TEXT`, `REASONING` and `CALL` are the format's names for the three kinds of part."""

    TEXT: str
    REASONING: str
    CALL: str

    def __init__(self) -> None:
        self.open: P | None = None
        self.blanks = ""  # content of blanks alone, held until more text says what it is

    def feed(self, delta: dict[str, Any]) -> Events:
        if "tool_calls" in delta:
            call = delta["tool_calls"][0]
            if "id" in call:  # a new call: its id and name, arguments to follow
                return self._begin_call(call["id"], call["function"]["name"])
            return self._more(self.CALL, call["function"]["arguments"])
        if "reasoning_content" in delta:
            return self._more(self.REASONING, delta["reasoning_content"])
        return self._content(delta.get("content") or "")

    def _content(self, text: str) -> Events:
        if self.open is not None and self.open.kind == self.TEXT:
            return self._delta(text)
        if not (self.blanks + text).strip():
            self.blanks += text
            return []
        text, self.blanks = self.blanks + text, ""
        return [*self._close(), *self._open(self.TEXT), *self._delta(text)]

    def _more(self, kind: str, text: str) -> Events:
        if self.open is not None and self.open.kind == kind:
            return self._delta(text)
        return [*self._close(), *self._open(kind), *self._delta(text)]

    @abstractmethod
    def _begin_call(self, call_id: str, name: str) -> Events:
        """Open a tool call part."""

    @abstractmethod
    def _open(self, kind: Any) -> Events:
        """Open a part of this kind."""

    @abstractmethod
    def _delta(self, text: str) -> Events:
        """Extend the open part."""

    @abstractmethod
    def _close(self) -> Events:
        """Close the open part, if any, as complete."""
