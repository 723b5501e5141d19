"""A thinking budget: a reply's reasoning (its `<think>` block) may run N tokens; then
its end is forced, and the reply goes on as the answer.

Where a reply's reasoning starts is read as server/reasoning.py reads it: the prompt ends
inside an open `<think>` (DeepSeek-R1's template, Qwen3.5's), or the reply itself begins
with `<think>` (Qwen3, SmolLM3 with thinking on). Every generated token from there is a
reasoning token until the reply's text holds `</think>`. Once N of them have come without
it, the next steps are forced: one token per step, the sampler's mask allowing that token
alone, so each forced token is sampled, streamed, fed back and written to the KV cache as
any other, and the run after it is the model's own continuation of that prefix.

What is forced is FORCED_CLOSE, `</think>` as Qwen3's chat template writes a closed block
into a conversation ("<think>\\n...\\n</think>\\n\\n" before the answer): the layout the
model saw after its thoughts. A reply that never opens a block is left alone.

A budget needs a bundle that knows both tags (`bundle_thinks`); it cannot be combined
with a constraint over the whole reply (sdk/params.py refuses it: that grammar would not
allow the forced tokens). A grammar that leaves the reasoning free takes it
(`Constraint.frees_reasoning`): structured output after the think block
(sdk/think_first.py: the close is text of the block, and the grammar then holds the
answer), and a lazy grammar (strict tools under auto), where the close is forced as
anywhere; while it holds a call the reasoning opened, the close waits for the call's end
(the sampler begins it only where the grammar takes it whole).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from edgeprefill.errors import RequestError
from edgeprefill.sdk.tokenizer import BundleTokenizer, Decoder

OPEN = "<think>"
CLOSE = "</think>"
FORCED_CLOSE = "\n</think>\n\n"
# Trailing tokens decoded to find `</think>`: each token of an ASCII tag is at least one
# character, so the tag ends inside this window when the last token completes it.
WINDOW = 2 * len(CLOSE)


def bundle_thinks(tokenizer: BundleTokenizer) -> bool:
    """Whether the bundle's replies may carry `<think>` blocks: its chat template (or its
    tokenizer) knows both tags, and decoding keeps them."""
    if tokenizer.tokenizer is None:
        return False
    template = tokenizer.info.chat_template or ""
    known = all(tag in template or tokenizer.tokenizer.token_to_id(tag) is not None
                for tag in (OPEN, CLOSE))
    # The reply's text keeps the tags, also where they are special tokens
    # (KEPT_SPECIAL_TOKENS); a tokenizer that decodes them to nothing leaves nothing to find.
    return known and CLOSE in tokenizer.decode(tokenizer.encode_plain(CLOSE))


def tags_are_special(special_ids: Mapping[str, int]) -> bool:
    """Whether a tokenizer (its special tokens, text -> id) has a think tag as a special
    token: a grammar whose free text is UTF-8 (a special call marker's) cannot hold it."""
    return OPEN in special_ids or CLOSE in special_ids


def prompt_opens_think(prompt: str) -> bool:
    """Whether a rendered prompt leaves a think block open for the reply (llama.cpp's
    test: the prompt ends with `<think>`, blanks aside). A `<think>` inside a message
    is followed by the template's own text, so it does not count."""
    return prompt.rstrip().endswith(OPEN)


def thinking_budget(budget: int, tokenizer: BundleTokenizer,
                    prompt: Sequence[int]) -> ThinkingBudget:
    """The budget's state for one request on `prompt` (token ids); a RequestError (one
    line) for a bundle without think tags."""
    if not bundle_thinks(tokenizer):
        raise RequestError("thinking_budget needs a model that thinks in <think> ... "
                           "</think> blocks; this bundle's chat template and tokenizer know "
                           "no such tags", "thinking_budget")
    return ThinkingBudget(budget, tokenizer.encode_plain(FORCED_CLOSE), tokenizer,
                          ids_open_think(tokenizer, prompt))


def ids_open_think(tokenizer: BundleTokenizer, prompt: Sequence[int]) -> bool:
    """prompt_opens_think on a prompt given as token ids: the text of its last WINDOW
    tokens, enough for a `<think>` at its end and the blanks after it."""
    return prompt_opens_think(tokenizer.decode(list(prompt[-WINDOW:])))


class ThinkingBudget:
    """One request's count of reasoning tokens, and the closing tokens still to force.
    The sampler asks `forced()` before each token and calls `accept` after it."""

    def __init__(self, budget: int, close_ids: list[int], decoder: Decoder,
                 opened: bool) -> None:
        self.budget = budget
        self.close_ids = close_ids
        self.decoder = decoder
        self.state: Literal["start", "reasoning", "closing", "answer"] = "start"
        self.tokens: list[int] = []  # the reply's tokens before its block, or in it
        self.used = 0  # reasoning tokens generated
        self.to_force: list[int] = []
        if opened:
            self._reasoning()

    def forced(self) -> int | None:
        """The token the next step must be, or None: the model chooses."""
        return self.to_force[0] if self.to_force else None

    @property
    def closing_begun(self) -> bool:
        """Some of the closing tokens are in the reply already."""
        return self.state == "closing" and len(self.to_force) < len(self.close_ids)

    def accept(self, token: int, forced: bool = True) -> None:
        """`forced`: the sampler forced this token (False: the close waits for a lazy
        grammar's call to end, and the token is the call's)."""
        if self.state == "closing":
            if not forced:
                return
            self.to_force.pop(0)
            if not self.to_force:
                self.state = "answer"
            return
        if self.state == "answer":
            return
        self.tokens.append(token)
        if self.state == "start":
            self._start()
            return
        self.used += 1
        if CLOSE in self.decoder.decode(self.tokens[-WINDOW:]):
            self.state = "answer"  # the model closed its block within the budget
        elif self.used >= self.budget:
            self._close()

    def _start(self) -> None:
        """Before the reply's first visible text: does it open a block?"""
        head = self.decoder.decode(self.tokens).lstrip()
        if head.startswith(OPEN):
            self._reasoning()
        elif not OPEN.startswith(head):  # blanks, or a part of <think>, wait
            self.state = "answer"

    def _reasoning(self) -> None:
        self.state, self.tokens = "reasoning", []
        if self.used >= self.budget:  # a budget of 0: closed before any thought
            self._close()

    def _close(self) -> None:
        self.state, self.to_force = "closing", list(self.close_ids)
        if not self.to_force:  # no tokens spell the tag: nothing can be forced
            self.state = "answer"
