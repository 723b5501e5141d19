"""gpt-oss's chat replies in OpenAI's harmony format, split into reasoning, answer and
tool calls, whole or as the reply streams in (what vLLM's OpenAI server returns for it).

The generation prompt ends with `<|start|>assistant`; a reply is one or more messages,

    <|channel|>analysis<|message|>...thinking...<|end|>
    <|start|>assistant<|channel|>final<|message|>...answer...<|return|>

and a tool call is a message to a recipient, named in the header before or after the
channel: `<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
{"location": "Tokyo"}<|call|>` or `<|start|>assistant to=functions.get_weather
<|channel|>commentary json<|message|>...`. `<|return|>` and `<|call|>` end generation
(so they seldom reach the text); `<|end|>` ends one message. Each message goes to:
- `analysis` -> the reasoning fields (server/reasoning.py's FIELDS);
- `final`, and `commentary` without a recipient (a preamble the user may see) -> content;
- a recipient `functions.NAME` -> a tool call of NAME, its body the JSON arguments (sent
  as they are generated); another recipient (a built-in tool this server does not run)
  -> reasoning, so no text is lost. A call is one whether or not the request sent tools:
  the format marks it unambiguously.
Messages of the same kind are joined by a newline. Blanks at both ends of a body are
dropped (the model writes none; a tokenizer that spaces its words writes some). Headers
never reach a field; a header cut by max_tokens is dropped, and a reply with no harmony
marker at all is content.

Which replies are split: the bundle's chat template has `<|channel|>` and `<|message|>`
and decoding keeps them (sdk/tokenizer.py's HARMONY_TOKENS), the server runs with
`--reasoning-parser auto`, and the reply is not constrained (as server/reasoning.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal, NamedTuple

from edgeprefill.sdk.reasoning_split import partial_suffix
from edgeprefill.sdk.tokenizer import BundleTokenizer
from edgeprefill.server.reasoning import Part
from edgeprefill.server.tool_parsers import Piece, ToolCall, assemble, new_call

CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
# What ends a message's body: `<|end|>`, or the end of generation where the text keeps it.
BODY_ENDS = ("<|end|>", "<|return|>", "<|call|>")
FUNCTIONS = "functions."
RECIPIENT = re.compile(r"(?:^|\s|>)to=([^\s<]+)")
CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([^\s<]+)")

Kind = Literal["reasoning", "content", "call"]


class Reply(NamedTuple):
    reasoning: str
    content: str
    calls: list[ToolCall]


def bundle_harmony(tokenizer: BundleTokenizer) -> bool:
    """Whether the bundle's replies are harmony messages this server can split."""
    if tokenizer.tokenizer is None:
        return False
    template = tokenizer.info.chat_template or ""
    if CHANNEL not in template or MESSAGE not in template:
        return False
    # Decoding must keep the markers (HARMONY_TOKENS), or there is nothing to split.
    return all(tag in tokenizer.decode(tokenizer.encode_plain(tag))
               for tag in (CHANNEL, MESSAGE))


def reply_harmony(enabled: bool, constrained: bool) -> Callable[[], HarmonyParser] | None:
    """What makes the parser of each reply of a chat request (None: no split). A grammar
    (response_format, a forced tool_choice) governs a constrained reply whole: content."""
    return HarmonyParser if enabled and not constrained else None


class HarmonyParser:
    """Splits one reply. `feed` takes text as it streams and returns what is now certain:
    reasoning and content as `Part`s, calls as `Piece`s (a call's start once its header is
    read, then its arguments). A header, a possible start of an end marker and blanks
    that may end a body are held back, so no marker reaches any field, however the tokens
    cut it. `finish` returns the rest; `parse` does a whole text the same way."""

    def __init__(self) -> None:
        self.buffer = ""  # text not yet returned
        self.kind: Kind | None = None  # the open message's; None: reading a header
        self.began = False  # the open message's body has shown text
        self.shown: set[Kind] = set()  # kinds some message has shown: later ones get "\n"
        self.marked = False  # some harmony marker was read

    def parse(self, text: str) -> Reply:
        out = [*self.feed(text), *self.finish()]
        parts = [p for p in out if isinstance(p, Part)]
        return Reply("".join(p.text for p in parts if p.reasoning),
                     "".join(p.text for p in parts if not p.reasoning),
                     assemble([p for p in out if isinstance(p, Piece)]).calls)

    def feed(self, text: str) -> list[Part | Piece]:
        self.buffer += text
        out: list[Part | Piece] = []
        while self._body(out) if self.kind else self._header(out):
            pass
        return out

    def finish(self) -> list[Part | Piece]:
        rest, self.buffer = self.buffer, ""
        if self.kind is not None:  # a body max_tokens cut: what it holds, no cut marker
            rest = rest[:len(rest) - max(partial_suffix(rest, t) for t in BODY_ENDS)]
            return self._show(rest.strip() if not self.began else rest.rstrip())
        if not self.marked and rest.strip():  # not harmony at all: the model's text
            return [Part(rest, False)]
        return []  # a header cut short, or blanks

    def _header(self, out: list[Part | Piece]) -> bool:
        """Read a header up to `<|message|>`: what its body is."""
        at = self.buffer.find(MESSAGE)
        if at < 0:
            self.marked = self.marked or "<|" in self.buffer
            return False
        header, self.buffer = self.buffer[:at], self.buffer[at + len(MESSAGE):]
        self.marked, self.began = True, False
        recipient = RECIPIENT.search(header)
        channel = CHANNEL_NAME.search(header)
        if recipient and recipient[1].startswith(FUNCTIONS):
            self.kind = "call"
            out.append(Piece(begin=new_call(recipient[1][len(FUNCTIONS):], "")))
        elif recipient or (channel and channel[1] == "analysis"):
            self.kind = "reasoning"
        else:  # final, or commentary meant for the user
            self.kind = "content"
        return True

    def _body(self, out: list[Part | Piece]) -> bool:
        """A body up to its end marker: shown up to its last non-blank character, keeping
        back what may begin a marker."""
        if not self.began:
            self.buffer = self.buffer.lstrip()
        ends = [at for at in (self.buffer.find(tag) for tag in BODY_ENDS) if at >= 0]
        if ends:
            at = min(ends)
            out.extend(self._show(self.buffer[:at].rstrip()))
            tag = next(t for t in BODY_ENDS if self.buffer.startswith(t, at))
            self.buffer, self.kind = self.buffer[at + len(tag):], None
            return True
        cut = len(self.buffer) - max(partial_suffix(self.buffer, t) for t in BODY_ENDS)
        end = len(self.buffer[:cut].rstrip())
        out.extend(self._show(self.buffer[:end]))
        self.buffer = self.buffer[end:]
        return False

    def _show(self, text: str) -> list[Part | Piece]:
        """A piece of the open message's body, as its kind sends it."""
        if not text or self.kind is None:
            return []
        if self.kind == "call":
            self.began = True
            return [Piece(arguments=text)]
        if not self.began and self.kind in self.shown:
            text = "\n" + text  # a later message of the same kind
        self.began = True
        self.shown.add(self.kind)
        return [Part(text, self.kind == "reasoning")]
