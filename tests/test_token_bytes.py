"""Each token's exact bytes (sdk/token_bytes.py), for logprobs: joined, a text's tokens'
bytes are the text, whatever the tokenizer's kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from edgeprefill.sdk.token_bytes import TokenBytes
from tests.bpe_tokenizers import byte_fallback_bpe, byte_level_bpe, metaspace_bpe

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["hello world \U0001F600 \u754c", " the secret is jade ."]


@pytest.mark.parametrize("make", [byte_level_bpe, byte_fallback_bpe], ids=["byte-level",
                                                                          "byte-fallback"])
@pytest.mark.parametrize("text", TEXTS)
def test_bytes_of_a_texts_tokens_join_to_the_text(make, text):
    tok = make()
    ids = tok.encode(text, add_special_tokens=False).ids
    pieces = [TokenBytes(tok)(i) for i in ids]
    assert b"".join(pieces) == text.encode()
    if "\U0001F600" in text:  # some token holds a part of the emoji's four bytes
        assert any(0 < len(p) < 4 and p[0] >= 0x80 for p in pieces)


def test_the_shipped_sentencepiece_style_tokenizer_keeps_each_words_space():
    tok = Tokenizer.from_file(str(ROOT / "models" / "tiny-recall" / "tokenizer.json"))
    ids = tok.encode("the secret is jade", add_special_tokens=False).ids
    # Metaspace prepends the first word's space too: the bytes are what the pieces hold.
    assert [TokenBytes(tok)(i) for i in ids] == [b" the", b" secret", b" is", b" jade"]
    assert TokenBytes(tok)(tok.token_to_id("<0x94>")) == b"\x94"
    assert TokenBytes(tok)(tok.token_to_id("</s>")) == b"</s>"  # an added token: its text


def test_a_word_level_tokenizer_gives_each_word_decoded_alone():
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "jade": 1, "ruby": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert [TokenBytes(tok)(i) for i in tok.encode("jade ruby").ids] == [b"jade", b"ruby"]


@pytest.mark.parametrize("make", [byte_level_bpe, byte_fallback_bpe], ids=["byte-level",
                                                                          "byte-fallback"])
def test_piece_spells_text_as_the_vocabulary_does(make):
    # The reverse of the reading (constraints.py spells added tokens with it).
    tok = make()
    spell = TokenBytes(tok).piece
    for token_id in tok.encode(" the secret is jade .", add_special_tokens=False).ids:
        assert spell(TokenBytes(tok)(token_id).decode()) == tok.id_to_token(token_id)


def test_strips_first_space_follows_what_the_decoder_does():
    # Llama 2 / Mistral style (the shipped tiny model): Strip(" ", start=1) after Fuse, so
    # a reply opening with `▁jade` reads "jade". A Metaspace decoder does the same.
    tiny = Tokenizer.from_file(str(ROOT / "models" / "tiny-recall" / "tokenizer.json"))
    assert tiny.decode([tiny.token_to_id("▁jade")]) == "jade"
    assert TokenBytes(tiny).strips_first_space()
    metaspace = byte_fallback_bpe()
    metaspace.decoder = decoders.Metaspace(prepend_scheme="always")
    assert TokenBytes(metaspace).strips_first_space()
    # Byte-level BPE, and byte fallback without a Strip (Gemma style), keep every space.
    for tok in (byte_level_bpe(), byte_fallback_bpe()):
        assert not TokenBytes(tok).strips_first_space()
        assert tok.decode(tok.encode(" jade", add_special_tokens=False).ids) == " jade"


@pytest.mark.parametrize("scheme", ["first", "always"])
def test_a_metaspace_decoder_drops_every_space_of_the_first_token(scheme):
    # A Metaspace decoder (either scheme, split or not) drops every `▁` of the text's first
    # token and keeps a byte fallback space; later tokens read as their bytes. The
    # constraint wrapper needs a first token to lose exactly one space.
    tok = metaspace_bpe(scheme)
    spell = TokenBytes(tok)
    assert spell.strips_first_space()
    the = tok.token_to_id("▁the")
    reads = {p: tok.decode([tok.token_to_id(p), the]) for p in
             ("▁", "▁▁", "▁▁▁", "▁a▁b", "▁▁the", "<0x20>", "▁t")}
    assert reads == {"▁": " the", "▁▁": " the", "▁▁▁": " the", "▁a▁b": "ab the",
                     "▁▁the": "the the", "<0x20>": "  the", "▁t": "t the"}
    for piece, text in reads.items():
        data = spell(tok.token_to_id(piece))
        exact = text == (data[1:] + b" the").decode()
        assert spell.opens_one_space_short(tok.token_to_id(piece)) == exact, piece
        assert exact == (piece in ("▁", "▁t"))


def test_llama2_style_first_tokens_lose_exactly_one_space():
    # Strip(" ", start=1) after Fuse: whatever opens the text, `▁▁` and `<0x20>` included.
    tiny = Tokenizer.from_file(str(ROOT / "models" / "tiny-recall" / "tokenizer.json"))
    spell, the = TokenBytes(tiny), tiny.token_to_id("▁the")
    spaced = [i for i in range(tiny.get_vocab_size()) if spell(i).startswith(b" ")]
    assert len(spaced) > 100 and tiny.token_to_id("<0x20>") in spaced
    for token_id in spaced:
        text = tiny.decode([token_id, the])
        assert text == (spell(token_id)[1:] + b" the").decode()
        assert spell.opens_one_space_short(token_id)
