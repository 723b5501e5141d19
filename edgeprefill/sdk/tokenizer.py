"""Prompts to token ids (text or chat messages) and generated ids back to streamed text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from edgeprefill.bundle import Manifest, resolve_inside
from edgeprefill.errors import BundleError, RequestError
from edgeprefill.sdk.chat_template import ChatTemplate, special_tokens, with_default_system
from edgeprefill.sdk.stop_matcher import StopMatcher
from edgeprefill.values import is_integral

if TYPE_CHECKING:
    from tokenizers import Tokenizer

Prompt = str | Sequence[int] | Sequence[dict[str, Any]]

# Special tokens that stay in the reply text where the tokenizer has them as special
# tokens: markers a reply parser reads (LFM2's tool-call tags and Mistral's `[TOOL_CALLS]`,
# server/tool_parsers.py: without it the text before a call swallowed the call; the
# thinking tags where a tokenizer registers them as special, server/reasoning.py). Every
# other special token (end of turn, BOS) is dropped, as transformers' decode with
# skip_special_tokens does; vLLM keeps them by decoding without skipping for such models.
KEPT_SPECIAL_TOKENS = ("<|tool_call_start|>", "<|tool_call_end|>", "[TOOL_CALLS]", "<think>",
                       "</think>")
# The harmony markers that frame gpt-oss's messages (server/harmony.py), kept where the
# tokenizer has `<|channel|>` (o200k_harmony): without them a reply reads "analysisThe
# user asks...assistantfinalHello". Only there, as Phi-3's end of turn is `<|end|>` too.
# `<|return|>` and `<|call|>` end generation, and are dropped as other ends are.
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>")


class Decoder(Protocol):
    """What TextStreamer needs of a tokenizer (BundleTokenizer, or any stand-in)."""

    def decode(self, ids: list[int]) -> str: ...


def check_prompt_type(prompt: object) -> None:
    """A prompt is a str, a sequence (or array) of token ids or of messages: anything else
    is a RequestError. Bytes are a sequence of ints, read as token ids they would be
    another text: refused, not taken."""
    if isinstance(prompt, bytes | bytearray):
        raise RequestError("a prompt is a string, a list of token ids, or a list of "
                           "messages; got bytes (decode them to a str)")
    if not isinstance(prompt, str | Sequence) and not hasattr(prompt, "__array__") or \
            getattr(prompt, "ndim", 1) != 1:  # a numpy scalar, a 0-d or 2-d array: no ids
        raise RequestError("a prompt is a string, a list of token ids, or a list of "
                           f"messages; got {type(prompt).__name__}")


class BundleTokenizer:
    def __init__(self, bundle_dir: Path, manifest: Manifest) -> None:
        from tokenizers import Tokenizer

        info = manifest.tokenizer
        self.info = info
        self.tokenizer: Tokenizer | None = None
        if info.file:
            try:
                path = resolve_inside(bundle_dir, info.file)
                self.tokenizer = Tokenizer.from_file(str(path))
            except Exception as err:  # tokenizers raises plain Exception for bad files
                raise BundleError(f"cannot load the bundle's tokenizer: {err}") from None
        self.chat_template: ChatTemplate | None = None
        if info.chat_template is not None:
            fallback = {"bos_token": info.bos_token, "eos_token": info.eos_token}
            tokens = special_tokens(bundle_dir, fallback)
            self.chat_template = ChatTemplate(info.chat_template, tokens)
        self.vocab_size = manifest.model.vocab_size
        # the ids a prompt may hold: the embedding's rows, past vocab_size where the model
        # embeds more tokens than it predicts (Molmo 2's image markers)
        self.input_vocab_size = manifest.model.input_vocab_size
        self._token_bytes: Callable[[int], bytes] | None = None
        # Read once: for the reply's decoding, and for grammars that name a special marker
        # by its id (server/strict_tools.py).
        self.special_ids = special_ids(self.tokenizer)
        self.dropped_specials = _dropped_specials(self.special_ids)

    def encode(self, prompt: Prompt, **chat: Any) -> list[int]:
        """Token ids of a prompt: text (the tokenizer adds its special tokens, e.g. BOS),
        chat messages (rendered with the bundle's chat template; `chat` goes to
        `render_chat`, e.g. tools=...), or ids as given."""
        if isinstance(prompt, str):
            return self._require().encode(_text(prompt), add_special_tokens=True).ids
        check_prompt_type(prompt)
        items: list[object] = list(prompt)
        if items and _messages(items):
            # The template writes the special tokens itself (as transformers does).
            return self.encode_plain(self.render_chat(items, **chat))
        if _token_ids(items):
            ids = [int(t) for t in items]  # numpy integers too
            bad = [t for t in ids if not 0 <= t < self.input_vocab_size]
            if bad:
                raise RequestError(f"token ids out of range [0, {self.input_vocab_size}): "
                                   f"{bad[:5]}")
            return ids
        raise RequestError("a prompt is a string, a list of token ids, or a list of messages")

    def encodes_nothing(self, text: str, ids: list[int]) -> bool:
        """Whether `ids`, `text`'s encoding, hold no token of the text: only the tokenizer's
        special tokens (BOS), as an empty text's. Whitespace alone may be tokens (GPT-2's
        spaces) or none (a tokenizer that drops it): only then is the prompt empty."""
        return not text.strip() and ids == self.encode("")

    def encode_plain(self, text: str) -> list[int]:
        """Text without the tokenizer's special tokens (a continuation, not a new prompt)."""
        return self._require().encode(_text(text), add_special_tokens=False).ids

    def render_chat(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> str:
        """Messages -> prompt text with the bundle's chat template, as transformers'
        apply_chat_template renders it (see ChatTemplate.render for the keywords), after
        the bundle's default system message where the messages start with none."""
        if self.chat_template is None:
            raise RequestError("this bundle has no chat template: send a plain text prompt")
        return self.chat_template.render(
            with_default_system(messages, self.info.default_system), **kwargs)

    def decode(self, ids: list[int]) -> str:
        """The ids' text as a reply streams it: special tokens dropped, but those of
        KEPT_SPECIAL_TOKENS."""
        if self.tokenizer is None:
            return ""
        if self.dropped_specials is None:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        kept = [i for i in ids if i not in self.dropped_specials]
        return self.tokenizer.decode(kept, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """One token's own text, for logprobs: its bytes as text, a word's leading space
        kept, U+FFFD where it holds part of a character (OpenAI's `token` field)."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """One token's exact bytes (OpenAI's `bytes` field; sdk/token_bytes.py)."""
        if self.tokenizer is None:
            return b""
        if self._token_bytes is None:  # reads the whole vocabulary once: not at load
            from edgeprefill.sdk.token_bytes import TokenBytes

            self._token_bytes = TokenBytes(self.tokenizer)
        return self._token_bytes(token_id)

    def _require(self) -> Tokenizer:
        if self.tokenizer is None:
            raise RequestError("this bundle has no tokenizer: send token ids")
        return self.tokenizer


class TextStreamer:
    """Incremental detokenization with stop strings, amortized O(1) per character.

    Token-by-token decoding breaks characters whose bytes span tokens (byte-fallback and
    byte-level BPE: emoji, CJK) and word-piece spacing, so each token's text comes from a
    stream decoder that waits for complete characters (`tokenizers`' DecodeStream, or a
    short window of ids for a tokenizer without one). Text that could still become a stop
    string is held back until it cannot: exactly the longest suffix that is a proper
    prefix of a stop string. A StopMatcher reads only the new text of each token, so a
    stop string split across tokens is found without rescanning the reply, at a cost that
    does not grow with the number or length of the stop strings.

    Where several stop strings occur, the one that completes first wins (earliest end),
    and among those ending at the same character the longest (earliest start); the text
    ends where the winner begins.
    """

    def __init__(self, tokenizer: Decoder, stop: tuple[str, ...]) -> None:
        self.decoder = _stream_decoder(tokenizer)
        self.stop = stop
        self.matcher = StopMatcher(stop) if stop else None
        self.held = ""  # decoded text not returned yet: it may begin a stop string
        self.stop_string: str | None = None  # the stop string that ended the text, if one

    @property
    def stopped(self) -> bool:
        return self.stop_string is not None

    def push(self, token_id: int) -> str:
        """Add a token; returns the text now safe to show (maybe empty)."""
        return self._release(self.decoder.step(token_id), at_end=False)

    def flush(self) -> str:
        """The rest of the text at the end of generation: what was held back, and the
        text of trailing ids that never made a whole character (as U+FFFD, as decoding
        all the ids gives)."""
        if self.stopped:
            return ""
        return self._release(self.decoder.finish(), at_end=True)

    def _release(self, new: str, at_end: bool) -> str:
        if self.matcher is None:  # no stop strings: nothing to hold back
            return new
        text = self.held + new
        start = self.matcher.feed(new)
        if start is not None:
            begin = len(text) - len(new) + start
            # The winner begins at `begin`; any longer stop string beginning there ends
            # later, so the winner is the shortest one found there.
            self.stop_string = min((s for s in self.stop if text.startswith(s, begin)), key=len)
            self.held = ""
            return text[:begin]
        keep = 0 if at_end else self.matcher.held
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]


def _messages(items: list[object]) -> TypeGuard[list[dict[str, Any]]]:
    return all(isinstance(m, dict) for m in items)


def _token_ids(items: list[object]) -> TypeGuard[list[int]]:
    return all(is_integral(t) for t in items)


def special_ids(tokenizer: Tokenizer | None) -> dict[str, int]:
    """The tokenizer's special tokens, text -> id (none without tokenizer.json)."""
    if tokenizer is None:
        return {}
    return {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}


def _dropped_specials(special: dict[str, int]) -> frozenset[int] | None:
    """The special token ids (`special`: text -> id) a reply's text drops where the
    tokenizer has some of KEPT_SPECIAL_TOKENS (or HARMONY_TOKENS) as special tokens; None
    where it has none (all are dropped)."""
    kept: tuple[str, ...] = KEPT_SPECIAL_TOKENS
    if "<|channel|>" in special:
        kept += HARMONY_TOKENS
    dropped = frozenset(i for text, i in special.items() if text not in kept)
    return None if len(dropped) == len(special) else dropped


def _stream_decoder(tokenizer: Decoder) -> _DecodeStream | _WindowDecoder:
    # A BundleTokenizer holds its `tokenizers` backend (None without tokenizer.json).
    backend: Tokenizer | None = getattr(tokenizer, "tokenizer", None)
    if backend is not None:
        return _DecodeStream(backend, getattr(tokenizer, "dropped_specials", None))
    return _WindowDecoder(tokenizer)


class _DecodeStream:
    """`tokenizers`' own streaming decoder, exact for byte-level and byte-fallback BPE,
    until it gives up: after a byte token, an invalid UTF-8 sequence makes it raise
    ("Invalid prefix encountered"), where decoding the ids whole gives U+FFFD. From then
    on the window decoder carries on from the last id whose text was returned.

    `dropped`: where a reply keeps some special tokens (KEPT_SPECIAL_TOKENS), the others'
    ids, which never reach the decoder; the text is then the ids' decode without skipping
    special tokens, as transformers and vLLM decode for such tool parsers. None: every
    special token is dropped (skip_special_tokens)."""

    def __init__(self, backend: Tokenizer, dropped: frozenset[int] | None = None) -> None:
        from tokenizers.decoders import DecodeStream

        self.backend = backend
        self.skip = dropped is None
        self.dropped = dropped or frozenset()
        self.stream = DecodeStream(skip_special_tokens=self.skip)
        self.window: _WindowDecoder | None = None
        self.ids: list[int] = []
        self.settled = 0  # ids before this index have had all their text returned

    def step(self, token_id: int) -> str:
        if token_id in self.dropped:
            return ""
        self.ids.append(token_id)
        if self.window is None:
            try:
                text = self.stream.step(self.backend, token_id)
            except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception
                self.window = _WindowDecoder(_Skipping(self.backend, self.skip),
                                             self.ids[:-1], self.settled)
            else:
                if text is not None:
                    self.settled = len(self.ids)
                return text or ""
        return self.window.step(token_id)

    def finish(self) -> str:
        if self.window is None:
            self.window = _WindowDecoder(_Skipping(self.backend, self.skip), self.ids,
                                         self.settled)
        return self.window.finish()


class _Skipping:
    """A tokenizers.Tokenizer as a Decoder, special tokens dropped (or not) as the stream
    drops them."""

    def __init__(self, backend: Tokenizer, skip: bool = True) -> None:
        self.backend = backend
        self.skip = skip

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=self.skip)


