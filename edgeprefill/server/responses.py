"""Response bodies in the OpenAI schema, for both endpoints, whole and streamed."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from edgeprefill.sdk.stream import TokenEvent, TokenStream
from edgeprefill.server.choices import Choices
from edgeprefill.server.logprobs import logprobs_body
from edgeprefill.server.tool_parsers import Piece, ToolCall, ToolParser, assemble


@dataclass(frozen=True)
class Shape:
    """What differs between /v1/completions and /v1/chat/completions."""

    chat: bool
    model: str
    id: str
    created: int
    # Chat with tools: a new parser per reply (calls are parsed out of the text).
    tool_parser: Callable[[], ToolParser] | None = None
    # A token id's exact bytes for logprobs (BundleTokenizer.token_bytes).
    token_bytes: Callable[[int], bytes] = field(default=lambda _: b"", compare=False, repr=False)
    # Streamed replies' tool-call state, by choice index (mutable, one per request).
    _streamed: dict[int, ToolDeltas] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def new(cls, chat: bool, model: str,
            tool_parser: Callable[[], ToolParser] | None = None,
            token_bytes: Callable[[int], bytes] = lambda _: b"") -> Shape:
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(chat, model, f"{prefix}-{uuid.uuid4().hex}", int(time.time()),
                   tool_parser if chat else None, token_bytes)

    @property
    def parses_tools(self) -> bool:
        return self.tool_parser is not None

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, stream: TokenStream | Choices) -> dict:
        """The non-streaming response of a finished stream (or of n choices)."""
        streams = stream.streams if isinstance(stream, Choices) else [stream]
        body = self._head("chat.completion" if self.chat else "text_completion")
        body["choices"] = [self._choice(i, s) for i, s in enumerate(streams)]
        body["usage"] = usage(stream)
        return body

    def _choice(self, index: int, stream: TokenStream) -> dict:
        if self.chat:
            message, finish = self._message(stream)
            choice = {"index": index, "message": message, "logprobs": None,
                      "finish_reason": finish}
        else:
            choice = {"index": index, "text": stream.text, "logprobs": None,
                      "finish_reason": stream.finish_reason}
        if stream.logprobs:
            choice["logprobs"] = logprobs_body(self.chat, stream.logprobs,
                                             token_bytes=self.token_bytes)
        return choice

    def _message(self, stream: TokenStream) -> tuple[dict, str | None]:
        """A whole chat reply's message and finish reason, with its tool calls if any."""
        message = {"role": "assistant", "content": stream.text}
        if self.tool_parser is None:
            return message, stream.finish_reason
        parsed = self.tool_parser().parse(stream.text)  # what the streamed reply adds up to
        if not parsed.calls:
            return {**message, "content": parsed.content}, stream.finish_reason
        message = {"role": "assistant",  # blanks alone: no content, as the stream sends
                   "content": parsed.content if parsed.content.strip() else None,
                   "tool_calls": [c.to_openai() for c in parsed.calls]}
        return message, calls_finish_reason(parsed.calls, stream.finish_reason)

    def chunks(self, text: str, index: int = 0) -> list[dict]:
        """The streamed chunks of newly generated text: content, or tool-call deltas."""
        tools = self._tool_deltas(index)
        if tools is None:
            return [self.chunk(text, index=index)] if text else []
        return [self.delta_chunk(d, index=index) for d in tools.feed(text)]

    def last_chunks(self, finish_reason: str | None, index: int = 0) -> list[dict]:
        """What the reply still holds back, then the chunk with the finish reason."""
        tools = self._tool_deltas(index)
        if tools is None:
            return [self.chunk("", finish_reason, index=index)]
        rest = [self.delta_chunk(d, index=index) for d in tools.finish()]
        return [*rest, self.chunk("", tools.finish_reason(finish_reason), index=index)]

    def _tool_deltas(self, index: int) -> ToolDeltas | None:
        if self.tool_parser is None:
            return None
        if index not in self._streamed:
            self._streamed[index] = ToolDeltas(self.tool_parser())
        return self._streamed[index]

    def chunk(self, text: str | None, finish_reason: str | None = None,
              logprobs: list[TokenEvent] | None = None, text_offset: int = 0,
              index: int = 0) -> dict:
        """One streamed piece. Chat: text None opens the reply with the role."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if text is None else (
                {"content": text} if text else {})
            return self.delta_chunk(delta, finish_reason, index, logprobs)
        choice = {"index": index, "text": text or "", "logprobs": None,
                  "finish_reason": finish_reason}
        if logprobs:
            choice["logprobs"] = logprobs_body(False, logprobs, text_offset)
        body = self._head("text_completion")
        body["choices"] = [choice]
        return body

    def delta_chunk(self, delta: dict, finish_reason: str | None = None, index: int = 0,
                    logprobs: list[TokenEvent] | None = None) -> dict:
        """A chat chunk carrying `delta`."""
        choice = {"index": index, "delta": delta, "logprobs": None,
                  "finish_reason": finish_reason}
        if logprobs:
            choice["logprobs"] = logprobs_body(True, logprobs, 0, self.token_bytes)
        body = self._head("chat.completion.chunk")
        body["choices"] = [choice]
        return body

    def usage_chunk(self, stream: TokenStream) -> dict:
        """The last chunk when the client asked for `stream_options.include_usage`."""
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage(stream)
        return body


def usage(stream: TokenStream | Choices) -> dict:
    prompt = stream.metrics.prompt_tokens  # once: the n choices share the prompt
    completion = stream.completion_tokens if isinstance(stream, Choices) else \
        len(stream.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class ToolDeltas:
    """The tool-call side of one streamed chat reply. OpenAI streams a call as deltas
    of `tool_calls[index]`: first its id, type and function name with empty arguments,
    then pieces of the arguments (as they are generated where the format allows it, in
    one piece once the call has parsed otherwise)."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.calls = 0
        self.sent: list[Piece] = []  # every piece, to assemble the calls at the end

    def feed(self, text: str) -> list[dict]:
        return self._deltas(self.parser.feed(text)) if text else []

    def finish(self) -> list[dict]:
        return self._deltas(self.parser.finish())

    def finish_reason(self, reason: str | None) -> str | None:
        return calls_finish_reason(assemble(self.sent).calls, reason)

    def _deltas(self, pieces: list[Piece]) -> list[dict]:
        self.sent.extend(pieces)
        deltas: list[dict] = []
        for piece in pieces:
            call = piece.call or piece.begin
            if call is not None:  # a new call: its id, type and name first
                self.calls += 1
                deltas.append({"tool_calls": [{
                    "index": self.calls - 1, "id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}}]})
            arguments = piece.call.arguments if piece.call is not None else piece.arguments
            if arguments:  # then its arguments, whole or as they are generated
                deltas.append({"tool_calls": [{"index": self.calls - 1,
                                               "function": {"arguments": arguments}}]})
            elif call is None:
                deltas.append({"content": piece.text})
        return deltas


def calls_finish_reason(calls: list[ToolCall], reason: str | None) -> str | None:
    """`tool_calls` for a reply that stopped on its own with every call's arguments whole
    JSON; the engine's reason otherwise (`length` for a call max_tokens cut, `stop` for
    one the model left unfinished): a client acting on `tool_calls` gets calls it can run."""
    if not calls or reason != "stop":
        return reason
    try:
        for call in calls:
            json.loads(call.arguments)
    except ValueError:
        return reason
    return "tool_calls"
