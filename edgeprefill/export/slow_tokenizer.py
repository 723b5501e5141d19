"""A checkpoint with slow tokenizer files only -> the bundle's tokenizer.json.

The runtime reads one tokenizer file, `tokenizer.json` (the `tokenizers` library's). Many
checkpoints carry only the files transformers' slow tokenizers read: a SentencePiece
`tokenizer.model` (Llama 2-era fine-tunes, Yi, older Mistral and Gemma saves) or GPT-2's
`vocab.json` + `merges.txt` (GPT-2, OPT). transformers converts them as it loads them
(`AutoTokenizer.from_pretrained`, which `save_pretrained` then writes as tokenizer.json);
this module runs that conversion in memory, so the checkpoint folder is never written to,
and the exporter saves the result into the bundle.

A conversion that splits text otherwise than the tokenizer the model was trained with
feeds the model ids it never saw, silently. So a SentencePiece conversion is checked
against the `sentencepiece` package's own encoding of PROBES (and of text beside each of
its control tokens and user-defined pieces); a difference refuses the export.

Spaces: transformers 5's Llama-style conversion (a Metaspace pre-tokenizer, prepend scheme
"first") adds no SentencePiece dummy prefix to text that starts with a space (" hi" ->
▁hi, where sentencepiece writes ▁▁hi) nor to text after a special token ("</s>hi" -> hi,
not ▁hi): transformers' non-`legacy` reading, whatever tokenizer_config.json says. The
checkpoints of that era were tokenized the `legacy` way (transformers' default where the
config does not say `"legacy": false`; Llama 2's own tokenizer.json: a Prepend("▁") +
Replace(" ", "▁") normalizer on each stretch between special tokens), so there the
converted tokenizer is rewritten to it (gguf_vocab.sentencepiece_spaces, the GGUF path's
same fix) and checked on such text too. A config that says `"legacy": false` keeps
transformers' reading, unchecked on such text, and so does a model whose dummy prefix
meets user-defined pieces (`_legacy_spaces` says why). GPT-2's files are checked the same
way against our own byte-level BPE (export/bpe_reference.py: GPT-2's algorithm, read as the
checkpoint's tokenizer class reads the files; a class it does not know is not checked, and
the log line says so).

A tokenizer class of the checkpoint's own code is never run. Where it is a listed copy of
Llama's (InternLM2's, Baichuan's), a staged copy of the files is converted as Llama's
(remote_tokenizer.py) and checked as above; every added_tokens_decoder entry must keep its
id.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeprefill.errors import ExportError
from edgeprefill.export import bpe_reference
from edgeprefill.export.converted_ids import refuse_other_ids
from edgeprefill.export.remote_tokenizer import LLAMA_COPIES, READ_AS, remote_class, stage_as_llama

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

SENTENCEPIECE = ("tokenizer.model",)
GPT2_BPE = ("vocab.json", "merges.txt")
INSTALL = "pip install 'edgeprefill[export]'"
SPM_PACKAGES = "pip install sentencepiece protobuf"
# What a converted SentencePiece tokenizer must split as sentencepiece does: ASCII,
# digits, whitespace runs (inside and after text), accents, CJK, emoji and symbols that
# fall back to bytes in a small vocabulary, full-width forms (NFKC normalization).
PROBES = (
    "Hello world",
    "The year 2024 had 366 days; 3.14159 is pi.",
    "two  spaces, three   spaces,\ttab\t\tand\nnew\n\nlines  ",
    "café naïve résumé über Ærø",
    "你好，世界。日本語のテキスト",
    "emoji 🙂🚀 and € £ ¥ symbols",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
)
LEADING_SPACE = (" a space first", "  two first")  # checked where spaces read `legacy`


@dataclass(frozen=True)
class Converted:
    """A tokenizer.json built from slow files: what the bundle saves, and what to say."""

    tokenizer: Tokenizer
    source: str  # the files it was built from
    checked: str  # how it was checked, for the log line
    read_as: str | None = None  # the checkpoint's own tokenizer class read as Llama's


def slow_files(hf_dir: Path) -> tuple[str, ...] | None:
    """The slow tokenizer files `hf_dir` holds (SentencePiece's, else GPT-2's); None if
    neither."""
    for files in (SENTENCEPIECE, GPT2_BPE):
        if all((hf_dir / name).is_file() for name in files):
            return files
    return None


def convert(hf_dir: Path) -> Converted:
    """The fast tokenizer transformers builds from `hf_dir`'s slow files, checked against
    sentencepiece where it can be; refused in one line where there is none, transformers
    cannot convert them, or the conversion splits a probe otherwise. A tokenizer class of
    the checkpoint's own code that copies Llama's is read as Llama's (remote_tokenizer)."""
    files = slow_files(hf_dir)
    if files is None:
        raise ExportError(f"{hf_dir} has no tokenizer: looked for tokenizer.json, "
                          f"{', '.join(SENTENCEPIECE)}, {' + '.join(GPT2_BPE)}"
                          f"{_tokenizer_elsewhere(hf_dir)}")
    settings = _settings(hf_dir)
    remote = remote_class(settings) if files == SENTENCEPIECE else None
    with tempfile.TemporaryDirectory(prefix="edgeprefill-tokenizer-") as staging:
        folder, read_as = hf_dir, None
        if remote in LLAMA_COPIES:  # others fail in transformers: "trust_remote_code"
            folder = Path(staging)
            stage_as_llama(hf_dir, settings, folder)
            read_as = (f"its {remote} ({LLAMA_COPIES[remote]}, the checkpoint's own code) "
                       f"read as transformers' {READ_AS}")
        converted = _convert(hf_dir, folder, files, read_as)
    _check_added_tokens(hf_dir, settings, converted.tokenizer)
    # A warning, as the exporter's other notes: the CLI shows warnings only, and the user
    # should know the bundle's tokenizer.json was made, not copied.
    log.warning("%s has no tokenizer.json: converted its %s with transformers%s (%s)",
                hf_dir, converted.source, f", {read_as}" if read_as else "",
                converted.checked)
    return converted


