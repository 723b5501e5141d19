"""SentencePiece Unigram tokenizers (XGLM's, mBART's, ALBERT's kind), built locally with
`tokenizers` over a few hundred lines of varied text, its pieces in tokenizer.json's list
form (`"vocab": [[piece, score], ...]`, the index is the id). Ids 0-3
are <s>, <pad>, </s> (EOS) and <unk>, as XGLM has them; its post-processor puts </s> first.
Accented letters, CJK and emoji are pieces of their own; with byte fallback the 256 byte
pieces <0x00>..<0xFF> follow the specials, and a character the vocabulary lacks (ÿ, €, 𝄞,
a newline) splits over byte tokens; without it (XGLM) such a character is <unk>."""

from __future__ import annotations

import math
import random
from collections import Counter

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


def _pieces(vocab_size: int) -> list[tuple[str, float]]:
    """The corpus's characters and its most frequent substrings of 2-6 characters (a word
    with its `▁`, as SentencePiece sees it), each scored by its log frequency: the seed
    vocabulary a UnigramTrainer starts from. (The trainer itself orders tied pieces
    differently from run to run, and so would the ids and a random model's replies.)"""
    words = [f"▁{w}" for line in corpus() for w in line.split(" ")]
    chars = Counter(c for w in words for c in w)
    subs = Counter(w[i:i + n] for w in words for n in range(2, 7)
                   for i in range(len(w) - n + 1))
    room = vocab_size - len(SPECIAL) - len(chars)
    counts = {**chars, **dict(sorted(subs.items(), key=lambda kv: (-kv[1], kv[0]))[:room])}
    total = sum(counts.values())
    return sorted(((p, math.log(n / total)) for p, n in counts.items()),
                  key=lambda ps: (-ps[1], ps[0]))


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

    vocab = [(t, 0.0) for t in SPECIAL]
    if byte_fallback:  # score 0, as SentencePiece's byte pieces
        vocab += [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    vocab += _pieces(vocab_size)
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
