"""An embedding bundle's tokenizer appends the EOS its model pools where
tokenizer_config.json says `add_eos_token: true` and tokenizer.json's post-processor
does not (e5-mistral-7b-instruct: its `</s>` is the token whose hidden state is the
embedding).

transformers 4's Llama-style fast tokenizers rebuilt the post-processor from
`add_bos_token`/`add_eos_token` when they loaded, so `</s>` was appended when the model
was trained and evaluated; transformers 5 takes tokenizer.json as it is and drops it
(mteb's "restore the EOS token for e5-mistral"). The bundle keeps the model's own
behaviour: its tokenizer.json gets the post-processor's tokens before the text as they
were, and the EOS after it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from edgeprefill.errors import ExportError
from edgeprefill.json_file import optional_json_object

log = logging.getLogger(__name__)


def append_eos(tokenizer_json: Path, hf_dir: Path) -> str | None:
    """Rewrite the bundle's `tokenizer_json` to append the EOS where the checkpoint's
    tokenizer_config.json asks for it and the post-processor leaves it out; the EOS token
    appended, or None where nothing changed."""
    from tokenizers import Tokenizer, processors

    config = optional_json_object(hf_dir / "tokenizer_config.json", ExportError)
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if config.get("add_eos_token") is not True or not isinstance(eos, str):
        return None
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    eos_id = tokenizer.token_to_id(eos)
    if eos_id is None:
        raise ExportError(f"tokenizer_config.json's eos_token {eos!r} is not in tokenizer.json")
    probe = "a"
    plain = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe, add_special_tokens=True).ids
    if full[-1:] == [eos_id]:
        return None  # the post-processor appends it already
    before = full[: len(full) - len(plain)]
    if full[len(before):] != plain:  # it adds tokens after the text: not Llama's template
        log.warning("tokenizer_config.json sets add_eos_token, but tokenizer.json's "
                    "post-processor adds other tokens after the text: left as it is")
        return None
    tokens = [(tokenizer.id_to_token(i), i) for i in [*before, eos_id]]
    names = [name for name, _ in tokens]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=[*names[:-1], "$A", eos], pair=[*names[:-1], "$A", "$B", eos],
        special_tokens=list(dict.fromkeys(tokens)))
    tokenizer.save(str(tokenizer_json))
    log.warning("tokenizer_config.json sets add_eos_token: the embedding bundle's tokenizer "
                "appends %s to each text, as transformers 4 did (the token the model pools; "
                "transformers 5 leaves it out)", eos)
    return eos