# Models whose checkpoints ship no tokenizer, and where theirs is.
TOKENIZER_ELSEWHERE = {
    "openelm": "Apple's OpenELM checkpoints ship none: they tokenize with Llama 2's "
               "(meta-llama/Llama-2-7b-hf); copy its tokenizer files into the folder",
}


def _tokenizer_elsewhere(hf_dir: Path) -> str:
    """'; ' and where the model's tokenizer is, for a model known to ship none; else ''."""
    try:
        config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""  # the config's own errors are the config reader's to say
    where = TOKENIZER_ELSEWHERE.get(config.get("model_type")) \
        if isinstance(config, dict) else None
    return f"; {where}" if where else ""


def _convert(hf_dir: Path, folder: Path, files: tuple[str, ...],
             read_as: str | None) -> Converted:
    """Convert `folder`'s files (`hf_dir`'s, or their staged Llama reading), rewrite the
    spaces and check the result; errors name `hf_dir`."""
    source = " + ".join(files)
    tokenizer = _converted(hf_dir, source, folder)
    rewritten = None
    if files == SENTENCEPIECE and _legacy(folder):
        rewritten = _legacy_spaces(tokenizer, folder / SENTENCEPIECE[0])
    legacy = rewritten is not None
    tokenizer = rewritten or tokenizer
    checked = _check(folder / SENTENCEPIECE[0], tokenizer, legacy, hf_dir) \
        if files == SENTENCEPIECE else \
        bpe_reference.check(hf_dir, tokenizer, PROBES)
    if read_as is not None:
        checked += "; sentencepiece's model with tokenizer_config.json's added tokens put in"
    return Converted(tokenizer, source, checked, read_as)


