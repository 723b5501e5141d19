"""GPT-2's byte-level BPE as export/bpe_reference.py implements it, against the
`tokenizers` objects GPT-2-style vocab.json + merges.txt are written from (trained here:
GPT-2's pre-tokenization, and Qwen2's with the regex transformers' Qwen2Tokenizer holds),
then the check the exporter makes with it: a converted tokenizer that splits otherwise
is refused in one line (a checked GPT-2 export, and what its manifest and `inspect` say:
tests/test_slow_tokenizer.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("regex")
pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from edgeprefill.errors import ExportError  # noqa: E402
from edgeprefill.export import bpe_reference, slow_tokenizer  # noqa: E402
from tests.test_slow_tokenizer import run_export, slow_checkpoint  # noqa: E402

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024; we'll see 12345 of them.",
    "Hello world, this is a small corpus for testing tokenizers. They've said I'd do it.",
    "naïve café résumé über 你好世界 東京 and   runs of  spaces\tand tabs\n\nnew lines",
    "emoji 🙂🚀 and code: x = [1, 2]; if (a >= b) { return c; }\r\n",
] * 30
# Not the exporter's probes: what this test checks is its own.
TEXTS = [
    "Hello world",
    "two  spaces,   three and a trailing run   ",
    "lines\n\nand\r\nCR LF\n   indented\tand tabbed",
    "digits 7 42 2024 1234567 and 3.14159",
    "it's they're I'LL we'd You've SHE'S",
    "你好，世界。東京の天気",
    "emoji 🙂🚀👍 and ∑ € ¥ symbols",
    " a space first",
    "unseen: zebra quizzes, xylophones!",
    "café naïve",  # precomposed
    "cafe\u0301 nai\u0308ve",  # decomposed (Qwen2 normalizes to NFC)
]
ENDOFTEXT = "<|endoftext|>"


def trained(pre_tokenizer, normalizer=None, special=(ENDOFTEXT,)):
    """A byte-level BPE trained on CORPUS with `pre_tokenizer` (its last step ByteLevel),
    as the files a checkpoint ships were written from."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    original = Tokenizer(models.BPE())
    original.normalizer = normalizer
    original.pre_tokenizer = pre_tokenizer
    original.decoder = decoders.ByteLevel()
    original.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=420, special_tokens=list(special), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return original


def gpt2_original(special=(ENDOFTEXT,)):
    from tokenizers import pre_tokenizers

    return trained(pre_tokenizers.ByteLevel(add_prefix_space=False), special=special)


def qwen2_original():
    """Qwen2's pre-tokenization, its regex taken from transformers (the reference keeps
    its own copy), and its NFC normalizer."""
    from tokenizers import Regex, normalizers, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    return trained(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        normalizers.NFC())


