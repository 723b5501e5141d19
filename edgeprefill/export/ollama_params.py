"""An Ollama model's parameters (its Modelfile's PARAMETER lines, the manifest's params
layer) -> the generation_config.json the bundle's sampling defaults come from
(sdk/generation_defaults.py).

Mapped where the bundle has the same default: temperature, top_k, top_p, repeat_penalty
(as repetition_penalty: transformers' penalty, which edgeprefill applies over the whole
context, where llama.cpp's covers the last repeat_last_n tokens), and each `stop` string
that is one added token of the vocabulary (`<|eot_id|>`, `<|im_end|>`): generation ends
at that token, so it joins the EOS ids. The rest are left out, with one warning: other
stop strings (a request's `stop` carries them), num_ctx (export's --max-context),
num_predict, seed, min_p and the penalties generation_config.json has no field for, and
Ollama's runtime options (num_gpu, num_thread, ...).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from edgeprefill.errors import BundleError, ExportError
from edgeprefill.json_file import optional_json_object
from edgeprefill.sdk.generation_defaults import FILE, GenerationDefaults

log = logging.getLogger(__name__)

# Ollama's option -> generation_config.json's field
MAPPED = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
          "repeat_penalty": "repetition_penalty"}


def write_generation_config(params: dict[str, Any], folder: Path, shown: str) -> None:
    """Merge `params` into `folder`'s generation_config.json (the converted GGUF's folder,
    which the exporter copies into the bundle); `shown` names the model in messages."""
    if not params:
        return
    config = optional_json_object(folder / FILE, ExportError)
    config.update({MAPPED[k]: v for k, v in params.items() if k in MAPPED})
    stop = params.get("stop")
    if not (stop is None or isinstance(stop, str) or isinstance(stop, list) and all(
            isinstance(s, str) for s in stop)):  # a hand-made store's: Ollama writes strings
        raise ExportError(f"{shown}: its parameters: stop must be a string or a list of "
                          f"strings, got {json.dumps(stop)[:80]}")
    stop_ids, other_stops = _stop_tokens(stop, folder / "tokenizer.json")
    if stop_ids:
        eos = config.get("eos_token_id")
        config["eos_token_id"] = list(dict.fromkeys(
            [*(eos if isinstance(eos, list) else [] if eos is None else [eos]), *stop_ids]))
    try:
        GenerationDefaults.from_dict(config)  # as a load will check it
    except BundleError as err:  # a value out of range
        raise ExportError(f"{shown}: its parameters: {err}") from None
    (folder / FILE).write_text(json.dumps(config, indent=1))
    _warn_left_out(params, other_stops, shown)


def _stop_tokens(stop: Any, tokenizer_file: Path) -> tuple[list[int], list[str]]:
    """The ids of the stop strings that are added tokens, and the other stop strings."""
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    tok = json.loads(tokenizer_file.read_text())
    added = {t["content"]: t["id"] for t in tok.get("added_tokens") or []}
    ids = [added[s] for s in stops if s in added]
    return ids, [s for s in stops if s not in added]


def _warn_left_out(params: dict[str, Any], other_stops: list[str], shown: str) -> None:
    left = [f"{k} {v!r}" for k, v in params.items() if k not in MAPPED and k != "stop"]
    left += [f"stop {s!r}" for s in other_stops]
    if left:
        log.warning("%s: Ollama parameters the bundle has no default for are left out: %s "
                    "(give them per request; num_ctx: export's --max-context)", shown,
                    ", ".join(left))