def _settings(hf_dir: Path) -> dict[str, Any]:
    """tokenizer_config.json ({} where there is none)."""
    config = hf_dir / "tokenizer_config.json"
    try:
        settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (OSError, ValueError) as err:
        raise ExportError(f"cannot read {config}: {err}") from None
    return settings if isinstance(settings, dict) else {}


def _check_added_tokens(hf_dir: Path, settings: dict[str, Any], tokenizer: Tokenizer) -> None:
    """Each of tokenizer_config.json's added_tokens_decoder entries must read as its id:
    transformers gives a token whose text differs from the piece at its id a new id past
    the vocabulary, an id the model never saw."""
    decoder = settings.get("added_tokens_decoder")
    if not isinstance(decoder, dict):
        return
    for key, token in decoder.items():
        content = token.get("content") if isinstance(token, dict) else None
        if not (str(key).isdigit() and isinstance(content, str)):
            continue
        got = tokenizer.token_to_id(content)
        if got != int(key):
            raise ExportError(
                f"{hf_dir}/tokenizer_config.json's added token {content!r} is id {key}, but "
                f"the tokenizer.json transformers converts gives it {got}: give the "
                "checkpoint a tokenizer.json that matches its tokenizer")


def _converted(hf_dir: Path, source: str, folder: Path | None = None) -> Tokenizer:
    """transformers' fast tokenizer of `folder`'s files (`hf_dir` by default)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ExportError(f"{hf_dir} has no tokenizer.json, and converting its {source} "
                          f"needs transformers: {INSTALL}") from None
    try:
        with _transformers_quiet():
            loaded = AutoTokenizer.from_pretrained(folder or hf_dir, local_files_only=True,
                                                   trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds here
        raise ExportError(_cannot_convert(hf_dir, source, _why(hf_dir, source, err))) from None
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None:
        why = f"transformers loads it as a slow tokenizer only ({type(loaded).__name__})"
        raise ExportError(_cannot_convert(hf_dir, source, why))
    return backend


def _cannot_convert(hf_dir: Path, source: str, why: str) -> str:
    needs = "transformers, sentencepiece and protobuf" if source == SENTENCEPIECE[0] \
        else "transformers"
    return (f"cannot convert {hf_dir}'s {source} to tokenizer.json: {why}; convert it "
            f"yourself with AutoTokenizer.from_pretrained(dir).save_pretrained(dir) "
            f"({needs} installed)")


def _why(hf_dir: Path, source: str, err: Exception) -> str:
    """The conversion's failure as the user can act on it. A SentencePiece file is read
    by transformers with the sentencepiece and protobuf packages; where that fails it
    falls back to tiktoken's format, whose error ("tiktoken is required") would mislead."""
    if source == SENTENCEPIECE[0]:
        missing = [name for name in ("sentencepiece", "google.protobuf")
                   if not _importable(name)]
        if missing:
            return (f"transformers reads {source} with the sentencepiece and protobuf "
                    f"packages ({SPM_PACKAGES})")
        unreadable = _spm_error(hf_dir / source)
        if unreadable is not None:
            return f"sentencepiece cannot read it ({unreadable})"
    text = str(err).strip()
    if "trust_remote_code" in text:  # auto_map to a class not read as Llama's: ChatGLM, Qwen
        return ("its tokenizer class is the checkpoint's own code, which export does not "
                "run (add trust_remote_code=True to from_pretrained where you trust it)")
    return text.splitlines()[0] if text else type(err).__name__


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _spm_error(model: Path) -> str | None:
    import sentencepiece

    try:
        sentencepiece.SentencePieceProcessor(model_file=str(model))
    except Exception as err:  # noqa: BLE001 - sentencepiece raises RuntimeError, OSError
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return None


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """transformers' own warnings while it converts (its tiktoken fallback, its `legacy`
    notes) are not the user's to act on: our error or log line says what matters."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _legacy(hf_dir: Path) -> bool:
    """Whether the checkpoint's tokenizer reads spaces the `legacy` way: unless its
    tokenizer_config.json says `"legacy": false` (transformers' default is legacy)."""
    return _settings(hf_dir).get("legacy") is not False


def _legacy_spaces(tokenizer: Tokenizer, model: Path) -> Tokenizer | None:
    """transformers' Metaspace conversion rewritten to SentencePiece's spaces: the dummy
    prefix (where the model's normalizer adds one) on each stretch of text between special
    tokens, a space that starts it kept. None where it cannot be: another conversion (no
    Metaspace), or a prefixing model with user-defined pieces (added tokens that are not
    special: `tokenizers` would cut the stretch at each and prefix the text after it, where
    sentencepiece finds them inside the one stretch it encodes)."""
    from tokenizers import Tokenizer

    from edgeprefill.export.gguf_vocab import sentencepiece_spaces

    layout = json.loads(tokenizer.to_str())
    if (layout.get("pre_tokenizer") or {}).get("type") != "Metaspace" \
            or not _importable("sentencepiece"):  # (transformers needs it to convert)
        return None
    prefix = _adds_dummy_prefix(model)
    if prefix and any(not token.get("special") for token in layout.get("added_tokens", [])):
        return None
    sentencepiece_spaces(layout, prefix)
    return Tokenizer.from_str(json.dumps(layout))


def _adds_dummy_prefix(model: Path) -> bool:
    """The SentencePiece model's own normalizer setting (transformers read the same file
    with the sentencepiece package a moment ago)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    return bool(proto.normalizer_spec.add_dummy_prefix)


def _check(model: Path, tokenizer: Tokenizer, legacy: bool, hf_dir: Path) -> str:
    """Compare the converted tokenizer with sentencepiece (reading `model`, `hf_dir`'s or
    its staged copy) on the probes and on text beside each control token; refuse at the
    first difference. Returns what was checked."""
    if not _importable("sentencepiece"):
        return "not checked against sentencepiece, which is not installed"
    import sentencepiece

    try:
        spm = sentencepiece.SentencePieceProcessor(model_file=str(model))
    except Exception:  # noqa: BLE001 - not a SentencePiece file (tiktoken's format)
        return f"not checked: sentencepiece cannot read {model.name}"
    refuse_other_ids(tokenizer, ((text, False, ids) for text, ids in _references(spm, legacy)),
                     str(hf_dir / model.name), "sentencepiece")
    count = len(PROBES) + (len(LEADING_SPACE) if legacy else 0)
    spaces = ("spaces read the legacy way" if legacy
              else "spaces as transformers reads them (non-legacy)")
    return (f"its ids equal sentencepiece's on {count} probe strings and beside its special "
            f"tokens; {spaces}")


def _user_defined(spm: Any) -> set[int]:
    """The ids of the model's user-defined pieces (sentencepiece's Python API has no test
    for them: its serialized proto names each piece's type)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(spm.serialized_model_proto())
    kind = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    return {i for i, piece in enumerate(proto.pieces) if piece.type == kind}


def _references(spm: Any, legacy: bool) -> Iterator[tuple[str, list[int]]]:
    """(text, sentencepiece's ids) for each probe, then for text followed by each control
    token's text (which a fast tokenizer reads as the one token; sentencepiece encodes
    such text as characters, so its id is put in). The `legacy` reading also encodes text
    that starts with a space and text after a control token as sentencepiece does
    (each stretch its own encoding); transformers' other reading does not."""
    texts = PROBES + LEADING_SPACE if legacy else PROBES
    user_defined = _user_defined(spm)
    for text in texts:
        yield text, list(spm.encode(text))
    for i in range(spm.get_piece_size()):
        piece = spm.id_to_piece(i)
        if spm.is_control(i) and piece:
            yield f"Hello{piece}", [*spm.encode("Hello"), i]
            if legacy:
                yield f"{piece} Hello{piece}there", [i, *spm.encode(" Hello"), i,
                                                     *spm.encode("there")]
        elif not spm.is_unknown(i) and i in user_defined:  # plain text, always whole
            text = f"Hello {piece} there"
            yield text, list(spm.encode(text))
