"""Checkpoints with slow tokenizer files only (export/slow_tokenizer.py): a SentencePiece
tokenizer.model (BPE with byte fallback, as Llama 2's; Unigram) or GPT-2's vocab.json +
merges.txt, each built here and put beside a tiny random model. The bundle's tokenizer
must split text as the original does: sentencepiece's own encoder, and the `tokenizers`
object GPT-2's files were written from, are the references. Refusals are one line."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

spm = pytest.importorskip("sentencepiece")
pytest.importorskip("transformers")

from edgeprefill.errors import ExportError  # noqa: E402
from edgeprefill.export import slow_tokenizer  # noqa: E402
from edgeprefill.export.exporter import ExportOptions, export  # noqa: E402
from edgeprefill.sdk import Engine, GenerationParams  # noqa: E402
from tests.conftest import build_hf_model, load_hf_model  # noqa: E402
from tests.test_cli_errors import cli  # noqa: E402

CORPUS = [
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Hello world, this is a small corpus for testing tokenizers.",
    "naïve café résumé über 你好世界 東京 and   runs of  spaces\tand tabs",
] * 40
# Not the exporter's probes: what the test checks is its own.
TEXTS = ["Hello there, world!", "a lazy fox 42 times", "résumé 東京 ⚡ Ωmega",
         "tabs\tand  double  spaces ", "unseen: zebra quizzes"]
MARKER = "<|im_start|>"
TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"
# As Llama 2's tokenizer.model: no normalization, whitespace kept (SentencePiece's default
# NFKC and whitespace collapsing are what transformers' Llama conversion drops).
LLAMA_LIKE = {"normalization_rule_name": "identity", "remove_extra_whitespaces": False}
OPTIONS = ExportOptions(chunks=(16,), max_context=64, show_progress=False)


def train_spm(folder: Path, **options) -> Path:
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(CORPUS), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "m"), vocab_size=400,
        byte_fallback=True, character_coverage=1.0, minloglevel=2, **options)
    return folder / "m.model"


def slow_checkpoint(root: Path, family: str, vocab_size: int, files: dict[str, Path],
                    tokenizer_config: dict) -> Path:
    """A tiny random `family` model whose tokenizer is `files` (name -> source) alone."""
    hf = build_hf_model(family, root / "hf", vocab_size=vocab_size)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).unlink()
    for name, source in files.items():
        shutil.copyfile(source, hf / name)
    (hf / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return hf


def llama_config(**extra) -> dict:
    return {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "add_bos_token": True, "chat_template": TEMPLATE, **extra}


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory) -> Path:
    """As Llama 2's: with a chat marker as a control token (special: the fast tokenizer
    reads its text as the one token)."""
    return train_spm(tmp_path_factory.mktemp("spm-bpe"), model_type="bpe",
                     control_symbols=[MARKER], **LLAMA_LIKE)


@pytest.fixture(scope="module")
def llama_slow(bpe_model, tmp_path_factory) -> Path:
    return slow_checkpoint(tmp_path_factory.mktemp("llama-slow"), "llama", 400,
                           {"tokenizer.model": bpe_model}, llama_config())


@pytest.fixture(scope="module")
def llama_bundle(llama_slow, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("llama-slow-bundle") / "b"
    export(llama_slow, out, OPTIONS)
    return out


def test_a_sentencepiece_checkpoint_splits_text_as_sentencepiece(llama_bundle, bpe_model):
    reference = spm.SentencePieceProcessor(model_file=str(bpe_model))
    marker = reference.piece_to_id(MARKER)
    with Engine.load(llama_bundle) as engine:
        for text in TEXTS:
            assert engine.tokenizer.encode_plain(text) == reference.encode(text), text
            # add_bos_token: a text prompt starts with <s>, as transformers' tokenizer's
            assert engine.tokenizer.encode(text) == [reference.bos_id(), *reference.encode(text)]
        assert engine.tokenizer.decode(reference.encode(TEXTS[2])) == TEXTS[2]
        assert engine.tokenizer.encode_plain(f"Hi there{MARKER}") == [
            *reference.encode("Hi there"), marker]


def test_spaces_read_the_legacy_way_as_sentencepiece_writes_them(llama_bundle, bpe_model):
    """A text that starts with a space keeps it (" hi" -> ▁▁hi), and each stretch after a
    special token gets its own dummy prefix, as sentencepiece encodes each stretch (and as
    Llama 2's own tokenizer.json does; transformers 5's conversion gives ▁hi and hi)."""
    reference = spm.SentencePieceProcessor(model_file=str(bpe_model))
    marker = reference.piece_to_id(MARKER)
    with Engine.load(llama_bundle) as engine:
        for text in (" Hello there", "  two spaces first"):
            assert engine.tokenizer.encode_plain(text) == reference.encode(text), text
        assert engine.tokenizer.encode_plain(f"{MARKER}Hi there{MARKER} lazy fox") == [
            marker, *reference.encode("Hi there"), marker, *reference.encode(" lazy fox")]
        assert engine.tokenizer.encode_plain("</s>Hello") == [reference.eos_id(),
                                                             *reference.encode("Hello")]
        # and what is decoded is what was encoded
        ids = engine.tokenizer.encode_plain(" Hello there")
        assert engine.tokenizer.decode(ids) == " Hello there"


def test_a_config_that_says_non_legacy_keeps_transformers_spaces(tmp_path, bpe_model):
    from transformers import AutoTokenizer

    hf = slow_checkpoint(tmp_path, "llama", 400, {"tokenizer.model": bpe_model},
                         llama_config(legacy=False))
    export(hf, tmp_path / "b", OPTIONS)
    reference = AutoTokenizer.from_pretrained(hf)
    with Engine.load(tmp_path / "b") as engine:
        for text in (" Hello there", f"{MARKER}Hi there", *TEXTS):
            assert engine.tokenizer.encode_plain(text) == reference.encode(
                text, add_special_tokens=False), text


def test_user_defined_pieces_stay_inside_the_stretch(tmp_path, caplog):
    """A user-defined piece (plain text, always whole) is an added token of the fast
    tokenizer, which would cut the text there and prefix what follows where the model adds
    a dummy prefix: such a model keeps transformers' spaces, and its pieces split as
    sentencepiece splits them."""
    model = train_spm(tmp_path, model_type="bpe", user_defined_symbols=["<tool>"],
                      **LLAMA_LIKE)
    hf = slow_checkpoint(tmp_path, "llama", 400, {"tokenizer.model": model}, llama_config())
    with caplog.at_level(logging.WARNING):
        export(hf, tmp_path / "b", OPTIONS)
    assert "non-legacy" in caplog.text
    reference = spm.SentencePieceProcessor(model_file=str(model))
    with Engine.load(tmp_path / "b") as engine:
        for text in ("call <tool> now", "a <tool><tool> b", *TEXTS):
            assert engine.tokenizer.encode_plain(text) == reference.encode(text), text


def test_greedy_generation_runs_as_transformers_does(llama_bundle, llama_slow):
    import torch

    with Engine.load(llama_bundle) as engine:
        prompt = engine.tokenizer.encode(TEXTS[0])
        got = engine.generate(prompt, GenerationParams(max_new_tokens=6)).result().token_ids
    model = load_hf_model(llama_slow)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                             eos_token_id=None)
    assert got == out[0, len(prompt):].tolist()


def test_the_checkpoint_is_left_as_it_was_and_its_template_kept(llama_bundle, llama_slow):
    assert not (llama_slow / "tokenizer.json").exists()
    manifest = json.loads((llama_bundle / "edgeprefill.json").read_text())
    assert "tokenizer.json" in manifest["files"]
    assert manifest["tokenizer"]["chat_template"] == TEMPLATE
    assert json.loads((llama_bundle / "tokenizer_config.json").read_text()) == llama_config()
    with Engine.load(llama_bundle) as engine:
        text = engine.tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert text == "[user] hi</s>"


def test_a_unigram_model_splits_text_as_sentencepiece(tmp_path, caplog):
    """A Unigram tokenizer.model under the generic fast class (no Llama BPE merges)."""
    model = train_spm(tmp_path, model_type="unigram", hard_vocab_limit=False, **LLAMA_LIKE)
    reference = spm.SentencePieceProcessor(model_file=str(model))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", "unk_token": "<unk>"}
    hf = slow_checkpoint(tmp_path, "llama", reference.get_piece_size(),
                         {"tokenizer.model": model}, config)
    with caplog.at_level(logging.WARNING, logger=slow_tokenizer.__name__):
        export(hf, tmp_path / "b", OPTIONS)
    assert "has no tokenizer.json: converted its tokenizer.model with transformers (its " \
           "ids equal sentencepiece's on 7 probe strings" in caplog.text
    with Engine.load(tmp_path / "b") as engine:
        for text in TEXTS:
            assert engine.tokenizer.encode_plain(text) == reference.encode(text), text


def test_gpt2_files_split_text_as_the_tokenizer_they_were_written_from(tmp_path):
    """Exported through the CLI: its warning, the manifest and `inspect` say the converted
    tokenizer was checked against export/bpe_reference.py (tests/test_bpe_reference.py
    checks that reference against `tokenizers`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    original = Tokenizer(models.BPE())
    original.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    original.decoder = decoders.ByteLevel()
    original.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    files = tmp_path / "files"
    files.mkdir()
    original.model.save(str(files))  # vocab.json, merges.txt
    config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
              "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
              "add_prefix_space": False, "model_max_length": 1024}
    hf = slow_checkpoint(tmp_path, "gpt2", original.get_vocab_size(),
                         {n: files / n for n in ("vocab.json", "merges.txt")}, config)
    done = cli("export", hf, "-o", tmp_path / "b", "--chunks", "16", "--max-context", "64",
               "--quiet")
    assert done.returncode == 0, done.stderr
    checked = ("its ids equal edgeprefill's own byte-level BPE's, reading the files as "
               "GPT2Tokenizer does, on 13 probe strings and beside its special tokens")
    assert f"converted its vocab.json + merges.txt with transformers ({checked})" in \
        done.stderr
    manifest = json.loads((tmp_path / "b" / "edgeprefill.json").read_text())
    assert manifest["source"]["tokenizer"] == {"converted_from": "vocab.json + merges.txt",
                                               "check": checked}
    assert f"by transformers ({checked})" in cli("inspect", tmp_path / "b").stdout
    with Engine.load(tmp_path / "b") as engine:
        for text in [*TEXTS, "end<|endoftext|>"]:
            assert engine.tokenizer.encode(text) == original.encode(text).ids, text


