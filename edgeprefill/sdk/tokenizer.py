"""Prompts to token ids (text or chat messages) and generated ids back to streamed text."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeprefill.bundle import Manifest, resolve_inside
from edgeprefill.errors import BundleError, RequestError
from edgeprefill.sdk.chat_template import ChatTemplate, special_tokens

Prompt = str | Sequence[int] | Sequence[dict[str, Any]]


class BundleTokenizer:
    def __init__(self, bundle_dir: Path, manifest: Manifest) -> None:
        from tokenizers import Tokenizer

        info = manifest.tokenizer
        self.info = info
        self.tokenizer = None
        if info.file:
            try:
                path = resolve_inside(bundle_dir, info.file)
                self.tokenizer = Tokenizer.from_file(str(path))
            except Exception as err:  # tokenizers raises plain Exception for bad files
                raise BundleError(f"cannot load the bundle's tokenizer: {err}") from None
        self.chat_template = None
        if info.chat_template is not None:
            fallback = {"bos_token": info.bos_token, "eos_token": info.eos_token}
            tokens = special_tokens(bundle_dir, fallback)
            self.chat_template = ChatTemplate(info.chat_template, tokens)
        self.vocab_size = manifest.model.vocab_size

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: text (the tokenizer adds its special tokens, e.g. BOS),
        chat messages (rendered with the bundle's chat template), or ids as given."""
        if isinstance(prompt, str):
            return self._require().encode(prompt, add_special_tokens=True).ids
        items = list(prompt)
        if items and all(isinstance(m, dict) for m in items):
            text = self.render_chat(items)
            # The template writes the special tokens itself (as transformers does).
            return self._require().encode(text, add_special_tokens=False).ids
        if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
            bad = [t for t in items if not 0 <= t < self.vocab_size]
            if bad:
                raise RequestError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
            return items
        raise RequestError("a prompt is a string, a list of token ids, or a list of messages")

    def encode_plain(self, text: str) -> list[int]:
        """Text without the tokenizer's special tokens (a continuation, not a new prompt)."""
        return self._require().encode(text, add_special_tokens=False).ids

    def render_chat(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> str:
        """Messages -> prompt text with the bundle's chat template, as transformers'
        apply_chat_template renders it (see ChatTemplate.render for the keywords)."""
        if self.chat_template is None:
            raise RequestError("this bundle has no chat template: send a plain text prompt")
        return self.chat_template.render(messages, **kwargs)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _require(self):
        if self.tokenizer is None:
            raise RequestError("this bundle has no tokenizer: send token ids")
        return self.tokenizer


class TextStreamer:
    """Incremental detokenization with stop strings.

    Decoding token by token breaks multi-byte characters and word-piece spacing, so the
    text of all generated ids is decoded and only the new, settled suffix is emitted. Text
    that could still become a stop string is held back until it cannot.
    """

    def __init__(self, tokenizer: BundleTokenizer, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already returned
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add a token; returns the text now safe to show (maybe empty)."""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for more bytes
            return ""
        cut = self._stop_at(text)
        if cut is not None:
            self.stopped = True
            return self._emit(text[:cut])
        return self._emit(text[: len(text) - self._held_back(text)])

    def flush(self) -> str:
        """The rest of the text at the end of generation."""
        if self.stopped:
            return ""
        return self._emit(self.tokenizer.decode(self.ids).rstrip("\ufffd"))

    def _emit(self, upto: str) -> str:
        new = upto[self.emitted :]
        self.emitted = max(self.emitted, len(upto))
        return new

    def _stop_at(self, text: str) -> int | None:
        hits = [i for s in self.stop if (i := text.find(s, max(0, self.emitted - len(s)))) >= 0]
        return min(hits) if hits else None

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    longest = max(longest, n)
                    break
        return longest
