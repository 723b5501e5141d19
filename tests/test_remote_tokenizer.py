"""Checkpoints whose tokenizer class is their own code, a copy of transformers' slow
LlamaTokenizer (export/remote_tokenizer.py): InternLM2's folders and Baichuan's ship a
tokenizer.model and tokenization_*.py only. Export reads them as Llama's without running
that code. These classes split text at tokenizer_config.json's added tokens and run
sentencepiece on each stretch; BOS comes first by default. The reference here is that
reading, computed with sentencepiece on the checkpoint's own tokenizer.model and the
added tokens' ids as the config gives them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

spm = pytest.importorskip("sentencepiece")
pytest.importorskip("transformers")

from sentencepiece import sentencepiece_model_pb2  # noqa: E402

from edgeprefill.export import slow_tokenizer  # noqa: E402
from edgeprefill.sdk import Engine, GenerationParams  # noqa: E402
from tests.conftest import load_hf_model  # noqa: E402
from tests.test_cli_errors import assert_one_line_error, cli  # noqa: E402
from tests.test_internlm2 import internlm2_checkpoint  # noqa: E402
from tests.test_slow_tokenizer import LLAMA_LIKE, TEXTS, slow_checkpoint, train_spm  # noqa: E402

# InternLM2's tokenizer.model ends with pieces named [UNUSED_TOKEN_141..146]; its
# tokenizer_config.json's added_tokens_decoder gives their ids the chat tokens' text
# (92543: <|im_start|>, 92542: <|im_end|>, 92541: <|action_start|>, ...).
UNUSED = ["[UNUSED_TOKEN_143]", "[UNUSED_TOKEN_144]", "[UNUSED_TOKEN_145]",
          "[UNUSED_TOKEN_146]"]
CHAT = ["<|action_end|>", "<|action_start|>", "<|im_end|>", "<|im_start|>"]
VOCAB = 400 + len(UNUSED)
IM_START, IM_END = VOCAB - 1, VOCAB - 2
TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] "
            "+ '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
READ_AS_LLAMA = "read as transformers' LlamaTokenizer"


def added(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}


def internlm2_config() -> dict:
    """Shaped as internlm/internlm2-chat-1_8b's tokenizer_config.json."""
    decoder = {"0": added("<unk>"), "1": added("<s>"), "2": added("</s>")}
    decoder.update({str(400 + i): added(text) for i, text in enumerate(CHAT)})
    return {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": CHAT[::-1],
        "auto_map": {"AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer",
                                       "tokenization_internlm2_fast.InternLM2TokenizerFast"]},
        "bos_token": "<s>", "chat_template": TEMPLATE, "clean_up_tokenization_spaces": False,
        "decode_with_prefix_space": False, "eos_token": "</s>", "pad_token": "</s>",
        "sp_model_kwargs": None, "tokenizer_class": "InternLM2Tokenizer", "unk_token": "<unk>"}


def baichuan_token(content: str) -> dict:
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True,
            "rstrip": False, "single_word": True}


def baichuan_config(name: str = "BaichuanTokenizer") -> dict:
    """Shaped as baichuan-inc/Baichuan-13B-Chat's tokenizer_config.json: no add_bos_token,
    so the class's default (true) applies, where transformers 5's LlamaTokenizer adds none."""
    return {"auto_map": {"AutoTokenizer": [f"tokenization_baichuan.{name}", None]},
            "bos_token": baichuan_token("<s>"), "clean_up_tokenization_spaces": False,
            "eos_token": baichuan_token("</s>"), "model_max_length": 4096,
            "pad_token": baichuan_token("<unk>"), "tokenizer_class": name,
            "unk_token": baichuan_token("<unk>")}


@pytest.fixture(scope="module")
def internlm2_model(tmp_path_factory) -> Path:
    """A Llama-like tokenizer.model with InternLM2's unused pieces appended at its end."""
    folder = tmp_path_factory.mktemp("spm-internlm2")
    trained = train_spm(folder, model_type="bpe", **LLAMA_LIKE)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(trained.read_bytes())
    for name in UNUSED:
        piece = proto.pieces.add()
        piece.piece, piece.score = name, -1000.0
    model = folder / "internlm2.model"
    model.write_bytes(proto.SerializeToString())
    assert spm.SentencePieceProcessor(model_file=str(model)).get_piece_size() == VOCAB
    return model


@pytest.fixture(scope="module")
def internlm2_folder(internlm2_model, tmp_path_factory) -> tuple[Path, Path]:
    """(the Llama the checkpoint was packed from, InternLM2's folder with slow files only)."""
    llama, hf = internlm2_checkpoint(tmp_path_factory.mktemp("internlm2-remote"), bias=True,
                                     vocab_size=VOCAB)
    (hf / "tokenizer.json").unlink()
    shutil.copyfile(internlm2_model, hf / "tokenizer.model")
    (hf / "tokenizer_config.json").write_text(json.dumps(internlm2_config()))
    return llama, hf