def test_a_conversion_that_splits_otherwise_is_refused(tmp_path, bpe_model):
    """SentencePiece's default NFKC normalization and whitespace collapsing, which
    transformers' Llama conversion leaves out: the first probe that differs is named."""
    model = train_spm(tmp_path, model_type="bpe")
    hf = slow_checkpoint(tmp_path, "llama", 400, {"tokenizer.model": model}, llama_config())
    with pytest.raises(ExportError, match=r"splits 'two  spaces, .* otherwise than "
                                          r"sentencepiece") as err:
        export(hf, tmp_path / "b", OPTIONS)
    assert "\n" not in str(err.value).replace("\\n", "")
    assert not (tmp_path / "b").exists()


def run_export(hf: Path, out: Path) -> str:
    """`edgeprefill export` through the console entry point: its one-line error."""
    done = cli("export", hf, "-o", out, "--chunks", "16", "--max-context", "64", "--quiet")
    assert done.returncode != 0
    assert "Traceback" not in done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr


def test_a_checkpoint_without_tokenizer_files_is_refused(tmp_path):
    hf = build_hf_model("llama", tmp_path / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).unlink()
    output = run_export(hf, tmp_path / "b")
    assert "has no tokenizer: looked for tokenizer.json, tokenizer.model, " \
           "vocab.json + merges.txt" in output


