"""Response bodies in the OpenAI schema, for both endpoints, whole and streamed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from edgeprefill import json_numbers
from edgeprefill.sdk.stream import TokenEvent, TokenStream
from edgeprefill.server.choices import Choices
from edgeprefill.server.harmony import HarmonyParser
from edgeprefill.server.logprobs import logprobs_body
from edgeprefill.server.reasoning import Part, ReasoningParser, Split, reasoning_fields
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
    # Chat of a model that thinks: a new parser per reply splits its reasoning from its
    # content (server/reasoning.py); tool calls are parsed in the content only.
    reasoning: Callable[[], ReasoningParser] | None = None
    # Chat of a model that writes harmony (gpt-oss): a new parser per reply splits its
    # reasoning, content and tool calls (server/harmony.py), in place of the two above.
    harmony: Callable[[], HarmonyParser] | None = None
    # Streamed replies' state, by choice index (mutable, one per request).
    _streamed: dict[int, ReplyDeltas] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def new(cls, chat: bool, model: str,
            tool_parser: Callable[[], ToolParser] | None = None,
            token_bytes: Callable[[int], bytes] = lambda _: b"",
            reasoning: Callable[[], ReasoningParser] | None = None,
            harmony: Callable[[], HarmonyParser] | None = None) -> Shape:
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(chat, model, f"{prefix}-{uuid.uuid4().hex}", int(time.time()),
                   tool_parser if chat else None, token_bytes, reasoning if chat else None,
                   harmony if chat else None)

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
        """A whole chat reply's message and finish reason, with its reasoning and tool
        calls if any: what the streamed reply adds up to."""
        if self.harmony is not None:
            return self._harmony_message(stream)
        split = self.reasoning().parse(stream.text) if self.reasoning else \
            Split("", stream.text)
        message = {"role": "assistant", "content": split.content,
                   **reasoning_fields(split.reasoning)}
        if self.tool_parser is None:
            return message, stream.finish_reason
        parsed = self.tool_parser().parse(split.content)
        if not parsed.calls:
            return {**message, "content": parsed.content}, stream.finish_reason
        message = {**message,  # blanks alone: no content, as the stream sends
                   "content": parsed.content if parsed.content.strip() else None,
                   "tool_calls": [c.to_openai() for c in parsed.calls]}
        return message, calls_finish_reason(parsed.calls, stream.finish_reason)

    def _harmony_message(self, stream: TokenStream) -> tuple[dict, str | None]:
        reply = self.harmony().parse(stream.text)  # type: ignore[misc]
        message = {"role": "assistant", "content": reply.content,
                   **reasoning_fields(reply.reasoning)}
        if not reply.calls:
            return message, stream.finish_reason
        message = {**message, "content": reply.content or None,
                   "tool_calls": [c.to_openai() for c in reply.calls]}
        return message, calls_finish_reason(reply.calls, stream.finish_reason)

    def chunks(self, text: str, index: int = 0) -> list[dict]:
        """The streamed chunks of newly generated text: content, reasoning, or tool-call
        deltas."""
        if self._reply(index) is None:
            return [self.chunk(text, index=index)] if text else []
        return [self.delta_chunk(d, index=index) for d in self.deltas(text, index)]

    def deltas(self, text: str, index: int = 0) -> list[dict]:
        """The chat deltas of newly generated text (`content`, the reasoning fields, or
        `tool_calls`), as `chunks` sends them; the Responses API re-shapes these."""
        reply = self._reply(index)
        if reply is None:
            return [{"content": text}] if text else []
        return reply.feed(text)

    def last_deltas(self, finish_reason: str | None,
                    index: int = 0) -> tuple[list[dict], str | None]:
        """What the reply still holds back, and its finish reason (`tool_calls` where the
        calls are whole)."""
        reply = self._reply(index)
        if reply is None:
            return [], finish_reason
        return reply.finish(), reply.finish_reason(finish_reason)

    def token_chunk(self, event: TokenEvent, text_offset: int, index: int = 0) -> dict:
        """One token's chunk with its logprobs: every token has exactly one, as OpenAI and
        vLLM stream logprobs. A chat reply the parsers read (reasoning, tools) sends what
        the token released as one delta: empty where they hold its text back or swallow
        it (a tag), so its logprobs still go out, in order."""
        reply = self._reply(index)
        if reply is None:
            return self.chunk(event.text, logprobs=[event], text_offset=text_offset,
                              index=index)
        return self.delta_chunk(one_delta(reply.feed(event.text)), index=index,
                                logprobs=[event])

    def last_chunks(self, finish_reason: str | None, index: int = 0) -> list[dict]:
        """What the reply still holds back, then the chunk with the finish reason."""
        deltas, reason = self.last_deltas(finish_reason, index)
        rest = [self.delta_chunk(d, index=index) for d in deltas]
        return [*rest, self.chunk("", reason, index=index)]

    def _reply(self, index: int) -> ReplyDeltas | None:
        """The streamed state of choice `index`; None where text goes out as it comes."""
        if self.tool_parser is None and self.reasoning is None and self.harmony is None:
            return None
        if index not in self._streamed and self.harmony is not None:
            # harmony marks its calls itself: its content is not parsed for others
            self._streamed[index] = ReplyDeltas(self.harmony(), ToolDeltas(None))
        elif index not in self._streamed:
            self._streamed[index] = ReplyDeltas(
                self.reasoning() if self.reasoning else None,
                ToolDeltas(self.tool_parser()) if self.tool_parser else None)
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


class ReplyDeltas:
    """The deltas of one streamed chat reply: its reasoning (until `</think>`), then its
    content, in which the tool calls are parsed; or a harmony reply's parts and calls."""

    def __init__(self, thinking: ReasoningParser | HarmonyParser | None,
                 tools: ToolDeltas | None) -> None:
        self.thinking = thinking
        self.tools = tools

    def feed(self, text: str) -> list[dict]:
        if self.thinking is None:
            return self._content(text)
        return self._deltas(self.thinking.feed(text)) if text else []

    def finish(self) -> list[dict]:
        held = self._deltas(self.thinking.finish()) if self.thinking else []
        return [*held, *(self.tools.finish() if self.tools else [])]

    def finish_reason(self, reason: str | None) -> str | None:
        return self.tools.finish_reason(reason) if self.tools else reason

    def _deltas(self, parts: list[Part] | list[Part | Piece]) -> list[dict]:
        deltas: list[dict] = []
        for part in parts:
            if isinstance(part, Piece):  # a harmony call
                assert self.tools is not None
                deltas.extend(self.tools.pieces([part]))
            else:
                deltas.extend([reasoning_fields(part.text)] if part.reasoning else
                              self._content(part.text))
        return deltas

    def _content(self, text: str) -> list[dict]:
        if self.tools is not None:
            return self.tools.feed(text)
        return [{"content": text}] if text else []