@pytest.fixture(scope="module")
def internlm2_export(internlm2_folder, tmp_path_factory):
    """`edgeprefill export` of the folder: (the bundle, what the CLI printed)."""
    out = tmp_path_factory.mktemp("internlm2-remote-bundle") / "b"
    done = cli("export", internlm2_folder[1], "-o", out, "--chunks", "16",
               "--max-context", "64")
    assert done.returncode == 0, done.stderr
    return out, done.stdout + done.stderr


def test_internlm2s_tokenizer_reads_text_as_its_own_class(internlm2_export, internlm2_model):
    bundle, _ = internlm2_export
    reference = spm.SentencePieceProcessor(model_file=str(internlm2_model))
    with Engine.load(bundle) as engine:
        for text in TEXTS:
            # add_bos_token: <s> first, as InternLM2Tokenizer's build_inputs_with_special_tokens
            assert engine.tokenizer.encode(text) == [reference.bos_id(), *reference.encode(text)]
        assert engine.tokenizer.decode(reference.encode(TEXTS[2])) == TEXTS[2]


def test_internlm2s_chat_tokens_are_the_ids_its_config_gives(internlm2_export,
                                                             internlm2_model):
    """<|im_start|> is 403, where the model's piece is [UNUSED_TOKEN_146]: one id, that
    one, and each stretch of text around it is sentencepiece's own encoding."""
    bundle, _ = internlm2_export
    reference = spm.SentencePieceProcessor(model_file=str(internlm2_model))
    assert reference.id_to_piece(IM_START) == "[UNUSED_TOKEN_146]"
    with Engine.load(bundle) as engine:
        text = "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
        assert engine.tokenizer.encode_plain(text) == [
            IM_START, *reference.encode("user\nHello there"), IM_END, *reference.encode("\n"),
            IM_START, *reference.encode("assistant\n")]
        for i, token in enumerate(CHAT):
            assert engine.tokenizer.encode_plain(f"a lazy fox{token}") == [
                *reference.encode("a lazy fox"), 400 + i]
        # InternLM2's chat template, rendered and read as the model was trained on it
        messages = [{"role": "user", "content": "Hello there"}]
        assert engine.tokenizer.encode(messages, add_generation_prompt=True) == [
            reference.bos_id(), IM_START, *reference.encode("user\nHello there"), IM_END,
            *reference.encode("\n"), IM_START, *reference.encode("assistant\n")]


def test_internlm2_generates_greedily_as_transformers_does(internlm2_export,
                                                           internlm2_folder):
    import torch

    bundle, _ = internlm2_export
    with Engine.load(bundle) as engine:
        prompt = engine.tokenizer.encode(f"<|im_start|>user\n{TEXTS[0]}<|im_end|>\n")
        got = engine.generate(prompt, GenerationParams(max_new_tokens=6)).result().token_ids
    model = load_hf_model(internlm2_folder[0])  # the Llama its weights were packed from
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                             eos_token_id=None)
    assert len(got) == 6 and got == out[0, len(prompt):].tolist()


def test_the_export_says_the_remote_class_was_read_as_llamas(internlm2_export,
                                                             internlm2_folder):
    bundle, printed = internlm2_export
    assert "its InternLM2Tokenizer (InternLM2's tokenization_internlm2.py, the " \
           f"checkpoint's own code) {READ_AS_LLAMA}" in printed
    said = json.loads((bundle / "edgeprefill.json").read_text())["source"]["tokenizer"]
    assert said["converted_from"] == "tokenizer.model"
    assert "InternLM2Tokenizer" in said["read_as"] and READ_AS_LLAMA in said["read_as"]
    assert "sentencepiece" in said["check"]
    shown = cli("inspect", bundle)
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("tokenizer "))
    assert "InternLM2Tokenizer" in line and READ_AS_LLAMA in line
    # the checkpoint is left as it was; its config is the bundle's, as for any folder
    assert not (internlm2_folder[1] / "tokenizer.json").exists()
    assert json.loads((bundle / "tokenizer_config.json").read_text()) == internlm2_config()


def test_internlm2s_tokenizer_is_read_as_llamas_whatever_the_model(tmp_path,
                                                                   internlm2_model):
    """transformers 5.24 reads a folder whose config.json says `internlm2` with its generic
    backend, the auto_map set aside (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS). A
    folder without that model type (InternVL2's internlm2 LLM, a tokenizer saved alone)
    was refused: the class is what decides, and its spaces are probed the legacy way."""
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copyfile(internlm2_model, folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps(internlm2_config()))
    converted = slow_tokenizer.convert(folder)
    assert converted.read_as is not None and "spaces read the legacy way" in converted.checked
    reference = spm.SentencePieceProcessor(model_file=str(internlm2_model))

    def encode(text: str) -> list[int]:
        return converted.tokenizer.encode(text, add_special_tokens=False).ids

    assert encode(" Hello there") == reference.encode(" Hello there")
    assert encode("<|im_start|>system\n  two spaces<|im_end|>") == [
        IM_START, *reference.encode("system\n  two spaces"), IM_END]