def test_a_corrupt_sentencepiece_model_is_refused(tmp_path):
    damaged = tmp_path / "damaged.model"
    damaged.write_bytes(b"\x0a\x05hello not a model\xff\x00")
    hf = slow_checkpoint(tmp_path, "llama", 400, {"tokenizer.model": damaged}, llama_config())
    output = run_export(hf, tmp_path / "b")
    assert "cannot convert" in output and "sentencepiece cannot read it" in output
    assert "AutoTokenizer.from_pretrained(dir).save_pretrained(dir)" in output


def test_a_tokenizer_class_of_custom_code_is_not_run(tmp_path, bpe_model):
    """A class that is no copy of Llama's (Qwen's first models read tiktoken's format;
    export/remote_tokenizer.py lists those read as Llama's)."""
    folder = tmp_path / "custom"
    folder.mkdir()
    shutil.copyfile(bpe_model, folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "QWenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_qwen.QWenTokenizer", None]}}))
    with pytest.raises(ExportError, match="the checkpoint's own code, which export does "
                                          "not run .*trust_remote_code=True"):
        slow_tokenizer.convert(folder)


def test_without_sentencepiece_the_check_is_skipped_and_said(llama_slow, monkeypatch,
                                                             caplog):
    """transformers 5.24 needs sentencepiece to convert a tokenizer.model at all; another
    reader of it (a tiktoken file) leaves nothing to check against: the log line says so."""
    converted = slow_tokenizer._converted(llama_slow, "tokenizer.model")
    monkeypatch.setattr(slow_tokenizer, "_converted", lambda *_: converted)
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with caplog.at_level(logging.WARNING, logger=slow_tokenizer.__name__):
        assert slow_tokenizer.convert(llama_slow).tokenizer is converted
    assert "not checked against sentencepiece, which is not installed" in caplog.text


