"""A GGUF embedding model (`ollama pull qwen3-embedding`, Qwen3-Embedding's GGUFs) ->
sentence-transformers' layout in the staging folder, so the exporter makes the embedding
bundle it makes of the Hugging Face checkpoint (export/sentence_layout.py).

llama.cpp's convert_hf_to_gguf.py reads the checkpoint's modules.json and 1_Pooling
(`_try_set_pooling_type`) into `{arch}.pooling_type` (gguf.PoolingType: NONE 0, MEAN 1,
CLS 2, LAST 3, RANK 4), and a reranker's (Qwen3-Reranker: its yes/no rows as `cls.output`)
as RANK with `{arch}.classifier.output_labels`. Ollama calls a model with any pooling_type
an embedding model (no completion). Here:
- LAST: modules.json, 1_Pooling/config.json (last token) and Normalize are written, so
  `--task auto` exports an embedding bundle. Normalized: llama.cpp's embeddings
  (`--embd-normalize` 2, Euclidean, its default) and Ollama's /api/embed are, and so is
  the checkpoint the file was converted from (Qwen3-Embedding's Normalize module, which
  the file does not record).
- MEAN, CLS, NONE (per-token vectors): refused in one line under `auto` and `embed` (the
  graph gives the last token's hidden state); `--task generate` exports the LM.
- RANK (a reranker, Qwen3-Reranker's): a score bundle under `auto` and `score`, its head
  `cls.output` read with gguf's reader (transformers' skips it) into a sequence
  classifier's staging folder (export/gguf_rerank.py, which says what is refused);
  `--task generate` where the file holds an LM head (output.weight). Classifier labels
  without RANK pooling are refused: llama.cpp scores by the head under RANK alone.

The pooled token: where the file says `tokenizer.ggml.add_eos_token` (gguf-py's
SpecialVocab writes it where tokenizer.json's post-processor ends each text with the EOS,
Qwen3-Embedding's `<|endoftext|>`, which it then records as the file's EOS; or where
tokenizer_config.json says add_eos_token, e5-mistral's `</s>`), llama.cpp's tokenizer
appends that EOS to each text it embeds. transformers' tokenizer of the file (5.24)
builds its post-processor from the same flag, so the staging tokenizer.json appends it
already, byte-level and SentencePiece vocabularies alike (tests/test_gguf_embed.py holds
it to that).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeprefill.errors import ExportError

# gguf.PoolingType's values -> names
POOLINGS = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
LAST = "last"
RANK = "rank"
EMBEDDING_TASKS = ("auto", "embed")
# the sentence-transformers files a LAST file's staging folder gets
MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize",
     "type": "sentence_transformers.models.Normalize"},
]


def pooling_of(metadata: dict[str, Any], file: str, task: str) -> str | None:
    """The file's pooling name (None where it names none), refused in one line where the
    export `task` cannot make the bundle it asks for."""
    arch = metadata["general.architecture"]
    key = f"{arch}.pooling_type"
    # (transformers' reader leaves arrays unparsed: whether the file has the labels)
    labelled = f"{arch}.classifier.output_labels" in metadata
    value = metadata.get(key)
    pooling = None if value is None else POOLINGS.get(int(value))
    if value is not None and pooling is None:
        raise ExportError(f"{file}: {key} {value} is no pooling llama.cpp knows "
                          f"({', '.join(f'{v} {n}' for v, n in POOLINGS.items())})")
    if labelled and pooling != RANK:  # llama.cpp ranks by the head under RANK alone
        raise ExportError(f"{file} is a reranker ({key} {pooling or 'unset'}, classifier "
                          "labels): llama.cpp scores by its head (cls.output) only where "
                          "the pooling is rank; export its Hugging Face checkpoint with "
                          "--task score")
    if pooling == RANK:  # what each task makes of it: gguf_rerank.check
        return pooling
    if pooling not in (None, LAST) and task in EMBEDDING_TASKS:
        raise ExportError(f"{file} pools its tokens by {pooling} ({key}): edgeprefill "
                          "exports last-token pooling only (the graph gives the last token's "
                          "hidden state); export the language model with --task generate")
    return pooling


def write_layout(folder: Path, hidden_size: int) -> None:
    """sentence-transformers' files for a LAST file in the staging `folder`: last-token
    pooling, normalized, no prompts (a GGUF records none)."""
    (folder / "modules.json").write_text(json.dumps(MODULES, indent=1))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden_size, "pooling_mode_lasttoken": True}, indent=1))
    (folder / "2_Normalize").mkdir(exist_ok=True)