def one_delta(deltas: list[dict]) -> dict:
    """The deltas one token released, as one delta (what it adds to the reply is the
    same): text fields joined, a call's pieces joined into one `tool_calls` entry."""
    merged: dict = {}
    for delta in deltas:
        for key, value in delta.items():
            if key == "tool_calls":
                merged[key] = _join_calls(merged.get(key, []), value)
            else:  # content and the reasoning fields
                merged[key] = merged.get(key, "") + value
    return merged


def _join_calls(calls: list[dict], pieces: list[dict]) -> list[dict]:
    """`tool_calls` delta entries with `pieces` added: a piece of the last entry's call
    (same index) extends its arguments, as one entry per call per chunk is what clients'
    accumulators expect."""
    out = list(calls)
    for piece in pieces:
        if out and out[-1]["index"] == piece["index"]:
            last = out[-1]
            arguments = last["function"].get("arguments", "") + \
                piece["function"].get("arguments", "")
            out[-1] = {**last, "function": {**last["function"], "arguments": arguments}}
        else:
            out.append(piece)
    return out


class ToolDeltas:
    """The tool-call side of one streamed chat reply. OpenAI streams a call as deltas
    of `tool_calls[index]`: first its id, type and function name with empty arguments,
    then pieces of the arguments (as they are generated where the format allows it, in
    one piece once the call has parsed otherwise). Without a parser (harmony's calls come
    as pieces already) text is content as it comes."""

    def __init__(self, parser: ToolParser | None) -> None:
        self.parser = parser
        self.calls = 0
        self.sent: list[Piece] = []  # every piece, to assemble the calls at the end

    def feed(self, text: str) -> list[dict]:
        if self.parser is None:
            return [{"content": text}] if text else []
        return self.pieces(self.parser.feed(text)) if text else []

    def finish(self) -> list[dict]:
        return self.pieces(self.parser.finish()) if self.parser else []

    def finish_reason(self, reason: str | None) -> str | None:
        return calls_finish_reason(assemble(self.sent).calls, reason)

    def pieces(self, pieces: list[Piece]) -> list[dict]:
        """The deltas of parsed pieces (the calls are kept for the finish reason)."""
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
            json_numbers.loads(call.arguments)  # JSON's: NaN is not
    except ValueError:
        return reason
    return "tool_calls"
