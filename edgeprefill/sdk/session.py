"""A conversation: its turns share one KV slot, so each turn prefills only what is new."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgeprefill.errors import RequestError
from edgeprefill.sdk.chat_template import check_template_kwargs
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.sdk.stream import TokenStream
from edgeprefill.sdk.tokenizer import Prompt, check_prompt_type

if TYPE_CHECKING:
    from edgeprefill.sdk.engine import Engine


class Session:
    """Turns are either chat messages (`chat`, or `generate` with a list of messages),
    rendered with the bundle's chat template over the whole conversation, or raw text /
    token ids appended to the conversation so far. The KV cache reuses the longest common
    token prefix with what the slot holds, so either way only the new tail is prefilled."""

    def __init__(self, engine: Engine, session_id: int) -> None:
        self.engine = engine
        self.id = session_id
        self.messages: list[dict[str, Any]] = []
        self.tokens: list[int] = []  # the conversation's tokens after the last turn
        self._last: TokenStream | None = None
        self._last_prompt: list[int] = []
        self._chat: bool | None = None  # fixed by the first turn
        # The chat template's variables for every turn (e.g. enable_thinking); the whole
        # conversation is rendered with them, as a client resends it to a server.
        self._template_kwargs: dict[str, Any] = {}
        # How a chat reply joins the conversation, from its turn's prompt ids and its text:
        # by default the text as the assistant's content. A client that splits a reply's
        # reasoning off (cli/chat.py) gives the message a server's client would send back.
        self.reply_message: Callable[[list[int], str], dict[str, Any]] = _as_content
        self._turn = threading.Lock()  # a turn's settle, render and submit, and close()

    def generate(
        self, prompt: Prompt, params: GenerationParams | None = None, *,
        priority: int | str = 0,
    ) -> TokenStream:
        """`priority`: lower is served first (vLLM's meaning); `high`/`normal`/`low` too."""
        check_prompt_type(prompt)  # before len(): a None or an int is no empty turn
        if (prompt.strip() if isinstance(prompt, str) else len(prompt)) in ("", 0):
            raise RequestError("the turn is empty")  # it would resubmit the conversation
        arrival = time.perf_counter()  # TTFT counts rendering and tokenizing the turn
        # One turn at a time: two threads' turns had both passed _settle's check, and the
        # conversation kept one of them (the other's turn and reply lost in silence).
        with self._turn:
            self._settle()
            is_chat = self._turn_kind(prompt)
            messages = self.messages
            if is_chat:
                messages = messages + [dict(m) for m in prompt if isinstance(m, dict)]
            tokens = self.engine.tokenizer.encode(messages, **self.template_kwargs) \
                if is_chat else self._continued(prompt)
            stream = self.engine.submit(tokens, params, priority, self.id, arrival=arrival)
            # Only a turn that was accepted joins the conversation: a template error or a
            # refused prompt leaves the session as it was, so the next turn can succeed.
            self._chat, self.messages = is_chat, messages
            self._last, self._last_prompt = stream, tokens
            return stream

    def chat(
        self, text: str, params: GenerationParams | None = None, *, priority: int | str = 0
    ) -> TokenStream:
        if not isinstance(text, str):
            raise RequestError(f"chat() takes the user's text as a string, got "
                               f"{type(text).__name__}")
        if not text.strip():  # the reply would follow the template's scaffolding alone
            raise RequestError("the chat turn is empty: send the user's text")
        return self.generate([{"role": "user", "content": text}], params, priority=priority)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's variables for every turn (e.g. enable_thinking, tools)."""
        return self._template_kwargs

    @template_kwargs.setter
    def template_kwargs(self, kwargs: dict[str, Any]) -> None:
        # Checked here, once: a bad `tools` is refused when it is set, in the words the
        # template's render uses, not at the next turn.
        self._template_kwargs = check_template_kwargs(kwargs)

    @property
    def last_prompt(self) -> list[int]:
        """The token ids the last turn was submitted with ([] before the first)."""
        return list(self._last_prompt)

    def close(self) -> None:
        """Forget the conversation; its KV stays only as an evictable prefix entry. A turn
        after close() starts a new conversation."""
        with self._turn:
            if self._last is not None and not self._last.done:
                self._last.cancel()
            self.engine.kv_forget(self.id)
            self.messages, self.tokens, self._chat = [], [], None
            self._last, self._last_prompt = None, []

    def _turn_kind(self, prompt: Prompt) -> bool:
        """True for chat messages; refuses a turn of the other kind than the first."""
        is_chat = not isinstance(prompt, str) and len(prompt) > 0 and all(
            isinstance(m, dict) for m in prompt  # (len: a numpy array of ids has no bool)
        )
        if self._chat is not None and is_chat != self._chat:
            raise RequestError("a session takes either chat messages or raw prompts, not both")
        return is_chat

    def _continued(self, prompt: Prompt) -> list[int]:
        """The raw conversation's tokens with this turn's text or ids appended."""
        tokenizer = self.engine.tokenizer
        if isinstance(prompt, str) and self.tokens:
            # Later raw turns continue the text: no second BOS.
            return self.tokens + tokenizer.encode_plain(prompt)
        return self.tokens + tokenizer.encode(prompt)

    def _settle(self) -> None:
        """Fold the previous turn's reply into the conversation."""
        last = self._last
        if last is None:
            return
        if not last.done:
            raise RequestError("this session's previous reply is still being generated")
        # The EOS that ended the reply is part of the conversation, as the model saw it.
        eos = [] if last.eos_token_id is None else [last.eos_token_id]
        self.tokens = self._last_prompt + last.token_ids + eos
        if self._chat:
            self.messages.append(self.reply_message(self._last_prompt, last.text))
        self._last = None


def _as_content(prompt: list[int], text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}
