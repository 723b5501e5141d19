"""Incremental detokenization: the streamed text equals decoding all ids at once, where
characters span tokens, and stop strings split across tokens are found."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgeprefill.sdk.tokenizer import TextStreamer
from tests.bpe_tokenizers import byte_fallback_bpe, byte_level_bpe

TEXTS = [
    "hello world",
    "naïve café über",
    "你好世界 東京",
    "emoji 😀🎉👍 in a row",
    '{"name": "Ada", "tags": ["x", "😀"]}',
]


@pytest.fixture(scope="module", params=["byte-level", "byte-fallback"])
def tokenizer(request):
    tok = byte_level_bpe() if request.param == "byte-level" else byte_fallback_bpe()
    return SimpleNamespace(tokenizer=tok, decode=lambda ids: tok.decode(ids))


def stream(tokenizer, ids, stop=()):
    streamer = TextStreamer(tokenizer, stop)
    pieces = []
    for i in ids:
        pieces.append(streamer.push(i))
        if streamer.stopped:
            break
    return "".join(pieces) + streamer.flush(), pieces, streamer


@pytest.mark.parametrize("text", TEXTS)
def test_stream_equals_decoding_all_ids(tokenizer, text):
    ids = tokenizer.tokenizer.encode(text).ids
    whole, pieces, _ = stream(tokenizer, ids)
    assert whole == tokenizer.tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)  # never half a character


def test_characters_really_span_tokens(tokenizer):
    # Otherwise the test above would prove nothing about split characters.
    tok = tokenizer.tokenizer
    ids = tok.encode("😀").ids
    assert len(ids) > 1 and "\ufffd" in tok.decode(ids[:1])


@pytest.mark.parametrize("text,stop", [
    ("emoji 😀🎉👍 in a row", "🎉👍"), ("你好世界 東京", "世界"), ("hello world", "lo wo"),
])
def test_stop_strings_split_across_tokens_end_the_text(tokenizer, text, stop):
    ids = tokenizer.tokenizer.encode(text).ids
    whole, _, streamer = stream(tokenizer, ids, (stop,))
    assert streamer.stopped
    assert whole == text[: text.index(stop)]


def test_a_partial_stop_string_is_released_when_it_does_not_complete(tokenizer):
    ids = tokenizer.tokenizer.encode("hello world").ids
    whole, pieces, streamer = stream(tokenizer, ids, ("lo x",))
    assert not streamer.stopped and whole == "hello world"


def test_bytes_that_never_make_a_character_are_flushed_as_replacement_characters(tokenizer):
    # A reply that ends inside a character (or on bytes no character starts with) shows
    # them as U+FFFD, as decoding all its ids does, instead of dropping them.
    tok = tokenizer.tokenizer
    ids = tok.encode("ok").ids + tok.encode("😀").ids[:2]
    text, pieces, _ = stream(tokenizer, ids)
    assert text == tok.decode(ids) and text.startswith("ok") and text.endswith("\ufffd")


def test_a_sequence_the_stream_decoder_gives_up_on_still_streams():
    # tokenizers' DecodeStream raises on an ASCII byte token, then a byte no UTF-8
    # character starts with, then a word ("Invalid prefix encountered"); a sampled reply
    # must not end in an error for it.
    from pathlib import Path

    from tokenizers import Tokenizer

    root = Path(__file__).resolve().parent.parent
    tok = Tokenizer.from_file(str(root / "models" / "tiny-recall" / "tokenizer.json"))
    decoder = SimpleNamespace(tokenizer=tok,
                              decode=lambda ids: tok.decode(ids, skip_special_tokens=True))
    ids = [tok.token_to_id(t) for t in ("▁the", "<0x35>", "<0xEB>", "▁river", "▁jade")]
    text, pieces, _ = stream(decoder, ids)
    assert text == "the5\ufffd river jade"  # the valid byte kept, the invalid one U+FFFD


def test_a_reply_keeps_the_special_tokens_a_parser_reads_and_drops_the_others(tokenizer):
    """LFM2's tool-call tags are special tokens: a reply's text keeps them (as
    transformers' decode without skipping special tokens writes them) and still drops
    the others, such as the end of a turn, wherever they come."""
    from tokenizers import AddedToken, Tokenizer

    from edgeprefill.sdk.tokenizer import KEPT_SPECIAL_TOKENS, _dropped_specials, special_ids

    tok = Tokenizer.from_str(tokenizer.tokenizer.to_str())  # a copy: the fixture is shared
    tags = ("<|tool_call_start|>", "<|tool_call_end|>")
    assert set(tags) <= set(KEPT_SPECIAL_TOKENS)
    tok.add_special_tokens([AddedToken(t, special=True) for t in (*tags, "<|im_end|>")])
    start, end, im_end = (tok.token_to_id(t) for t in (*tags, "<|im_end|>"))
    text_ids = [tok.encode(t).ids for t in ("naïve 😀 ", '[f(a="你好")]', " ok")]
    ids = [*text_ids[0], start, *text_ids[1], end, *text_ids[2], im_end]
    decoder = SimpleNamespace(tokenizer=tok, dropped_specials=_dropped_specials(special_ids(tok)),
                              decode=lambda ids: tok.decode(ids))
    text, pieces, _ = stream(decoder, ids)
    assert text == tok.decode([i for i in ids if i != im_end], skip_special_tokens=False)
    assert text == 'naïve 😀 <|tool_call_start|>[f(a="你好")]<|tool_call_end|> ok'
    # Without such tokens every special token is dropped, as before.
    assert _dropped_specials(special_ids(byte_level_bpe())) is None


def test_a_harmony_reply_keeps_its_markers_where_the_tokenizer_is_harmonys(tokenizer):
    """gpt-oss's markers are special tokens: a reply keeps them (the server splits its
    channels on them; without them it read "analysisHmm.assistantfinalHi"), but only
    where the tokenizer has `<|channel|>`: Phi-3's end of turn is `<|end|>` too."""
    from tokenizers import AddedToken, Tokenizer

    from edgeprefill.sdk.tokenizer import _dropped_specials, special_ids

    harmony = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>")
    tok = Tokenizer.from_str(tokenizer.tokenizer.to_str())  # a copy: the fixture is shared
    tok.add_special_tokens([AddedToken(t, special=True) for t in harmony])
    start, channel, message, end, ret = (tok.token_to_id(t) for t in harmony)
    words = {w: tok.encode(w).ids for w in ("analysis", "Hmm.", "assistant", "final", "Hi")}
    ids = [channel, *words["analysis"], message, *words["Hmm."], end, start,
           *words["assistant"], channel, *words["final"], message, *words["Hi"], ret]
    decoder = SimpleNamespace(tokenizer=tok, dropped_specials=_dropped_specials(special_ids(tok)),
                              decode=lambda ids: tok.decode(ids))
    text, _, _ = stream(decoder, ids)
    assert text == tok.decode(ids[:-1], skip_special_tokens=False)  # <|return|> dropped
    assert "<|channel|>" in text and "<|end|>" in text and "<|return|>" not in text

    phi3 = Tokenizer.from_str(tokenizer.tokenizer.to_str())
    phi3.add_special_tokens([AddedToken("<|end|>", special=True)])
    assert _dropped_specials(special_ids(phi3)) is None  # every special token dropped, as before
