"""Each token's exact bytes, for logprobs (OpenAI's `bytes` field).

Decoding one token alone gives U+FFFD for a piece of a character (an emoji split over byte
tokens) and drops a word's leading space (the decoders strip it at the start of a text).
The bytes come instead from the vocabulary entry, read the way the tokenizer's decoder
reads it:
- byte-level BPE (GPT-2, Llama 3, Qwen): every character of a piece stands for one byte
  (GPT-2's printable alphabet);
- byte fallback (Llama 2, Mistral, Gemma, SmolLM's sentencepiece heritage): `<0xHH>` is
  the byte HH, other pieces are text whose `▁` (or the decoder's own Replace) is a space;
- anything else (word-level, WordPiece): the token decoded alone.
Added (special) tokens are their content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: printable Latin-1 bytes stand for themselves,
    the other 68 bytes for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {chr(b): b for b in printable}
    others = (b for b in range(256) if b not in alphabet.values())
    alphabet.update({chr(256 + n): b for n, b in enumerate(others)})
    return alphabet


BYTE_LEVEL = _byte_level_alphabet()
BYTE_CHARS = {b: c for c, b in BYTE_LEVEL.items()}  # a byte -> its character


class TokenBytes:
    def __init__(self, tokenizer: Tokenizer, data: dict[str, Any] | None = None) -> None:
        """`data`: tokenizer.json already parsed, where the caller has it."""
        self.tokenizer = tokenizer
        data = json.loads(tokenizer.to_str()) if data is None else data
        decoders = list(_decoders(data.get("decoder")))
        kinds = {d.get("type") for d in decoders}
        self.byte_level = "ByteLevel" in kinds
        self.byte_fallback = "ByteFallback" in kinds
        # Text substitutions of a byte-fallback decoder: Replace("▁", " "), Metaspace.
        self.replace = [(d["pattern"]["String"], d["content"]) for d in decoders
                        if d.get("type") == "Replace" and "String" in d.get("pattern", {})]
        self.replace += [(d.get("replacement", "▁"), " ") for d in decoders
                         if d.get("type") == "Metaspace"]
        self.added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}

    def __call__(self, token_id: int) -> bytes:
        if token_id in self.added:
            return self.added[token_id].encode()
        piece = self.tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if self.byte_level and all(c in BYTE_LEVEL for c in piece):
            return bytes(BYTE_LEVEL[c] for c in piece)
        if self.byte_fallback:
            byte = BYTE_PIECE.fullmatch(piece)
            if byte is not None:
                return bytes([int(byte.group(1), 16)])
        if self.byte_level or self.byte_fallback or self.replace:
            for old, new in self.replace:
                piece = piece.replace(old, new)
            return piece.encode()
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode()

    def strips_first_space(self) -> bool:
        """Whether decoding drops the space that begins a text: Llama 2 and Mistral
        (Replace ▁, ..., Fuse, Strip(" ", start=1)), a Metaspace decoder (prepend_scheme
        "first" or "always"). A reply whose first token is `▁jade` (bytes " jade") then
        reads "jade", as transformers' decode gives it. Asked of the decoder itself, with
        " x x" spelled as the vocabulary spells it. How much a first token loses varies
        by decoder: see opens_one_space_short."""
        decoder = self.tokenizer.decoder
        if decoder is None:
            return False
        word = self.piece(" x")
        try:
            text: str = decoder.decode([word, word])
        except Exception:  # noqa: BLE001 - tokenizers raises plain exceptions
            return False
        return text == "x x"

    def opens_one_space_short(self, token_id: int) -> bool:
        """Whether `token_id`, first in a text, reads as its bytes less exactly their
        leading space (a token whose bytes begin with one). Llama 2's Strip(start=1) after
        Fuse drops one space of the whole text, whatever the first token. A Metaspace
        decoder drops every `▁` of the first token instead and keeps a byte fallback
        space: `▁▁` (bytes "  ") reads "", `▁a▁b` reads "ab", `<0x20>` reads " ".
        Asked of the decoder, the token followed by " x" (a Strip may go on into it)."""
        data = self(token_id)
        piece = self.tokenizer.id_to_token(token_id)
        if not data.startswith(b" ") or piece is None or self.tokenizer.decoder is None:
            return False
        try:
            text: str = self.tokenizer.decoder.decode([piece, self.piece(" x")])
        except Exception:  # noqa: BLE001 - tokenizers raises plain exceptions
            return False
        return text == (data[1:] + b" x").decode("utf-8", errors="replace")

    def piece(self, text: str) -> str:
        """`text` spelled as the vocabulary spells its pieces, the reading above reversed:
        GPT-2's byte alphabet, or the decoder's substitutions undone (a space as ▁)."""
        if self.byte_level:
            return "".join(BYTE_CHARS[b] for b in text.encode())
        for old, new in self.replace:
            text = text.replace(new, old)
        return text


def _decoders(decoder: Any) -> Iterator[dict[str, Any]]:
    """The decoder and, for a Sequence, every decoder inside it."""
    if not isinstance(decoder, dict):
        return
    yield decoder
    for inner in decoder.get("decoders") or ():
        yield from _decoders(inner)