@pytest.mark.parametrize("name, code", [
    ("BaichuanTokenizer", "Baichuan's tokenization_baichuan.py"),
    ("BaiChuanTokenizer", "Baichuan-7B's tokenization_baichuan.py"),
])
def test_a_baichuan_folder_reads_text_as_its_own_class(tmp_path, name, code):
    model = train_spm(tmp_path, model_type="bpe", **LLAMA_LIKE)
    hf = slow_checkpoint(tmp_path, "llama", 400, {"tokenizer.model": model},
                         baichuan_config(name))
    done = cli("export", hf, "-o", tmp_path / "b", "--chunks", "16", "--max-context", "64")
    assert done.returncode == 0, done.stderr
    assert f"its {name} ({code}, the checkpoint's own code) {READ_AS_LLAMA}" in \
        done.stdout + done.stderr
    reference = spm.SentencePieceProcessor(model_file=str(model))
    with Engine.load(tmp_path / "b") as engine:
        for text in TEXTS:
            assert engine.tokenizer.encode(text) == [reference.bos_id(), *reference.encode(text)]
        assert engine.tokenizer.encode_plain(f"{TEXTS[0]}</s>") == [
            *reference.encode(TEXTS[0]), reference.eos_id()]
        result = engine.generate(engine.tokenizer.encode(TEXTS[1]),
                                 GenerationParams(max_new_tokens=4)).result()
    assert len(result.token_ids) == 4


def test_a_remote_class_that_is_not_llamas_is_refused_in_one_line(tmp_path):
    """ChatGLM's class puts [gMASK] and sop first: not a Llama copy, so not read as one."""
    model = train_spm(tmp_path, model_type="bpe", **LLAMA_LIKE)
    hf = slow_checkpoint(tmp_path, "llama", 400, {"tokenizer.model": model}, {
        "tokenizer_class": "ChatGLMTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]}})
    result = cli("export", hf, "-o", tmp_path / "b", "--chunks", "16", "--max-context", "64")
    assert_one_line_error(result, "its tokenizer class is the checkpoint's own code, which "
                                  "export does not run")
    assert not (tmp_path / "b").exists()


def test_an_added_token_that_transformers_moves_is_refused(tmp_path, internlm2_model):
    """Llama's own class with InternLM2's renames: transformers 5 gives <|im_start|> a new
    id past the vocabulary (the model's piece there is [UNUSED_TOKEN_146]), refused rather
    than exported. The model's vocab_size is padded past the new ids, as many are, so
    that the check of ids against vocab_size cannot tell."""
    config = {**internlm2_config(), "tokenizer_class": "LlamaTokenizer"}
    del config["auto_map"]
    hf = slow_checkpoint(tmp_path, "llama", 512, {"tokenizer.model": internlm2_model},
                         config)
    result = cli("export", hf, "-o", tmp_path / "b", "--chunks", "16", "--max-context", "64")
    assert_one_line_error(result, "added token '<|action_end|>' is id 400, but the "
                                  "tokenizer.json transformers converts gives it 404")


def test_baichuan_2_exports_from_its_own_files_and_decodes_as_its_llama(tmp_path):
    """Baichuan's model (W_pack, Baichuan 2's NormHead: tests/test_baichuan.py) and its
    remote tokenizer class together, from a folder with no tokenizer.json, as the Hub's
    Baichuan2-7B-Chat holds them: greedy decoding of a text prompt equals the Llama the
    checkpoint was packed from, its head normalized."""
    import torch

    from tests.test_baichuan import baichuan_checkpoint

    model = train_spm(tmp_path, model_type="bpe", **LLAMA_LIKE)
    llama_dir, hf = baichuan_checkpoint(tmp_path, alibi=False, version=2, vocab_size=400)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).unlink(missing_ok=True)
    shutil.copyfile(model, hf / "tokenizer.model")
    (hf / "tokenizer_config.json").write_text(json.dumps(baichuan_config()))
    done = cli("export", hf, "-o", tmp_path / "b", "--chunks", "16", "--max-context", "64")
    assert done.returncode == 0, done.stderr
    reference = spm.SentencePieceProcessor(model_file=str(model))
    ids = [reference.bos_id(), *reference.encode(TEXTS[1])]
    llama = load_hf_model(llama_dir)
    with torch.no_grad():
        llama.lm_head.weight.copy_(torch.nn.functional.normalize(llama.lm_head.weight))
        expected = llama.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                                  eos_token_id=None)[0, len(ids):].tolist()
    with Engine.load(tmp_path / "b") as engine:
        assert engine.tokenizer.encode(TEXTS[1]) == ids
        result = engine.generate(ids, GenerationParams(max_new_tokens=6, temperature=0.0,
                                                       ignore_eos=True)).result()
    assert result.token_ids == expected
