"""A SentencePiece checkpoint whose tokenizer class is its own code, read as Llama's.

InternLM2's and Baichuan's checkpoints ship a `tokenizer.model` and the Python class that
reads it (tokenizer_config.json's `auto_map` / `tokenizer_class`), no tokenizer.json.
Export runs no checkpoint code. Some of those classes are transformers' slow
LlamaTokenizer copied under another name, and they are listed in LLAMA_COPIES after
reading their code. The conversion runs transformers' LlamaTokenizer on a staging copy of
the tokenizer files that says what the class does:

- tokenizer_config.json names LlamaTokenizer and has no `auto_map`. `add_bos_token` and
  `add_eos_token` take the class's defaults (true, false) where the config leaves them
  out, because transformers 5's LlamaTokenizer defaults to no BOS. `legacy` is dropped:
  the class has none, and it runs sentencepiece on each stretch between added tokens,
  which is the `legacy` reading slow_tokenizer applies.
- tokenizer.model has the pieces at added_tokens_decoder's ids renamed to the config's
  text, control pieces where the config marks them special. InternLM2's model has
  `[UNUSED_TOKEN_146]` where its config says `<|im_start|>` (92543). The class reads the
  config's text as that id. transformers 5 would instead give `<|im_start|>` a new id past
  the vocabulary, so that name would reach the model as an id it never saw. InternLM2's
  own fast converter and llama.cpp's InternLM2 conversion make the same renames.

slow_tokenizer then checks the result against sentencepiece on the staged model and
rewrites its spaces, as it does for any tokenizer.model. A class that is not listed
(ChatGLM's adds [gMASK] and sop, Qwen's first models read tiktoken's format) is still
refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from edgeprefill.errors import ExportError

READ_AS = "LlamaTokenizer"
# Remote classes that are transformers' slow LlamaTokenizer copied under another name:
# `_tokenize` is `sp_model.encode(text)` on each stretch between added tokens; `bos` is
# added where `add_bos_token` is set (default true) and `eos` where `add_eos_token` is set
# (default false). Decoding is sentencepiece's. When special tokens are kept as text, the
# classes put a space before one that follows text (as Llama's slow class of transformers
# 4.29 does) and the bundle's tokenizer.json does not; the runtime drops special tokens
# from a reply's text, so this does not show there.
LLAMA_COPIES = {
    # tokenization_internlm2.py of internlm/internlm2-chat-1_8b and internlm2_5-7b-chat,
    # read in copies on GitHub (the model repos are not reachable from here). It is marked
    # "Modified from transformers.model.llama.tokenization_llama.LlamaTokenizer". Its
    # build_inputs adds bos and eos only, with the defaults above. Its
    # convert_tokens_to_string puts a space in front and cuts the first character off,
    # which leaves sentencepiece's text: `_maybe_add_prefix_space` compares a piece with
    # a set of ids, so it always adds the space. Its fast twin's InternLM2Converter is
    # Llama's legacy conversion with the added tokens' renames.
    "InternLM2Tokenizer": "InternLM2's tokenization_internlm2.py",
    # tokenization_baichuan.py of baichuan-inc/Baichuan-13B-Chat and Baichuan2-13B-Chat.
    # Read in copies: DSXiangLi/LongBaichuan's, and PygmalionAI/aphrodite-engine's of
    # Baichuan2-13B-Chat's (transformers_utils/tokenizers/baichuan.py). It is
    # LlamaTokenizer of transformers 4.29: vocab_file tokenizer.model, the same _tokenize,
    # build_inputs_with_special_tokens and convert_tokens_to_string, and the same
    # add_bos_token and add_eos_token defaults.
    "BaichuanTokenizer": "Baichuan's tokenization_baichuan.py",
    # baichuan-inc/Baichuan-7B spells the same class this way (mindnlp's port of it was
    # read: the same methods and defaults).
    "BaiChuanTokenizer": "Baichuan-7B's tokenization_baichuan.py",
}


def remote_class(settings: dict[str, Any]) -> str | None:
    """The tokenizer class of the checkpoint's own code that tokenizer_config.json names:
    auto_map's AutoTokenizer (slow class first), else `tokenizer_class` where it is a
    listed copy (a name transformers has no class for)."""
    auto_map = settings.get("auto_map")
    entry = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None
    if isinstance(entry, list | tuple):
        entry = next((e for e in entry if isinstance(e, str)), None)
    if isinstance(entry, str):
        return entry.rsplit(".", 1)[-1]
    named = settings.get("tokenizer_class")
    return named if named in LLAMA_COPIES else None


def stage_as_llama(hf_dir: Path, settings: dict[str, Any], stage: Path) -> None:
    """Write into `stage` the tokenizer.model and tokenizer_config.json through which
    transformers' LlamaTokenizer reads `hf_dir`'s files as its listed remote class does."""
    llama = {k: v for k, v in settings.items() if k not in ("auto_map", "legacy")}
    llama["tokenizer_class"] = READ_AS
    llama.setdefault("add_bos_token", True)  # the copies' defaults, not transformers 5's
    llama.setdefault("add_eos_token", False)
    (stage / "tokenizer_config.json").write_text(json.dumps(llama), encoding="utf-8")
    model = hf_dir / "tokenizer.model"
    renamed = _with_added_tokens(model, _added_tokens(settings, hf_dir))
    if renamed is None:
        shutil.copyfile(model, stage / model.name)
    else:
        (stage / model.name).write_bytes(renamed)


def _added_tokens(settings: dict[str, Any], hf_dir: Path) -> dict[int, tuple[str, bool]]:
    """added_tokens_decoder as id -> (text, special)."""
    decoder = settings.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise ExportError(f"{hf_dir}/tokenizer_config.json: added_tokens_decoder is not an "
                          "object of id -> token")
    tokens = {}
    for key, token in decoder.items():
        content = token.get("content") if isinstance(token, dict) else None
        if not (str(key).isdigit() and isinstance(content, str)):
            raise ExportError(f"{hf_dir}/tokenizer_config.json: added_tokens_decoder's "
                              f"entry {key!r} is not an id with a token's content")
        tokens[int(key)] = (content, bool(token.get("special", False)))
    return tokens


def _with_added_tokens(model: Path, tokens: dict[int, tuple[str, bool]]) -> bytes | None:
    """The SentencePiece model with each added token's piece renamed to its text and typed
    as the class reads it: split off before sentencepiece runs, a control piece where
    special (never produced from text), user-defined otherwise. Unknown and byte pieces
    keep their type. None where nothing changes. An id past the model is left to
    transformers, and slow_tokenizer checks the id it gets."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:  # transformers needs it too, and its refusal names it
        return None
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(model.read_bytes())
    except Exception:  # noqa: BLE001 - not a SentencePiece file: transformers says so
        return None
    kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
    kept = (kinds.UNKNOWN, kinds.BYTE)
    changed = False
    for i, (content, special) in tokens.items():
        if i >= len(proto.pieces) or proto.pieces[i].type in kept:
            continue
        piece = proto.pieces[i]
        kind = kinds.CONTROL if special else kinds.USER_DEFINED
        if piece.piece != content or piece.type != kind:
            piece.piece, piece.type, changed = content, kind, True
    return proto.SerializeToString() if changed else None