@pytest.mark.parametrize("missing, says", [
    ("transformers", "needs transformers: pip install 'edgeprefill[export]'"),
    ("sentencepiece", "sentencepiece and protobuf packages (pip install sentencepiece "
                      "protobuf)"),
])
def test_a_missing_package_is_named(llama_slow, monkeypatch, missing, says):
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError
    with pytest.raises(ExportError) as err:
        slow_tokenizer.convert(llama_slow)
    assert says in str(err.value)


def test_a_config_that_says_legacy_reads_spaces_as_sentencepiece(tmp_path, bpe_model):
    """transformers converts an explicit `legacy: true` with prepend_scheme "always" (a
    prefix after special tokens, still ▁hi for " hi"): the bundle's is sentencepiece's."""
    hf = slow_checkpoint(tmp_path, "llama", 400, {"tokenizer.model": bpe_model},
                         llama_config(legacy=True))
    export(hf, tmp_path / "b", OPTIONS)
    reference = spm.SentencePieceProcessor(model_file=str(bpe_model))
    with Engine.load(tmp_path / "b") as engine:
        for text in (" Hello there", "  two spaces first", *TEXTS):
            assert engine.tokenizer.encode_plain(text) == reference.encode(text), text


def test_the_manifest_and_inspect_say_the_tokenizer_was_converted(llama_bundle, hf_model,
                                                                   tmp_path):
    manifest = json.loads((llama_bundle / "edgeprefill.json").read_text())
    assert manifest["source"]["tokenizer"]["converted_from"] == "tokenizer.model"
    assert "sentencepiece" in manifest["source"]["tokenizer"]["check"]
    shown = cli("inspect", llama_bundle)
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("tokenizer "))
    assert "converted from the checkpoint's tokenizer.model by transformers" in line
    # a bundle whose checkpoint had its tokenizer.json says nothing of the kind
    export(hf_model("llama"), tmp_path / "b", OPTIONS)
    assert "tokenizer" not in json.loads((tmp_path / "b" / "edgeprefill.json").read_text())[
        "source"]
    assert "converted from" not in cli("inspect", tmp_path / "b").stdout
