"""Which checkpoint tensor is the LM head, as transformers 5 loads it.

`tie_word_embeddings` (read per family by `ModelConfig.from_hf`: the outer config of
Qwen3-VL and Gemma 3, either level of Qwen2-VL) says to tie the head to the embedding, but
`PreTrainedModel.tie_weights` ties only a head the checkpoint lacks or holds equal to the
embedding: a stored head that differs is kept, with a warning ("... so we will NOT tie
them"). A stored head is therefore always the head; the embedding stands in only where a
tied config's checkpoint has none, and the other way round: a tied checkpoint that stores
only the head gets it as the embedding too.
"""

from __future__ import annotations

import logging

from edgeprefill.errors import ExportError
from edgeprefill.export.checkpoint import Checkpoint
from edgeprefill.export.model_config import ModelConfig

log = logging.getLogger(__name__)


def head_weight(ckpt: Checkpoint, cfg: ModelConfig) -> str:
    """The name of the tensor the bundle's LM head reads."""
    names = cfg.names
    heads = tuple(h + ".weight" for h in names.lm_head)
    stored = _first_stored(ckpt, heads)
    if stored is None and cfg.tie_embeddings:
        stored = _first_stored(ckpt, names.embed)
    if stored is None:
        raise ExportError(f"the checkpoint lacks the tensor {' or '.join(map(repr, heads))}")
    return _tied_to_adapted_embedding(ckpt, cfg, stored) or stored


def _tied_to_adapted_embedding(ckpt: Checkpoint, cfg: ModelConfig, head: str) -> str | None:
    """The embedding, for a stored head transformers ties to it (equal values, a tied
    config) where a LoRA adapter changes the embedding and not the head: peft's merge adds
    the delta to the one table both then read."""
    embedding = _first_stored(ckpt, cfg.names.embed)
    adapter = ckpt.adapter
    if (adapter is None or not cfg.tie_embeddings or embedding is None or head == embedding
            or adapter.touches(head) or not adapter.touches(embedding)):
        return None
    return embedding if ckpt.same(head, embedding) else None


def embedding_weight(ckpt: Checkpoint, cfg: ModelConfig) -> str:
    """The name of the tensor the bundle's token embedding reads."""
    names = cfg.names
    stored = _first_stored(ckpt, names.embed)
    if stored is None and cfg.tie_embeddings:
        stored = _first_stored(ckpt, tuple(h + ".weight" for h in names.lm_head))
    if stored is None:
        raise ExportError(f"the checkpoint lacks the tensor {' or '.join(map(repr, names.embed))}")
    return stored


def warn_if_kept_apart(ckpt: Checkpoint, cfg: ModelConfig) -> None:
    """transformers' warning, where the config ties but the stored head differs from the
    embedding: the bundle keeps the head apart, as transformers does."""
    names = cfg.names
    head = head_weight(ckpt, cfg)
    embedding = _first_stored(ckpt, names.embed)
    if not cfg.tie_embeddings or embedding is None or head == embedding:
        return
    if ckpt.adapter is not None and head in ckpt.adapter.replacements:
        return  # a LoRA adapter's modules_to_save head: peft unties it, and so does this
    if not ckpt.same(head, embedding):
        log.warning("config.json ties the embeddings, but the checkpoint's %s differs from "
                    "%s: the bundle keeps it as the LM head, as transformers does "
                    "(tie_word_embeddings false silences this)", head, embedding)


def _first_stored(ckpt: Checkpoint, candidates: tuple[str, ...]) -> str | None:
    return next((name for name in candidates if ckpt.has(name)), None)
