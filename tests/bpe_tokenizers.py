"""Tokenizers that split characters across tokens, built locally with `tokenizers`:
byte-level BPE (GPT-2 / Qwen / Llama 3 style) and byte-fallback BPE (Llama 2 /
SentencePiece style). Ids 0, 1, 2 are <pad>/<unk>, <s> (BOS), </s> (EOS)."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    '{"name": "Ada", "age": 36, "ok": true, "tags": ["x", "y"]}',
    "hello world, the quick brown fox jumps over the lazy dog 0123456789",
    "naïve café über 你好世界 東京 😀🎉👍 a-b_c.d:e;f(g)[h]{i}",
] * 20


def byte_level_bpe(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def byte_fallback_bpe():
    """ASCII letters and a few merges as pieces; everything else falls back to <0xXX>."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁"] + [chr(c) for c in range(33, 127)] + ["▁t", "he", "▁the", "ll", "o▁"]
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("l", "l"), ("o", "▁")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
    ])
    return tok


def install(tok, model_dir: Path) -> None:
    """Replace a checkpoint's tokenizer files with `tok` (EOS </s> = 2)."""
    from tests.conftest import CHAT_TEMPLATE

    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}))


def metaspace_bpe(prepend_scheme: str = "always"):
    """byte_fallback_bpe read by a Metaspace decoder (SentencePiece conversions that keep
    it), with pieces of several spaces and of two words (`▁▁`, `▁a▁b`), as vocabularies
    trained without splitting at spaces have them: first in a text, the decoder drops
    every `▁` of such a piece."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = byte_fallback_bpe().get_vocab()
    for piece in ("▁▁", "▁▁▁", "▁▁▁▁", "▁a▁b", "▁of▁the", "▁▁the", "x▁y"):
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab, [("▁", "t"), ("h", "e"), ("▁t", "he")],
                               unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend_scheme, split=False)
    tok.decoder = decoders.Sequence([
        decoders.Metaspace(prepend_scheme=prepend_scheme, split=False),
        decoders.ByteFallback(), decoders.Fuse(),
    ])
    return tok


def sentencepiece_bpe(vocab_size: int = 460):
    """A Llama 2 style tokenizer.json (Llama-2-7b-hf's, Mistral 7B's, TinyLlama's) with
    a trained vocabulary: <unk>, <s>, </s>, the 256 byte pieces <0x00>..<0xFF>, then
    SentencePiece-style pieces (`▁` for a space) in merge order, 70 characters of the
    corpus (the rest, emoji and most CJK, fall back to bytes); a Prepend("▁") +
    Replace(" ", "▁") normalizer, BOS added."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    special = ["<unk>", "<s>", "</s>"]
    trainee = Tokenizer(models.BPE(unk_token="<unk>"))
    trainee.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=True)
    trainee.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, limit_alphabet=70,
        show_progress=False))
    trained = json.loads(trainee.to_str())["model"]
    pieces = special + [f"<0x{b:02X}>" for b in range(256)] + [
        p for p in sorted(trained["vocab"], key=trained["vocab"].get) if p not in special]
    tok = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)},
                               [tuple(m) for m in trained["merges"]], unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


def digit_split_bpe():
    """byte_level_bpe splitting each digit off first (SmolLM's and StarCoder's split); its
    vocabulary has pieces of several digits ("01", "Ġ0"), as a vocabulary borrowed from
    another model may, which GPT-2's split alone would use."""
    from tokenizers import pre_tokenizers

    tok = byte_level_bpe()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return tok


def gemma_bpe():
    """sentencepiece_bpe's pieces in Gemma's layout and tokenizer.json form: <pad>, <eos>,
    <bos>, <unk>, <mask>, the turn markers, the byte pieces, then the pieces and runs of
    spaces and newlines; a Replace(" ", "▁") normalizer (no space prefix), BOS added."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    spm = json.loads(sentencepiece_bpe().to_str())["model"]
    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>",
               "<end_of_turn>"]
    trained = sorted(spm["vocab"], key=spm["vocab"].get)[3 + 256:]
    runs = [p for p in ("\n", "▁", "▁▁", "▁▁▁▁", "\n\n") if p not in trained]
    pieces = special + [f"<0x{b:02X}>" for b in range(256)] + trained + runs
    merges = [tuple(m) for m in spm["merges"]] + [("▁", "▁"), ("▁▁", "▁▁"), ("\n", "\n")]
    tok = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, merges,
                               unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)])
    return tok