class _WindowDecoder:
    """For any object with `decode(ids) -> str`: decode a few trailing ids with and
    without the new one; the difference is the new text once it is whole characters.
    `ids` / `read`: ids already pushed, and how many of them have had their text returned
    (the window starts one id earlier, so a word's leading space survives the decode)."""

    def __init__(self, tokenizer: Decoder, ids: list[int] | None = None, read: int = 0) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(ids or [])
        self.read = read  # ids before this index have had their text returned
        self.prefix = max(0, read - 1)  # ids before this index are out of the window

    def step(self, token_id: int) -> str:
        self.ids.append(token_id)
        window = self.ids[self.prefix :]
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        text = self.tokenizer.decode(window)
        if text.endswith("\ufffd") or len(text) <= len(before):
            return ""  # an incomplete character: wait for more bytes
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before) :]

    def finish(self) -> str:
        """The text of the ids after the last returned text, whole or not."""
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        text = self.tokenizer.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return text[len(before) :] if text.startswith(before) else text


def _text(text: str) -> str:
    """Text the tokenizer can take: a lone surrogate (U+D800..U+DFFF, half of a UTF-16
    pair, which Python strings may hold and no UTF-8 can) is refused in one line."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RequestError(f"the text holds a lone surrogate ({text[err.start]!a} at "
                           f"character {err.start}): not valid Unicode") from None
    return text
