"""GPT-2's byte-level BPE, written here from its published algorithm: the reference a
tokenizer.json that transformers converts from `vocab.json` + `merges.txt` is checked
against (export/slow_tokenizer.py), as a converted tokenizer.model is checked against
the `sentencepiece` package.

The algorithm (OpenAI's GPT-2 encoder, openai/gpt-2 src/encoder.py): every UTF-8 byte is
written as one printable character (the printable Latin-1 bytes as themselves, the other
68 as the characters from U+0100 on, in byte order); the text is first cut into pieces by
a regex (contractions; runs of letters, of digits, of other symbols, each with an optional
space in front; whitespace runs, whose last space goes to the word after them), each piece
written in those characters; inside each piece the adjacent pair whose merge comes
earliest in merges.txt is merged, everywhere in the piece, until no pair has a merge; each
final symbol is looked up in vocab.json.

The tokenizer classes that read these files differ in the regex, a normalization and the
tokens they put around a text; which class a checkpoint uses is tokenizer_config.json's
`tokenizer_class` (else, as AutoTokenizer picks it, config.json's `model_type`), and a
class not in CLASSES is not checked. Around the algorithm, as transformers' tokenizers
read it: special and added tokens (tokenizer_config.json, special_tokens_map.json,
added_tokens.json) are cut out of the text whole before any of this, and
`add_prefix_space` puts one space before a text that does not start with one (once, as
transformers' slow tokenizers did: not again after each special token).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeprefill.export.converted_ids import refuse_other_ids

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# GPT-2's pre-tokenization regex (encoder.py), which GPT2Tokenizer (OPT's too), CodeGen's,
# RoBERTa's and BART's use.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Qwen2Tokenizer's (transformers' PRETOKENIZE_REGEX): contractions in any case, a letter
# run with one non-letter, non-digit character before it, each digit alone, and newlines
# kept with the symbols or whitespace before them.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
               r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Beside the exporter's probes (slow_tokenizer.PROBES): what the byte-level regexes cut
# apart. Contractions in both cases, a text that starts with spaces, CR LF and runs of
# newlines and indents, digit runs and symbols, a decomposed accent (Qwen2's NFC).
PROBES = (
    "I'm sure it's fine; we'll see, they've said. IT'S I'D",
    " a space first",
    "  two spaces first",
    "line\r\nbreak\n\n\tindent  \n    end",
    "x = 12345 + 0.5; y=[1,2]//3 -> z!!",
    "cafe\u0301 in NFD",
)
SPECIAL_FIELDS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                  "cls_token", "mask_token")


@dataclass(frozen=True)
class Rules:
    """How one tokenizer class reads GPT-2's files."""

    split: str  # the pre-tokenization regex
    defaults: tuple[tuple[str, str], ...]  # its special tokens where the files name none
    nfc: bool = False  # NFC-normalize the text first (Qwen2's)
    wrapped: bool = False  # cls ... sep around every text (RoBERTa's, BART's)


ENDOFTEXT = (("bos_token", "<|endoftext|>"), ("eos_token", "<|endoftext|>"),
             ("unk_token", "<|endoftext|>"))
ROBERTA = Rules(GPT2_SPLIT, (("bos_token", "<s>"), ("eos_token", "</s>"), ("sep_token", "</s>"),
                             ("cls_token", "<s>"), ("unk_token", "<unk>"),
                             ("pad_token", "<pad>"), ("mask_token", "<mask>")), wrapped=True)
CLASSES = {
    "GPT2Tokenizer": Rules(GPT2_SPLIT, ENDOFTEXT),
    "CodeGenTokenizer": Rules(GPT2_SPLIT, ENDOFTEXT),
    "Qwen2Tokenizer": Rules(QWEN2_SPLIT, (("unk_token", "<|endoftext|>"),
                                          ("eos_token", "<|endoftext|>"),
                                          ("pad_token", "<|endoftext|>")), nfc=True),
    "RobertaTokenizer": ROBERTA,
    "BartTokenizer": ROBERTA,
}
# Where tokenizer_config.json names no class, AutoTokenizer takes config.json's model_type
# (OPT's checkpoints name none: GPT-2's class, its `</s>` BOS from add_bos_token).
MODEL_TYPES = {
    **dict.fromkeys(("gpt2", "opt", "gpt_neo", "gptj", "codegen"), "GPT2Tokenizer"),
    **dict.fromkeys(("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"), "Qwen2Tokenizer"),
}


class Unchecked(Exception):
    """Why there is no reference for these files (said as "not checked: ...")."""


