"""A GGUF vocabulary's tokenizer as llama.cpp tokenizes with it, where transformers' GGUF
reader (5.24) builds another: the staging tokenizer.json rewritten, or the file refused
in one line (never a silently different tokenizer).

SentencePiece (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral 7B, TinyLlama, ...):
llama.cpp prefixes every stretch of text with a space (`tokenizer.ggml.add_space_prefix`,
true where the file does not say) at the start and after each special token, as the
checkpoints' own tokenizer.json does it (Llama 2's: a Prepend("▁") + Replace(" ", "▁")
normalizer). transformers' LlamaTokenizer puts a Metaspace pre-tokenizer instead, which
adds no space to text that starts with one (" hi" -> ▁hi, not ▁▁hi) nor after a special
token ("</s>hi" -> hi, not ▁hi), and prefixes even where the file says not to. Gemma's
and Phi-3's own builders (transformers' GGUF_SENTENCEPIECE_BUILDERS) are left as they are.

Byte-level BPE (`"gpt2"`): the text is split before the merges by the regex its
`tokenizer.ggml.pre` names (llama.cpp's llama-vocab.cpp). transformers maps some names
(GGUF_PRE_TOKENIZER_SPLITS: llama-bpe, qwen2, tekken, ...) and splits any other by
GPT-2's regex: right for GPT2_SPLIT's names; DIGITS_THEN_GPT2's (SmolLM, StarCoder,
Command-R, ...) split each digit off first and SAME_SPLIT's (StableLM 2) as a mapped one,
put back here; any other name (Falcon's, DeepSeek's, BLOOM's, ...) is refused.

End of generation: llama.cpp stops at the file's EOS and at its EOT, EOM and FIM ids and
at any token spelled as one of END_TEXTS (an instruct model's end of turn: Gemma's
`<end_of_turn>`, ChatML's `<|im_end|>`, Llama 3's `<|eot_id|>`), where transformers'
reader keeps the EOS alone; the others go to the staging generation_config.json's
eos_token_id, which the bundle stops at too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeprefill.errors import ExportError

SPACE = "\u2581"  # SentencePiece's word boundary
# llama.cpp's pre-tokenizer names that split by GPT-2's regex alone (transformers' default)
GPT2_SPLIT = ("gpt-2", "mpt", "olmo", "jais", "trillion", "granite-docling")
# llama.cpp's names that split each digit off, then by GPT-2's regex (the checkpoints'
# tokenizer.json: Digits(individual_digits) before ByteLevel)
DIGITS_THEN_GPT2 = ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                    "minerva-7b")
# llama.cpp's names that split as another that transformers maps (llama-vocab.cpp's cases)
SAME_SPLIT = {"stablelm2": "qwen2"}


# llama-vocab.cpp's load(): the ids of special_eog_ids, and the texts it adds by name
END_KEYS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")
END_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
             "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
             "<|end_of_text|>", "<end_of_utterance>")
# gpt-oss's (o200k_harmony): `<|end|>` ends a message, not the reply, where these exist
HARMONY_ENDS = ("<|return|>", "<|call|>")


def fix_tokenizer(gguf_file: Path, tokenizer_file: Path) -> None:
    """Rewrite the staging `tokenizer_file` (transformers' reading of `gguf_file`) as
    llama.cpp tokenizes with the file's vocabulary; ExportError where it cannot be."""
    from transformers.integrations.gguf.reader import read_gguf_metadata

    metadata, _ = read_gguf_metadata(str(gguf_file))
    kind = metadata.get("tokenizer.ggml.model")
    tok = json.loads(tokenizer_file.read_text())
    if kind == "llama" and not _own_builder(metadata["general.architecture"]):
        sentencepiece_spaces(tok, bool(metadata.get("tokenizer.ggml.add_space_prefix", True)))
    elif kind == "gpt2":
        _bpe_split(tok, metadata.get("tokenizer.ggml.pre"), gguf_file.name)
    else:
        return
    tokenizer_file.write_text(json.dumps(tok, ensure_ascii=False))


def _own_builder(architecture: str) -> bool:
    """Architectures whose SentencePiece vocabulary transformers builds its own way."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_SENTENCEPIECE_BUILDERS,
    )

    return architecture in GGUF_SENTENCEPIECE_BUILDERS


def sentencepiece_spaces(tok: dict[str, Any], prefix: bool) -> None:
    """Spaces as llama.cpp's SentencePiece tokenizer writes them: a normalizer (applied to
    each stretch between special tokens) in place of the Metaspace pre-tokenizer, and a
    decoder that strips the prefixed space only where one was added."""
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    steps = [{"type": "Prepend", "prepend": SPACE}, replace] if prefix else [replace]
    tok["normalizer"] = {"type": "Sequence", "normalizers": steps}
    tok["pre_tokenizer"] = None
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    if prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    tok["decoder"] = {"type": "Sequence", "decoders": decoders}


def _bpe_split(tok: dict[str, Any], pre: str | None, file: str) -> None:
    """The split before the merges: transformers' where it maps `pre` or splits as GPT-2
    does, digits split off first where llama.cpp does that; else refused."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_PRE_TOKENIZER_SPLITS,
    )

    if pre in GGUF_PRE_TOKENIZER_SPLITS or pre in GPT2_SPLIT:
        return
    if pre in SAME_SPLIT:  # as transformers' set_split_regex writes the mapped one
        tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": GGUF_PRE_TOKENIZER_SPLITS[SAME_SPLIT[pre]]},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]}
        return
    if pre in DIGITS_THEN_GPT2:
        tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]}
        return
    raise ExportError(f"{file}: its byte-level vocabulary splits text as llama.cpp's "
                      f"tokenizer.ggml.pre {pre!r}, which transformers' GGUF reader does not "
                      "read: refused rather than tokenized another way")


def write_end_ids(gguf_file: Path, folder: Path, vocab_size: int) -> None:
    """Add the ids llama.cpp ends generation at, past config.json's EOS, to `folder`'s
    generation_config.json."""
    from transformers.integrations.gguf.reader import read_gguf_metadata

    metadata, _ = read_gguf_metadata(str(gguf_file), ("tokenizer.ggml.tokens",))
    ids = end_ids(metadata)
    config = json.loads((folder / "config.json").read_text())
    eos = config.get("eos_token_id")
    known = eos if isinstance(eos, list) else [] if eos is None else [eos]
    extra = [i for i in ids if i not in known and 0 <= i < vocab_size]
    if extra:
        (folder / "generation_config.json").write_text(
            json.dumps({"eos_token_id": [*known, *extra]}, indent=1))


def end_ids(metadata: dict[str, Any]) -> list[int]:
    """llama.cpp's end-of-generation ids of a file's vocabulary, in id order."""
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    ids = {metadata[f"tokenizer.ggml.{key}_token_id"] for key in END_KEYS
           if f"tokenizer.ggml.{key}_token_id" in metadata}
    texts = set(END_TEXTS)
    if all(end in tokens for end in HARMONY_ENDS):
        texts.discard("<|end|>")
    ids.update(i for i, token in enumerate(tokens) if token in texts)
    return sorted(ids)
