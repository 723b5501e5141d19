"""Whether a checkpoint exports as an embedding bundle: sentence-transformers' layout.

An embedding model saved by sentence-transformers (Qwen3-Embedding, gte-Qwen2-instruct,
e5-mistral-7b-instruct, SFR-Embedding-Mistral) is a causal LM folder plus `modules.json`,
the pipeline its library runs after the model:

    [{"type": "sentence_transformers.models.Transformer", "path": ""},
     {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
     {"type": "sentence_transformers.models.Normalize", "path": "2_Normalize"}]

with the pooling in `1_Pooling/config.json` (`"pooling_mode_lasttoken": true`, or a
`pooling_mode` name). The bundle's graph gives each row's last valid token's hidden state
(contract.HIDDEN), which is last-token pooling itself: that one pooling is exported, with
the Normalize module as a flag the runtime applies. Any other pooling (mean, CLS, max,
weighted mean; a latent-attention module) or module (a Dense projection) would give other
vectors than the model's: refused in one line naming it.

sentence-transformers' `config_sentence_transformers.json` names the prompts a text may be
given before it is embedded (Qwen3-Embedding: `"query": "Instruct: Given a web search
query, retrieve relevant passages that answer the query\nQuery:"`, `"document": ""`;
e5-mistral and gte-Qwen2 likewise) and, optionally, the one every text gets where none is
asked for (`default_prompt_name`). They are the model's: its queries were trained with
them. They go into the manifest as they are, for the runtime to put before a text by name
(sdk/embedding.py).

`--task` overrides what the folder says: `generate` exports the LM (the folder's head, or
a tied embedding, as the LM head), `embed` a folder without modules.json as last-token
pooling, normalized (what every model listed above does), and `auto`, the default, embeds
exactly where modules.json is.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgeprefill.bundle import EmbeddingInfo
from edgeprefill.errors import ExportError

MODULES_FILE = "modules.json"
PROMPTS_FILE = "config_sentence_transformers.json"
TASKS = ("auto", "embed", "generate", "score")  # score: export/score_head.py
TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
NORMALIZE = "sentence_transformers.models.Normalize"
LAST_TOKEN = "lasttoken"
# Pooling's config keys (sentence-transformers 2 to 5) -> the mode's name
MODE_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": LAST_TOKEN,
}
# a model without modules.json exported with --task embed
DEFAULT_EMBEDDING = EmbeddingInfo(pooling=LAST_TOKEN, normalize=True)


def embedding_head(hf_dir: Path, task: str) -> EmbeddingInfo | None:
    """The embedding bundle's head, or None for a generation (or score) bundle."""
    if task not in TASKS:
        raise ExportError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    modules = hf_dir / MODULES_FILE
    if task in ("generate", "score") or (task == "auto" and not modules.is_file()):
        return None
    head = _read_modules(hf_dir, _json(modules)) if modules.is_file() else DEFAULT_EMBEDDING
    return _with_prompts(head, hf_dir / PROMPTS_FILE)


def _with_prompts(head: EmbeddingInfo, config: Path) -> EmbeddingInfo:
    """`head` with the folder's named prompts and default prompt, where it has them."""
    if not config.is_file():
        return head
    raw = _json(config)
    if not isinstance(raw, dict):
        raise ExportError(f"{config} is malformed: an object is expected")
    prompts = raw.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ExportError(f"{config}: 'prompts' must map names to prompt texts")
    default = raw.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ExportError(f"{config}: default_prompt_name {default!r} is none of its "
                          f"prompts ({', '.join(prompts) or 'none'})")
    return replace(head, prompts=dict(prompts), default_prompt_name=default)


def _read_modules(hf_dir: Path, modules: Any) -> EmbeddingInfo:
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ExportError(f"{hf_dir / MODULES_FILE} is malformed: a list of modules "
                          "({\"type\": ..., \"path\": ...}) is expected")
    pooling: str | None = None
    normalize = False
    for module in modules:
        kind, path = str(module.get("type", "")), str(module.get("path", ""))
        if kind == TRANSFORMER:
            continue
        if kind == POOLING and pooling is None:
            pooling = _pooling(hf_dir / path / "config.json")
        elif kind == NORMALIZE:
            normalize = True
        else:
            raise ExportError(f"{MODULES_FILE}: the module {kind or '(no type)'} "
                              f"{('at ' + path + ' ') if path else ''}is not exported (an "
                              "embedding bundle is the model, last-token pooling and "
                              "Normalize); export the language model with --task generate")
    if pooling is None:
        raise ExportError(f"{MODULES_FILE} has no {POOLING} module: the model's pooling is "
                          "unknown; export it with --task embed (last-token pooling, "
                          "normalized) or --task generate")
    return EmbeddingInfo(pooling=pooling, normalize=normalize)


def _pooling(config: Path) -> str:
    """The Pooling module's one mode; refused unless it is last-token pooling."""
    raw = _json(config)
    if not isinstance(raw, dict):
        raise ExportError(f"{config} is malformed: an object is expected")
    named = raw.get("pooling_mode")
    modes = [str(named)] if isinstance(named, str) else \
        [mode for key, mode in MODE_KEYS.items() if raw.get(key) is True]
    if modes == [LAST_TOKEN]:
        return LAST_TOKEN
    said = " + ".join(modes) if modes else "none"
    raise ExportError(f"the model pools its tokens by {said} ({config}): edgeprefill "
                      "exports last-token pooling only (the graph gives the last token's "
                      "hidden state)")


def _json(path: Path) -> Any:
    if not path.is_file():
        raise ExportError(f"{path} is missing (named by {MODULES_FILE})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ExportError(f"{path} is not readable JSON: {err}") from None
