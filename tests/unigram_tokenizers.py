"""SentencePiece Unigram tokenizers (XGLM's, mBART's, ALBERT's kind), built locally with
`tokenizers`: a UnigramTrainer over a few hundred lines of varied text, its pieces in
tokenizer.json's list form (`"vocab": [[piece, score], ...]`, the index is the id). Ids 0-3
are <s>, <pad>, </s> (EOS) and <unk>, as XGLM has them; its post-processor puts </s> first.
Accented letters, CJK and emoji are pieces of their own; with byte fallback the 256 byte
pieces <0x00>..<0xFF> follow the specials, and a character the vocabulary lacks (ÿ, €, 𝄞,
a newline) splits over byte tokens; without it (XGLM) such a character is <unk>."""

from __future__ import annotations

import json
import random

WORDS = ("the quick brown fox jumps over lazy dog hello world secret jade amber ruby name "
         "age true false null yes no calm glad sad naïve café über déjà vu façade señor "
         "你好 世界 東京 日本語 한국어 😀 🎉 👍 Ωμέγα привет мир").split()
MARKS = [*",.;:!?-_()[]{}\"'", "0123", "42", "3.14", "1e5"]
SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]


def corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """Lines of words, marks and made-up syllables (so the trainer finds pieces of several
    letters), and a JSON object."""
    rng = random.Random(seed)

    def word() -> str:
        if rng.random() < 0.7:
            return rng.choice(WORDS + MARKS)
        return "".join(rng.choice("aeioubdklmnprst") for _ in range(rng.randint(2, 7)))

    text = [" ".join(word() for _ in range(rng.randint(3, 12))) for _ in range(lines)]
    return text + ['{"name": "Ada", "age": 36, "ok": true, "tags": ["x", "y"]}'] * 20


def _trained_pieces(vocab_size: int) -> list[list]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    trainee = Tokenizer(models.Unigram())
    trainee.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    trainee.train_from_iterator(corpus(), trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, unk_token="<unk>", max_piece_length=8,
        show_progress=False))
    return json.loads(trainee.to_str())["model"]["vocab"]


def unigram(byte_fallback: bool = True, metaspace: bool = True, vocab_size: int = 300):
    """`metaspace`: XGLM's form (transformers' SpmConverter): a Metaspace pre-tokenizer
    and decoder (prepend "always"), so a reply's first token loses its `▁`. Otherwise a
    Gemma-like form: the normalizer writes spaces as `▁`, no space is prepended, and the
    decoder keeps every space."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    pieces = _trained_pieces(vocab_size)
    vocab = [tuple(p) for p in pieces[:len(SPECIAL)]]
    if byte_fallback:  # score 0, as SentencePiece's byte pieces
        vocab += [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    vocab += [tuple(p) for p in pieces[len(SPECIAL):]]
    tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=byte_fallback))
    fallback = [decoders.ByteFallback(), decoders.Fuse()] if byte_fallback else []
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
        tok.decoder = decoders.Sequence(
            [decoders.Metaspace(prepend_scheme="always"), *fallback])
    else:
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), *fallback])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    tok.post_processor = processors.TemplateProcessing(
        single="</s> $A", pair="</s> $A </s> </s> $B", special_tokens=[("</s>", 2)])
    return tok
