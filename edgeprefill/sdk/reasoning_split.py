"""A reply's `<think>` block split from its answer, as the text streams in: the parser the
server's chat route (server/reasoning.py, which says which replies are split and how) and
the CLI's chat (cli/thinking.py) share. Pure text: no server, no tokenizer.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from edgeprefill.sdk.thinking_budget import CLOSE, OPEN


class Part(NamedTuple):
    text: str
    reasoning: bool  # False: the answer (content)


class Split(NamedTuple):
    reasoning: str  # "" when the reply has none
    content: str


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0



class ReasoningParser:
    """Splits one reply. `feed` takes text as it streams and returns the parts now
    certain (a possible start of a tag and blanks that may end the reasoning are held
    back, so no tag reaches either field, however the tokens cut it); `finish` returns
    the rest. `parse` does a whole text the same way, so a whole reply is what the
    streamed one adds up to."""

    def __init__(self, opened: bool) -> None:
        self.opened = opened  # the prompt left a think block open
        self.state: Literal["start", "reasoning", "after", "content"] = "start"
        self.buffer = ""  # text not yet returned
        self.shown = False  # some reasoning was returned: its leading blanks are gone

    def parse(self, text: str) -> Split:
        parts = [*self.feed(text), *self.finish()]
        return Split("".join(p.text for p in parts if p.reasoning),
                     "".join(p.text for p in parts if not p.reasoning))

    def feed(self, text: str) -> list[Part]:
        self.buffer += text
        parts: list[Part] = []
        while self._step(parts):
            pass
        return [p for p in parts if p.text]

    def finish(self) -> list[Part]:
        rest, self.buffer = self.buffer, ""
        if self.state == "start" and self.opened:
            rest, self.state = rest.lstrip(), "reasoning"
        if self.state == "reasoning":  # a block max_tokens cut: what it held, "</thi" too
            return [Part(rest.rstrip(), True)] if rest.strip() else []
        if self.state == "start":
            return [Part(rest, False)] if rest else []  # blanks, or a cut-off "<thi"
        return []  # after: blanks; content: nothing is held

    def _step(self, parts: list[Part]) -> bool:
        """One move of the state machine; True if it can move again at once."""
        if self.state == "start":
            return self._start()
        if self.state == "reasoning":
            return self._reasoning(parts)
        if self.state == "after":
            self.buffer = self.buffer.lstrip()
            if self.buffer:
                self.state = "content"
                return True
            return False
        if self.buffer:
            parts.append(Part(self.buffer, False))
            self.buffer = ""
        return False

    def _start(self) -> bool:
        """Before the first visible character: is this a think block?"""
        head = self.buffer.lstrip()
        if head.startswith(OPEN):
            self.buffer, self.state = head[len(OPEN):], "reasoning"
            return True
        if OPEN.startswith(head):
            return False  # blanks, or a possible start of <think>: wait
        if self.opened:
            self.buffer, self.state = head, "reasoning"
        else:
            self.state = "content"  # as the model wrote it, its blanks included
        return True

    def _reasoning(self, parts: list[Part]) -> bool:
        """Reasoning up to `</think>`: shown up to its last non-blank character, keeping
        back what may begin the tag (blanks before it are dropped, wherever the stream
        is cut)."""
        if not self.shown:
            self.buffer = self.buffer.lstrip()  # the blanks that open the reasoning
        at = self.buffer.find(CLOSE)
        if at >= 0:
            parts.append(Part(self.buffer[:at].rstrip(), True))
            self.buffer, self.state = self.buffer[at + len(CLOSE):], "after"
            return True
        cut = len(self.buffer) - partial_suffix(self.buffer, CLOSE)
        end = len(self.buffer[:cut].rstrip())
        if end:
            parts.append(Part(self.buffer[:end], True))
            self.buffer, self.shown = self.buffer[end:], True
        return False
