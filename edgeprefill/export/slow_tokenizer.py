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
against the `sentencepiece` package's own encoding of PROBES (and of each of its control
tokens after text); a difference refuses the export. The probes leave out text that
starts with a space: transformers' converted Llama tokenizers (Metaspace, prepend_scheme
"first") add no SentencePiece dummy prefix where the text already begins with one, for
every checkpoint alike, as the tokenizer.json transformers saves for it does. GPT-2's
files have no independent implementation to check against: that conversion is
transformers' byte-level BPE as it stands.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeprefill.errors import ExportError

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


@dataclass(frozen=True)
class Converted:
    """A tokenizer.json built from slow files: what the bundle saves, and what to say."""

    tokenizer: Tokenizer
    source: str  # the files it was built from
    checked: str  # how it was checked, for the log line


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
    cannot convert them, or the conversion splits a probe otherwise."""
    files = slow_files(hf_dir)
    if files is None:
        raise ExportError(f"{hf_dir} has no tokenizer: looked for tokenizer.json, "
                          f"{', '.join(SENTENCEPIECE)}, {' + '.join(GPT2_BPE)}")
    source = " + ".join(files)
    tokenizer = _converted(hf_dir, source)
    checked = _check(hf_dir, tokenizer) if files == SENTENCEPIECE else \
        "not checked: no independent implementation of GPT-2's files is at hand"
    converted = Converted(tokenizer, source, checked)
    # A warning, as the exporter's other notes: the CLI shows warnings only, and the user
    # should know the bundle's tokenizer.json was made, not copied.
    log.warning("%s has no tokenizer.json: converted its %s with transformers (%s)",
                hf_dir, source, checked)
    return converted


def _converted(hf_dir: Path, source: str) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ExportError(f"{hf_dir} has no tokenizer.json, and converting its {source} "
                          f"needs transformers: {INSTALL}") from None
    try:
        with _transformers_quiet():
            loaded = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True,
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
    if "trust_remote_code" in text:  # tokenizer_config.json's auto_map: Baichuan, InternLM
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


def _check(hf_dir: Path, tokenizer: Tokenizer) -> str:
    """Compare the converted tokenizer with sentencepiece on the probes and on each
    control token after text; refuse at the first difference. Returns what was checked."""
    if not _importable("sentencepiece"):
        return "not checked against sentencepiece, which is not installed"
    model = hf_dir / SENTENCEPIECE[0]
    import sentencepiece

    try:
        spm = sentencepiece.SentencePieceProcessor(model_file=str(model))
    except Exception:  # noqa: BLE001 - not a SentencePiece file (tiktoken's format)
        return f"not checked: sentencepiece cannot read {model.name}"
    for text, expected in _references(spm):
        got = tokenizer.encode(text, add_special_tokens=False).ids
        if got != expected:
            raise ExportError(
                f"the tokenizer.json transformers converts from {model} splits {text!r} "
                f"otherwise than sentencepiece ({got[:12]} against {expected[:12]}): the "
                "model would read ids it was not trained on; give the checkpoint a "
                "tokenizer.json that matches its tokenizer")
    return f"its ids equal sentencepiece's on {len(PROBES)} probe strings and its special tokens"


def _references(spm: Any) -> Iterator[tuple[str, list[int]]]:
    """(text, sentencepiece's ids) for each probe, then for text followed by each control
    token's text (which a fast tokenizer reads as the one token; sentencepiece encodes
    such text as characters, so its id is appended). After a special token transformers'
    `legacy` setting decides whether a dummy prefix follows: no probe text comes after one."""
    for text in PROBES:
        yield text, list(spm.encode(text))
    for i in range(spm.get_piece_size()):
        piece = spm.id_to_piece(i)
        if spm.is_control(i) and piece:
            yield f"Hello{piece}", [*spm.encode("Hello"), i]
