"""A reasoning model's reply in the terminal: its `<think>` block shown apart from the
answer, as Ollama's CLI shows it ("Thinking..." / "...done thinking."; dimmed on a
terminal), or hidden (`--hide-thinking`, Ollama's `--hidethinking`).

The reply is split as the server's chat route splits it, by the parser they share
(sdk/reasoning_split.py). It splits where the bundle knows the tags, for chat turns only
(a raw prompt's reply is all text, as the completions route returns it), the block
opened by the prompt or by the reply itself.
A bundle without think tags prints as before.

The conversation keeps what a server's client sends back (cli/chat.py): the answer as
`content`, the reasoning as `reasoning_content`, which the server hands to the chat
template too; the template decides whether to replay it (Qwen3's drops it from turns
before the last user message).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from edgeprefill.errors import RequestError
from edgeprefill.sdk.reasoning_split import Part, ReasoningParser
from edgeprefill.sdk.stream import TokenStream
from edgeprefill.sdk.thinking_budget import bundle_thinks, ids_open_think
from edgeprefill.sdk.tokenizer import BundleTokenizer

OPENING = "Thinking...\n"
CLOSING = "\n...done thinking.\n\n"


@dataclass(frozen=True)
class ThinkingView:
    """How replies are shown. `splits`: the bundle thinks in tags (else the reply is
    printed as generated); `hide`: the reasoning is not printed; `styled`: dim it (a
    terminal)."""

    splits: bool = False
    hide: bool = False
    styled: bool = False

    @classmethod
    def of(cls, tokenizer: BundleTokenizer, hide: bool, styled: bool) -> ThinkingView:
        return cls(bundle_thinks(tokenizer), hide, styled)

    def parser(self, tokenizer: BundleTokenizer, prompt: list[int],
               chat: bool) -> ReasoningParser | None:
        """The parser of a reply to `prompt` (None: print the reply as it comes)."""
        if not (self.splits and chat):
            return None
        return ReasoningParser(ids_open_think(tokenizer, prompt))

    def dim(self, text: str) -> str:
        return click.style(text, dim=True) if self.styled else text


def show_reply(stream: TokenStream, write: Callable[[str], None], view: ThinkingView,
               parser: ReasoningParser | None) -> None:
    """Print a reply as it is generated, its reasoning apart (or not at all) where
    `parser` splits it; `write` takes each piece."""
    printer = _Printer(write, view)
    try:
        for event in stream:
            if parser is None:
                write(event.text)
            else:
                printer.parts(parser.feed(event.text))
    except KeyboardInterrupt:
        # Ctrl-C mid-thought: the block is closed as a finished one is (its closing line,
        # the dim style reset), then the caller stops the reply as it stops any.
        printer.end_reasoning()
        raise
    if parser is not None:
        printer.parts(parser.finish())
        printer.end_reasoning()
    write("\n")
    if stream.finish_reason == "error":
        raise RequestError(f"generation failed: {stream.error}")


def reply_text(text: str, view: ThinkingView, parser: ReasoningParser | None) -> str:
    """A whole reply as show_reply prints it, without the final newline."""
    if parser is None:
        return text
    out: list[str] = []
    printer = _Printer(out.append, view)
    printer.parts([*parser.feed(text), *parser.finish()])
    printer.end_reasoning()
    return "".join(out)


def think_kwargs(think: bool | None) -> dict[str, bool]:
    """The chat template's keywords for `--think`/`--no-think` (`/think`, `/nothink`):
    its enable_thinking, or none where the user chose neither (the template's default)."""
    return {} if think is None else {"enable_thinking": think}


def assistant_message(tokenizer: BundleTokenizer, view: ThinkingView
                      ) -> Callable[[list[int], str], dict[str, Any]]:
    """A chat session's `reply_message`: the answer as content, the reasoning as
    `reasoning_content` (only where there is some), as the server reads an assistant
    message that a client sends back."""

    def message(prompt: list[int], text: str) -> dict[str, Any]:
        parser = view.parser(tokenizer, prompt, chat=True)
        if parser is None:
            return {"role": "assistant", "content": text}
        split = parser.parse(text)
        reasoning = {"reasoning_content": split.reasoning} if split.reasoning else {}
        return {"role": "assistant", "content": split.content, **reasoning}

    return message


class _Printer:
    """Writes parts: the reasoning between OPENING and CLOSING (dimmed on a terminal),
    or nothing of it when hidden; the answer as it is."""

    def __init__(self, write: Callable[[str], None], view: ThinkingView) -> None:
        self.write, self.view = write, view
        self.thinking = False  # OPENING written, CLOSING not yet

    def parts(self, parts: list[Part]) -> None:
        for part in parts:
            if not part.reasoning:
                self.end_reasoning()
                self.write(part.text)
            elif not self.view.hide:
                if not self.thinking:
                    self.write(self.view.dim(OPENING))
                    self.thinking = True
                self.write(self.view.dim(part.text))

    def end_reasoning(self) -> None:
        if self.thinking:
            self.write(self.view.dim(CLOSING))
            self.thinking = False