@cache
def byte_symbols() -> dict[int, str]:
    """Each byte's character: printable Latin-1 bytes stand for themselves; the rest, in
    byte order, take the characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable},
            **{b: chr(256 + n) for n, b in enumerate(others)}}


@dataclass(frozen=True)
class ByteLevelBPE:
    """A checkpoint's vocab.json + merges.txt as its tokenizer class reads them."""

    tokenizer_class: str
    rules: Rules
    vocab: dict[str, int]
    ranks: dict[tuple[str, str], int]  # merges.txt's pairs by line
    added: dict[str, int]  # special and added tokens' text -> id, cut out whole
    prefix_space: bool  # add_prefix_space
    single_word: frozenset[str]  # added tokens matched only as whole words (not probed)
    before: tuple[int, ...]  # what the class puts before a text (a BOS, RoBERTa's <s>)
    after: tuple[int, ...]  # and after it (an EOS, RoBERTa's </s>)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [i for piece, token in self._stretches(text)
               for i in ([token] if token is not None else self._encode_plain(piece))]
        return [*self.before, *ids, *self.after] if add_special_tokens else ids

    def _stretches(self, text: str) -> Iterator[tuple[str, int | None]]:
        """The text cut at its added tokens (leftmost, then longest): (text, None) for a
        stretch between them, (token, id) for each; a prefix space before the first."""
        if self.prefix_space and not text.startswith(" "):
            text = " " + text
        start = 0
        while start < len(text):
            found = self._next_added(text, start)
            if found is None:
                yield text[start:], None
                return
            at, token = found
            if at > start:
                yield text[start:at], None
            yield token, self.added[token]
            start = at + len(token)

    def _next_added(self, text: str, start: int) -> tuple[int, str] | None:
        hits = [(text.find(token, start), -len(token), token) for token in self.added]
        hits = [hit for hit in hits if hit[0] >= 0]
        if not hits:
            return None
        at, _, token = min(hits)
        return at, token

    def _encode_plain(self, text: str) -> list[int]:
        import regex  # type: ignore[import-untyped]

        if self.rules.nfc:
            text = unicodedata.normalize("NFC", text)
        symbols = byte_symbols()
        ids: list[int] = []
        for piece in regex.findall(self.rules.split, text):
            word = "".join(symbols[b] for b in piece.encode("utf-8"))
            ids.extend(self._id(symbol) for symbol in self._merged(word))
        return ids

    def _merged(self, word: str) -> list[str]:
        """GPT-2's merge loop: the earliest-ranked adjacent pair, merged everywhere."""
        parts = list(word)
        while len(parts) > 1:
            pairs = {(a, b) for a, b in zip(parts, parts[1:], strict=False)}
            best = min(pairs, key=lambda pair: self.ranks.get(pair, len(self.ranks)))
            if best not in self.ranks:
                break
            merged: list[str] = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def _id(self, symbol: str) -> int:
        if symbol not in self.vocab:
            raise Unchecked(f"vocab.json has no entry for {symbol!r}, which its own merges "
                            "or GPT-2's byte alphabet make")
        return self.vocab[symbol]


def load(hf_dir: Path) -> ByteLevelBPE:
    """The reference for `hf_dir`'s files; Unchecked where there is none (a class not in
    CLASSES, no `regex` package, files it cannot read)."""
    try:
        import regex  # noqa: F401 - the \\p{L} classes the regexes need
    except ImportError:
        raise Unchecked("the regex package is not installed") from None
    settings = _json(hf_dir / "tokenizer_config.json")
    name = _class_name(settings, _json(hf_dir / "config.json"))
    if name not in CLASSES:
        known = ", ".join(CLASSES)
        raise Unchecked(f"no reference for tokenizer class {name} (only {known})")
    vocab = _json(hf_dir / "vocab.json")
    rules = CLASSES[name]
    # special_tokens_map.json's tokens are the class's as tokenizer_config.json's are
    settings = {**settings, **_json(hf_dir / "special_tokens_map.json")}
    added = _added(hf_dir, settings, rules, vocab)
    return ByteLevelBPE(name, rules, vocab, _ranks(hf_dir / "merges.txt"), added,
                        settings.get("add_prefix_space") is True, _single_word(settings),
                        *_around(rules, settings, added))


def check(hf_dir: Path, tokenizer: Tokenizer, probes: tuple[str, ...]) -> str:
    """Compare the converted tokenizer with the reference on `probes` and PROBES, once
    with the tokens the class puts around a text, and on text beside each special and
    added token; refuse at the first difference. Returns what was checked."""
    try:
        reference = load(hf_dir)
        cases = list(_cases(reference, probes + PROBES))
    except Unchecked as why:
        return f"not checked: {why}"
    refuse_other_ids(tokenizer, cases, f"{hf_dir}'s vocab.json + merges.txt",
                     f"{reference.tokenizer_class} reads GPT-2's files")
    unprobed = ("; text after a special token not probed (add_prefix_space)"
                if reference.prefix_space else "")
    return (f"its ids equal edgeprefill's own byte-level BPE's, reading the files as "
            f"{reference.tokenizer_class} does, on {len(probes + PROBES)} probe strings and "
            f"beside its special tokens{unprobed}")