def write_files(original, folder: Path, tokenizer_config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    original.model.save(str(folder))  # vocab.json, merges.txt
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    original = gpt2_original()
    folder = write_files(original, tmp_path_factory.mktemp("gpt2-files"),
                         {"tokenizer_class": "GPT2Tokenizer"})
    return original, folder


def test_the_reference_splits_text_as_the_tokenizer_the_files_were_written_from(gpt2):
    original, folder = gpt2
    reference = bpe_reference.load(folder)
    for text in [*TEXTS, f"end{ENDOFTEXT}start", f"{ENDOFTEXT}{ENDOFTEXT} x"]:
        assert reference.encode(text) == original.encode(text).ids, text
    # GPT-2's regex keeps a run of digits together (a merged piece of several digits)
    assert any(len(original.id_to_token(i)) > 1
               for i in reference.encode("12345") if original.id_to_token(i).isdigit())


def test_a_qwen2_tokenizer_splits_each_digit_and_normalizes_to_nfc(tmp_path):
    original = qwen2_original()
    folder = write_files(original, tmp_path, {"tokenizer_class": "Qwen2Tokenizer"})
    reference = bpe_reference.load(folder)
    for text in TEXTS:
        assert reference.encode(text) == original.encode(text).ids, text
    assert [original.id_to_token(i) for i in reference.encode("2024")] == list("2024")
    assert reference.encode("cafe\u0301") == reference.encode("café")


def test_added_tokens_and_the_bos_are_the_class_s(tmp_path):
    """An added token from tokenizer_config.json's added_tokens_decoder (an id past
    vocab.json's) is cut out whole; add_bos_token puts the bos_token first (as OPT's
    checkpoints put their </s>; they name no class: config.json's model_type "opt" is
    read with GPT-2's)."""
    from tokenizers import AddedToken

    original = gpt2_original()
    config = {"bos_token": ENDOFTEXT, "add_bos_token": True,
              "added_tokens_decoder": {"420": {"content": "<tool>", "special": False}}}
    folder = write_files(original, tmp_path, config)
    (folder / "config.json").write_text(json.dumps({"model_type": "opt"}))
    original.add_tokens([AddedToken("<tool>", normalized=False)])
    assert original.token_to_id("<tool>") == 420
    reference = bpe_reference.load(folder)
    for text in ("call <tool> now", "a<tool><tool>b", *TEXTS[:3]):
        assert reference.encode(text) == original.encode(text).ids, text
        assert reference.encode(text, add_special_tokens=True) == [
            original.token_to_id(ENDOFTEXT), *original.encode(text).ids]


def test_a_roberta_style_class_puts_its_cls_and_sep_around_a_text(tmp_path):
    """RoBERTa's and BART's classes wrap every text in <s> ... </s> (`tokenizers`'
    RobertaProcessing as the independent reading), whatever add_bos_token says."""
    from tokenizers import processors

    original = gpt2_original(special=("<s>", "<pad>", "</s>", "<unk>", "<mask>"))
    original.post_processor = processors.RobertaProcessing(
        ("</s>", original.token_to_id("</s>")), ("<s>", original.token_to_id("<s>")))
    folder = write_files(original, tmp_path, {"tokenizer_class": "BartTokenizer"})
    reference = bpe_reference.load(folder)
    for text in ("Hello world", "a <mask> b</s>", TEXTS[2]):
        assert reference.encode(text, add_special_tokens=True) == original.encode(text).ids


@pytest.mark.parametrize("config, says", [
    ({"tokenizer_class": "GPTNeoXTokenizer"},
     "not checked: no reference for tokenizer class GPTNeoXTokenizer (only GPT2Tokenizer"),
    ({}, "not checked: tokenizer_config.json names no tokenizer_class, and model_type None "
         "has no reference"),
])
def test_a_class_without_a_reference_is_said_to_be_unchecked(gpt2, tmp_path, config, says):
    original, _ = gpt2
    folder = write_files(original, tmp_path, config)
    assert bpe_reference.check(folder, original, ("Hello",)).startswith(says)


def test_without_the_regex_package_the_check_is_skipped_and_said(gpt2, monkeypatch):
    original, folder = gpt2
    monkeypatch.setitem(sys.modules, "regex", None)  # import raises ImportError
    assert bpe_reference.check(folder, original, ("Hello",)) == \
        "not checked: the regex package is not installed"


def test_a_tokenizer_that_splits_otherwise_is_refused_naming_the_string(gpt2):
    """The GPT-2 files read with Qwen2's digit split: the first probe with digits."""
    _, folder = gpt2
    other = qwen2_original()
    other.model = tokenizers.models.BPE.from_file(str(folder / "vocab.json"),
                                                  str(folder / "merges.txt"))
    with pytest.raises(ExportError, match=r"splits 'The year 2024 .*' otherwise than "
                                          r"GPT2Tokenizer reads GPT-2's files"):
        bpe_reference.check(folder, other, slow_tokenizer.PROBES)


def gpt2_checkpoint(root: Path, original, tokenizer_config: dict, family="gpt2") -> Path:
    files = root / "files"
    files.mkdir()
    original.model.save(str(files))
    return slow_checkpoint(root, family, original.get_vocab_size(),
                           {n: files / n for n in ("vocab.json", "merges.txt")},
                           tokenizer_config)


def test_a_qwen2_config_whose_prefix_space_transformers_puts_everywhere_is_refused(tmp_path):
    """transformers 5's Qwen2Tokenizer honours `add_prefix_space` in its ByteLevel step,
    which runs after the regex: a space goes before every piece that lacks one (each
    digit, each symbol), not before the text. The export is refused in one line."""
    original = qwen2_original()
    hf = gpt2_checkpoint(tmp_path, original, {"tokenizer_class": "Qwen2Tokenizer",
                                              "eos_token": ENDOFTEXT,
                                              "add_prefix_space": True}, family="qwen2")
    output = run_export(hf, tmp_path / "b")
    assert "splits 'The year 2024 had 366 days; 3.14159 is pi.' otherwise than " \
           "Qwen2Tokenizer reads GPT-2's files" in output
    assert "give the checkpoint a tokenizer.json" in output
    assert not (tmp_path / "b").exists()


def test_a_prefix_space_that_transformers_puts_at_the_start_is_checked(gpt2, tmp_path):
    """GPT2Tokenizer's add_prefix_space: one space before a text that has none, as the
    reference reads it; text after a special token is not probed (transformers' slow
    tokenizers put no space there, its fast ones do) and the check says so."""
    from transformers import AutoTokenizer

    original, _ = gpt2
    folder = write_files(original, tmp_path, {"tokenizer_class": "GPT2Tokenizer",
                                              "add_prefix_space": True})
    converted = AutoTokenizer.from_pretrained(folder).backend_tokenizer
    checked = bpe_reference.check(folder, converted, slow_tokenizer.PROBES)
    assert checked.endswith("; text after a special token not probed (add_prefix_space)")
    reference = bpe_reference.load(folder)
    assert reference.encode("Hello") == original.encode(" Hello").ids
