"""GGUF vocabularies other than GPT-2's byte-level BPE, written as llama.cpp's converter
writes them (tests/gguf_files.py): a SentencePiece one (Llama 2 / Mistral / TinyLlama)
tokenizes as the checkpoint's own tokenizer.json (and llama.cpp) does, spaces and byte
fallback included, with its BOS, EOS and chat template in the bundle; a BPE split by
llama.cpp's SmolLM/StarCoder rule splits digits as theirs; other splits are refused
(export/gguf_vocab.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeprefill.export.gguf_input import converted
from tests.bpe_tokenizers import (
    byte_level_bpe,
    digit_split_bpe,
    gemma_bpe,
    install,
    sentencepiece_bpe,
)
from tests.conftest import CHAT_TEMPLATE, build_hf_model, load_hf_model
from tests.gguf_files import write_gguf
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_gguf_input import check_greedy_text, check_logits, cli_here, exported

pytest.importorskip("gguf")

# Where tokenizers disagree: spaces first, several spaces, newlines and tabs, characters
# only byte fallback spells (emoji, CJK, accents), digits, special tokens inside text.
TEXTS = ["hello world", " leading space", "  two leading spaces", "several   spaces  in",
         "new\nline\n\n and\ttab ", "naïve café 你好 😀🎉 🚀 Ωmega", "0123456789 and 2024",
         "x</s>y <s> z", "</s>after", "trailing ", "", "\n"]


def _spm_gguf(root: Path, prefix: bool = True) -> tuple[Path, Path]:
    """A tiny Llama with the Llama 2 style tokenizer, and its GGUF; `prefix=False`: a
    vocabulary without the space prefix (add_space_prefix false in the file)."""
    tok = sentencepiece_bpe()
    if not prefix:
        from tokenizers import decoders, normalizers

        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "),
                                         decoders.ByteFallback(), decoders.Fuse()])
    hf = build_hf_model("llama", root / "hf", vocab_size=tok.get_vocab_size())
    install(tok, hf)
    tok_config = json.loads((hf / "tokenizer_config.json").read_text())
    tok_config.update(add_bos_token=True, add_prefix_space=prefix)
    (hf / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return hf, write_gguf(hf, root / "spm.gguf")


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    return _spm_gguf(tmp_path_factory.mktemp("gguf-spm"))


def assert_same_tokenizer(original_file: Path, got_file: Path, texts: list[str]) -> None:
    """Ids (with the tokenizer's own special tokens) and decoded text equal, text by text."""
    from tokenizers import Tokenizer

    original, got = Tokenizer.from_file(str(original_file)), Tokenizer.from_file(str(got_file))
    for text in texts:
        ids = original.encode(text).ids
        assert got.encode(text).ids == ids, (text, got.encode(text).tokens,
                                             original.encode(text).tokens)
        assert got.decode(ids) == original.decode(ids), text


@pytest.mark.parametrize("prefix", [True, False])
def test_a_sentencepiece_gguf_tokenizes_as_the_checkpoints_tokenizer(tmp_path, prefix):
    """transformers' reading puts a Metaspace pre-tokenizer: " x" -> ▁x (llama.cpp and
    Llama 2's tokenizer: ▁▁x), no ▁ after </s>, a prefix where the file says none."""
    hf, gguf = _spm_gguf(tmp_path, prefix)
    with converted(gguf, tmp_path / "b", show_progress=False) as (folder, _):
        assert_same_tokenizer(hf / "tokenizer.json", folder / "tokenizer.json", TEXTS)


@pytest.mark.slow
def test_a_sentencepiece_gguf_exports_the_model_with_its_tokenizer_and_template(
        spm, tmp_path):
    from edgeprefill.sdk import Engine

    hf, gguf = spm
    bundle = exported(gguf, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, [1, *range(300, 340)])
    check_greedy_text(model, hf, bundle)
    from tokenizers import Tokenizer

    original = Tokenizer.from_file(str(hf / "tokenizer.json"))
    engine = Engine.load(bundle, threads=1, background=False)
    for text in TEXTS:  # the bundle's tokenizer, as `run` encodes a prompt (BOS first)
        assert engine.tokenizer.encode(text) == original.encode(text).ids, text
        ids = original.encode(text).ids
        assert engine.tokenizer.decode(ids) == original.decode(ids), text
        assert engine.tokenizer.decode(ids) == text or "<s>" in text or "</s>" in text
    engine.close()
    manifest = json.loads((bundle / "edgeprefill.json").read_text())
    assert manifest["tokenizer"]["chat_template"] == CHAT_TEMPLATE
    assert (manifest["tokenizer"]["bos_token"], manifest["tokenizer"]["eos_token"]) == (
        "<s>", "</s>")
    assert manifest["bos_token_id"] == 1 and 2 in manifest["eos_token_ids"]
    lines = cli("inspect", bundle).stdout.splitlines()
    assert "chat        template included" in lines


def test_a_gemma3_gguf_tokenizes_as_the_checkpoints_tokenizer_and_ends_turns(tmp_path):
    """Gemma's layout (BOS 2, EOS 1), no space prefix (add_space_prefix false), merges
    derived from the file's order, the turn markers whole; llama.cpp ends a reply at
    `<end_of_turn>` too. (Gemma's whitespace pieces written as user-defined real spaces
    are not modelled: the runs here are plain pieces.)"""
    from tests.test_gguf_input import OVERRIDES

    tok = gemma_bpe()
    hf = build_hf_model("gemma3_text", tmp_path / "hf", vocab_size=tok.get_vocab_size(),
                        bos_token_id=2, eos_token_id=1, **OVERRIDES["gemma3_text"])
    install(tok, hf)
    tok_config = json.loads((hf / "tokenizer_config.json").read_text())
    tok_config.update(bos_token="<bos>", eos_token="<eos>", add_prefix_space=False)
    (hf / "tokenizer_config.json").write_text(json.dumps(tok_config))
    gguf = write_gguf(hf, tmp_path / "gemma.gguf")
    with converted(gguf, tmp_path / "b", show_progress=False) as (folder, _):
        assert_same_tokenizer(hf / "tokenizer.json", folder / "tokenizer.json", [
            *TEXTS, "a  b    c      d", "x\n\n\ny", "<start_of_turn>user\nhi<end_of_turn>\n"])
        generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [1, tok.token_to_id("<end_of_turn>")]


def _bpe_gguf(root: Path, pre: str) -> tuple[Path, Path]:
    tok = digit_split_bpe()
    hf = build_hf_model("llama", root / "hf", vocab_size=tok.get_vocab_size())
    install(tok, hf)
    return hf, write_gguf(hf, root / f"{pre}.gguf", pre=pre)


def test_a_smollm_split_gguf_splits_digits_as_the_checkpoints_tokenizer(tmp_path):
    """transformers splits an unmapped `tokenizer.ggml.pre` as GPT-2 does: " 0123" one
    piece where SmolLM's split (and llama.cpp's) gives one digit a piece."""
    hf, gguf = _bpe_gguf(tmp_path, "smollm")
    with converted(gguf, tmp_path / "b", show_progress=False) as (folder, _):
        assert_same_tokenizer(hf / "tokenizer.json", folder / "tokenizer.json",
                              [*TEXTS, "call 555 1234 or 42", "a1b22c333 x0123456789"])


def test_a_bpe_split_transformers_does_not_read_is_refused_in_one_line(tmp_path, capsys):
    _, gguf = _bpe_gguf(tmp_path, "deepseek-llm")
    result = cli_here(capsys, "export", gguf, "-o", tmp_path / "out")
    assert_one_line_error(result, "deepseek-llm")
    assert "which transformers' GGUF reader does not read" in result.stderr


# The checkpoints' own splits (their tokenizer.json's Split regex), for llama.cpp's names
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")


@pytest.mark.parametrize("pre, split", [
    ("gpt-2", None), ("olmo", None), ("llama-bpe", LLAMA3_SPLIT), ("qwen2", QWEN2_SPLIT),
    ("stablelm2", QWEN2_SPLIT)])
def test_bpe_splits_transformers_reads_tokenize_as_the_checkpoints_tokenizer(
        tmp_path, pre, split):
    """GPT-2's split (and llama.cpp's names for it), Llama 3's and Qwen2's, which
    transformers maps: read as they are; StableLM 2's, llama.cpp's Qwen2 split, as it."""
    from tokenizers import Regex, pre_tokenizers

    tok = byte_level_bpe()
    if split is not None:  # as Llama 3's and Qwen2's tokenizer.json split
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf = build_hf_model("llama", tmp_path / "hf", vocab_size=tok.get_vocab_size())
    install(tok, hf)
    gguf = write_gguf(hf, tmp_path / f"{pre}.gguf", pre=pre)
    with converted(gguf, tmp_path / "b", show_progress=False) as (folder, _):
        assert_same_tokenizer(hf / "tokenizer.json", folder / "tokenizer.json",
                              [*TEXTS, "I'LL don't 12345 x\r\n\r\ny  \n z"])


@pytest.mark.parametrize("harmony", [False, True])
def test_the_ends_of_turn_llama_cpp_stops_at_are_the_bundles_eos_ids(tmp_path, harmony):
    """The file's EOT id and the tokens llama.cpp ends at by name (`<|im_end|>`), where
    transformers keeps the EOS alone; gpt-oss's `<|end|>` ends a message, not a reply."""
    tok = byte_level_bpe()
    ends = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<|im_start|>"]
    tok.add_special_tokens([*ends, *(["<|return|>", "<|call|>"] if harmony else [])])
    hf = build_hf_model("llama", tmp_path / "hf", vocab_size=tok.get_vocab_size())
    install(tok, hf)
    vocab = tok.get_vocab()
    gguf = write_gguf(hf, tmp_path / "chat.gguf", eot=vocab["<|eot_id|>"])
    bundle = exported(gguf, tmp_path / "b")
    expected = [2, vocab["<|eot_id|>"], vocab["<|im_end|>"]]
    expected += [vocab["<|return|>"], vocab["<|call|>"]] if harmony else [vocab["<|end|>"]]
    manifest = json.loads((bundle / "edgeprefill.json").read_text())
    assert sorted(manifest["eos_token_ids"]) == sorted(expected)
