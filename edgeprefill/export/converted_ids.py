"""The one check both slow-tokenizer conversions end with: the tokenizer.json transformers
built gives each probe the ids an independent reader of the same files gives it
(sentencepiece for a tokenizer.model, export/bpe_reference.py for GPT-2's files); the first
text it splits otherwise refuses the export, in one line."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from edgeprefill.errors import ExportError

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def refuse_other_ids(tokenizer: Tokenizer, cases: Iterable[tuple[str, bool, list[int]]],
                     files: str, reader: str) -> None:
    """`cases`: (text, add_special_tokens, the reader's ids). `files` names what was
    converted, `reader` what read it independently, both for the refusal."""
    for text, special, expected in cases:
        got = tokenizer.encode(text, add_special_tokens=special).ids
        if got != expected:
            raise ExportError(
                f"the tokenizer.json transformers converts from {files} splits {text!r} "
                f"otherwise than {reader} ({got[:12]} against {expected[:12]}): the model "
                "would read ids it was not trained on; give the checkpoint a "
                "tokenizer.json that matches its tokenizer")
