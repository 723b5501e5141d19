"""A chat reply's reasoning: what a model writes between `<think>` and `</think>` (Qwen3,
DeepSeek-R1 distills, SmolLM3, ...), split from the answer after
it, whole or as the reply streams in.

Which replies are split (`reply_reasoning` below, per request):
- the bundle's chat template (or its tokenizer) knows both tags, and decoding keeps them
  (as it does where they are special tokens: sdk/tokenizer.py's KEPT_SPECIAL_TOKENS);
- the server runs with `--reasoning-parser auto` (the default; `none` leaves the tags in
  `content`, as before);
- the reply is not constrained: a grammar (response_format, a forced tool_choice)
  governs the whole reply, and the whole reply is content.

Where a reply starts is read from the prompt as rendered for the request, as llama.cpp's
server does, not from a list of models:
- the generation prompt ends inside an open `<think>` (DeepSeek-R1's template, Qwen3.5's):
  the reply begins as reasoning, and only `</think>` is in it;
- otherwise the reply is reasoning only if it begins with `<think>` (Qwen3 and SmolLM3
  with thinking on). With `enable_thinking: false` their templates render an empty,
  closed block into the prompt, so the reply is content.

A reply that never closes its block (max_tokens cut it) is all reasoning, as vLLM and
llama.cpp return it. Blanks are dropped at both ends of the reasoning and right after
`</think>` (as llama.cpp does; vLLM's generic parser keeps them): the model's "\\n\\n"
between its thoughts and its answer is layout, not answer. Text after the answer has
begun is content, whatever it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

# The tags, and how a bundle and a prompt are read for them, are the SDK's: its thinking
# budget (sdk/thinking_budget.py) reads replies the same way.
from edgeprefill.sdk.thinking_budget import CLOSE, OPEN
from edgeprefill.sdk.thinking_budget import bundle_thinks as bundle_thinks
from edgeprefill.sdk.thinking_budget import prompt_opens_think as prompt_opens_think
from edgeprefill.server.tool_parsers import partial_suffix

MODES = ("auto", "none")  # --reasoning-parser
# The reply's reasoning goes out under both names clients read: `reasoning_content`
# (DeepSeek's API, llama.cpp's server, SGLang, older vLLM) and `reasoning` (vLLM since
# vllm-project/vllm#27752, after OpenAI's guidance for gpt-oss; #33402 dropped the old
# name; OpenRouter). Each client reads one; the same text under both costs bytes only.
FIELDS = ("reasoning_content", "reasoning")


class Part(NamedTuple):
    text: str
    reasoning: bool  # False: the answer (content)


class Split(NamedTuple):
    reasoning: str  # "" when the reply has none
    content: str


def reasoning_fields(text: str) -> dict[str, str]:
    """A message's or a delta's reasoning fields; none for no reasoning text, so replies
    without reasoning keep their old shape."""
    return {name: text for name in FIELDS} if text else {}


def reply_reasoning(
    enabled: bool, constrained: bool, opened: bool
) -> Callable[[], ReasoningParser] | None:
    """What makes the parser of each reply of a chat request (None: no split). `enabled`:
    the bundle thinks and the server splits; `opened`: the prompt opened the block."""
    if not enabled or constrained:
        return None
    return lambda: ReasoningParser(opened)


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
