"""Response bodies in the OpenAI schema, for both endpoints, whole and streamed."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from edgeprefill.sdk.stream import TokenEvent, TokenStream
from edgeprefill.server.choices import Choices
from edgeprefill.server.logprobs import logprobs_body


@dataclass(frozen=True)
class Shape:
    """What differs between /v1/completions and /v1/chat/completions."""

    chat: bool
    model: str
    id: str
    created: int

    @classmethod
    def new(cls, chat: bool, model: str) -> Shape:
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(chat, model, f"{prefix}-{uuid.uuid4().hex}", int(time.time()))

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
            choice = {"index": index, "message": {"role": "assistant", "content": stream.text},
                      "logprobs": None, "finish_reason": stream.finish_reason}
        else:
            choice = {"index": index, "text": stream.text, "logprobs": None,
                      "finish_reason": stream.finish_reason}
        if stream.logprobs:
            choice["logprobs"] = logprobs_body(self.chat, stream.logprobs)
        return choice

    def chunk(self, text: str | None, finish_reason: str | None = None,
              logprobs: list[TokenEvent] | None = None, text_offset: int = 0,
              index: int = 0) -> dict:
        """One streamed piece. Chat: text None opens the reply with the role."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if text is None else (
                {"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": None,
                      "finish_reason": finish_reason}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": index, "text": text or "", "logprobs": None,
                      "finish_reason": finish_reason}
            body = self._head("text_completion")
        if logprobs:
            choice["logprobs"] = logprobs_body(self.chat, logprobs, text_offset)
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