def _cases(reference: ByteLevelBPE,
           probes: tuple[str, ...]) -> Iterator[tuple[str, bool, list[int]]]:
    """(text, add_special_tokens, the reference's ids): each probe; the first with the
    tokens the class puts around it; text before each special and added token, and after
    it where add_prefix_space is off (where it is on, transformers' slow tokenizers put
    the space before the whole text and its fast ones before each stretch between special
    tokens: which of the two a model was trained with is not in its files)."""
    for text in probes:
        yield text, False, reference.encode(text)
    yield probes[0], True, reference.encode(probes[0], add_special_tokens=True)
    for token in reference.added:
        if token in reference.single_word:
            continue
        texts = [f"Hello{token}"] if reference.prefix_space else \
            [f"Hello{token}", f"{token}there{token}x"]
        for text in texts:
            yield text, False, reference.encode(text)


def _class_name(settings: dict[str, Any], config: dict[str, Any]) -> str:
    name = settings.get("tokenizer_class")
    if isinstance(name, str):
        return name.removesuffix("Fast")
    model_type = config.get("model_type")
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    raise Unchecked(f"tokenizer_config.json names no tokenizer_class, and model_type "
                    f"{model_type!r} has no reference")


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise Unchecked(f"cannot read {path.name} ({err})") from None
    return value if isinstance(value, dict) else {}


def _ranks(merges: Path) -> dict[tuple[str, str], int]:
    """merges.txt: one pair a line, the earliest merged first; a `#version` line on top."""
    lines = merges.read_text(encoding="utf-8").splitlines()
    pairs = [tuple(line.split(" ")) for line in lines
             if line.strip() and not line.startswith("#version")]
    if any(len(pair) != 2 for pair in pairs):
        raise Unchecked("merges.txt has a line that is not two symbols")
    return {(a, b): rank for rank, (a, b) in enumerate(pairs)}


def _content(token: Any) -> str | None:
    """A token as the files write it: a string, or an AddedToken's {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None


def _added(hf_dir: Path, settings: dict[str, Any], rules: Rules,
           vocab: dict[str, int]) -> dict[str, int]:
    """Every special and added token the files name (or the class has by default), with
    its id: vocab.json's, else the one added_tokens_decoder or added_tokens.json gives (a
    token with neither is left out: it has no id the model knows)."""
    ids: dict[str, int] = {}
    for key, token in (settings.get("added_tokens_decoder") or {}).items():
        content = _content(token)
        if content and str(key).isdigit():
            ids[content] = int(key)
    ids.update({k: v for k, v in _json(hf_dir / "added_tokens.json").items()
                if isinstance(v, int)})
    ids.update({k: v for k, v in vocab.items() if k in ids})  # vocab.json's id first
    for name in _special(settings, rules):
        if name in vocab:
            ids[name] = vocab[name]
    return ids


def _single_word(settings: dict[str, Any]) -> frozenset[str]:
    tokens = (settings.get("added_tokens_decoder") or {}).values()
    return frozenset(_content(token) or "" for token in tokens
                     if isinstance(token, dict) and token.get("single_word") is True)


def _special(settings: dict[str, Any], rules: Rules) -> Iterator[str]:
    """The special tokens' text: each field the files set (null: none), else the class's
    default, and the additional ones."""
    defaults = dict(rules.defaults)
    for field in SPECIAL_FIELDS:
        content = _content(settings[field] if field in settings else defaults.get(field))
        if content:
            yield content
    for field in ("additional_special_tokens", "extra_special_tokens"):
        extra = settings.get(field) or []
        for token in extra.values() if isinstance(extra, dict) else extra:
            content = _content(token)
            if content:
                yield content


def _around(rules: Rules, settings: dict[str, Any],
            added: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids a text gets before and after it: RoBERTa's and BART's cls and sep always;
    another class's bos_token where add_bos_token is true and eos_token where
    add_eos_token is (OPT's `</s>` BOS)."""
    defaults = dict(rules.defaults)

    def token_id(field: str) -> tuple[int, ...]:
        name = _content(settings[field] if field in settings else defaults.get(field))
        return (added[name],) if name in added else ()

    if rules.wrapped:
        return token_id("cls_token"), token_id("sep_token")
    return (token_id("bos_token") if settings.get("add_bos_token") is True else (),
            token_id("eos_token") if settings.get("add_eos_token") is True else ())
